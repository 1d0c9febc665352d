package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/engine/storetest"
	"github.com/sluice-rl/sluice/internal/manualclock"
)

// partnerLimit is a key with a high limit: 50 000/s, a tenth of a second
// of burst.
var partnerLimit = engine.Limit{Algorithm: engine.TokenBucket, Rate: 50_000, Burst: 5_000}

// testLeaseBound is what the leases of partnerLimit promise: slices of at
// most a LeasePeriod of its rate.
var testLeaseBound = storetest.LeaseBound{
	Slice:     int64(partnerLimit.Rate * LeasePeriod.Seconds()),
	TakeBurst: LeaseTakeBurst, Interval: LeaseInterval, Lifetime: LeaseLifetime, Margin: time.Millisecond,
}

// newLeaseLimiter is a limiter over a store that counts its calls, on a
// virtual clock, with a deadline no loaded machine reaches.
func newLeaseLimiter(t *testing.T) (*Limiter, *faultyStore, *manualclock.Clock) {
	clock := manualclock.New()
	st := newFaulty(clock)
	return New(Config{Store: st, Clock: clock, Timeout: time.Minute, DenyCacheSize: -1}), st, clock
}

func leaser(l *Limiter, st *faultyStore, clock *manualclock.Clock) storetest.Leaser {
	return storetest.Leaser{Check: l.Check, Calls: func() uint64 { return uint64(st.calls.Load()) }, Clock: clock}
}

// TestLeaseTrafficWithinBound offers a 50 000/s key on leases under, at
// and over its limit: admissions stay within the documented bound of the
// exact bucket and the store sees at most 1/LeaseInterval +
// 1/LeaseLifetime calls per second for it.
func TestLeaseTrafficWithinBound(t *testing.T) {
	for _, offered := range []float64{20_000, 50_000, 100_000} {
		t.Run("", func(t *testing.T) {
			l, st, clock := newLeaseLimiter(t)
			storetest.LeaseTraffic(t, leaser(l, st, clock), partnerLimit, 5_000, offered, 3*time.Second, testLeaseBound)
			if s := l.Stats().Leases; s.Takes == 0 || s.Admitted == 0 {
				t.Errorf("no lease was used: %+v", s)
			}
		})
	}
}

// warmLease offers the partner key 1 000 checks at 50 000/s, so that it
// holds a lease, and returns the tokens the lease holds.
func warmLease(t *testing.T, l *Limiter, clock *manualclock.Clock, c engine.Check) int64 {
	t.Helper()
	storetest.Offer(t, leaser(l, nil, clock), "key", c, 50_000, 20*time.Millisecond, nil)
	e := l.leases.get(leaseKey{"key", c.Policy})
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.held == 0 {
		t.Fatalf("no lease held after 20 ms at 50 000/s: %+v", l.Stats().Leases)
	}
	return e.held
}

// peek is the bucket's Remaining as the store holds it.
func peek(t *testing.T, st *faultyStore, c engine.Check) int64 {
	t.Helper()
	c.Cost, c.Lease = 0, 0
	d, err := st.inner.Check(context.Background(), engine.Request{Subject: "key", Checks: []engine.Check{c}})
	if err != nil {
		t.Fatal(err)
	}
	return d.Results[0].Remaining
}

