package region

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testlog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/engine/redisstore"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/internal/testwait"
	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/region/globalshare"
	"github.com/sluice-rl/sluice/share"
)

func TestNextRevisionOrders(t *testing.T) {
	t0 := time.UnixMilli(1_800_000_000_000)
	tests := []struct {
		name      string
		now       time.Time
		last      uint64
		node      string
		wantAbove uint64
	}{
		{"first change", t0, 0, "a1", 0},
		{"later wall clock", t0.Add(time.Millisecond), nextRevision(t0, 0, "z9"), "a1", nextRevision(t0, 0, "z9")},
		{"clock behind what was seen", t0.Add(-time.Hour), nextRevision(t0, 0, "b1"), "a1", nextRevision(t0, 0, "b1")},
		{"same millisecond as seen", t0, nextRevision(t0, 0, "b1"), "a1", nextRevision(t0, 0, "b1")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := nextRevision(tt.now, tt.last, tt.node); got <= tt.wantAbove {
				t.Errorf("nextRevision(%v, %d, %q) = %d, want > %d", tt.now, tt.last, tt.node, got, tt.wantAbove)
			}
		})
	}
	if a, b := nextRevision(t0, 0, "a1"), nextRevision(t0, 0, "b1"); a == b {
		t.Errorf("two nodes changing in the same millisecond got the same revision %d", a)
	}
}

func TestPolicyHashIgnoresVersionsAndOrder(t *testing.T) {
	p := quota.Policy{ID: "g", Algorithm: "token_bucket", RatePerSec: 10, Burst: 5, Mode: quota.ModeEnforce, Scope: quota.ScopeGlobal}
	q := quota.Policy{ID: "h", Algorithm: "token_bucket", RatePerSec: 1, Burst: 1, Mode: quota.ModeEnforce}
	p2 := p
	p2.Version = 7
	if policyHash([]quota.Policy{p, q}, nil, nil) != policyHash([]quota.Policy{q, p2}, nil, nil) {
		t.Error("policyHash depends on order or version numbers")
	}
	p2.RatePerSec = 11
	if policyHash([]quota.Policy{p, q}, nil, nil) == policyHash([]quota.Policy{p2, q}, nil, nil) {
		t.Error("policyHash does not see a changed rate")
	}
}

type liveDaemon struct {
	d      *Daemon
	base   string
	cancel context.CancelFunc
	done   chan struct{}   // closed when Serve has returned
	err    error           // what Serve returned
	logs   *testlog.Buffer // the daemon's log, as text
}

func startRegionDaemon(t *testing.T, regionName, node, join string, pols []quota.Policy) *liveDaemon {
	t.Helper()
	cfg := DefaultConfig()
	cfg.AdminToken = testToken
	cfg.Policies = pols
	cfg.Listen = "127.0.0.1:0"
	cfg.ShutdownTimeout = time.Second
	cfg.Gossip = &GossipConfig{Region: regionName, Node: node, Listen: "127.0.0.1:0", Interval: time.Second, Dev: true, Preset: "local"}
	if join != "" {
		cfg.Gossip.Join = []string{join}
	}
	return serveDaemon(t, cfg)
}

