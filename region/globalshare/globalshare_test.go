package globalshare

import (
	"context"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/gossip"
	"github.com/sluice-rl/sluice/internal/testwait"
	"github.com/sluice-rl/sluice/share"
)

// fakeClock fires timers only when the test advances it.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []waiter
}

type waiter struct {
	at time.Time
	ch chan time.Time
}

func (f *fakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeClock) After(d time.Duration) <-chan time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- f.now
		return ch
	}
	f.waiters = append(f.waiters, waiter{f.now.Add(d), ch})
	return ch
}

func (f *fakeClock) advance(to time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = to
	keep := f.waiters[:0]
	for _, w := range f.waiters {
		if !w.at.After(to) {
			w.ch <- to
		} else {
			keep = append(keep, w)
		}
	}
	f.waiters = keep
}

func (f *fakeClock) numWaiters() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.waiters)
}

const (
	policy = "global-api"
	limit  = 100.0 // L_global, units/s
)

// traffic is each node's offered rate for the test key, in units/s.
type traffic struct {
	mu   sync.Mutex
	rate map[string]float64 // node → rate
}

func (tr *traffic) set(m map[string]float64) {
	tr.mu.Lock()
	tr.rate = m
	tr.mu.Unlock()
}

type daemon struct {
	node      *gossip.Node
	g         *countingGossip
	coord     *Coordinator
	region    string
	stop      context.CancelFunc
	done      chan struct{}
	stopCoord context.CancelFunc // stops the coordinator only
	coordDone chan struct{}
}

func testShareConfig() share.Config {
	sc := share.DefaultConfig()
	sc.Interval = time.Second
	sc.Recent = 200 * time.Millisecond
	sc.Settle = 400 * time.Millisecond
	sc.RaiseDelay = 200 * time.Millisecond
	return sc
}

// newDaemon starts a real gossip node and a coordinator on the fake clock,
// whose usage is drawn from tr: demand = rate·dt, admitted = what the
// region's share allows, split across its nodes by rate.
func newDaemon(t *testing.T, ctx context.Context, clk *fakeClock, tr *traffic, name, region string, join ...string) *daemon {
	t.Helper()
	return newDaemonCfg(t, ctx, clk, tr, testShareConfig(), name, region, join...)
}

