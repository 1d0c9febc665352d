// Package live runs a simulator.Scenario against real daemons: one or more
// `sluice serve` daemons per region (the region package, in process) on
// loopback, joined by real memberlist gossip, each region on the embedded
// memory store or its own redis-server, with every arrival a real HTTP
// check. Time is compressed: the scenario's report interval (10 s by
// default) becomes Options.Interval (1 s), and every scenario time (duration,
// steps, warm-up, windows) is scaled by the same factor, so a 300 s scenario
// runs in 30 s. Rates are scaled too: the scenario's multiples of L apply to
// Options.Limit, the live L_global.
//
// The result has the shape of the virtual-time simulator's
// (simulator.Result, same JSON), with times and durations reported in
// scenario time, so the two can be compared field by field. The oracle is
// engine.Decide on the same arrivals at the full limit, as in the simulator.
//
// Supported: splits, steps, Poisson or even arrivals, bursts, diurnal
// rotation, several keys (uniform or Zipf), crashes (the region's daemons are
// stopped without a graceful leave). Not supported live: partitions, clock
// skew, injected delay and loss, limit steps and quotas (Run says so).
package live

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/region"
	"github.com/sluice-rl/sluice/simulator"
)

// Options tune a live run.
type Options struct {
	// Seed seeds arrivals and key choice.
	Seed uint64
	// Store is "memory" (default) or "redis": one redis-server per region,
	// started and stopped by Run (redis-server must be on PATH).
	Store string
	// NodesPerRegion is the number of daemons per region (default 1).
	NodesPerRegion int
	// Interval is the live report interval (default 1 s); the scenario's
	// interval maps onto it.
	Interval time.Duration
	// Limit is the live L_global in units per second (default 1000, the
	// simulator's own L). The allocation estimates each region's rate from
	// the arrivals of one interval and of its last fifth; at 1 s intervals a
	// smaller L leaves a small region a handful of arrivals per estimate,
	// and the Poisson noise, not the algorithm, dominates the error
	// (steady-uneven, global_error_p99_pct: 0.07% virtual; live 3.0% at
	// L = 200 and 0.3% at 1000). Offered load is Traffic.Rate·Limit checks
	// per second.
	Limit float64
	// Logger receives the daemons' logs (default: discarded).
	Logger *slog.Logger
	// Progress, if set, is called about once per live second with the
	// scenario time done and the total.
	Progress func(done, total time.Duration)
}

const policyID = "live-global"

