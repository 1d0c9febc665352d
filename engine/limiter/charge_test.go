package limiter

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/internal/manualclock"
)

func (s *faultyStore) Charge(ctx context.Context, req engine.ChargeRequest) (engine.Decision, error) {
	s.calls.Add(1)
	if s.fail.Load() {
		return engine.Decision{}, errStoreDown
	}
	return s.inner.Charge(ctx, req)
}

// TestChargeThatCannotReachTheStore: a charge the store cannot apply is
// tried once and counted; dropped with a degraded outcome when its policies
// fail open, an error when one fails closed. Applied, it ends the
// subject's remembered rejection.
func TestChargeThatCannotReachTheStore(t *testing.T) {
	clock := manualclock.New()
	st := newFaulty(clock)
	lim := New(Config{Store: st, Clock: clock})
	ctx := context.Background()
	l := engine.Limit{Algorithm: engine.TokenBucket, Rate: 1, Burst: 10}
	charge := func(f engine.Failure) (Outcome, error) {
		return lim.Charge(ctx, engine.ChargeRequest{Subject: "s", Checks: []engine.Check{{Policy: "p", Limit: l, Cost: 15, OnFailure: f}}})
	}
	o, err := charge(engine.FailOpen)
	if err != nil || o.Degraded || o.Results[0].Remaining != 0 || o.Results[0].RetryAfter != 5*time.Second {
		t.Fatalf("charge of 15 into a bucket of 10 = %+v, %v; want applied, 5s of debt", o, err)
	}
	if o, _ := lim.Check(ctx, engine.Request{Subject: "s", Checks: []engine.Check{{Policy: "p", Limit: l, Cost: 1}}}); o.Allowed {
		t.Fatalf("check after the debt allowed: %+v", o)
	}
	st.fail.Store(true)
	before := st.calls.Load()
	if o, err := charge(engine.FailOpen); err != nil || !o.Degraded {
		t.Fatalf("fail-open charge to a down store = %+v, %v; want dropped, degraded", o, err)
	}
	if _, err := charge(engine.FailClosed); !errors.Is(err, errStoreDown) {
		t.Fatalf("fail-closed charge to a down store = %v, want the store's error", err)
	}
	if calls := st.calls.Load() - before; calls != 2 {
		t.Errorf("two charges took %d store calls, want one each (never retried)", calls)
	}
	if s := lim.Stats(); s.ChargeErrors != 2 || s.ChargesDropped != 1 {
		t.Errorf("Stats = %d charge errors, %d dropped; want 2 and 1", s.ChargeErrors, s.ChargesDropped)
	}
}

// TestChargeIsTrackedUsage: a tracked policy's charge counts as demand and
// as admitted usage, as the global shares and quotas drain it, even past
// the limit; a settlement is not counted (its estimate was, by the check).
func TestChargeIsTrackedUsage(t *testing.T) {
	lim := New(Config{Clock: manualclock.New()})
	ctx := context.Background()
	l := engine.Limit{Algorithm: engine.FixedWindow, Count: 100, Window: time.Hour}
	c := engine.Check{Policy: "daily", Limit: l, Cost: 250, Track: true}
	if _, err := lim.Charge(ctx, engine.ChargeRequest{Subject: "s", Checks: []engine.Check{c}}); err != nil {
		t.Fatal(err)
	}
	u := lim.DrainUsage()[engine.UsageKey{Subject: "s", Policy: "daily"}]
	if u.Demand != 250 || u.Admitted != 250 {
		t.Errorf("usage after a charge of 250 = %+v, want demand and admitted 250", u)
	}
}
