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
// the limit; a settlement counts what it charged beyond its estimate
// (which the check counted), and a refund takes nothing back.
func TestChargeIsTrackedUsage(t *testing.T) {
	lim := New(Config{Clock: manualclock.New()})
	ctx := context.Background()
	l := engine.Limit{Algorithm: engine.FixedWindow, Count: 100, Window: time.Hour}
	c := engine.Check{Policy: "daily", Limit: l, Cost: 250, Track: true}
	if _, err := lim.Charge(ctx, engine.ChargeRequest{Subject: "s", Checks: []engine.Check{c}}); err != nil {
		t.Fatal(err)
	}
	key := engine.UsageKey{Subject: "s", Policy: "daily"}
	u := lim.DrainUsage()[key]
	if u.Demand != 250 || u.Admitted != 250 {
		t.Errorf("usage after a charge of 250 = %+v, want demand and admitted 250", u)
	}
	settle := func(estimate, real int64) engine.Usage {
		t.Helper()
		c := engine.Check{Policy: "daily", Limit: engine.Limit{Algorithm: engine.FixedWindow, Count: 1000, Window: time.Hour}, Cost: estimate, Track: true}
		if o, err := lim.Check(ctx, engine.Request{Subject: "s", Checks: []engine.Check{c}}); err != nil || !o.Allowed {
			t.Fatalf("check of the estimate = %+v, %v", o, err)
		}
		if err := lim.Reserve(ctx, "s", "r", []engine.Check{c}, time.Minute); err != nil {
			t.Fatal(err)
		}
		c.Cost = real
		if _, err := lim.Charge(ctx, engine.ChargeRequest{Subject: "s", Checks: []engine.Check{c}, Reservation: "r"}); err != nil {
			t.Fatal(err)
		}
		return lim.DrainUsage()[key]
	}
	if u := settle(40, 100); u.Demand != 100 || u.Admitted != 100 {
		t.Errorf("estimate 40 settled at 100: usage %+v, want demand and admitted 100 (40 by the check, 60 by the settlement)", u)
	}
	if u := settle(40, 10); u.Demand != 40 || u.Admitted != 40 {
		t.Errorf("estimate 40 settled at 10: usage %+v, want 40 (a refund takes nothing back)", u)
	}
}
