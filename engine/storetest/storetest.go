// Package storetest holds the tests every engine.Store must pass, so that
// the memory store and the Redis store are held to the same semantics:
// each store's package calls Run with a constructor of a fresh store.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/internal/manualclock"
)

// Checker is what the store-independent tests drive.
type Checker interface {
	Check(ctx context.Context, req engine.Request) (engine.Decision, error)
}

// Case builds a fresh, empty store whose time comes from clock.
type Case struct {
	Name string
	New  func(t *testing.T, clock engine.Clock) Checker
}

// AlgorithmLimits is one limit of each algorithm, of comparable size.
var AlgorithmLimits = []engine.Limit{
	{Algorithm: engine.TokenBucket, Rate: 100, Burst: 10},
	{Algorithm: engine.LeakyBucket, Rate: 100, Burst: 10},
	{Algorithm: engine.FixedWindow, Count: 100, Window: time.Second},
	{Algorithm: engine.SlidingWindowLog, Count: 100, Window: time.Second},
	{Algorithm: engine.SlidingWindowCounter, Count: 100, Window: time.Second},
}

// allowance is what a limit admits over d of steady overload starting on a
// window boundary.
func allowance(l engine.Limit, d time.Duration) float64 {
	if l.Algorithm.Windowed() {
		return l.Count * float64(d) / float64(l.Window)
	}
	return l.Burst + l.Rate*d.Seconds()
}

// Run runs every store-independent test against each of cases, as
// subtests named for the test.
func Run(t *testing.T, cases ...Case) {
	tests := []struct {
		name string
		run  func(*testing.T, []Case)
	}{
		{"AccuracyUnderSteadyOverload", accuracyUnderSteadyOverload},
		{"FixedWindowEdgeBurst", fixedWindowEdgeBurst},
		{"AtomicUnderConcurrency", atomicUnderConcurrency},
		{"RejectedMultiPolicyCheckConsumesNothing", rejectedMultiPolicyCheckConsumesNothing},
		{"RetryAfterIsHonest", retryAfterIsHonest},
		{"ScaleChangesWithoutReset", scaleChangesWithoutReset},
		{"RaisedScaleAfterRejectionsAdmitsTheRate", raisedScaleAfterRejectionsAdmitsTheRate},
		{"CheckRejectsBadRequests", checkRejectsBadRequests},
		{"AlgorithmSwitchKeepsStateUntilCommit", algorithmSwitchKeepsStateUntilCommit},
		{"ScaledStateOutlivesItsScaledTTL", scaledStateOutlivesItsScaledTTL},
		{"LargeWindowCountsAreExact", largeWindowCountsAreExact},
		{"ResetForgetsState", resetForgetsState},
	}
	tests = append(tests, chargeTests...)
	tests = append(tests, spanTests...)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.run(t, cases) })
	}
}

func MustCheck(t *testing.T, s Checker, req engine.Request) engine.Decision {
	t.Helper()
	d, err := s.Check(context.Background(), req)
	if err != nil {
		t.Fatalf("Check(%+v): %v", req, err)
	}
	return d
}

func One(subject, policy string, l engine.Limit, cost int64) engine.Request {
	return engine.Request{Subject: subject, Checks: []engine.Check{{Policy: policy, Limit: l, Cost: cost}}}
}

func accuracyUnderSteadyOverload(t *testing.T, storeCases []Case) {
	for _, sc := range storeCases {
		for _, l := range AlgorithmLimits {
			t.Run(sc.Name+"/"+l.Algorithm.String(), func(t *testing.T) {
				clock := manualclock.New()
				s := sc.New(t, clock)
				const dur = 60 * time.Second
				want := allowance(l, dur)
				offered := 2 * want / dur.Seconds() // units per second
				step := time.Duration(float64(time.Second) / offered)
				admitted := 0
				for el := time.Duration(0); el < dur; el += step {
					if MustCheck(t, s, One("alice", "p", l, 1)).Allowed {
						admitted++
					}
					clock.Advance(step)
				}
				if err := math.Abs(float64(admitted)-want) / want; err > 0.01 {
					t.Errorf("admitted %d over %v at 2x, want %.0f ±1%% (off by %.2f%%)", admitted, dur, want, err*100)
				}
			})
		}
	}
}

