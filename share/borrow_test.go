package share

import (
	"math"
	"testing"
	"time"
)

func TestNeedLoanAndLendAmount(t *testing.T) {
	cfg := DefaultConfig()
	tests := []struct {
		name                       string
		share, limit, rate, tokens float64
		want                       float64
	}{
		{"under its share", 0.5, 1000, 400, 0, 0},
		{"empties within the horizon", 0.1, 1000, 600, 100, 0.5},
		{"enough tokens for the horizon", 0.1, 1000, 600, 600, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := NeedLoan(tt.share, tt.limit, tt.rate, tt.tokens, cfg.BorrowHorizon); math.Abs(got-tt.want) > 1e-12 {
				t.Errorf("NeedLoan = %v, want %v", got, tt.want)
			}
		})
	}
	// The lender keeps CapFactor × its own rate.
	if got := LendAmount(cfg, 0.8, 1000, 100, 1); math.Abs(got-0.68) > 1e-12 {
		t.Errorf("LendAmount = %v, want 0.68", got)
	}
	if got := LendAmount(cfg, 0.8, 1000, 100, 0.3); got != 0.3 {
		t.Errorf("LendAmount capped by want = %v, want 0.3", got)
	}
	if got := LendAmount(cfg, 0.1, 1000, 200, 1); got != 0 {
		t.Errorf("LendAmount without slack = %v, want 0", got)
	}
}

// A loan moves share from the lender (cut before the Loan exists) to the
// borrower; Σ enforced never exceeds 1, and loans expire at the next
// rebalance without a raise before RaiseDelay.
func TestBorrowingKeepsSumAndExpires(t *testing.T) {
	c := newCluster(t, 3)
	offered := map[string]float64{"r0": 1800, "r1": 10, "r2": 10}
	for range 4 {
		c.step(offered)
	}
	now := c.cfg.EpochStart(c.epoch).Add(c.cfg.Settle + 2*c.cfg.RaiseDelay)
	b, l := c.allocs["r1"], c.allocs["r0"]
	before := c.enforced(now, c.key)
	// Traffic moved to r1: its bucket is empty, r0 is idle.
	req, ok := b.Borrow(now, c.key, c.limit, 1800, 0)
	if !ok {
		t.Fatal("Borrow: no request with an empty bucket")
	}
	if _, again := b.Borrow(now.Add(time.Second/2), c.key, c.limit, 1800, 0); again {
		t.Error("Borrow asked twice within BorrowEvery")
	}
	loan, ok := l.Lend(now, req, c.limit, Use{})
	if !ok {
		t.Fatal("Lend: idle lender did not lend")
	}
	// Lender has cut; the loan is in flight: under-serves, never over.
	if got := c.enforced(now, c.key); got > before+1e-12 || got >= before-loan.Amount+1e-9 {
		t.Errorf("Σ with loan in flight = %v, want %v", got, before-loan.Amount)
	}
	if !b.Accept(now, loan) {
		t.Fatal("Accept refused a loan of the current generation")
	}
	if got := c.enforced(now, c.key); math.Abs(got-before) > 1e-9 {
		t.Errorf("Σ after the loan = %v, want %v", got, before)
	}
	if b.Accept(now, loan) && c.enforced(now, c.key) > 1+1e-9 {
		t.Error("a duplicated loan pushed Σ above 1")
	}
	// Next epoch: loans expire; Σ ≤ 1 at every moment of the transition.
	c.step(map[string]float64{"r0": 0, "r1": 1800, "r2": 10})
	start := c.cfg.EpochStart(c.epoch).Add(c.cfg.Settle)
	for d := time.Duration(0); d < 3*c.cfg.RaiseDelay; d += 100 * time.Millisecond {
		if got := c.enforced(start.Add(d), c.key); got > 1+1e-9 {
			t.Errorf("Σ at +%v after the rebalance = %v, want ≤ 1", d, got)
		}
	}
	if got := b.Loans(c.key); got != 0 {
		t.Errorf("borrower's loan after the rebalance = %v, want 0", got)
	}
	// A loan of the old generation is dropped.
	if b.Accept(start, loan) {
		t.Error("Accept took a loan of an older generation")
	}
}