// serveDaemon starts a daemon on a loopback port with its background work
// running, as `sluice serve` does, and stops it when the test ends.
func serveDaemon(t *testing.T, cfg Config) *liveDaemon {
	t.Helper()
	reg := prometheus.NewRegistry()
	logs := &testlog.Buffer{}
	d, err := New(context.Background(), cfg, slog.New(slog.NewTextHandler(logs, nil)), reg, reg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ld := &liveDaemon{d: d, base: "http://" + ln.Addr().String(), cancel: cancel, done: make(chan struct{}), logs: logs}
	go func() { defer close(ld.done); ld.err = d.Serve(ctx, ln, nil) }()
	t.Cleanup(ld.stop)
	return ld
}

// stop stops the daemon, as SIGTERM does, and waits until it has stopped.
func (l *liveDaemon) stop() {
	l.cancel()
	<-l.done
}

func (l *liveDaemon) admin(t *testing.T, method, path, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, l.base+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+testToken)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func (l *liveDaemon) regions(t *testing.T) RegionsStatus {
	t.Helper()
	code, body := l.admin(t, "GET", "/v1/regions", "")
	var st RegionsStatus
	if code != 200 || json.Unmarshal([]byte(body), &st) != nil {
		t.Fatalf("GET /v1/regions = %d %s", code, body)
	}
	return st
}

// TestPolicySyncNewestWins: a change in one region reaches the other over
// gossip, /v1/regions shows the skew until it has, and two conflicting
// changes made at once in two regions converge on one of them everywhere.
func TestPolicySyncNewestWins(t *testing.T) {
	if testing.Short() {
		t.Skip("real memberlist on loopback; skipped under -short")
	}
	pol := func(rate float64) string {
		return fmt.Sprintf(`{"algorithm":"token_bucket","rate_per_sec":%g,"burst":10,"mode":"enforce","scope":"global"}`, rate)
	}
	seed := []quota.Policy{{ID: "g", Algorithm: "token_bucket", RatePerSec: 10, Burst: 10, Mode: quota.ModeEnforce, Scope: quota.ScopeGlobal}}
	a := startRegionDaemon(t, "a", "a1", "", seed)
	b := startRegionDaemon(t, "b", "b1", a.d.Gossip().Addr(), seed)
	testwait.For(t, 10*time.Second, "two regions", func() bool {
		st := a.regions(t)
		return len(st.Members) == 2 && !st.PolicySkew
	})

	rate := func(l *liveDaemon) float64 {
		p, _ := l.d.Registry().Get("g")
		return p.RatePerSec
	}
	if code, body := a.admin(t, "PUT", "/v1/policies/g", pol(20)); code != 200 {
		t.Fatalf("PUT = %d %s", code, body)
	}
	// The change is stamped and broadcast by a goroutine, not by the PUT.
	testwait.For(t, 5*time.Second, "a revision for the local change", func() bool {
		return a.regions(t).PolicyRevision != 0
	})
	testwait.For(t, 5*time.Second, "the change to reach b", func() bool { return rate(b) == 20 })
	testwait.For(t, 5*time.Second, "no skew", func() bool {
		st := b.regions(t)
		return !st.PolicySkew && st.PolicyRevision == a.regions(t).PolicyRevision
	})

	// Conflicting changes at once: the larger revision wins everywhere.
	ca := make(chan int)
	go func() { code, _ := a.admin(t, "PUT", "/v1/policies/g", pol(30)); ca <- code }()
	if code, body := b.admin(t, "PUT", "/v1/policies/g", pol(40)); code != 200 {
		t.Fatalf("PUT in b = %d %s", code, body)
	}
	if code := <-ca; code != 200 {
		t.Fatalf("PUT in a = %d", code)
	}
	testwait.For(t, 5*time.Second, "both regions to agree", func() bool {
		sa, sb := a.regions(t), b.regions(t)
		return rate(a) == rate(b) && sa.PolicyHash == sb.PolicyHash && sa.PolicyRevision == sb.PolicyRevision && !sa.PolicySkew
	})
	t.Logf("conflict resolved to rate %g", rate(a))

	// Key usage shows every region's share of the global policy.
	code, body := b.admin(t, "GET", "/v1/keys/k1/usage", "")
	var u Usage
	if code != 200 || json.Unmarshal([]byte(body), &u) != nil || len(u.GlobalShares) != 1 || len(u.GlobalShares[0].Regions) != 2 {
		t.Errorf("GET usage = %d %s, want the shares of regions a and b", code, body)
	}
}

func TestRedisSharesRoundTrip(t *testing.T) {
	srv := redistest.Start(t)
	client, err := redisstore.NewClient("redis://" + srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	st := &redisShares{c: client, ttl: time.Minute}
	ctx := context.Background()
	if got, err := st.LoadShares(ctx, "eu"); err != nil || len(got.Shares) != 0 {
		t.Fatalf("LoadShares(empty) = %+v, %v; want nothing, nil", got, err)
	}
	want := globalshare.Saved{Region: "eu", Epoch: 42, Shares: []globalshare.SavedShare{{Key: share.Key{Policy: "g", Subject: "k"}, Share: 0.7}}}
	if err := st.SaveShares(ctx, want); err != nil {
		t.Fatal(err)
	}
	got, err := st.LoadShares(ctx, "eu")
	if err != nil || got.Epoch != 42 || len(got.Shares) != 1 || got.Shares[0] != want.Shares[0] {
		t.Errorf("LoadShares = %+v, %v; want %+v", got, err, want)
	}
	if other, _ := st.LoadShares(ctx, "us"); len(other.Shares) != 0 {
		t.Errorf("LoadShares(us) = %+v, want nothing (shares are per region)", other)
	}
}

// TestGarbageOnGossipPortKeepsServing feeds random bytes to a daemon's
// gossip port (UDP and TCP) and requires it to keep answering checks and
// its cluster status.
func TestGarbageOnGossipPortKeepsServing(t *testing.T) {
	if testing.Short() {
		t.Skip("real memberlist on loopback; skipped under -short")
	}
	seed := []quota.Policy{{ID: "g", Algorithm: "token_bucket", RatePerSec: 1000, Burst: 1000, Mode: quota.ModeEnforce, Scope: quota.ScopeGlobal}}
	a := startRegionDaemon(t, "a", "a1", "", seed)
	addr := a.d.Gossip().Addr()
	rng := mrand.New(mrand.NewPCG(1, 2))
	junk := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	u, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	for i := range 500 {
		u.Write(junk(1 + i%1400))
	}
	for i := range 20 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(junk(1 + i*500))
		c.Close()
	}
	for i := range 20 {
		req, _ := http.NewRequest("POST", a.base+"/v1/check", strings.NewReader(`{"subject":"k","route":"/x"}`))
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("check %d after garbage: %v", i, err)
		}
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("check %d after garbage = %d, want 200", i, res.StatusCode)
		}
	}
	if st := a.regions(t); !st.MultiRegion || len(st.Members) != 1 {
		t.Errorf("GET /v1/regions after garbage = %+v", st)
	}
}

