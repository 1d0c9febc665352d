package decide_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-rl/sluice/decide"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/engine/limiter"
	"github.com/sluice-rl/sluice/quota"
)

// downStore is a store in process that fails every call while down is set,
// as a Redis nobody listens for refuses it.
type downStore struct {
	inner *engine.MemoryStore
	down  atomic.Bool
	calls atomic.Int64
}

func (s *downStore) Check(ctx context.Context, req engine.Request) (engine.Decision, error) {
	s.calls.Add(1)
	if s.down.Load() {
		return engine.Decision{}, errors.New("dial tcp: connection refused")
	}
	return s.inner.Check(ctx, req)
}

// TestStoreDownRecoveryVirtual is the protocol of region's
// TestStartWithRedisDown and TestLocalFallbackSharedByRegionDaemons on
// virtual time: a Decider over a Limiter whose store is down decides an
// on_store_failure "local" policy from the in-process fallback at its
// rate divided by the region's daemons, degraded; the breaker opens; once
// the store is back, decisions come from it again no later than the
// breaker's OpenFor after it opened, and none before. The breaker
// (gobreaker) and the limiter read time.Now, so the test runs in a
// testing/synctest bubble, where every figure is exact however loaded the
// machine.
func TestStoreDownRecoveryVirtual(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			rate    = 30.0 // the policy's units per second
			daemons = 3    // daemons of the region sharing it
			openFor = 5 * time.Second
		)
		st := &downStore{inner: engine.NewMemoryStore(engine.MemoryConfig{})}
		st.down.Store(true)
		lim := limiter.New(limiter.Config{Store: st, Timeout: 50 * time.Millisecond,
			Daemons: func() int { return daemons }, Breaker: limiter.BreakerConfig{OpenFor: openFor}})
		reg := newRegistry(t, quota.Policy{ID: "orders", Match: quota.Match{Routes: []string{"/v1/orders"}}, Algorithm: "token_bucket",
			RatePerSec: rate, Burst: 3, Mode: quota.ModeEnforce, OnStoreFailure: quota.FailLocal})
		dc := decide.New(decide.Config{Limiter: lim, Registry: reg})
		check := func() decide.Answer {
			t.Helper()
			a, p := dc.Check(context.Background(), user("alice"))
			if p != nil {
				t.Fatalf("Check with the store down: problem %+v", p)
			}
			return a
		}

		// Three seconds at 100 checks a second with the store down.
		const span = 3 * time.Second
		start := time.Now()
		allowed, opened := 0, time.Time{}
		for time.Since(start) < span {
			a := check()
			if a.Decision.Source != "fallback" || !a.Decision.Degraded {
				t.Fatalf("check with the store down: source %q degraded %v, want fallback, true", a.Decision.Source, a.Decision.Degraded)
			}
			if a.Decision.Allowed {
				allowed++
			}
			if opened.IsZero() && lim.Stats().Breakers["store"] == "open" {
				opened = time.Now()
			}
			time.Sleep(10 * time.Millisecond)
		}
		// The fallback bucket holds rate/daemons a second, burst
		// max(1, 3/daemons): 1 unit at the start, then 10 a second.
		if want := 1 + int(rate/daemons*span.Seconds()); allowed < want-1 || allowed > want {
			t.Errorf("admitted %d in %v with the store down, want %d (rate %g / %d daemons)", allowed, span, want, rate, daemons)
		}
		t.Logf("store down: %d admitted in %v, breaker open %v after the first check", allowed, span, opened.Sub(start))
		if opened.IsZero() {
			t.Fatal("the breaker did not open with every store call failing")
		}

		// The store comes back: the first decision from it is the breaker's
		// probe, OpenFor after it opened.
		st.down.Store(false)
		var recovered time.Time
		for time.Since(opened) < 2*openFor {
			a := check()
			if a.Decision.Source == "store" {
				recovered = time.Now()
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		switch took := recovered.Sub(opened); {
		case recovered.IsZero():
			t.Fatalf("no decision from the store within %v of the breaker opening", 2*openFor)
		case took < openFor || took > openFor+10*time.Millisecond:
			t.Errorf("first decision from the store %v after the breaker opened, want OpenFor %v (+ a check period)", took, openFor)
		}
		if got := lim.Stats().Breakers["store"]; got != "closed" {
			t.Errorf("breaker after the store answered = %q, want closed", got)
		}
		if a := check(); a.Decision.Source != "store" || a.Decision.Degraded {
			t.Errorf("check after recovery: source %q degraded %v, want store, false", a.Decision.Source, a.Decision.Degraded)
		}
	})
}
