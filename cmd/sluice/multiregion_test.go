package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/racedetector"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/internal/testwait"
)

// freeGossipPort returns a loopback port free for both TCP and UDP (freePort).
func freeGossipPort(t *testing.T) int {
	t.Helper()
	return freePort(t, true)
}

// regionView is the part of GET /v1/regions the tests read.
type regionView struct {
	MultiRegion bool `json:"multi_region"`
	Regions     []struct {
		Region          string   `json:"region"`
		Nodes           []string `json:"nodes"`
		LastReportBytes int      `json:"last_report_bytes"`
		LastReportKeys  int      `json:"last_report_keys"`
	} `json:"regions"`
	PolicySkew      bool                `json:"policy_skew"`
	PolicyRevisions map[string][]uint64 `json:"policy_revisions"`
}

func (d *daemon) regions() (regionView, string) {
	d.t.Helper()
	r := d.admin("GET", "/v1/regions", "")
	var v regionView
	if r.status != 200 || json.Unmarshal([]byte(r.body), &v) != nil {
		d.t.Fatalf("GET /v1/regions = %d %s", r.status, r.body)
	}
	return v, r.body
}

// loadGen offers evenly spaced checks of one subject to a set of daemons at
// rates that can change while it runs, and counts admissions per Unix
// second (the 1 s interval's epochs are aligned to Unix seconds).
type loadGen struct {
	// send makes one check at a daemon address and reports whether it
	// was admitted; an error is a check that got no answer.
	send  func(addr string) (admitted bool, err error)
	mu    sync.Mutex
	rates map[string]float64 // daemon addr → checks per second
	admit map[int64]int      // Unix second (of the send) → admitted
	offer map[int64]int
	// pending counts the checks sent and not yet answered by Unix second
	// of their send, sched the send time of each pacer's latest check:
	// settle waits on them.
	pending map[int64]int
	sched   map[string]time.Time
	errs    atomic.Int64
	stop    chan struct{}
	wg      sync.WaitGroup
}

// newLoadGen offers POST /v1/check of subject to daemons' gateway
// addresses.
func newLoadGen(subject string) *loadGen {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	body := []byte(fmt.Sprintf(`{"subject":%q,"route":"/v1/orders"}`, subject))
	return newLoadGenOf(func(addr string) (bool, error) {
		res, err := client.Post("http://"+addr+"/v1/check", "application/json", bytes.NewReader(body))
		if err != nil {
			return false, err
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode == http.StatusOK, nil
	})
}

// newLoadGenOf offers the checks that send makes.
func newLoadGenOf(send func(addr string) (bool, error)) *loadGen {
	return &loadGen{send: send,
		rates: map[string]float64{}, admit: map[int64]int{}, offer: map[int64]int{},
		pending: map[int64]int{}, sched: map[string]time.Time{}, stop: make(chan struct{})}
}

func (g *loadGen) setRates(r map[string]float64) {
	g.mu.Lock()
	g.rates = r
	g.mu.Unlock()
}

// run starts one pacer per daemon address in addrs, each feeding workers.
func (g *loadGen) run(addrs []string) {
	for _, addr := range addrs {
		jobs := make(chan time.Time, 256)
		for range 6 {
			g.wg.Add(1)
			go func() {
				defer g.wg.Done()
				for at := range jobs {
					g.check(addr, at)
				}
			}()
		}
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			defer close(jobs)
			next := time.Now()
			for {
				g.mu.Lock()
				rate := g.rates[addr]
				g.mu.Unlock()
				if rate <= 0 {
					select {
					case <-g.stop:
						return
					case <-time.After(20 * time.Millisecond):
					}
					next = time.Now()
					continue
				}
				next = next.Add(time.Duration(float64(time.Second) / rate))
				if d := time.Until(next); d > 0 {
					select {
					case <-g.stop:
						return
					case <-time.After(d):
					}
				} else if d < -time.Second {
					next = time.Now() // fell behind: do not burst to catch up
				}
				g.mu.Lock()
				g.pending[next.Unix()]++
				g.sched[addr] = next
				g.mu.Unlock()
				select {
				case jobs <- next:
				case <-g.stop:
					return
				}
			}
		}()
	}
}