func (o Options) withDefaults() Options {
	if o.Store == "" {
		o.Store = "memory"
	}
	if o.NodesPerRegion <= 0 {
		o.NodesPerRegion = 1
	}
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.Limit <= 0 {
		o.Limit = 1000
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// Validate reports what of sc cannot run live.
func Validate(sc simulator.Scenario) error {
	if err := sc.Validate(); err != nil {
		return err
	}
	var bad []string
	if len(sc.Gossip.Partitions) > 0 {
		bad = append(bad, "partitions")
	}
	if sc.Gossip.Skew > 0 || sc.Gossip.Loss > 0 {
		bad = append(bad, "clock skew and loss")
	}
	if sc.Quota != nil {
		bad = append(bad, "quotas")
	}
	if len(sc.LimitSteps) > 0 {
		bad = append(bad, "limit steps")
	}
	if a := sc.Limit.Algorithm; a != "" && a != "token_bucket" {
		bad = append(bad, "algorithm "+a)
	}
	for _, c := range sc.Gossip.Crashes {
		if c.Restart > 0 {
			bad = append(bad, "crash restarts")
			break
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("scenario %s: not supported live: %s", sc.Name, strings.Join(bad, ", "))
	}
	return nil
}

// node is one in-process daemon.
type node struct {
	region int
	d      *region.Daemon
	addr   string
	cancel context.CancelFunc
	done   chan error
}

type cluster struct {
	nodes   [][]*node // by region
	stops   []func()
	crashed []atomic.Bool
}

// Run plays sc against live daemons and returns its metrics.
func Run(ctx context.Context, sc simulator.Scenario, opt Options) (simulator.Result, error) {
	opt = opt.withDefaults()
	if err := Validate(sc); err != nil {
		return simulator.Result{}, err
	}
	sc = withDefaults(sc)
	f := float64(opt.Interval) / float64(sc.Share.Interval.D()) // live seconds per scenario second

	cl, err := start(ctx, sc, opt, f)
	defer cl.close()
	if err != nil {
		return simulator.Result{}, err
	}
	p := newPlayer(sc, opt, f, cl)
	return p.play(ctx)
}

// withDefaults fills what the simulator fills (simulator.Scenario's
// documented defaults).
func withDefaults(sc simulator.Scenario) simulator.Scenario {
	if sc.Keys == 0 {
		sc.Keys = 1
	}
	if sc.Limit.Burst == 0 {
		sc.Limit.Burst = sc.Limit.Rate
	}
	if sc.Share.Interval == 0 {
		sc.Share.Interval = simulator.Duration(10 * time.Second)
	}
	if sc.Warmup == 0 {
		sc.Warmup = 2 * sc.Share.Interval
	}
	return sc
}

func start(ctx context.Context, sc simulator.Scenario, opt Options, f float64) (*cluster, error) {
	cl := &cluster{nodes: make([][]*node, sc.Regions), crashed: make([]atomic.Bool, sc.Regions)}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return cl, err
	}
	// The live policy: L_live, with the scenario's burst in its own
	// seconds of L, compressed like time.
	burst := liveBurst(sc, opt, f)
	pol := quota.Policy{ID: policyID, Algorithm: "token_bucket", RatePerSec: opt.Limit, Burst: burst,
		Mode: quota.ModeEnforce, Scope: quota.ScopeGlobal, OnStoreFailure: quota.FailOpen}
	sh := region.ShareConfig(opt.Interval)
	if sc.Share.Pressure != 0 {
		sh.Pressure = sc.Share.Pressure
	}
	if sc.Share.NoBorrow {
		sh.BorrowEvery = 0
	}
	if sc.Share.LendFraction != 0 {
		sh.LendFraction = sc.Share.LendFraction
	}
	var seed string
	for r := 0; r < sc.Regions; r++ {
		store := "memory"
		if opt.Store == "redis" {
			srv, err := startRedis(ctx)
			if err != nil {
				return cl, err
			}
			cl.stops = append(cl.stops, srv.stop)
			store = "redis://" + srv.addr
		} else if opt.Store != "memory" {
			return cl, fmt.Errorf("live store %q: want memory or redis", opt.Store)
		}
		for i := 0; i < opt.NodesPerRegion; i++ {
			cfg := region.DefaultConfig()
			cfg.Listen = "127.0.0.1:0"
			cfg.Store = store
			cfg.StoreTimeout = 200 * time.Millisecond
			cfg.Policies = []quota.Policy{pol}
			cfg.ShutdownTimeout = 2 * time.Second
			cfg.Gossip = &region.GossipConfig{Region: regionName(r), Node: fmt.Sprintf("%s-n%d", regionName(r), i),
				Listen: "127.0.0.1:0", Interval: opt.Interval, SecretKey: key, Preset: "local", Share: sh}
			if seed != "" {
				cfg.Gossip.Join = []string{seed}
			}
			reg := prometheus.NewRegistry()
			d, err := region.New(ctx, cfg, opt.Logger.With("node", cfg.Gossip.Node), reg, reg)
			if err != nil {
				return cl, fmt.Errorf("daemon %s: %w", cfg.Gossip.Node, err)
			}
			if seed == "" {
				seed = d.Gossip().Addr()
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return cl, err
			}
			nctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
			n := &node{region: r, d: d, addr: ln.Addr().String(), cancel: cancel, done: make(chan error, 1)}
			go func() { n.done <- d.Serve(nctx, ln, nil) }()
			cl.nodes[r] = append(cl.nodes[r], n)
		}
	}
	// Wait until every node sees every other.
	want := sc.Regions * opt.NodesPerRegion
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok := true
		for _, ns := range cl.nodes {
			for _, n := range ns {
				if n.d.Gossip().NumLive() != want {
					ok = false
				}
			}
		}
		if ok {
			return cl, nil
		}
		if time.Now().After(deadline) {
			return cl, errors.New("live: the daemons did not form one cluster within 30 s")
		}
		select {
		case <-ctx.Done():
			return cl, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// liveBurst is the scenario's burst (in seconds of L) compressed like time,
// in live units.
func liveBurst(sc simulator.Scenario, opt Options, f float64) float64 {
	return math.Max(1, math.Round(opt.Limit*f*sc.Limit.Burst/sc.Limit.Rate))
}

func regionName(i int) string { return fmt.Sprintf("r%d", i) }

// crash stops region r's daemons abruptly: no graceful leave, as a crash.
func (cl *cluster) crash(r int) {
	if cl.crashed[r].Swap(true) {
		return
	}
	for _, n := range cl.nodes[r] {
		n.d.Gossip().Shutdown()
		n.cancel()
	}
}

func (cl *cluster) close() {
	for _, ns := range cl.nodes {
		for _, n := range ns {
			n.cancel()
		}
	}
	for _, ns := range cl.nodes {
		for _, n := range ns {
			select {
			case <-n.done:
			case <-time.After(5 * time.Second):
			}
		}
	}
	for _, s := range cl.stops {
		s()
	}
}

// arrival is one scheduled check.
type arrival struct {
	at     time.Duration // scenario time
	region int
	key    int
}

type player struct {
	sc     simulator.Scenario
	opt    Options
	f      float64
	cl     *cluster
	rng    *mrand.Rand
	zipf   *mrand.Zipf
	client *http.Client
	subs   []string
	oracle []engine.State
	olimit engine.Limit
	m      *recorder
}

// crashed says whether region r's daemons have been stopped.
func (p *player) crashed(r int) bool { return p.cl.crashed[r].Load() }

func newPlayer(sc simulator.Scenario, opt Options, f float64, cl *cluster) *player {
	p := &player{sc: sc, opt: opt, f: f, cl: cl, rng: mrand.New(mrand.NewPCG(opt.Seed, 0x5eed)),
		client: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 128}}}
	if sc.Keys > 1 && sc.Zipf > 1 {
		p.zipf = mrand.NewZipf(p.rng, sc.Zipf, 1, uint64(sc.Keys-1))
	}
	for k := 0; k < sc.Keys; k++ {
		p.subs = append(p.subs, fmt.Sprintf("live-key-%d", k))
	}
	p.oracle = make([]engine.State, sc.Keys)
	// The oracle runs on scenario time with the live limit: L_live·f units
	// per scenario second, the live burst.
	p.olimit = engine.Limit{Algorithm: engine.TokenBucket, Rate: opt.Limit * f, Burst: liveBurst(sc, opt, f)}
	p.m = newRecorder(sc, f, opt.Limit)
	return p
}

// play generates arrivals in scenario-time order on the live clock, decides
// each at the oracle and sends it to a daemon of its region, until the
// scenario's end; then it waits for the answers and computes the result.
func (p *player) play(ctx context.Context) (simulator.Result, error) {
	sc := p.sc
	total := sc.Duration.D()
	// Start on an epoch boundary of the live interval, as the simulator's
	// windows start on its epochs.
	now := time.Now()
	start := now.Truncate(p.opt.Interval).Add(p.opt.Interval)
	if start.Sub(now) < p.opt.Interval/2 {
		start = start.Add(p.opt.Interval)
	}
	live := func(t time.Duration) time.Time { return start.Add(time.Duration(float64(t) * p.f)) }

	type job struct {
		a   arrival
		ok  bool // oracle
		sub string
	}
	work := make([][]chan job, sc.Regions)
	var wg sync.WaitGroup
	for r := range work {
		for _, n := range p.cl.nodes[r] {
			ch := make(chan job, 1024)
			work[r] = append(work[r], ch)
			for range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for j := range ch {
						allowed, err := p.check(ctx, n.addr, j.sub)
						p.m.arrival(j.a, j.ok, allowed, err)
					}
				}()
			}
		}
	}
	stopShares := p.m.sampleShares(ctx, p.cl, start, p.subs[0])

	// Next arrival per region: exponential (Poisson) or even gaps in
	// scenario time at rate·L_scenario, re-evaluated as rates change.
	rates := make([]float64, sc.Regions)
	next := make([]time.Duration, sc.Regions)
	rr := make([]int, sc.Regions)
	gap := func(r int, t time.Duration) time.Duration {
		p.sc.Traffic.Rates(t, p.crashed, rates)
		lam := rates[r] * p.opt.Limit * p.f // arrivals per scenario second
		if lam <= 0 {
			return 100 * time.Millisecond // look again later
		}
		mean := 1 / lam
		if sc.Traffic.Poisson {
			return time.Duration(p.rng.ExpFloat64() * mean * float64(time.Second))
		}
		return time.Duration(mean * float64(time.Second))
	}
	for r := range next {
		next[r] = gap(r, 0)
	}
	crashes := sc.Gossip.Crashes
	lastProgress := time.Now()
	for {
		r := 0
		for i := range next {
			if next[i] < next[r] {
				r = i
			}
		}
		t := next[r]
		if t >= total {
			break
		}
		for _, c := range crashes {
			if t >= c.At.D() && c.Region < sc.Regions && !p.cl.crashed[c.Region].Load() {
				p.cl.crash(c.Region)
			}
		}
		if d := time.Until(live(t)); d > 0 {
			select {
			case <-ctx.Done():
				stopShares()
				return simulator.Result{}, ctx.Err()
			case <-time.After(d):
			}
		}
		if p.opt.Progress != nil && time.Since(lastProgress) >= time.Second {
			p.opt.Progress(t, total)
			lastProgress = time.Now()
		}
		p.sc.Traffic.Rates(t, p.crashed, rates)
		if rates[r] > 0 && !p.cl.crashed[r].Load() {
			k := 0
			if sc.Keys > 1 {
				if p.zipf != nil {
					k = int(p.zipf.Uint64())
				} else {
					k = p.rng.IntN(sc.Keys)
				}
			}
			a := arrival{at: t, region: r, key: k}
			var res engine.Result
			p.oracle[k], res = engine.Decide(time.Unix(0, 0).Add(t), p.oracle[k], p.olimit, 1)
			ch := work[r][rr[r]%len(work[r])]
			rr[r]++
			select {
			case ch <- job{a: a, ok: res.Allowed, sub: p.subs[k]}:
			default:
				p.m.dropped() // the daemon cannot keep up; counted, not queued
			}
		}
		next[r] = t + gap(r, t)
	}
	for r := range work {
		for _, ch := range work[r] {
			close(ch)
		}
	}
	wg.Wait()
	stopShares()
	res := p.m.result()
	p.m.mu.Lock()
	errs, drops, offered := p.m.errs, p.m.drops, p.m.checks/2
	p.m.mu.Unlock()
	if bad := errs + drops; bad > 0 {
		p.opt.Logger.Warn("live: checks not answered", "errors", errs, "dropped", drops, "of", offered+drops)
		if float64(bad) > 0.02*float64(offered+drops) && len(sc.Gossip.Crashes) == 0 {
			return res, fmt.Errorf("live: %d of %d checks failed or were dropped: the machine cannot drive this load; lower Options.Limit", bad, offered+drops)
		}
	}
	return res, nil
}

func (p *player) check(ctx context.Context, addr, subject string) (bool, error) {
	body := fmt.Sprintf(`{"subject":%q,"route":"/live"}`, subject)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/check", strings.NewReader(body))
	if err != nil {
		return false, err
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := p.client.Do(req)
	if err != nil {
		return false, err
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	switch res.StatusCode {
	case http.StatusOK:
		return true, nil
	case http.StatusTooManyRequests:
		return false, nil
	}
	return false, fmt.Errorf("check: HTTP %d", res.StatusCode)
}
