package globalshare

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/gossip"
	"github.com/sluice-rl/sluice/internal/testwait"
	"github.com/sluice-rl/sluice/share"
)

// countingGossip counts the borrow messages a coordinator hands to gossip,
// so a test can wait until every one has been delivered and handled.
type countingGossip struct {
	*gossip.Node
	mu    sync.Mutex
	reqs  int
	loans map[[2]string]int // (lender, borrower) → loans
}

func (g *countingGossip) SendBorrowRequest(ctx context.Context, r share.BorrowRequest) error {
	g.mu.Lock()
	g.reqs++
	g.mu.Unlock()
	return g.Node.SendBorrowRequest(ctx, r)
}

func (g *countingGossip) SendLoan(ctx context.Context, l share.Loan) error {
	g.mu.Lock()
	g.loans[[2]string{l.Lender, l.Borrower}]++
	g.mu.Unlock()
	return g.Node.SendLoan(ctx, l)
}

// TestBorrowAfterShift runs eu ×2, us and ap on real gossip and a fake
// clock. All traffic moves from eu to us in the middle of an interval: us
// gets a loan from eu within a second, long before the next rebalance;
// both eu nodes cut before us raises (Σ of the enforced shares never above
// 1 at any sampled instant, and the eu nodes always agree); when us's
// traffic stops, the next rebalance ends the loans: us falls to its
// allocation at once and eu is back at its allocation after the raise.
func TestBorrowAfterShift(t *testing.T) {
	ctx := context.Background()
	sc := share.DefaultConfig()
	sc.Interval = 4 * time.Second
	sc.Recent = 400 * time.Millisecond
	sc.Settle = 400 * time.Millisecond
	sc.RaiseDelay = 200 * time.Millisecond
	const collect = 150 * time.Millisecond
	t0 := sc.EpochStart(300_000).Add(100 * time.Millisecond)
	clk := &fakeClock{now: t0}
	tr := &traffic{}
	tr.set(map[string]float64{"eu-1": 45, "eu-2": 45, "us-1": 5, "ap-1": 5})
	eu1 := newDaemonCfg(t, ctx, clk, tr, sc, "eu-1", "eu")
	eu2 := newDaemonCfg(t, ctx, clk, tr, sc, "eu-2", "eu", eu1.node.Addr())
	us1 := newDaemonCfg(t, ctx, clk, tr, sc, "us-1", "us", eu1.node.Addr())
	ap1 := newDaemonCfg(t, ctx, clk, tr, sc, "ap-1", "ap", eu1.node.Addr())
	all := []*daemon{eu1, eu2, us1, ap1}
	nodes := map[string]int{"eu": 2, "us": 1, "ap": 1}
	testwait.For(t, 10*time.Second, "4 nodes in 3 regions", func() bool {
		for _, d := range all {
			if r := d.node.Regions(); len(r) != 3 || len(r["eu"]) != 2 {
				return false
			}
		}
		return true
	})

	// quiet holds once every coordinator waits on the clock and every
	// borrow message sent has been handled by each of its receivers, and
	// the epoch's node usage and reports have arrived when they are due.
	quiet := func() bool {
		if clk.numWaiters() < len(all) {
			return false
		}
		var enqReq, enqLoan, sentReq, sentLoan, wantReqIn, wantLoanIn, reqIn, loanIn int64
		for _, d := range all {
			enqReq += d.coord.reqSent.Load()
			enqLoan += d.coord.loansSent.Load()
			reqIn += d.coord.reqIn.Load()
			loanIn += d.coord.loansIn.Load()
			d.g.mu.Lock()
			sentReq += int64(d.g.reqs)
			wantReqIn += int64(d.g.reqs * (len(all) - nodes[d.region]))
			for lb, n := range d.g.loans {
				sentLoan += int64(n)
				wantLoanIn += int64(n * (nodes[lb[0]] - 1 + nodes[lb[1]]))
			}
			d.g.mu.Unlock()
		}
		if enqReq != sentReq || enqLoan != sentLoan || reqIn != wantReqIn || loanIn != wantLoanIn {
			return false
		}
		now := clk.Now()
		e := sc.Epoch(now) - 1
		since := now.Sub(sc.EpochStart(e + 1))
		if sc.EpochStart(e + 1).Before(t0) {
			return true // started within this interval: nothing due
		}
		if since >= 0 && since < collect && (!hasNodeUse(eu1.coord, e, "eu-2") || !hasNodeUse(eu2.coord, e, "eu-1")) {
			return false
		}
		if since >= collect && since < sc.Settle {
			for _, d := range all {
				for r := range nodes {
					if r != d.region && !hasReport(d.coord, e, r) {
						return false
					}
				}
			}
		}
		return true
	}
	const step = 50 * time.Millisecond
	first := sc.EpochStart(sc.Epoch(clk.Now()) + 1)
	shares := func() (eu, eu2s, us, ap float64) {
		return eu1.coord.Share(policy, "hot"), eu2.coord.Share(policy, "hot"), us1.coord.Share(policy, "hot"), ap1.coord.Share(policy, "hot")
	}
	// advance moves the clock to the given time in steps, checking the
	// invariants at every quiet instant, and calls each (if set) there.
	advance := func(to time.Time, each func(now time.Time) bool) {
		t.Helper()
		for clk.Now().Before(to) {
			testwait.For(t, 10*time.Second, "the cluster to be quiet", quiet)
			clk.advance(clk.Now().Add(step))
			testwait.For(t, 10*time.Second, "the cluster to be quiet", quiet)
			if clk.Now().Before(first) {
				continue // coordinators publish 1/n of the regions they saw at start until their first wake-up
			}
			eu, eu2s, us, ap := shares()
			if sum := max(eu, eu2s) + us + ap; sum > 1+3*share.MinShare+1e-12 { // a share lent to nothing is still MinShare
				t.Fatalf("%v: Σ enforced shares = %.6f > 1 (eu %.4f/%.4f us %.4f ap %.4f)", clk.Now().Sub(start(sc, clk)), sum, eu, eu2s, us, ap)
			}
			if math.Abs(eu-eu2s) > 1e-9 {
				t.Fatalf("%v: eu-1 enforces %.6f, eu-2 %.6f: one region, one share", clk.Now().Sub(start(sc, clk)), eu, eu2s)
			}
			if each != nil && each(clk.Now()) {
				return
			}
		}
	}

	// Warm up: shares follow the 90/5/5 split.
	b := first.Add(3 * sc.Interval)
	advance(b.Add(600*time.Millisecond), nil) // past b's rebalance and raise
	eu, _, us, ap := shares()
	t.Logf("before the shift: eu %.3f us %.3f ap %.3f", eu, us, ap)
	if eu < 0.7 || us > 0.2 {
		t.Fatalf("before the shift eu %.3f us %.3f, want eu ≥ 0.7, us ≤ 0.2", eu, us)
	}

	// All traffic moves to us, mid-interval.
	advance(b.Add(time.Second), nil)
	shift := clk.Now()
	tr.set(map[string]float64{"us-1": 100})
	var loanAt time.Time
	advance(b.Add(sc.Interval), func(now time.Time) bool {
		eu, _, us, _ := shares()
		if us >= 0.9 { // possibly in several loans: eu's first one is cut short by its traffic of the tick before
			loanAt = now
			t.Logf("%v after the shift: eu %.3f us %.3f", now.Sub(shift), eu, us)
			return true
		}
		return false
	})
	if loanAt.IsZero() || loanAt.Sub(shift) > 1500*time.Millisecond {
		t.Fatalf("us got no loan within 1.5 s of the shift (at %v)", loanAt.Sub(shift))
	}
	if eu, _, _, _ := shares(); eu > 0.1 {
		t.Errorf("after the loan eu enforces %.3f, want it cut", eu)
	}
	if us1.coord.loansIn.Load() == 0 || eu1.coord.loansSent.Load() == 0 || eu2.coord.loansSent.Load() != 0 {
		t.Errorf("loans: us-1 handled %d, eu-1 sent %d, eu-2 sent %d; want eu-1 (its region's acting node) alone to lend",
			us1.coord.loansIn.Load(), eu1.coord.loansSent.Load(), eu2.coord.loansSent.Load())
	}

	// us's traffic stops (eu's comes back) before the next boundary's
	// recent window: at the rebalance us is allocated a floor, and its
	// loans must not keep it above that.
	advance(b.Add(2500*time.Millisecond), nil)
	tr.set(map[string]float64{"eu-1": 45, "eu-2": 45})
	next := b.Add(sc.Interval)
	rebal := next.Add(sc.Settle)
	advance(rebal, nil)
	eu, _, us, _ = shares()
	alloc := us1.coord.RegionShares(policy, "hot")
	t.Logf("at the rebalance: eu %.3f us %.3f; allocation %v", eu, us, alloc)
	if math.Abs(us-alloc["us"]) > 1e-9 || us > 0.1 {
		t.Errorf("after the rebalance us enforces %.4f, want its allocation %.4f: loans expire", us, alloc["us"])
	}
	advance(rebal.Add(sc.RaiseDelay), nil)
	eu, eu2s, _, _ := shares()
	if alloc := eu1.coord.RegionShares(policy, "hot"); math.Abs(eu-alloc["eu"]) > 1e-9 || math.Abs(eu2s-alloc["eu"]) > 1e-9 {
		t.Errorf("after the raise eu enforces %.4f/%.4f, want its allocation %.4f: the lender's cut expires", eu, eu2s, alloc["eu"])
	}
}

