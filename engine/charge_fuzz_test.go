package engine

import (
	"testing"
	"time"
)

// FuzzCharge interleaves checks, charges and refunds decoded from the
// fuzzer's bytes and holds the invariants of a debt: a charge is always
// applied; a state past its limit refuses every check of a positive cost,
// with a RetryAfter after which the debt is paid; a refund never fills a
// token bucket past its burst nor empties a count below zero.
func FuzzCharge(f *testing.F) {
	f.Add(uint8(1), 10.0, 20.0, 100.0, int64(1000), []byte{1, 2, 3, 200, 0, 7, 9, 1})
	f.Add(uint8(2), 1.0, 5.0, 5.0, int64(60000), []byte{0, 255, 0, 3, 255, 9})
	f.Add(uint8(3), 1.0, 1.0, 5.0, int64(60000), []byte{0, 0, 0, 255, 255, 4})
	f.Add(uint8(5), 0.5, 2.0, 7.0, int64(86400000), []byte{10, 1, 100, 2, 3, 3})
	f.Fuzz(func(t *testing.T, alg uint8, rate, burst, count float64, windowMs int64, steps []byte) {
		l := Limit{Algorithm: Algorithm(alg % 6), Rate: rate, Burst: burst, Count: count, Window: time.Duration(windowMs) * time.Millisecond}
		if l.Validate() != nil || l.Algorithm == SlidingWindowLog {
			return
		}
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		var st State
		var resAt int64
		for i := 0; i+2 < len(steps); i += 3 {
			now = now.Add(time.Duration(steps[i]) * 13 * time.Millisecond)
			n := int64(steps[i+2])
			switch steps[i+1] % 3 {
			case 0:
				var r Result
				if st, r = decideAndKeep(now, st, l, n%4); r.Allowed {
					resAt = now.UnixMicro()
				}
			case 1:
				var r Result
				st, r = Charge(now, st, l, n*3, 0)
				if r.Remaining < 0 || r.RetryAfter < 0 || r.ResetAfter < 0 || (r.Allowed != (r.RetryAfter == 0)) {
					t.Fatalf("step %d: charge result %+v", i, r)
				}
				if !r.Allowed {
					if _, c := Decide(now, st, l, 1); c.Allowed {
						t.Fatalf("step %d: past the limit (%+v) but a check of 1 is allowed", i, st)
					}
					if _, c := Decide(now.Add(r.RetryAfter), st, l, 0); !c.Allowed {
						t.Fatalf("step %d: still past the limit after RetryAfter %v: %+v", i, r.RetryAfter, c)
					}
				}
			default:
				st, _ = Charge(now, st, l, -n, resAt)
			}
			switch {
			case l.Algorithm == TokenBucket && st.A > l.Burst:
				t.Fatalf("step %d: token bucket holds %v past its burst %v", i, st.A, l.Burst)
			case l.Algorithm != TokenBucket && (st.A < 0 || st.B < 0):
				t.Fatalf("step %d: negative count or level %+v", i, st)
			}
		}
	})
}

// decideAndKeep is Decide with the state a store keeps.
func decideAndKeep(now time.Time, st State, l Limit, cost int64) (State, Result) {
	next, r := Decide(now, st, l, cost)
	if r.Allowed && cost == 0 {
		return st, r
	}
	return next, r
}