func (g *loadGen) check(addr string, at time.Time) {
	admitted, err := g.send(addr)
	sec := at.Unix()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.pending[sec]--
	if err != nil {
		g.errs.Add(1)
		return
	}
	g.offer[sec]++
	if admitted {
		g.admit[sec]++
	}
}

// settle waits until every check due before the Unix second to has been
// sent and answered, so that window counts whole seconds: read at to
// itself, the last second lacked the checks still in flight, and on a
// loaded machine that read as a shortfall (offered 348 of 400, admitted
// 173 of 200). A check's HTTP client gives up after 2 s.
func (g *loadGen) settle(t *testing.T, to int64) {
	t.Helper()
	end := time.Unix(to, 0)
	testwait.For(t, 10*time.Second, fmt.Sprintf("the checks due before %d to be answered", to), func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		for addr, r := range g.rates {
			if r > 0 && g.sched[addr].Before(end) {
				return false
			}
		}
		for s, n := range g.pending {
			if s < to && n > 0 {
				return false
			}
		}
		return true
	})
}

func (g *loadGen) close() {
	close(g.stop)
	g.wg.Wait()
}

// admitted returns the admitted and offered counts of the Unix seconds in
// [from, to).
func (g *loadGen) window(from, to int64) (admitted, offered []int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for s := from; s < to; s++ {
		admitted = append(admitted, g.admit[s])
		offered = append(offered, g.offer[s])
	}
	return admitted, offered
}

// nextSecond waits until the start of the next Unix second and returns it:
// the start of a load generator's interval, which it counts admissions
// by. It and waitSeconds wait for the wall clock to pass an instant, which
// a loaded machine can only delay (by at most For's 50 ms poll once it
// runs), not a condition it could keep from holding.
func nextSecond(t *testing.T) int64 {
	t.Helper()
	s := time.Now().Truncate(time.Second).Add(time.Second)
	testwait.For(t, 2*time.Second, "the next second", func() bool { return !time.Now().Before(s) })
	return s.Unix()
}

// waitSeconds waits until n seconds after the Unix second from.
func waitSeconds(t *testing.T, n int64, from int64) {
	t.Helper()
	end := time.Unix(from+n, 0)
	testwait.For(t, time.Until(end)+time.Second, fmt.Sprintf("second %d", from+n), func() bool { return !time.Now().Before(end) })
}

// startRegions runs perRegion daemons (the real binary) in each of
// regions on loopback, each region with its own redis-server, gossiping
// over real memberlist at a 1 s interval, each with args added; it waits
// until every daemon sees every region with all its nodes.
func startRegions(t *testing.T, bin string, regions []string, perRegion int, args ...string) map[string][]*daemon {
	t.Helper()
	key := writeFile(t, "gossip.key", "c2x1aWNlLXRlc3QtZ29zc2lwLWtleS0zMi1ieXRlcyE=") // 32 bytes, base64
	var seed string
	ds := map[string][]*daemon{}
	for _, r := range regions {
		store := "redis://" + redistest.Start(t).Addr()
		for i := range perRegion {
			port := freeGossipPort(t)
			dargs := append([]string{"--store", store, "--store-timeout", "200ms",
				"--region", r, "--node", fmt.Sprintf("%s-n%d", r, i), "--gossip-listen", "127.0.0.1:" + strconv.Itoa(port),
				"--gossip-interval", "1s", "--gossip-preset", "local", "--gossip-key-file", key}, args...)
			if seed != "" {
				dargs = append(dargs, "--join", seed)
			} else {
				seed = "127.0.0.1:" + strconv.Itoa(port)
			}
			ds[r] = append(ds[r], startDaemon(t, bin, dargs...))
		}
	}
	testwait.For(t, 20*time.Second, fmt.Sprintf("%d regions of %d live nodes each", len(regions), perRegion), func() bool {
		for _, r := range regions {
			for _, d := range ds[r] {
				v, _ := d.regions()
				if len(v.Regions) != len(regions) {
					return false
				}
				for _, ri := range v.Regions {
					if len(ri.Nodes) != perRegion {
						return false
					}
				}
			}
		}
		return true
	})
	return ds
}