// TestLeasePolicyChangeFallsBack changes the policy's version under a
// held lease: the lease's tokens go back to the bucket at once, the check
// and the key's next ones are decided by the store directly, the change
// is counted, and the key leases again under the new version once seen
// hot again.
func TestLeasePolicyChangeFallsBack(t *testing.T) {
	l, st, clock := newLeaseLimiter(t)
	c := engine.Check{Policy: "partner", Limit: partnerLimit, Lease: 5_000, Version: 1}
	held := warmLease(t, l, clock, c)
	before := peek(t, st, c)

	c.Version = 2
	calls := st.calls.Load()
	out, err := l.Check(context.Background(), engine.Request{Subject: "key", Checks: []engine.Check{{Policy: c.Policy, Limit: c.Limit, Lease: c.Lease, Version: 2, Cost: 1}}})
	if err != nil || !out.Allowed {
		t.Fatalf("check of the new version = %+v, %v; want allowed", out, err)
	}
	if got := st.calls.Load() - calls; got != 2 {
		t.Errorf("the check of the new version made %d store calls, want 2 (the return, the check itself)", got)
	}
	s := l.Stats().Leases
	if s.PolicyChanged != 1 || s.Returns != 1 || s.TokensReturned != uint64(held) {
		t.Errorf("after the change: %+v; want one change, one return of %d tokens", s, held)
	}
	if got, want := peek(t, st, c), min(before+held-1, int64(partnerLimit.Burst)); got != want {
		t.Errorf("bucket after the return = %d, want %d (before %d + returned %d - the direct check's 1)", got, want, before, held)
	}
	// Cold again: the next check goes to the store directly.
	calls = st.calls.Load()
	clock.Advance(LeaseInterval)
	c.Cost = 1
	if _, err := l.Check(context.Background(), engine.Request{Subject: "key", Checks: []engine.Check{c}}); err != nil {
		t.Fatal(err)
	}
	if got := st.calls.Load() - calls; got != 1 {
		t.Errorf("the next check made %d store calls, want 1 (direct)", got)
	}
	takes := l.Stats().Leases.Takes
	warmLease(t, l, clock, c)
	if l.Stats().Leases.Takes == takes {
		t.Error("no lease taken under the new version")
	}
}

// TestLeaseReturnedOnceAfterExpiry lets a held lease expire: the sweep
// returns its tokens once, and neither a later check, nor a changed
// policy, nor the return of every lease at shutdown returns them again.
func TestLeaseReturnedOnceAfterExpiry(t *testing.T) {
	l, st, clock := newLeaseLimiter(t)
	c := engine.Check{Policy: "partner", Limit: partnerLimit, Lease: 5_000, Version: 1}
	held := warmLease(t, l, clock, c)
	clock.Advance(LeaseLifetime)
	// Spend the bucket down so that a second return would show.
	if d, err := st.inner.Check(context.Background(), engine.Request{Subject: "key", Checks: []engine.Check{{Policy: c.Policy, Limit: c.Limit, Cost: peek(t, st, c)}}}); err != nil || !d.Allowed {
		t.Fatalf("emptying the bucket: %+v, %v", d, err)
	}
	base := peek(t, st, c)
	if base+held > int64(partnerLimit.Burst) {
		t.Fatalf("bucket %d + lease %d over the burst: the test cannot see a double return", base, held)
	}

	ctx := context.Background()
	l.SweepLeases(ctx)
	s := l.Stats().Leases
	if s.Expired != 1 || s.Returns != 1 || s.TokensReturned != uint64(held) {
		t.Fatalf("after the sweep: %+v; want one expiry, one return of %d", s, held)
	}
	after := peek(t, st, c)
	if after != base+held {
		t.Fatalf("bucket after the return = %d, want %d + %d", after, base, held)
	}
	l.SweepLeases(ctx)
	c2 := c
	c2.Version, c2.Cost = 2, 0
	if _, err := l.Check(ctx, engine.Request{Subject: "key", Checks: []engine.Check{c2}}); err != nil {
		t.Fatal(err)
	}
	l.ReturnLeases(ctx)
	if s := l.Stats().Leases; s.Returns != 1 || s.TokensReturned != uint64(held) {
		t.Errorf("the expired lease was returned again: %+v", s)
	}
	if got := peek(t, st, c); got != after {
		t.Errorf("bucket = %d after a second sweep, a changed policy and a shutdown return; want %d", got, after)
	}
}