// fixedWindowEdgeBurst documents the fixed window's known weakness: a
// client that spends the whole limit at the end of one window and again at
// the start of the next gets twice the limit within one window's length.
func fixedWindowEdgeBurst(t *testing.T, storeCases []Case) {
	for _, sc := range storeCases {
		t.Run(sc.Name, func(t *testing.T) {
			clock := manualclock.New()
			s := sc.New(t, clock)
			l := engine.Limit{Algorithm: engine.FixedWindow, Count: 100, Window: time.Minute}
			clock.Advance(59*time.Second + 900*time.Millisecond) // 100 ms before the boundary
			admitted := 0
			for range 100 {
				if MustCheck(t, s, One("edge", "p", l, 1)).Allowed {
					admitted++
				}
			}
			clock.Advance(200 * time.Millisecond) // 100 ms after it
			for range 100 {
				if MustCheck(t, s, One("edge", "p", l, 1)).Allowed {
					admitted++
				}
			}
			if admitted != 200 {
				t.Errorf("admitted %d within 200 ms across a window edge, want 200 (2x the limit of 100)", admitted)
			}
			// The sliding window counter on the same traffic does not.
			lc := engine.Limit{Algorithm: engine.SlidingWindowCounter, Count: 100, Window: time.Minute}
			clock.Advance(time.Hour)
			clock.Set(clock.Now().Truncate(time.Minute).Add(59*time.Second + 900*time.Millisecond))
			admitted = 0
			for range 100 {
				if MustCheck(t, s, One("edge", "pc", lc, 1)).Allowed {
					admitted++
				}
			}
			clock.Advance(200 * time.Millisecond)
			for range 100 {
				if MustCheck(t, s, One("edge", "pc", lc, 1)).Allowed {
					admitted++
				}
			}
			if admitted > 101 {
				t.Errorf("sliding window counter admitted %d across the edge, want about 100", admitted)
			}
		})
	}
}

func atomicUnderConcurrency(t *testing.T, storeCases []Case) {
	for _, sc := range storeCases {
		for _, l := range AlgorithmLimits {
			t.Run(sc.Name+"/"+l.Algorithm.String(), func(t *testing.T) {
				clock := manualclock.New() // frozen: nothing refills
				s := sc.New(t, clock)
				limit := int64(l.Capacity())
				var admitted atomic.Int64
				var wg sync.WaitGroup
				for g := 0; g < 64; g++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range 10 {
							d, err := s.Check(context.Background(), One("hot", "p", l, 1))
							if err != nil {
								t.Error(err)
								return
							}
							if d.Allowed {
								admitted.Add(1)
							}
						}
					}()
				}
				wg.Wait()
				if got := admitted.Load(); got != limit {
					t.Errorf("64 goroutines x 10 checks admitted %d, want exactly %d", got, limit)
				}
			})
		}
	}
}

func rejectedMultiPolicyCheckConsumesNothing(t *testing.T, storeCases []Case) {
	for _, sc := range storeCases {
		t.Run(sc.Name, func(t *testing.T) {
			clock := manualclock.New()
			s := sc.New(t, clock)
			burst := engine.Limit{Algorithm: engine.TokenBucket, Rate: 1, Burst: 5}
			daily := engine.Limit{Algorithm: engine.FixedWindow, Count: 1000, Window: 24 * time.Hour}
			req := engine.Request{Subject: "bob", Checks: []engine.Check{
				{Policy: "daily", Limit: daily, Cost: 1},
				{Policy: "burst", Limit: burst, Cost: 1},
			}}
			for i := range 5 {
				if d := MustCheck(t, s, req); !d.Allowed {
					t.Fatalf("check %d rejected, want allowed", i)
				}
			}
			for range 50 {
				d := MustCheck(t, s, req)
				if d.Allowed {
					t.Fatal("check past the burst allowed")
				}
				if d.Decider != 1 {
					t.Fatalf("Decider = %d, want 1 (burst)", d.Decider)
				}
			}
			// Read the daily quota without spending.
			peek := MustCheck(t, s, engine.Request{Subject: "bob", Checks: []engine.Check{{Policy: "daily", Limit: daily, Cost: 0}}})
			if got := peek.Results[0].Remaining; got != 995 {
				t.Errorf("daily remaining after 5 allowed and 50 rejected = %d, want 995", got)
			}
		})
	}
}