func TestLendKeepsPendingUntilSlack(t *testing.T) {
	c := newCluster(t, 2)
	for range 4 {
		c.step(map[string]float64{"r0": 1800, "r1": 10})
	}
	now := c.cfg.EpochStart(c.epoch).Add(c.cfg.Settle + 2*c.cfg.RaiseDelay)
	req, ok := c.allocs["r1"].Borrow(now, c.key, c.limit, 1800, 0)
	if !ok {
		t.Fatal("no request")
	}
	l := c.allocs["r0"]
	if _, ok := l.Lend(now, req, c.limit, Use{Rate: 1800}); ok {
		t.Fatal("a busy lender lent")
	}
	if l.Pending() != 1 {
		t.Fatalf("Pending = %d, want 1", l.Pending())
	}
	loans := l.ServeLoans(now.Add(300*time.Millisecond), func(Key) (float64, Use) { return c.limit, Use{} })
	if len(loans) != 1 || loans[0].Amount <= 0 {
		t.Fatalf("ServeLoans once idle = %v, want one loan", loans)
	}
	if l.Pending() != 0 {
		t.Errorf("Pending after serving = %d, want 0", l.Pending())
	}
}

func TestSetDeadReclaimsAndIsolates(t *testing.T) {
	c := newCluster(t, 5)
	offered := map[string]float64{"r0": 600, "r1": 600, "r2": 600, "r3": 600, "r4": 600}
	for range 3 {
		c.step(offered)
	}
	now := c.cfg.EpochStart(c.epoch).Add(c.cfg.Settle + 2*c.cfg.RaiseDelay)
	// Membership: r4 is cut off. The majority reclaims at once (raises
	// after RaiseDelay), r4 falls back at once.
	for _, name := range c.names[:4] {
		c.allocs[name].SetDead(now, []string{"r4"})
	}
	c.allocs["r4"].SetDead(now, []string{"r0", "r1", "r2", "r3"})
	if !c.allocs["r4"].Isolated() {
		t.Error("r4 sees four of five dead but is not isolated")
	}
	safe := c.cfg.safe(5)
	if got := c.allocs["r4"].Table(now).Share(c.key.Policy, c.key.Subject); got > safe+1e-12 {
		t.Errorf("isolated share = %v, want ≤ %v at once", got, safe)
	}
	if got := c.enforced(now, c.key); got > 1+1e-9 {
		t.Errorf("Σ right after SetDead = %v, want ≤ 1", got)
	}
	later := now.Add(c.cfg.RaiseDelay)
	if got := c.enforced(later, c.key); math.Abs(got-1) > 1e-9 {
		t.Errorf("Σ after the raise = %v, want 1 (r4's share reclaimed)", got)
	}
	// Reports keep flowing on the majority side; r4 stays reclaimed.
	c.deliver = func(from, to string) bool { return (from == "r4") == (to == "r4") }
	for range 2 {
		c.step(offered)
		if got := c.enforced(c.cfg.EpochStart(c.epoch).Add(c.cfg.Settle+c.cfg.RaiseDelay), c.key); got > 1+1e-9 {
			t.Errorf("epoch %d: Σ = %v, want ≤ 1", c.epoch, got)
		}
	}
	// Heal: membership alive again, reports back; Σ = 1 with r4 included.
	c.deliver = nil
	for _, name := range c.names {
		c.allocs[name].SetDead(now, nil)
	}
	c.step(offered)
	c.step(offered)
	at := c.cfg.EpochStart(c.epoch).Add(c.cfg.Settle + c.cfg.RaiseDelay)
	if got := c.enforced(at, c.key); math.Abs(got-1) > 1e-9 {
		t.Errorf("Σ after healing = %v, want 1", got)
	}
	if got := c.allocs["r4"].Table(at).Share(c.key.Policy, c.key.Subject); got < 0.15 {
		t.Errorf("r4's share after healing = %v, want ≈ 0.2", got)
	}
}

// evenLenders is three regions offered 100/s each for three intervals, at
// an instant after the raises of the last: r1 to borrow, r0 to lend.
func evenLenders(t *testing.T) (c *cluster, now time.Time, borrower, lender *Allocator) {
	t.Helper()
	c = newCluster(t, 3)
	for range 3 {
		c.step(map[string]float64{"r0": 100, "r1": 100, "r2": 100})
	}
	now = c.cfg.EpochStart(c.epoch).Add(c.cfg.Settle + 2*c.cfg.RaiseDelay)
	return c, now, c.allocs["r1"], c.allocs["r0"]
}

// emptyBucketBorrow is b's request for c's key with its bucket empty.
func emptyBucketBorrow(t *testing.T, c *cluster, now time.Time, b *Allocator) BorrowRequest {
	t.Helper()
	req, ok := b.Borrow(now, c.key, c.limit, 3000, 0)
	if !ok {
		t.Fatal("Borrow: no request with an empty bucket")
	}
	return req
}