// TestLeaseNotUsedWhereItCannotServe checks that a request naming another
// policy beside a leased one, and a limiter over the in-process store,
// take no lease.
func TestLeaseNotUsedWhereItCannotServe(t *testing.T) {
	l, st, clock := newLeaseLimiter(t)
	c := engine.Check{Policy: "partner", Limit: partnerLimit, Lease: 5_000, Cost: 1}
	other := engine.Check{Policy: "user", Limit: partnerLimit, Cost: 1}
	for range 100 {
		if _, err := l.Check(context.Background(), engine.Request{Subject: "key", Checks: []engine.Check{c, other}}); err != nil {
			t.Fatal(err)
		}
		clock.Advance(20 * time.Microsecond)
	}
	if got := st.calls.Load(); got != 100 {
		t.Errorf("100 checks of two policies made %d store calls, want 100", got)
	}
	mem := New(Config{Clock: clock})
	for range 100 {
		if _, err := mem.Check(context.Background(), engine.Request{Subject: "key", Checks: []engine.Check{c}}); err != nil {
			t.Fatal(err)
		}
		clock.Advance(20 * time.Microsecond)
	}
	if s := l.Stats().Leases; s.Takes != 0 {
		t.Errorf("two-policy checks took leases: %+v", s)
	}
	if s := mem.Stats().Leases; s.Takes != 0 {
		t.Errorf("the in-process store took leases: %+v", s)
	}
	// A leased key that never sees LeaseWarm units within a
	// LeaseInterval is checked directly: at 90/s they are 11 ms apart.
	calls := st.calls.Load()
	a := storetest.Offer(t, leaser(l, st, clock), "quiet", c, 90, time.Second, nil)
	if s, got := l.Stats().Leases, st.calls.Load()-calls; s.Takes != 0 || got != a.Offered {
		t.Errorf("a key at 90/s: %+v and %d store calls for %d checks; want no lease, every check direct", s, got, a.Offered)
	}
}

// TestLeaseStoreFailure fails the store under a held lease: the lease
// admits what it holds and no more, the rest is decided by the policy's
// failure mode as without leases, and the failed return of an expired
// lease is counted and loses its tokens (the bucket admits less, never
// more).
func TestLeaseStoreFailure(t *testing.T) {
	l, st, clock := newLeaseLimiter(t)
	c := engine.Check{Policy: "partner", Limit: partnerLimit, Lease: 5_000, Version: 1, OnFailure: engine.FailClosed}
	held := warmLease(t, l, clock, c)
	st.fail.Store(true)
	c.Cost = 1
	var admitted int64
	for range held + 100 {
		out, err := l.Check(context.Background(), engine.Request{Subject: "key", Checks: []engine.Check{c}})
		if err != nil {
			t.Fatal(err)
		}
		if out.Allowed {
			admitted++
		}
		clock.Advance(time.Microsecond)
	}
	if admitted != held {
		t.Errorf("with the store down and fail closed, admitted %d; want the %d the lease held", admitted, held)
	}

	l, st, clock = newLeaseLimiter(t)
	c.Cost = 0
	held = warmLease(t, l, clock, c)
	st.fail.Store(true)
	clock.Advance(LeaseLifetime)
	l.SweepLeases(context.Background())
	if s := l.Stats().Leases; s.ReturnErrors != 1 || s.Returns != 0 {
		t.Errorf("the return of %d tokens to a failed store: %+v; want one return error", held, s)
	}
	c.Cost = 1
	if out, err := l.Check(context.Background(), engine.Request{Subject: "key", Checks: []engine.Check{c}}); err != nil || out.Allowed {
		t.Errorf("check after the expiry with the store down = %+v, %v; want rejected, fail closed", out.Decision, err)
	}
}

// TestLeaseExpiredDoesNotAdmit lets a held lease outlive LeaseLifetime:
// the next check is not admitted from it: its tokens are returned and the
// check is decided by a new take from the store.
func TestLeaseExpiredDoesNotAdmit(t *testing.T) {
	l, st, clock := newLeaseLimiter(t)
	c := engine.Check{Policy: "partner", Limit: partnerLimit, Lease: 5_000, Version: 1, Cost: 1}
	held := warmLease(t, l, clock, c)
	clock.Advance(LeaseLifetime)
	admitted, calls := l.Stats().Leases.Admitted, st.calls.Load()
	if _, err := l.Check(context.Background(), engine.Request{Subject: "key", Checks: []engine.Check{c}}); err != nil {
		t.Fatal(err)
	}
	s := l.Stats().Leases
	if s.Admitted != admitted || s.Expired != 1 || s.TokensReturned != uint64(held) {
		t.Errorf("check after the lifetime: %+v; want no admission from the lease, one expiry returning %d", s, held)
	}
	if got := st.calls.Load() - calls; got != 2 {
		t.Errorf("check after the lifetime made %d store calls, want 2 (the return, a new take)", got)
	}
}