func retryAfterIsHonest(t *testing.T, storeCases []Case) {
	for _, sc := range storeCases {
		for _, l := range AlgorithmLimits {
			t.Run(sc.Name+"/"+l.Algorithm.String(), func(t *testing.T) {
				clock := manualclock.New()
				clock.Advance(333 * time.Millisecond)
				s := sc.New(t, clock)
				for i := range 200 {
					cost := int64(1 + i%3)
					d := MustCheck(t, s, One("r", "p", l, cost))
					if d.Allowed {
						clock.Advance(time.Millisecond)
						continue
					}
					retry := d.RetryAfter()
					if retry <= 0 {
						t.Fatalf("rejected with RetryAfter %v", retry)
					}
					if retry > time.Millisecond {
						clock.Advance(retry - time.Millisecond)
						if MustCheck(t, s, One("r", "p", l, 0)).Results[0].Remaining >= cost && l.Algorithm != engine.SlidingWindowCounter {
							t.Fatalf("RetryAfter %v too long: cost %d fits 1ms earlier", retry, cost)
						}
						clock.Advance(time.Millisecond)
					} else {
						clock.Advance(retry)
					}
					if d2 := MustCheck(t, s, One("r", "p", l, cost)); !d2.Allowed {
						t.Fatalf("check %d: rejected again after waiting RetryAfter %v (new retry %v)", i, retry, d2.RetryAfter())
					}
				}
			})
		}
	}
}

func scaleChangesWithoutReset(t *testing.T, storeCases []Case) {
	for _, sc := range storeCases {
		t.Run(sc.Name, func(t *testing.T) {
			clock := manualclock.New()
			s := sc.New(t, clock)
			l := engine.Limit{Algorithm: engine.TokenBucket, Rate: 10, Burst: 100}
			req := func(scale float64) engine.Request {
				return engine.Request{Subject: "g", Checks: []engine.Check{{Policy: "global", Limit: l, Cost: 1, Scale: scale}}}
			}
			for range 30 {
				MustCheck(t, s, req(0.5)) // capacity 50: 30 spent, 20 left
			}
			d := MustCheck(t, s, req(0.25)) // capacity 25: still 20 left, so 19 after
			if got := d.Results[0].Remaining; got != 19 {
				t.Errorf("remaining after shrinking the share = %d, want 19 (state kept, not reset)", got)
			}
			if got := d.Results[0].Limit; got != 25 {
				t.Errorf("limit at scale 0.25 = %d, want 25", got)
			}
		})
	}
}

