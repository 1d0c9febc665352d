package storetest

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/internal/manualclock"
)

// Leaser is what a lease test drives: a limiter (engine/limiter) over a
// store, on clock, and the store calls it made so far.
type Leaser struct {
	Check func(ctx context.Context, req engine.Request) (engine.Outcome, error)
	Calls func() uint64
	Clock *manualclock.Clock
}

// LeaseBound is what the limiter's leases promise (engine/limiter's
// lease.go, docs/algorithms.md): slices of at most Slice tokens, at most
// TakeBurst takes at once and one more per Interval, one return per
// Lifetime, and a store clock
// that may differ by up to Margin (the limiter takes Margin of refill
// less than it thinks the bucket holds).
type LeaseBound struct {
	Slice     int64
	TakeBurst int
	Interval  time.Duration
	Lifetime  time.Duration
	Margin    time.Duration
}

// MaxCallsPerSecond is the most store calls one key costs per second,
// on average over a span of d.
func (b LeaseBound) MaxCallsPerSecond(d time.Duration) float64 {
	return 1/b.Interval.Seconds() + 1/b.Lifetime.Seconds() + float64(b.TakeBurst)/d.Seconds()
}

// Admissions are the checks of one key that were allowed, as
// microseconds since the traffic started.
type Admissions struct {
	Offered int64
	At      []int64
}

// Admitted is how many checks were allowed.
func (a Admissions) Admitted() int64 { return int64(len(a.At)) }

// MaxInWindow is the most admissions within any w-long span.
func (a Admissions) MaxInWindow(w time.Duration) int64 {
	wu := w.Microseconds()
	best, lo := 0, 0
	for hi := range a.At {
		for a.At[hi]-a.At[lo] >= wu {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	return int64(best)
}

// Offer sends one check of cost 1 under check's policy every 1/rate
// seconds of the clock for dur, and records the admitted ones. mid, if
// set, runs before each check with the time since the start.
func Offer(t testing.TB, l Leaser, subject string, check engine.Check, rate float64, dur time.Duration, mid func(time.Duration) engine.Check) Admissions {
	t.Helper()
	step := time.Duration(float64(time.Second) / rate)
	var a Admissions
	for el := time.Duration(0); el < dur; el += step {
		c := check
		if mid != nil {
			c = mid(el)
		}
		c.Cost = 1
		out, err := l.Check(context.Background(), engine.Request{Subject: subject, Checks: []engine.Check{c}})
		if err != nil {
			t.Fatalf("check at %v: %v", el, err)
		}
		a.Offered++
		if out.Allowed {
			a.At = append(a.At, el.Microseconds())
		}
		l.Clock.Advance(step)
	}
	return a
}

// ExactAdmissions is what one exact token bucket of lim, full at the
// start, admits of the traffic Offer sends.
func ExactAdmissions(lim engine.Limit, rate float64, dur time.Duration) int64 {
	step := time.Duration(float64(time.Second) / rate)
	now := manualclock.Start
	var st engine.State
	var n int64
	for el := time.Duration(0); el < dur; el += step {
		var r engine.Result
		st, r = engine.Decide(now.Add(el), st, lim, 1)
		if r.Allowed {
			n++
		}
	}
	return n
}

// LeaseTraffic offers a leased key of lim a steady rate for dur through
// l and holds it to the bound: in every window of 100 ms at most
// burst + rate × window + Slice admissions (one limiter holds at most one
// slice), the whole run within Slice + rate × (Interval + Margin) + 2 of
// the exact bucket, and after a first second, at most
// b.MaxCallsPerSecond store calls per second.
func LeaseTraffic(t *testing.T, l Leaser, lim engine.Limit, lease int64, offered float64, dur time.Duration, b LeaseBound) {
	t.Helper()
	check := engine.Check{Policy: "partner", Limit: lim, Lease: lease, Version: 1}
	calls0 := l.Calls()
	warm := Offer(t, l, "key", check, offered, time.Second, nil)
	callsAt := l.Calls()
	rest := Offer(t, l, "key", check, offered, dur-time.Second, nil)
	calls := l.Calls() - callsAt

	all := Admissions{Offered: warm.Offered + rest.Offered, At: warm.At}
	for _, at := range rest.At {
		all.At = append(all.At, at+time.Second.Microseconds())
	}
	exact := ExactAdmissions(lim, offered, dur)
	tol := float64(b.Slice) + lim.Rate*(b.Interval+b.Margin).Seconds() + 2
	if diff := math.Abs(float64(all.Admitted() - exact)); diff > tol {
		t.Errorf("offered %v/s for %v: admitted %d, exact %d: %v apart, the bound is %v", offered, dur, all.Admitted(), exact, diff, tol)
	}
	w := 100 * time.Millisecond
	if got, bound := all.MaxInWindow(w), math.Floor(lim.Burst+lim.Rate*w.Seconds())+float64(b.Slice); float64(got) > bound {
		t.Errorf("offered %v/s: %d admitted within %v, the bound is %v", offered, got, w, bound)
	}
	perSec := float64(calls) / (dur - time.Second).Seconds()
	if most := b.MaxCallsPerSecond(dur - time.Second); perSec > most {
		t.Errorf("offered %v/s: %v store calls per second after the first second, at most %v", offered, perSec, most)
	}
	t.Logf("offered %v/s for %v: admitted %d (exact %d); %d store calls in the first second, %.1f/s after it", offered, dur, all.Admitted(), exact, callsAt-calls0, perSec)
}