// TestLeaseTwoDaemonsWithinBound has two limiters lease one key of one
// store, each offered the key's whole rate: together they admit no more
// than the exact bucket over the run (they started holding nothing), in
// any window at most burst + rate × window + 2 × S (the tokens both held
// when it started), and no less over the run than the exact bucket less
// what each may hold or leave in the bucket at the end.
func TestLeaseTwoDaemonsWithinBound(t *testing.T) {
	clock := manualclock.New()
	inner := engine.NewMemoryStore(engine.MemoryConfig{Clock: clock})
	var daemons [2]*Limiter
	for i := range daemons {
		daemons[i] = New(Config{Store: &faultyStore{inner: inner}, Clock: clock, Timeout: time.Minute, DenyCacheSize: -1})
	}
	c := engine.Check{Policy: "partner", Limit: partnerLimit, Lease: 5_000, Version: 1, Cost: 1}
	const dur, step = 3 * time.Second, 10 * time.Microsecond // 50 000/s to each
	var a storetest.Admissions
	for el := time.Duration(0); el < dur; el += step {
		for _, l := range daemons {
			out, err := l.Check(context.Background(), engine.Request{Subject: "key", Checks: []engine.Check{c}})
			if err != nil {
				t.Fatal(err)
			}
			a.Offered++
			if out.Allowed {
				a.At = append(a.At, el.Microseconds())
			}
		}
		clock.Advance(step)
	}
	if most := int64(partnerLimit.Burst + partnerLimit.Rate*dur.Seconds()); a.Admitted() > most {
		t.Errorf("two daemons admitted %d in %v, over the exact bucket's %d", a.Admitted(), dur, most)
	}
	w := 100 * time.Millisecond
	if got, most := a.MaxInWindow(w), int64(partnerLimit.Burst+partnerLimit.Rate*w.Seconds())+2*testLeaseBound.Slice; got > most {
		t.Errorf("two daemons admitted %d within %v, over burst + rate × window + 2S = %d", got, w, most)
	}
	exact := storetest.ExactAdmissions(partnerLimit, 100_000, dur)
	b := testLeaseBound
	if tol := 2 * (float64(b.Slice) + partnerLimit.Rate*(b.Interval+b.Margin).Seconds() + 2); float64(exact-a.Admitted()) > tol {
		t.Errorf("two daemons admitted %d, exact %d: more than 2 × (S + R × (T + 1 ms) + 2) = %v under", a.Admitted(), exact, tol)
	}
	t.Logf("two daemons offered 100 000/s for %v: admitted %d, exact %d; %+v", dur, a.Admitted(), exact, daemons[0].Stats().Leases)
}

// TestLeaseDroppedOnReset resets a subject that holds a lease: the lease
// is dropped, not returned and not admitted from, so the fresh bucket is
// all the subject gets.
func TestLeaseDroppedOnReset(t *testing.T) {
	clock := manualclock.New()
	st := newFaulty(clock)
	l := New(Config{Store: resettable{st}, Clock: clock, Timeout: time.Minute, DenyCacheSize: -1})
	c := engine.Check{Policy: "partner", Limit: partnerLimit, Lease: 5_000, Version: 1, Cost: 1}
	warmLease(t, l, clock, c)
	if err := l.Reset(context.Background(), "key", []string{c.Policy}); err != nil {
		t.Fatal(err)
	}
	admitted := l.Stats().Leases.Admitted
	if _, err := l.Check(context.Background(), engine.Request{Subject: "key", Checks: []engine.Check{c}}); err != nil {
		t.Fatal(err)
	}
	if s := l.Stats().Leases; s.Admitted != admitted || s.Returns != 0 {
		t.Errorf("after a reset: %+v; want no admission from the old lease and no return", s)
	}
	if got := peek(t, st, c); got != int64(partnerLimit.Burst)-1 {
		t.Errorf("bucket after the reset and one check = %d, want %v", got, partnerLimit.Burst-1)
	}
}

// resettable is a faultyStore that can forget state, as Limiter.Reset needs.
type resettable struct{ *faultyStore }

func (s resettable) Reset(ctx context.Context, subject string, policies []string) error {
	return s.inner.Reset(ctx, subject, policies)
}