// A request marked Burst gets, with the loan, the tokens the lender's cut
// takes out of its bucket; the borrower spends them as an extra share over
// BurstSpread, and they end there or at the next rebalance, where they do
// not count as the level a raise starts from. A request not so marked, or
// a lender whose bucket estimate is not trusted, moves rate only.
func TestLoanHandsOverTokens(t *testing.T) {
	tests := []struct {
		name       string
		burst      bool
		use        Use
		wantTokens func(amount float64) float64
	}{
		{"onset, lender full", true, Use{Rate: 50, Tokens: 1000}, func(amt float64) float64 { return amt }},
		{"onset, lender half full", true, Use{Rate: 50, Tokens: 200}, func(amt float64) float64 { return max(0, 0.2-(1.0/3-amt)) }},
		{"onset, lender without traffic", true, Use{Rate: 0, Tokens: 333}, func(float64) float64 { return 0 }},
		{"onset, lender estimate untrusted", true, Use{Rate: 50}, func(float64) float64 { return 0 }},
		{"long shortage", false, Use{Rate: 50, Tokens: 333}, func(float64) float64 { return 0 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, now, b, l := evenLenders(t)
			before := b.Table(now).Share(c.key.Policy, c.key.Subject)
			req := emptyBucketBorrow(t, c, now, b)
			if req.Want > 1-before {
				t.Errorf("Want = %v, more than lifts the share to the whole limit", req.Want)
			}
			req.Burst = tt.burst
			loan, ok := l.Lend(now, req, c.limit, tt.use)
			if !ok {
				t.Fatal("Lend: a lender with slack did not lend")
			}
			if want := tt.wantTokens(loan.Amount); math.Abs(loan.Tokens-want) > 1e-9 {
				t.Fatalf("Tokens = %v, want %v (amount %v)", loan.Tokens, want, loan.Amount)
			}
			if !b.Accept(now, loan) {
				t.Fatal("Accept refused the loan")
			}
			after := b.Table(now).Share(c.key.Policy, c.key.Subject)
			extra := after - before - loan.Amount
			if math.Abs(extra*c.cfg.BurstSpread.Seconds()-loan.Tokens) > 1e-9 && after < 1 {
				t.Errorf("extra share %v over %v, want the loan's %v tokens", extra, c.cfg.BurstSpread, loan.Tokens)
			}
			spent := now.Add(c.cfg.Interval / 2)
			if got := b.Table(spent).Share(c.key.Policy, c.key.Subject); math.Abs(got-before-loan.Amount) > 1e-9 {
				t.Errorf("after the tokens are spent the share is %v, want %v", got, before+loan.Amount)
			}
			if !b.BurstsUntil().IsZero() {
				t.Errorf("BurstsUntil = %v after the burst ended, want zero", b.BurstsUntil())
			}
		})
	}
}

// Tokens do not outlive their generation, and a raise does not start from
// the extra share they gave.
func TestTokensEndAtTheRebalance(t *testing.T) {
	c := newCluster(t, 3)
	for range 3 {
		c.step(map[string]float64{"r0": 100, "r1": 100, "r2": 100})
	}
	now := c.cfg.EpochStart(c.epoch + 1).Add(-200 * time.Millisecond)
	b, l := c.allocs["r1"], c.allocs["r0"]
	req, _ := b.Borrow(now, c.key, c.limit, 3000, 0)
	req.Burst = true
	loan, ok := l.Lend(now, req, c.limit, Use{Rate: 50, Tokens: 333})
	if !ok || loan.Tokens == 0 || !b.Accept(now, loan) {
		t.Fatalf("no loan with tokens: %+v", loan)
	}
	c.step(map[string]float64{"r0": 100, "r1": 3000, "r2": 100})
	at := c.cfg.EpochStart(c.epoch).Add(c.cfg.Settle)
	if !b.BurstsUntil().IsZero() {
		t.Errorf("tokens outlived the rebalance (until %v)", b.BurstsUntil())
	}
	for d := time.Duration(0); d < 2*c.cfg.RaiseDelay; d += 50 * time.Millisecond {
		if got := c.enforced(at.Add(d), c.key); got > 1+1e-9 {
			t.Errorf("Σ at +%v after the rebalance = %v, want ≤ 1", d, got)
		}
	}
}