// raisedScaleAfterRejectionsAdmitsTheRate covers a region whose share
// of a global limit is too small for a check's cost (it lent the share
// away): it rejects a subject's first checks, then the share is raised and
// the subject is offered ten times the rate. Over the following interval
// a token bucket admits at most the rate × interval plus what it held at
// the small share, not a full burst at the new one: the rejected checks
// stored a full bucket at the small share, refilled from there. For the
// other algorithms a fresh state reads as empty (nothing kept could grant
// more), so the rejected subject admits no more than one never seen.
func raisedScaleAfterRejectionsAdmitsTheRate(t *testing.T, storeCases []Case) {
	const (
		small    = 0.001
		interval = time.Second
		step     = time.Millisecond
	)
	limits := []engine.Limit{
		{Algorithm: engine.TokenBucket, Rate: 100, Burst: 50},
		{Algorithm: engine.LeakyBucket, Rate: 100, Burst: 50},
		{Algorithm: engine.FixedWindow, Count: 100, Window: time.Second},
		{Algorithm: engine.SlidingWindowLog, Count: 100, Window: time.Second},
		{Algorithm: engine.SlidingWindowCounter, Count: 100, Window: time.Second},
	}
	for _, sc := range storeCases {
		for _, l := range limits {
			t.Run(sc.Name+"/"+l.Algorithm.String(), func(t *testing.T) {
				clock := manualclock.New()
				clock.Advance(250 * time.Millisecond) // off any window boundary
				s := sc.New(t, clock)
				req := func(subject string, scale float64) engine.Request {
					return engine.Request{Subject: subject, Checks: []engine.Check{{Policy: "global", Limit: l, Cost: 1, Scale: scale}}}
				}
				// Rejected at the small share: first as a subject never
				// seen, then as one the store holds.
				for range 2 {
					if d := MustCheck(t, s, req("alice", small)); d.Allowed {
						t.Fatalf("Check(cost 1, scale %v) = allowed, want rejected", small)
					}
					clock.Advance(500 * time.Millisecond)
				}
				MustCheck(t, s, req("alice", small))
				admitted := map[string]int{}
				for el := time.Duration(0); el < interval; el += step {
					for _, subject := range []string{"alice", "bob"} {
						if MustCheck(t, s, req(subject, 1)).Allowed {
							admitted[subject]++
						}
					}
					clock.Advance(step)
				}
				bound := float64(admitted["bob"]) // bob: never seen before the raise
				if l.Algorithm == engine.TokenBucket {
					bound = l.Rate*interval.Seconds() + small*l.Burst
				}
				if got := admitted["alice"]; float64(got) > bound {
					t.Errorf("admitted %d in %v after the scale rose from %v to 1, want at most %.2f (a never-seen subject admitted %d)",
						got, interval, small, bound, admitted["bob"])
				}
			})
		}
	}
}

func checkRejectsBadRequests(t *testing.T, storeCases []Case) {
	good := engine.Limit{Algorithm: engine.TokenBucket, Rate: 1, Burst: 1}
	tests := []struct {
		name string
		req  engine.Request
	}{
		{"empty subject", engine.Request{Checks: []engine.Check{{Policy: "p", Limit: good, Cost: 1}}}},
		{"no policy name", engine.Request{Subject: "s", Checks: []engine.Check{{Limit: good, Cost: 1}}}},
		{"negative cost", engine.Request{Subject: "s", Checks: []engine.Check{{Policy: "p", Limit: good, Cost: -1}}}},
		{"invalid limit", engine.Request{Subject: "s", Checks: []engine.Check{{Policy: "p", Limit: engine.Limit{Algorithm: engine.TokenBucket}, Cost: 1}}}},
		{"duplicate policy", engine.Request{Subject: "s", Checks: []engine.Check{{Policy: "p", Limit: good, Cost: 1}, {Policy: "p", Limit: good, Cost: 1}}}},
		{"scale above one", engine.Request{Subject: "s", Checks: []engine.Check{{Policy: "p", Limit: good, Cost: 1, Scale: 2}}}},
		{"too many policies", engine.Request{Subject: "s", Checks: func() []engine.Check {
			var cs []engine.Check
			for i := range engine.MaxChecks + 1 {
				cs = append(cs, engine.Check{Policy: fmt.Sprint(i), Limit: good, Cost: 1})
			}
			return cs
		}()}},
	}
	for _, sc := range storeCases {
		for _, tt := range tests {
			t.Run(sc.Name+"/"+tt.name, func(t *testing.T) {
				s := sc.New(t, manualclock.New())
				if _, err := s.Check(context.Background(), tt.req); err == nil {
					t.Errorf("Check(%s) = nil error, want one", tt.name)
				}
			})
		}
	}
}