// TestMultiRegionSharesConverge runs 3 regions × 2
// daemons (the real binary) on loopback, real memberlist, each region with
// its own redis-server; one global key offered 2·L split 70/20/10 at a 1 s
// interval. After 3 intervals the total admitted per interval is within 5%
// of L; after all traffic moves to one region it is back within 5% within
// 3 intervals; after that region's daemons are killed (its traffic failing
// over to the others), the others take over its share within the documented
// time: K+1 = 4 intervals plus Settle and RaiseDelay, so the 6th interval
// after the kill is within 5% again. The protocol's timings are tested
// on virtual time by the coordinator's scripted cores (TestCoreSharesFollowTraffic,
// TestCoreTakeoverAfterCrash at these 1 s timings) and gossip's
// TestContactFollowsReachabilityVirtual; this test keeps the real binary,
// Redis and memberlist, with the margins stated at each bound.
func TestMultiRegionSharesConverge(t *testing.T) {
	bin := buildSluice(t)
	const limit = 200.0 // L_global, units per second
	policies := writeFile(t, "policies.json", fmt.Sprintf(
		`[{"id":"global-orders","algorithm":"token_bucket","rate_per_sec":%g,"burst":%g,"mode":"enforce","scope":"global"}]`, limit, limit/10))
	regions := []string{"r1", "r2", "r3"}
	ds := startRegions(t, bin, regions, 2, "--policies", policies)

	g := newLoadGen("tenant-42")
	var all []string
	for _, r := range regions {
		for _, d := range ds[r] {
			all = append(all, d.addr)
		}
	}
	g.run(all)
	defer g.close()
	split := func(fr map[string]float64) map[string]float64 {
		out := map[string]float64{}
		for r, f := range fr {
			for _, d := range ds[r] {
				out[d.addr] = 2 * limit * f / float64(len(ds[r]))
			}
		}
		return out
	}
	// The bound is the documented ±5% of L, on real time (six daemon
	// processes and three redis-servers cannot share a virtual clock),
	// judged over each two adjacent intervals: admissions are counted per
	// second as the load generator sees them, and a stall of the machine
	// moves some of them across a second's edge (a daemon that did not run
	// for a while finds its bucket refilled, up to its burst of L/10, and
	// admits it after the stall), so one second can read +14% and the
	// next -9% with the two together on L (seen beside a CPU hog on 2
	// cores: 228 then 183 of 200). Over two seconds such a shift cancels,
	// while a share error, which lasts, does not. A shortfall also comes
	// from checks answered late and bunched (refill beyond the burst is
	// lost): -5% allows about 100 ms of bunching per two intervals. Under
	// the race detector the daemons answer several times slower and the
	// intervals fall short by 5-12% in turn; only overshoot is asserted
	// there, shortfall without it.
	under := 0.05
	if racedetector.Enabled {
		under = 1
	}
	within := func(phase string, from, to int64) {
		t.Helper()
		g.settle(t, to)
		adm, off := g.window(from, to)
		t.Logf("%s: admitted per interval %v (offered %v), L = %g", phase, adm, off, limit)
		for i := 0; i+1 < len(adm); i++ {
			two := adm[i] + adm[i+1]
			if e := (float64(two) - 2*limit) / (2 * limit); e > 0.05 || e < -under {
				t.Errorf("%s: intervals %d and %d of [%d,%d) admitted %d, %.1f%% off 2L = %g (want within +5%%/-%.0f%%)", phase, i, i+1, from, to, two, 100*e, 2*limit, 100*under)
			}
		}
	}

	// Phase 1: 2L split 70/20/10.
	t1 := nextSecond(t)
	g.setRates(split(map[string]float64{"r1": 0.7, "r2": 0.2, "r3": 0.1}))
	waitSeconds(t, 8, t1)
	within("70/20/10 after 3 intervals", t1+3, t1+8)
	_, body := ds["r1"][0].regions()
	t.Logf("GET /v1/regions on r1-n0: %s", body)
	r := ds["r2"][0].admin("GET", "/v1/keys/tenant-42/usage", "")
	t.Logf("GET /v1/keys/tenant-42/usage on r2-n0: %s", r.body)
	if !strings.Contains(r.body, `"coordinated":true`) {
		t.Errorf("usage does not show negotiated shares: %s", r.body)
	}

	// Phase 2: all traffic moves to r3 (the smallest).
	t2 := nextSecond(t)
	g.setRates(split(map[string]float64{"r3": 1}))
	waitSeconds(t, 7, t2)
	within("all traffic in r3, from the 4th interval", t2+3, t2+7)

	// Phase 3: r3's daemons die (SIGKILL: no graceful leave); its traffic
	// fails over to r1 and r2.
	t3 := nextSecond(t)
	for _, d := range ds["r3"] {
		d.cmd.Process.Signal(syscall.SIGKILL)
	}
	g.setRates(split(map[string]float64{"r1": 0.5, "r2": 0.5}))
	waitSeconds(t, 9, t3)
	within("r3 killed, from the 6th interval", t3+5, t3+9)
	adm, _ := g.window(t3, t3+5)
	t.Logf("r3 killed, intervals 0-4 (before the documented takeover): %v", adm)
	if n := g.errs.Load(); n > 0 {
		t.Logf("%d checks failed at the HTTP level (the killed daemons)", n)
	}
	_, body = ds["r1"][0].regions()
	t.Logf("GET /v1/regions on r1-n0 at the end: %s", body)
	// Gossip traffic, for the bandwidth arithmetic in docs/architecture.md.
	for _, d := range []*daemon{ds["r1"][0], ds["r1"][1], ds["r2"][0]} {
		m := d.do("GET", "/metrics", "")
		var lines []string
		for _, l := range strings.Split(m.body, "\n") {
			if strings.HasPrefix(l, "sluice_gossip_sent") || strings.HasPrefix(l, "sluice_gossip_received") {
				lines = append(lines, l)
			}
		}
		t.Logf("gossip metrics of %s after %v: %s", d.addr, time.Since(time.Unix(t1, 0)).Round(time.Second), strings.Join(lines, "; "))
	}

	// One policy set everywhere: a change made in r2 reaches r1 over gossip
	// within a few intervals, and /v1/regions shows no skew once it has.
	if r := ds["r2"][1].admin("PUT", "/v1/policies/global-orders",
		fmt.Sprintf(`{"algorithm":"token_bucket","rate_per_sec":%g,"burst":%g,"mode":"enforce","scope":"global"}`, 2*limit, limit/10)); r.status != 200 {
		t.Fatalf("PUT policy in r2 = %d %s", r.status, r.body)
	}
	changed := time.Now()
	defer func() {
		if t.Failed() {
			_, b := ds["r1"][1].regions()
			t.Logf("r1-n1 regions: %s\nr1-n0 policies: %s\nr2-n1 log:\n%s", b, ds["r1"][0].admin("GET", "/v1/policies", "").body, ds["r2"][1].log())
		}
	}()
	// The skew clears once membership has declared both of r3's killed
	// daemons dead: Lifeguard starts a suspicion at its longest timeout
	// (18 s with the local preset's 1 s probes) and shortens it only as
	// other members confirm, which a loaded machine may not do in time.
	testwait.For(t, 30*time.Second, "the policy change to reach r1 with no skew", func() bool {
		r := ds["r1"][0].admin("GET", "/v1/policies", "")
		if !strings.Contains(r.body, fmt.Sprintf(`"rate_per_sec":%g`, 2*limit)) {
			return false
		}
		v, _ := ds["r1"][1].regions()
		return !v.PolicySkew && len(v.PolicyRevisions["r1"]) == 1 && len(v.PolicyRevisions["r2"]) == 1 &&
			v.PolicyRevisions["r1"][0] == v.PolicyRevisions["r2"][0] && v.PolicyRevisions["r1"][0] != 0
	})
	t.Logf("policy change in r2 applied in r1 and skew cleared after %v", time.Since(changed).Round(10*time.Millisecond))
	if os.Getenv("SLUICE_TEST_VERBOSE") != "" {
		t.Logf("r1-n0 log:\n%s", ds["r1"][0].log())
	}
}
