package coordinator

import (
	"math"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/coordinator/msg"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/share"
)

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
			rd := us.Step(n.now, msg.Message{Kind: msg.KindBorrow, From: "eu-1", Region: "eu", Borrow: req})
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

// TestCoreBorrowsAfterShift: traffic moves from eu to us mid-interval; us
// gets a loan within 1.5 s, eu cuts before us raises.
func TestCoreBorrowsAfterShift(t *testing.T) {
	sc := share.DefaultConfig()
	sc.Interval = 4 * time.Second
	sc.Recent = 400 * time.Millisecond
	sc.Settle = 400 * time.Millisecond
	sc.RaiseDelay = 200 * time.Millisecond
	n := newCoreNet(t, sc, "eu-1", "eu-2", "us-1", "ap-1")
	n.rate = map[string]float64{"eu-1": 45, "eu-2": 45, "us-1": 5, "ap-1": 5}
	n.run(n.now.Add(3*sc.Interval+time.Second), 50*time.Millisecond, nil)
	shift := n.now
	n.rate = map[string]float64{"us-1": 100}
	var got time.Time
	n.run(n.now.Add(1500*time.Millisecond), 50*time.Millisecond, func() {
		s := n.shares("eu-1", "eu-2", "us-1", "ap-1")
		if total := max(s[0], s[1]) + s[2] + s[3]; total > 1+3*share.MinShare+1e-12 {
			t.Fatalf("%v after the shift: Σ enforced shares = %v", n.now.Sub(shift), total)
		}
		if s[2] >= 0.5 && got.IsZero() {
			got = n.now
		}
	})
	if got.IsZero() {
		t.Fatalf("us got no loan within 1.5 s of the shift (us at %.3f)", n.shares("us-1")[0])
	}
}

// TestCoreAsksAtOnce: a region that starts rejecting asks for a loan at
// the core's next look (checkEvery), not at the next borrow tick, and the
// request says the shortage has only just begun (Burst).
func TestCoreAsksAtOnce(t *testing.T) {
	sc := share.DefaultConfig()
	sc.Interval = 4 * time.Second
	sc.Recent = 400 * time.Millisecond
	sc.Settle = 400 * time.Millisecond
	sc.RaiseDelay = 200 * time.Millisecond
	n := newCoreNet(t, sc, "eu-1", "us-1", "ap-1")
	for _, nd := range n.nodes {
		nd.core.cfg.Bucket = func(string) bool { return true }
	}
	n.rate = map[string]float64{"eu-1": 90, "us-1": 5, "ap-1": 5}
	n.run(n.now.Add(3*sc.Interval+time.Second), 10*time.Millisecond, nil)
	us := n.node("us-1").core
	if tick := us.cfg.BorrowTick; tick <= us.checkEvery() {
		t.Fatalf("BorrowTick %v is no longer than checkEvery %v: nothing to show", tick, us.checkEvery())
	}
	shift := n.now
	n.rate = map[string]float64{"eu-1": 90, "us-1": 100, "ap-1": 5}
	seen := len(n.log)
	var asked time.Time
	var req share.BorrowRequest
	n.run(n.now.Add(time.Second), 10*time.Millisecond, func() {
		if b, ok := n.firstBorrow(seen, "us"); ok && asked.IsZero() {
			asked, req = n.now, b
		}
		seen = len(n.log)
	})
	if asked.IsZero() {
		t.Fatal("us never asked for a loan")
	}
	if d := asked.Sub(shift); d > us.checkEvery()+20*time.Millisecond {
		t.Errorf("us asked %v after it started rejecting, want within %v", d, us.checkEvery()+20*time.Millisecond)
	}
	if !req.Burst {
		t.Errorf("the first request after a quiet spell is not marked Burst: %+v", req)
	}
	if !(req.Want > 0 && req.Want <= 1) {
		t.Errorf("Want = %v, want in (0, 1]", req.Want)
	}
}