// TestGlobalBucket: loans hand over tokens only for global token buckets
// that hold at least a second of their rate, the rule the simulator's
// coordinator follows for its own policy.
func TestGlobalBucket(t *testing.T) {
	tb := func(id string, rate, burst float64, scope string) quota.Policy {
		return quota.Policy{ID: id, Algorithm: "token_bucket", RatePerSec: rate, Burst: burst, Mode: quota.ModeEnforce, Scope: scope}
	}
	pols := []quota.Policy{
		tb("second-of-burst", 10, 10, quota.ScopeGlobal),
		tb("thin-burst", 10, 5, quota.ScopeGlobal),
		tb("regional", 10, 20, ""),
		{ID: "window", Algorithm: "fixed_window", Count: 100, Window: 60, Mode: quota.ModeEnforce, Scope: quota.ScopeGlobal},
	}
	h := newHarness(t, func(c *Config) { c.Policies = pols })
	for id, want := range map[string]bool{"second-of-burst": true, "thin-burst": false, "regional": false, "window": false, "missing": false} {
		if got := h.d.globalBucket(id); got != want {
			t.Errorf("globalBucket(%q) = %v, want %v", id, got, want)
		}
	}
}

// TestReadyWaitsForOtherRegionsPings: in a multi-region deployment a
// daemon answers /readyz 503 "joining" while the other regions cannot yet
// confirm contact with it (alone, without seeds, or not yet pinged by the
// nodes of other regions that watch it), 200 once they can, and ready
// anyway after half the gossip interval.
func TestReadyWaitsForOtherRegionsPings(t *testing.T) {
	t.Parallel()
	start := func(region, node, join string) *liveDaemon {
		cfg := DefaultConfig()
		cfg.AdminToken = testToken
		cfg.Listen = "127.0.0.1:0"
		cfg.ShutdownTimeout = time.Second
		// At a 20 s interval the wait is bounded at 10 s: what the test sees
		// before that is the pings', not the bound's.
		cfg.Gossip = &GossipConfig{Region: region, Node: node, Listen: "127.0.0.1:0", Interval: 20 * time.Second, Dev: true, Preset: "local"}
		if join != "" {
			cfg.Gossip.Join = []string{join}
		}
		return serveDaemon(t, cfg)
	}
	ready := func(l *liveDaemon) (int, Readiness) {
		res, err := http.Get(l.base + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var rd Readiness
		if err := json.NewDecoder(res.Body).Decode(&rd); err != nil {
			t.Fatal(err)
		}
		return res.StatusCode, rd
	}
	serving := func(l *liveDaemon) bool { _, rd := ready(l); return rd.Status != "stopping" }

	eu := start("eu", "eu-1", "")
	testwait.For(t, 30*time.Second, "eu-1 to serve", func() bool { return serving(eu) })
	if code, rd := ready(eu); code != 503 || rd.Status != "joining" || !strings.Contains(rd.Reason, "not joined") {
		t.Errorf("/readyz of a seedless daemon alone = %d %+v, want 503 joining, not joined", code, rd)
	}

	us := start("us", "us-1", eu.d.cl.g.Addr())
	testwait.For(t, 30*time.Second, "both daemons ready", func() bool {
		c1, _ := ready(eu)
		c2, _ := ready(us)
		return c1 == 200 && c2 == 200
	})
	for _, l := range []*liveDaemon{eu, us} {
		if why := l.d.cl.unconfirmed(0); why != "" {
			t.Errorf("%s ready before the bound while unconfirmed: %s", l.d.cl.g.Name(), why)
		}
	}

	// A seed that never answers: not joined, until the bound.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	ap := start("ap", "ap-1", dead)
	testwait.For(t, 30*time.Second, "ap-1 to serve", func() bool { return serving(ap) })
	if why := ap.d.cl.unconfirmed(0); !strings.Contains(why, "not joined") {
		t.Errorf("unconfirmed with a dead seed = %q, want not joined", why)
	}
	if why := ap.d.cl.unconfirmed(10 * time.Second); why != "" {
		t.Errorf("unconfirmed at half the interval = %q, want ready anyway", why)
	}
}

// TestSeedlessNodeIsWarned: a node given no seeds logs one warning that
// says so; one given seeds logs none.
func TestSeedlessNodeIsWarned(t *testing.T) {
	for _, tc := range []struct {
		name string
		join []string
		warn bool
	}{
		{"no seeds", nil, true},
		{"seeds", []string{"127.0.0.1:7946"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf testlog.Buffer
			log := slog.New(slog.NewTextHandler(&buf, nil))
			g := GossipConfig{Node: "n1", Region: "eu", Listen: "127.0.0.1:0", Join: tc.join, Dev: true}
			if _, err := g.gossipConfig(log, prometheus.NewRegistry()); err != nil {
				t.Fatal(err)
			}
			if got := strings.Contains(buf.String(), "no --join seeds"); got != tc.warn {
				t.Errorf("warned %v, want %v; log: %s", got, tc.warn, buf.String())
			}
		})
	}
}