func start(sc share.Config, clk *fakeClock) time.Time {
	return sc.EpochStart(sc.Epoch(clk.Now()))
}

// borrowConfig is a share config with a 4 s interval, so that a test has
// room inside one interval.
func borrowConfig() share.Config {
	sc := share.DefaultConfig()
	sc.Interval = 4 * time.Second
	sc.Recent = 400 * time.Millisecond
	sc.Settle = 400 * time.Millisecond
	sc.RaiseDelay = 200 * time.Millisecond
	return sc
}

// TestCoreBorrowsBeforeFirstRebalance: regions started together enforce
// 1/n until their first rebalance and borrow in the start generation
// (share.NewAllocator) meanwhile: eu, offered 0.6 of the limit, asks with
// that generation's epoch and holds more than 1/3 within a second, long
// before the first rebalance; Σ of the enforced shares never exceeds 1,
// across that rebalance too, which ends the loans (no loan is left in the
// new generation).
func TestCoreBorrowsBeforeFirstRebalance(t *testing.T) {
	sc := borrowConfig()
	n := newCoreNet(t, sc, "eu-1", "us-1", "ap-1")
	n.rate = map[string]float64{"eu-1": 60, "us-1": 5, "ap-1": 5}
	start := n.now
	first := sc.EpochStart(sc.Epoch(start) + 1).Add(sc.Settle) // first rebalance
	eu := n.node("eu-1").core
	var asked *share.BorrowRequest
	var lent time.Time
	seen := 0
	check := func() {
		if b, ok := n.firstBorrow(seen, "eu"); ok && asked == nil {
			asked = &b
		}
		seen = len(n.log)
		s := n.shares("eu-1", "us-1", "ap-1")
		if total := sum(s); total > 1+1e-9 {
			t.Fatalf("%v after the start: Σ enforced shares = %v (%v)", n.now.Sub(start), total, s)
		}
		if lent.IsZero() && s[0] > 0.5 {
			lent = n.now
		}
	}
	n.run(start.Add(time.Second), 10*time.Millisecond, check)
	if asked == nil {
		t.Fatal("eu did not ask before its first rebalance")
	}
	if want := sc.Epoch(start) - 1; asked.Epoch != want {
		t.Errorf("request of epoch %d, want the start generation %d", asked.Epoch, want)
	}
	if lent.IsZero() {
		t.Fatalf("eu enforces %v a second after the start, want more than 1/2 by then", eu.Share(policy, "hot"))
	}
	if !lent.Before(first) {
		t.Fatalf("eu's share rose at %v, not before the first rebalance at %v", lent, first)
	}
	// Right after the first rebalance (before any new loan could arrive)
	// the start generation's loans are gone.
	n.run(first.Add(10*time.Millisecond), 10*time.Millisecond, check)
	if !eu.balanced || eu.b.gen != sc.Epoch(start) {
		t.Fatalf("at %v: balanced %v, generation %d; want the first rebalance, of epoch %d", n.now, eu.balanced, eu.b.gen, sc.Epoch(start))
	}
	if got := eu.alloc.Loans(share.Key{Policy: policy, Subject: "hot"}); got != 0 {
		t.Errorf("the start generation's loan (%v) outlived the first rebalance", got)
	}
	n.run(first.Add(2*sc.RaiseDelay), 10*time.Millisecond, check)
}