// A lender whose quarter-second rate is within counting noise of its
// smoothed demand keeps an upper bound of that demand, not CapFactor times
// the noisy count; a rate beyond the noise, or one counted over an unknown
// span, is taken as it is (CapFactor × rate); and a lender never keeps more
// than CapFactor × its rate, so one whose traffic is leaving lends as much
// as LendAmount says.
func TestLenderKeepsItsDemand(t *testing.T) {
	const span = 250 * time.Millisecond
	c := newCluster(t, 3) // for its settings
	ts := c.cfg.Interval.Seconds()
	demandKeep := (100 + lendKeepZ*math.Sqrt(100*ts)/ts) / c.limit
	tests := []struct {
		name string
		use  Use
		keep float64 // fraction of L the lender keeps
	}{
		{"noisy count above the demand", Use{Rate: 130, Span: span}, demandKeep},
		{"noisy count at the demand", Use{Rate: 100, Span: span}, demandKeep},
		{"count below the demand", Use{Rate: 70, Span: span}, c.cfg.CapFactor * 70 / c.limit},
		{"a real fall", Use{Rate: 20, Span: span}, c.cfg.CapFactor * 20 / c.limit},
		{"a real rise", Use{Rate: 200, Span: span}, c.cfg.CapFactor * 200 / c.limit},
		{"no span", Use{Rate: 130}, c.cfg.CapFactor * 130 / c.limit},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, now, b, l := evenLenders(t)
			s := l.Table(now).Share(c.key.Policy, c.key.Subject)
			req := emptyBucketBorrow(t, c, now, b)
			loan, ok := l.Lend(now, req, c.limit, tt.use)
			want := min(req.Want, s-tt.keep)
			if want < req.Want && want < s/2 {
				// Less than half its share: the request waits for more.
				if ok {
					t.Fatalf("Lend(%+v) lent %v at once, want the request kept pending (keeps %v of %v)", tt.use, loan.Amount, tt.keep, s)
				}
				return
			}
			if !ok {
				t.Fatal("Lend: a lender with slack did not lend")
			}
			if math.Abs(loan.Amount-want) > 1e-9 {
				t.Errorf("Lend(%+v).Amount = %v, want %v (keeps %v of %v)", tt.use, loan.Amount, want, tt.keep, s)
			}
			if got := l.Table(now).Share(c.key.Policy, c.key.Subject); math.Abs(got-(s-loan.Amount)) > 1e-9 {
				t.Errorf("lender's share after the loan = %v, want %v", got, s-loan.Amount)
			}
		})
	}
}

// Before its first Rebalance an allocator is in the start generation, the
// epoch before the one it was created in: allocators created together lend
// to each other in it (Overlay shows the loan), their first Rebalance ends
// it, and a request of the start generation is not served after it.
func TestStartGeneration(t *testing.T) {
	c := newCluster(t, 3)
	b, l := c.allocs["r1"], c.allocs["r0"]
	if got := l.Generation(); got != c.epoch-1 {
		t.Fatalf("Generation() before the first rebalance = %d, want %d", got, c.epoch-1)
	}
	now := c.cfg.EpochStart(c.epoch).Add(3 * time.Second)
	req, ok := b.Borrow(now, c.key, c.limit, 900, 0)
	if !ok || req.Epoch != c.epoch-1 {
		t.Fatalf("Borrow in the start generation = %+v, %v; want a request of epoch %d", req, ok, c.epoch-1)
	}
	loan, ok := l.Lend(now, req, c.limit, Use{Rate: 100})
	if !ok || !b.Accept(now, loan) {
		t.Fatalf("no loan in the start generation: %+v", loan)
	}
	if got := b.Overlay(now)[c.key]; math.Abs(got-loan.Amount) > 1e-12 {
		t.Errorf("borrower's Overlay = %v, want %v", got, loan.Amount)
	}
	if got := l.Overlay(now)[c.key]; math.Abs(got+loan.Amount) > 1e-12 {
		t.Errorf("lender's Overlay = %v, want %v", got, -loan.Amount)
	}
	if got := c.enforced(now, c.key); got > 1+1e-9 {
		t.Errorf("Σ enforced with the loan = %v, want ≤ 1", got)
	}
	c.step(map[string]float64{"r0": 100, "r1": 900, "r2": 100})
	after := c.cfg.EpochStart(c.epoch).Add(c.cfg.Settle + 2*c.cfg.RaiseDelay)
	if l.Generation() != c.epoch || len(b.Overlay(after)) != 0 || len(l.Overlay(after)) != 0 {
		t.Errorf("after the first rebalance: generation %d (want %d), overlays %v and %v (want none)",
			l.Generation(), c.epoch, b.Overlay(after), l.Overlay(after))
	}
	if _, ok := l.Lend(after, req, c.limit, Use{Rate: 100}); ok {
		t.Error("a request of the start generation was served after the first rebalance")
	}
}