// algorithmSwitchKeepsStateUntilCommit checks that a check under
// another algorithm which is rejected or spends nothing leaves the stored
// state alone, so switching a policy's algorithm back and forth does not
// hand out a fresh bucket.
func algorithmSwitchKeepsStateUntilCommit(t *testing.T, storeCases []Case) {
	for _, sc := range storeCases {
		t.Run(sc.Name, func(t *testing.T) {
			clock := manualclock.New()
			s := sc.New(t, clock)
			tb := engine.Limit{Algorithm: engine.TokenBucket, Rate: 0.001, Burst: 5}
			fw := engine.Limit{Algorithm: engine.FixedWindow, Count: 5, Window: time.Hour}
			MustCheck(t, s, One("sw", "p", tb, 5))
			MustCheck(t, s, One("sw", "p", fw, 0))
			if d := MustCheck(t, s, One("sw", "p", tb, 1)); d.Allowed {
				t.Error("token bucket spent, peeked under another algorithm, then allowed again")
			}
		})
	}
}

// scaledStateOutlivesItsScaledTTL spends part of a bucket at half
// share and reads it at full share after the half-share refill time: the
// state must still be there (its TTL is the full-share refill time).
func scaledStateOutlivesItsScaledTTL(t *testing.T, storeCases []Case) {
	for _, sc := range storeCases {
		t.Run(sc.Name, func(t *testing.T) {
			clock := manualclock.New()
			s := sc.New(t, clock)
			l := engine.Limit{Algorithm: engine.TokenBucket, Rate: 10, Burst: 100}
			req := func(scale float64, cost int64) engine.Request {
				return engine.Request{Subject: "ttl", Checks: []engine.Check{{Policy: "g", Limit: l, Cost: cost, Scale: scale}}}
			}
			MustCheck(t, s, req(0.5, 10)) // 40 of 50 left; refills in 2 s at half share
			clock.Advance(3500 * time.Millisecond)
			d := MustCheck(t, s, req(1, 0))
			if got := d.Results[0].Remaining; got != 75 {
				t.Errorf("remaining at full share 3.5 s later = %d, want 75 (40 + 3.5 s x 10/s)", got)
			}
		})
	}
}

// largeWindowCountsAreExact fills windows of up to 1e12 units, the
// largest valid Count, in large checks and then cost-1 checks, and
// requires every unit of the limit to be admitted, one unit at a time
// where it ends, with the exact remaining count after each check: window
// counts above 2^29 are kept exactly, not rounded to 29 significant bits
// (which counted a cost-1 check there as 2, so that a window of 600 000 000
// admitted about 568 000 000). The sliding window counter is filled again
// half way into the next window, where its previous count weighs half.
func largeWindowCountsAreExact(t *testing.T, storeCases []Case) {
	counts := []struct {
		name         string
		count, scale float64
	}{
		{"600M", 6e8, 1},
		{"1e12-1", 1e12 - 1, 1},
		{"1e12", 1e12, 1},
		{"1e12 at a share of 0.6", 1e12, 0.6}, // a Count with a fraction
	}
	// The counter's window is 1 ms so that its weighting, prev × (w − e)
	// / w, is exact and the expected numbers are plain halves.
	windows := []engine.Limit{
		{Algorithm: engine.FixedWindow, Window: time.Hour},
		{Algorithm: engine.SlidingWindowCounter, Window: time.Millisecond},
	}
	for _, sc := range storeCases {
		for _, wl := range windows {
			for _, cc := range counts {
				t.Run(sc.Name+"/"+wl.Algorithm.String()+"/"+cc.name, func(t *testing.T) {
					clock := manualclock.New()
					clock.Set(clock.Now().Truncate(time.Hour))
					s := sc.New(t, clock)
					l := wl
					l.Count = cc.count
					c := engine.Check{Policy: "p", Limit: l, Scale: cc.scale}
					full := int64(c.Effective().Count)
					spendExactly(t, s, "big", c, full)
					if l.Algorithm == engine.FixedWindow {
						clock.Advance(l.Window)
						spendExactly(t, s, "big", c, full)
						return
					}
					clock.Advance(l.Window + l.Window/2)
					spendExactly(t, s, "big", c, int64(math.Floor(c.Effective().Count-float64(full)/2)))
				})
			}
		}
	}
}