// TestCoreStartGenerationOnly: before its first rebalance a region lends
// only in the start generation, and only while the 1/n it enforces is the
// allocator's (no restored shares): a request of another generation (a
// running cluster's) or to a region that restored saved shares gets no
// loan, and its share does not move.
func TestCoreStartGenerationOnly(t *testing.T) {
	sc := borrowConfig()
	key := share.Key{Policy: policy, Subject: "hot"}
	for _, tt := range []struct {
		name     string
		gen      func(start uint64) uint64
		restored bool
		lends    bool
	}{
		{"start generation", func(e uint64) uint64 { return e - 1 }, false, true},
		{"a rebalanced generation", func(e uint64) uint64 { return e }, false, false},
		{"restored shares", func(e uint64) uint64 { return e - 1 }, true, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n := newCoreNet(t, sc, "eu-1", "us-1")
			us := n.node("us-1").core
			if tt.restored {
				us.restored = map[share.Key]float64{key: 0.5}
			}
			n.rate = map[string]float64{"us-1": 10}
			n.run(n.now.Add(500*time.Millisecond), 10*time.Millisecond, nil)
			before := us.Share(policy, "hot")
			req := share.BorrowRequest{Version: share.RateVersion, Region: "eu", Epoch: tt.gen(sc.Epoch(n.now)), Key: key, Want: 0.3}
			rd := us.Step(n.now, gossip.Message{Kind: gossip.KindBorrow, From: "eu-1", Region: "eu", Borrow: req})
			if got := len(rd.Loans) > 0; got != tt.lends {
				t.Fatalf("Step(request of epoch %d) lent = %v, want %v (%+v)", req.Epoch, got, tt.lends, rd)
			}
			after := us.Share(policy, "hot")
			if tt.lends {
				if want := before - rd.Loans[0].Amount; math.Abs(after-want) > 1e-9 {
					t.Errorf("lender's share after the loan = %v, want %v", after, want)
				}
			} else if after != before {
				t.Errorf("share moved from %v to %v without a loan", before, after)
			}
		})
	}
}

