package globalshare

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

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