// spendExactly spends the want units c's limit has left for subject, in
// large checks and then ten of cost 1, requiring each to be allowed with
// exactly what is left as remaining, and then that one more unit is
// refused while a cost-0 check is still allowed.
func spendExactly(t *testing.T, s Checker, subject string, c engine.Check, want int64) {
	t.Helper()
	check := func(cost int64) engine.Result {
		c.Cost = cost
		return MustCheck(t, s, engine.Request{Subject: subject, Checks: []engine.Check{c}}).Results[0]
	}
	left := want
	spend := func(cost int64) {
		t.Helper()
		r := check(cost)
		left -= cost
		if !r.Allowed || r.Remaining != left {
			t.Fatalf("Check(cost %d, %d of %d left) = allowed %v, remaining %d; want allowed, remaining %d",
				cost, left+cost, want, r.Allowed, r.Remaining, left)
		}
	}
	big := max(want/8, 100_000_000)
	for left > big+10 {
		spend(big)
	}
	spend(left - 10)
	for left > 0 {
		spend(1)
	}
	if r := check(1); r.Allowed || r.Remaining != 0 {
		t.Errorf("Check(cost 1) after spending all %d = allowed %v, remaining %d; want refused, remaining 0", want, r.Allowed, r.Remaining)
	}
	if r := check(0); !r.Allowed || r.Remaining != 0 {
		t.Errorf("Check(cost 0) after spending all %d = allowed %v, remaining %d; want allowed, remaining 0", want, r.Allowed, r.Remaining)
	}
}

// resetForgetsState spends two policies of one subject and one of
// another, resets one policy of the first, and requires exactly that state
// to read as a subject never seen.
func resetForgetsState(t *testing.T, storeCases []Case) {
	for _, sc := range storeCases {
		t.Run(sc.Name, func(t *testing.T) {
			clock := manualclock.New()
			s := sc.New(t, clock)
			r, ok := s.(interface {
				Reset(ctx context.Context, subject string, policies []string) error
			})
			if !ok {
				t.Fatalf("%T has no Reset", s)
			}
			ctx := context.Background()
			tb := engine.Limit{Algorithm: engine.TokenBucket, Rate: 1, Burst: 5}
			fw := engine.Limit{Algorithm: engine.FixedWindow, Count: 5, Window: time.Hour}
			both := func(sub string, cost int64) engine.Request {
				return engine.Request{Subject: sub, Checks: []engine.Check{{Policy: "a", Limit: tb, Cost: cost}, {Policy: "b", Limit: fw, Cost: cost}}}
			}
			MustCheck(t, s, both("s1", 5))
			MustCheck(t, s, One("s2", "a", tb, 5))
			if err := r.Reset(ctx, "s1", []string{"a", "never-used"}); err != nil {
				t.Fatal(err)
			}
			d := MustCheck(t, s, both("s1", 0))
			if got := d.Results[0].Remaining; got != 5 {
				t.Errorf("s1/a remaining after reset = %d, want 5 (full)", got)
			}
			if got := d.Results[1].Remaining; got != 0 {
				t.Errorf("s1/b remaining = %d, want 0 (not reset)", got)
			}
			if got := MustCheck(t, s, One("s2", "a", tb, 0)).Results[0].Remaining; got != 0 {
				t.Errorf("s2/a remaining = %d, want 0 (another subject)", got)
			}
			if err := r.Reset(ctx, "", []string{"a"}); !errors.Is(err, engine.ErrBadRequest) {
				t.Errorf("Reset of an empty subject = %v, want engine.ErrBadRequest", err)
			}
		})
	}
}
