package engine

import (
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/engine/internal/quant"
)

// FuzzDecide drives every algorithm through a sequence of checks decoded
// from the fuzzer's bytes and holds the invariants every caller relies on.
func FuzzDecide(f *testing.F) {
	f.Add(uint8(1), 10.0, 20.0, 100.0, int64(1000), []byte{1, 2, 3, 200, 0, 7})
	f.Add(uint8(3), 1.0, 1.0, 5.0, int64(60000), []byte{0, 0, 0, 255, 255})
	f.Add(uint8(4), 1.0, 1.0, 3.0, int64(1), []byte{9, 9, 9, 9})
	f.Add(uint8(5), 0.5, 2.0, 7.0, int64(86400000), []byte{10, 1, 100, 2})
	f.Fuzz(func(t *testing.T, alg uint8, rate, burst, count float64, windowMs int64, steps []byte) {
		l := Limit{Algorithm: Algorithm(alg%6) + 0, Rate: rate, Burst: burst, Count: count, Window: time.Duration(windowMs) * time.Millisecond, MaxLog: 50}
		if l.Validate() != nil {
			return
		}
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		var st State
		for i := 0; i+1 < len(steps); i += 2 {
			now = now.Add(time.Duration(steps[i]) * 7 * time.Millisecond)
			cost := int64(steps[i+1] % 8)
			next, r := Decide(now, st, l, cost)
			if r.Remaining < 0 || r.Remaining > r.Limit {
				t.Fatalf("step %d: remaining %d outside [0, %d]", i, r.Remaining, r.Limit)
			}
			if r.Limit != int64(math.Floor(l.Capacity())) {
				t.Fatalf("step %d: limit %d, want %v", i, r.Limit, math.Floor(l.Capacity()))
			}
			if r.RetryAfter < 0 || r.ResetAfter < 0 {
				t.Fatalf("step %d: negative retry %v or reset %v", i, r.RetryAfter, r.ResetAfter)
			}
			if r.Allowed && r.RetryAfter != 0 {
				t.Fatalf("step %d: allowed with retry-after %v", i, r.RetryAfter)
			}
			if !r.Allowed && r.RetryAfter <= 0 {
				t.Fatalf("step %d: rejected with retry-after %v", i, r.RetryAfter)
			}
			if cost == 0 && !r.Allowed {
				t.Fatalf("step %d: cost 0 rejected", i)
			}
			// A rejection keeps the state, or stores a full bucket at now.
			if !r.Allowed && !reflect.DeepEqual(next, st) &&
				(l.Algorithm != TokenBucket || !reflect.DeepEqual(next, State{A: quant.Down(l.Burst), T: now.UnixMicro()})) {
				t.Fatalf("step %d: rejected check changed the state %+v to %+v", i, st, next)
			}
			bound := 3*l.Window.Seconds() + 1
			if !l.Algorithm.Windowed() {
				bound = l.Capacity()/l.Rate + 1
			}
			if float64(cost) <= l.Capacity() && r.RetryAfter.Seconds() > bound {
				t.Fatalf("step %d: retry-after %v longer than the limit could need", i, r.RetryAfter)
			}
			st = next
		}
	})
}

// FuzzLimitValidate checks that validation never panics and that whatever
// it accepts can be decided, including a cost at exactly its capacity.
func FuzzLimitValidate(f *testing.F) {
	f.Add(uint8(1), 1.0, 1.0, 1.0, int64(1000000))
	f.Add(uint8(4), 0.0, 0.0, 1001.0, int64(1000000))
	f.Add(uint8(5), math.NaN(), math.Inf(1), -1.0, int64(-5))
	f.Fuzz(func(t *testing.T, alg uint8, rate, burst, count float64, window int64) {
		l := Limit{Algorithm: Algorithm(alg), Rate: rate, Burst: burst, Count: count, Window: time.Duration(window)}
		if err := l.Validate(); err != nil {
			if _, ok := err.(*LimitError); !ok {
				t.Fatalf("Validate error %T, want *LimitError", err)
			}
			return
		}
		cost := int64(l.Capacity())
		if err := l.ValidateCost(cost); err != nil {
			t.Fatalf("ValidateCost(capacity %d) = %v", cost, err)
		}
		if err := l.ValidateCost(cost + 1); err == nil && float64(cost+1) > l.Capacity() {
			t.Fatalf("ValidateCost(%d) above capacity %v accepted", cost+1, l.Capacity())
		}
		if l.Algorithm == SlidingWindowLog {
			return // a cost of up to a million timestamps is slow, not wrong
		}
		if _, r := Decide(time.Unix(1e9, 0), State{}, l, cost); !r.Allowed {
			t.Fatalf("fresh state rejected a cost of its capacity %d", cost)
		}
	})
}