// TestCoreAsksOnSurge: a key offered far more than its share refills asks
// for a loan at the core's next look even before the engine rejects it (its
// bucket still held tokens), and the request is marked as the onset of a
// shortage (Burst).
func TestCoreAsksOnSurge(t *testing.T) {
	sc := borrowConfig()
	n := newCoreNet(t, sc, "eu-1", "us-1", "ap-1")
	for _, nd := range n.nodes {
		nd.core.cfg.Bucket = func(string) bool { return true }
	}
	n.rate = map[string]float64{"eu-1": 90, "us-1": 5, "ap-1": 5}
	n.run(n.now.Add(3*sc.Interval+time.Second), 10*time.Millisecond, nil)
	us := n.node("us-1")
	// us runs well under its share (nothing rejected since long), then its
	// traffic surges right after a borrow tick, so that only a look can
	// ask before the next one.
	delete(n.rate, "us-1") // us-1's usage is scripted from here on
	uk := engine.UsageKey{Subject: "hot", Policy: policy}
	quiet := func(until time.Time) {
		for n.now.Before(until) {
			n.run(n.now.Add(10*time.Millisecond), 10*time.Millisecond, nil)
			if n.now.Sub(sc.EpochStart(0))%(250*time.Millisecond) == 0 { // 4 units/s
				n.send(us, us.core.Tick(n.now, map[engine.UsageKey]engine.Usage{uk: {Demand: 1, Admitted: 1}}, nil))
			}
		}
	}
	quiet(n.now.Add(2 * us.core.quiet()))
	for us.core.b.nextTick.Sub(n.now) < us.core.cfg.BorrowTick-10*time.Millisecond {
		quiet(n.now.Add(10 * time.Millisecond))
	}
	surge := n.now
	var asked time.Time
	var req share.BorrowRequest
	within := us.core.checkEvery() + 20*time.Millisecond
	if within >= us.core.cfg.BorrowTick {
		t.Fatalf("BorrowTick %v is no longer than a look (%v): nothing to show", us.core.cfg.BorrowTick, within)
	}
	seen := len(n.log)
	for n.now.Before(surge.Add(within)) {
		n.run(n.now.Add(10*time.Millisecond), 10*time.Millisecond, nil)
		// 300 units/s, every one admitted: no rejection yet.
		n.send(us, us.core.Tick(n.now, map[engine.UsageKey]engine.Usage{uk: {Demand: 3, Admitted: 3}}, nil))
		if b, ok := n.firstBorrow(seen, "us"); ok && asked.IsZero() {
			asked, req = n.now, b
		}
		seen = len(n.log)
	}
	if asked.IsZero() {
		t.Fatalf("us, offered 300/s on a share of %v, did not ask within %v", us.core.Share(policy, "hot"), within)
	}
	if !req.Burst {
		t.Errorf("the request at a surge is not marked Burst: %+v", req)
	}
	if !(req.Want > 0 && req.Want <= 1) {
		t.Errorf("Want = %v, want in (0, 1]", req.Want)
	}
}