func newDaemonCfg(t *testing.T, ctx context.Context, clk *fakeClock, tr *traffic, sc share.Config, name, region string, join ...string) *daemon {
	t.Helper()
	n, err := gossip.New(gossip.Config{Node: name, Region: region, BindAddr: "127.0.0.1", Dev: true,
		Preset: gossip.PresetLocal, Join: join, LeaveTimeout: 300 * time.Millisecond, Interval: sc.Interval, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	d := &daemon{node: n, region: region}
	last := clk.Now()
	usage := func() map[engine.UsageKey]engine.Usage {
		now := clk.Now()
		dt := now.Sub(last).Seconds()
		last = now
		tr.mu.Lock()
		rate, regional := tr.rate[name], 0.0
		for node, r := range tr.rate {
			if regionOf(node) == region {
				regional += r
			}
		}
		tr.mu.Unlock()
		if rate == 0 {
			return map[engine.UsageKey]engine.Usage{{Subject: "idle", Policy: policy}: {Demand: 1, Admitted: 1}}
		}
		allowed := d.coord.Share(policy, "hot") * limit * dt * rate / regional
		demand := rate * dt
		return map[engine.UsageKey]engine.Usage{
			{Subject: "hot", Policy: policy}:     {Demand: int64(demand), Admitted: int64(min(demand, allowed))},
			{Subject: "hot", Policy: "local-rl"}: {Demand: 1000, Admitted: 1000}, // not global: ignored
		}
	}
	lookup := func(p string) (float64, bool) { return limit, p == policy }
	d.g = &countingGossip{Node: n, loans: map[[2]string]int{}}
	// The pings that time contact run in real time while this clock jumps,
	// so their times would look stale: the contact rule is tested on
	// scripted times (core_test.go), and here regions are lost through
	// missing reports only.
	d.coord, err = New(Config{Share: sc, Gossip: d.g, Usage: usage, Limit: lookup, Clock: clk,
		Collect: 150 * time.Millisecond, Silence: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	gctx, stop := context.WithCancel(ctx)
	d.stop = stop
	d.done = make(chan struct{})
	cctx, stopCoord := context.WithCancel(gctx)
	d.stopCoord, d.coordDone = stopCoord, make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { _ = n.Run(gctx) })
	wg.Go(func() { defer close(d.coordDone); _ = d.coord.Run(cctx) })
	go func() { wg.Wait(); close(d.done) }()
	t.Cleanup(func() { stop(); <-d.done })
	return d
}

func regionOf(node string) string { return node[:2] }

// TestSharesFollowTraffic runs four daemons (eu ×2, us, ap) on real gossip
// and a fake clock: one key offered 2·L_global split 70/20/10; the shares
// move toward the traffic and sum to 1; then all traffic moves to us; then
// ap stops reporting and the others reclaim its share.
func TestSharesFollowTraffic(t *testing.T) {
	ctx := context.Background()
	sc := testShareConfig()
	clk := &fakeClock{now: sc.EpochStart(1_000_000).Add(100 * time.Millisecond)}
	tr := &traffic{}
	tr.set(map[string]float64{"eu-1": 70, "eu-2": 70, "us-1": 40, "ap-1": 20})
	eu1 := newDaemon(t, ctx, clk, tr, "eu-1", "eu")
	eu2 := newDaemon(t, ctx, clk, tr, "eu-2", "eu", eu1.node.Addr())
	us1 := newDaemon(t, ctx, clk, tr, "us-1", "us", eu1.node.Addr())
	ap1 := newDaemon(t, ctx, clk, tr, "ap-1", "ap", eu1.node.Addr())
	all := []*daemon{eu1, eu2, us1, ap1}
	testwait.For(t, 10*time.Second, "4 nodes in 3 regions", func() bool {
		for _, d := range all {
			r := d.node.Regions()
			if len(r) != 3 || len(r["eu"]) != 2 {
				return false
			}
		}
		return true
	})

	running := slices.Clone(all)
	first := true
	// epoch drives one interval through every step of every running
	// coordinator, waiting for gossip to deliver between steps.
	epoch := func() uint64 {
		t.Helper()
		boundary := sc.EpochStart(sc.Epoch(clk.Now()) + 1)
		e := sc.Epoch(boundary) - 1
		step := func(to time.Time) {
			t.Helper()
			testwait.For(t, 5*time.Second, "coordinators to wait on the clock", func() bool { return clk.numWaiters() >= len(running) })
			clk.advance(to)
		}
		step(boundary.Add(-sc.Recent))
		if first {
			first = false
			testwait.For(t, 5*time.Second, "the first wake-up", func() bool { return clk.numWaiters() >= len(running) })
			for _, d := range running {
				if got := d.coord.Share(policy, "hot"); math.Abs(got-1.0/3) > 1e-9 {
					t.Errorf("%s: Share before any rebalance = %v, want 1/3 of the live regions", d.node.Name(), got)
				}
			}
		}
		step(boundary)
		testwait.For(t, 5*time.Second, "eu node usage exchanged", func() bool {
			return hasNodeUse(eu1.coord, e, "eu-2") && hasNodeUse(eu2.coord, e, "eu-1")
		})
		step(boundary.Add(150 * time.Millisecond))
		testwait.For(t, 5*time.Second, "reports delivered", func() bool {
			for _, d := range running {
				for _, o := range running {
					if o.region != d.region && !hasReport(d.coord, e, o.region) {
						if testing.Verbose() {
							t.Logf("%s lacks %s's report of epoch %d", d.node.Name(), o.region, e)
						}
						return false
					}
				}
			}
			return true
		})
		step(boundary.Add(sc.Settle))
		step(boundary.Add(sc.Settle + sc.RaiseDelay))
		testwait.For(t, 5*time.Second, "tables published", func() bool {
			for _, d := range running {
				if d.coord.raised() != e {
					return false
				}
			}
			return true
		})
		return e
	}
	shares := func() (eu, us, ap float64) {
		return eu1.coord.Share(policy, "hot"), us1.coord.Share(policy, "hot"), ap1.coord.Share(policy, "hot")
	}

	for i := range 6 {
		epoch()
		eu, us, ap := shares()
		t.Logf("epoch %d: eu %.3f us %.3f ap %.3f Σ %.4f", i, eu, us, ap, eu+us+ap)
		if sum := eu + us + ap; sum > 1+1e-9 {
			t.Errorf("epoch %d: Σ shares = %v > 1", i, sum)
		}
		if e2 := eu2.coord.Share(policy, "hot"); e2 != eu {
			t.Errorf("epoch %d: eu-2 enforces %v, eu-1 %v: one region, one share", i, e2, eu)
		}
	}
	eu, us, ap := shares()
	if math.Abs(eu+us+ap-1) > 1e-6 {
		t.Errorf("Σ shares = %v, want 1", eu+us+ap)
	}
	for _, c := range []struct {
		region    string
		got, want float64
	}{{"eu", eu, 0.7}, {"us", us, 0.2}, {"ap", ap, 0.1}} {
		if math.Abs(c.got-c.want) > 0.05 {
			t.Errorf("share of %s = %.3f, want %.2f ± 0.05", c.region, c.got, c.want)
		}
	}
	if got := eu1.coord.Share(policy, "idle"); math.Abs(got-1.0/3) > 1e-9 {
		t.Errorf("Share of an unreported key = %v, want 1/3", got)
	}
	rs := us1.coord.RegionShares(policy, "hot")
	if math.Abs(rs["eu"]-eu) > 1e-9 || math.Abs(rs["ap"]-ap) > 1e-9 {
		t.Errorf("us-1's RegionShares = %v, want eu %v ap %v", rs, eu, ap)
	}
	st := us1.coord.Status()
	if len(st.Regions) != 3 || st.Regions[1].Region != "eu" || st.Regions[1].LastReportKeys != 1 || len(st.Regions[1].Nodes) != 2 {
		t.Errorf("Status() = %+v", st)
	}

	// All traffic moves to us.
	tr.set(map[string]float64{"us-1": 200})
	for i := range 4 {
		epoch()
		eu, us, ap := shares()
		t.Logf("shift epoch %d: eu %.3f us %.3f ap %.3f Σ %.4f", i, eu, us, ap, eu+us+ap)
		if sum := eu + us + ap; sum > 1+1e-9 {
			t.Errorf("shift epoch %d: Σ shares = %v > 1", i, sum)
		}
	}
	if _, us, _ = shares(); us < 0.9 {
		t.Errorf("after the shift us holds %.3f, want ≥ 0.9", us)
	}

	// ap stops reporting (its coordinator stops; its node stays a member):
	// after K+1 epochs eu and us reclaim all but the safe reserve.
	tr.set(map[string]float64{"eu-1": 100, "us-1": 100, "ap-1": 100})
	ap1.stopCoord()
	<-ap1.coordDone
	running = []*daemon{eu1, eu2, us1}
	// share damps moves it cannot tell from counting noise (7c5bdba), so
	// eu and us close their gap by about a quarter per epoch: K+5 epochs.
	for i := range sc.PartitionIntervals + 5 {
		epoch()
		eu, us, _ := shares()
		t.Logf("ap silent epoch %d: eu %.3f us %.3f; views eu-1 %v us-1 %v", i, eu, us, eu1.coord.RegionShares(policy, "hot"), us1.coord.RegionShares(policy, "hot"))
	}
	eu, us, _ = shares()
	apView := us1.coord.RegionShares(policy, "hot")["ap"]
	if eu+us < 0.98 || math.Abs(eu+us+apView-1) > 1e-6 {
		t.Errorf("with ap silent eu+us = %.4f (ap reserved %.4f), want ≥ 0.98 and Σ = 1", eu+us, apView)
	}
	if math.Abs(eu-us) > 0.02 {
		t.Errorf("with equal traffic eu %.3f and us %.3f differ", eu, us)
	}
}

func hasNodeUse(c *Coordinator, e uint64, node string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, nodes := c.core.Filed(e)
	return slices.Contains(nodes, node)
}

func hasReport(c *Coordinator, e uint64, region string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	reports, _ := c.core.Filed(e)
	return slices.Contains(reports, region)
}

type memStore struct {
	mu    sync.Mutex
	saved map[string]Saved
	saves int
}

func (m *memStore) LoadShares(_ context.Context, region string) (Saved, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.saved[region], nil
}

func (m *memStore) SaveShares(_ context.Context, s Saved) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.saved[s.Region] = s
	m.saves++
	return nil
}

// TestSavedSharesRestored: a coordinator starting with recent saved shares
// enforces them (other keys at 1/n) until its first rebalance, ignores saved
// shares older than PartitionIntervals epochs, and saves after each raise.
func TestSavedSharesRestored(t *testing.T) {
	sc := testShareConfig()
	for _, tt := range []struct {
		name string
		age  uint64 // epochs
		want float64
	}{
		{"recent", 1, 0.8},
		{"too old", uint64(sc.PartitionIntervals) + 1, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n, err := gossip.New(gossip.Config{Node: "eu1", Region: "eu", BindAddr: "127.0.0.1", Dev: true, Preset: gossip.PresetLocal})
			if err != nil {
				t.Fatal(err)
			}
			st := &memStore{saved: map[string]Saved{"eu": {Region: "eu", Epoch: sc.Epoch(time.Now()) - tt.age,
				Shares: []SavedShare{{Key: share.Key{Policy: policy, Subject: "hot"}, Share: 0.8}}}}}
			c, err := New(Config{Share: sc, Gossip: n, Store: st,
				Usage: func() map[engine.UsageKey]engine.Usage { return nil },
				Limit: func(string) (float64, bool) { return limit, true }})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			wg.Go(func() { _ = n.Run(ctx) })
			wg.Go(func() { _ = c.Run(ctx) })
			defer func() { cancel(); wg.Wait() }()
			testwait.For(t, 2*time.Second, "the saved shares to be restored", func() bool {
				return c.Share(policy, "hot") == tt.want && c.Share(policy, "cold") == 1
			})
			testwait.For(t, 4*time.Second, "a save after a raise", func() bool {
				st.mu.Lock()
				defer st.mu.Unlock()
				return st.saves > 0 && st.saved["eu"].Epoch >= sc.Epoch(time.Now())-2
			})
		})
	}
}
