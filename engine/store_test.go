package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// manualClock is virtual time for tests: it moves only when told.
type manualClock struct {
	mu sync.Mutex
	t  time.Time
}

func newManualClock() *manualClock {
	return &manualClock{t: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)}
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func (c *manualClock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

// checker is what the store-independent tests drive.
type checker interface {
	Check(ctx context.Context, req Request) (Decision, error)
}

// storeCase builds a fresh, empty store whose time comes from clock.
type storeCase struct {
	name string
	new  func(t *testing.T, clock Clock) checker
}

// storeCases lists every store the shared tests run against; the Redis
// store adds itself in redis_test.go.
var storeCases = []storeCase{
	{"memory", func(t *testing.T, clock Clock) checker {
		return NewMemoryStore(MemoryConfig{Clock: clock})
	}},
}

var algorithmLimits = []Limit{
	{Algorithm: TokenBucket, Rate: 100, Burst: 10},
	{Algorithm: LeakyBucket, Rate: 100, Burst: 10},
	{Algorithm: FixedWindow, Count: 100, Window: time.Second},
	{Algorithm: SlidingWindowLog, Count: 100, Window: time.Second},
	{Algorithm: SlidingWindowCounter, Count: 100, Window: time.Second},
}

// allowance is what a limit admits over d of steady overload starting on a
// window boundary.
func allowance(l Limit, d time.Duration) float64 {
	if l.Algorithm.Windowed() {
		return l.Count * float64(d) / float64(l.Window)
	}
	return l.Burst + l.Rate*d.Seconds()
}

func mustCheck(t *testing.T, s checker, req Request) Decision {
	t.Helper()
	d, err := s.Check(context.Background(), req)
	if err != nil {
		t.Fatalf("Check(%+v): %v", req, err)
	}
	return d
}

func one(subject, policy string, l Limit, cost int64) Request {
	return Request{Subject: subject, Checks: []Check{{Policy: policy, Limit: l, Cost: cost}}}
}

func TestAccuracyUnderSteadyOverload(t *testing.T) {
	for _, sc := range storeCases {
		for _, l := range algorithmLimits {
			t.Run(sc.name+"/"+l.Algorithm.String(), func(t *testing.T) {
				clock := newManualClock()
				s := sc.new(t, clock)
				const dur = 60 * time.Second
				want := allowance(l, dur)
				offered := 2 * want / dur.Seconds() // units per second
				step := time.Duration(float64(time.Second) / offered)
				admitted := 0
				for el := time.Duration(0); el < dur; el += step {
					if mustCheck(t, s, one("alice", "p", l, 1)).Allowed {
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

// TestFixedWindowEdgeBurst documents the fixed window's known weakness: a
// client that spends the whole limit at the end of one window and again at
// the start of the next gets twice the limit within one window's length.
func TestFixedWindowEdgeBurst(t *testing.T) {
	for _, sc := range storeCases {
		t.Run(sc.name, func(t *testing.T) {
			clock := newManualClock()
			s := sc.new(t, clock)
			l := Limit{Algorithm: FixedWindow, Count: 100, Window: time.Minute}
			clock.Advance(59*time.Second + 900*time.Millisecond) // 100 ms before the boundary
			admitted := 0
			for range 100 {
				if mustCheck(t, s, one("edge", "p", l, 1)).Allowed {
					admitted++
				}
			}
			clock.Advance(200 * time.Millisecond) // 100 ms after it
			for range 100 {
				if mustCheck(t, s, one("edge", "p", l, 1)).Allowed {
					admitted++
				}
			}
			if admitted != 200 {
				t.Errorf("admitted %d within 200 ms across a window edge, want 200 (2x the limit of 100)", admitted)
			}
			// The sliding window counter on the same traffic does not.
			lc := Limit{Algorithm: SlidingWindowCounter, Count: 100, Window: time.Minute}
			clock.Advance(time.Hour)
			clock.Set(clock.Now().Truncate(time.Minute).Add(59*time.Second + 900*time.Millisecond))
			admitted = 0
			for range 100 {
				if mustCheck(t, s, one("edge", "pc", lc, 1)).Allowed {
					admitted++
				}
			}
			clock.Advance(200 * time.Millisecond)
			for range 100 {
				if mustCheck(t, s, one("edge", "pc", lc, 1)).Allowed {
					admitted++
				}
			}
			if admitted > 101 {
				t.Errorf("sliding window counter admitted %d across the edge, want about 100", admitted)
			}
		})
	}
}

func TestAtomicUnderConcurrency(t *testing.T) {
	for _, sc := range storeCases {
		for _, l := range algorithmLimits {
			t.Run(sc.name+"/"+l.Algorithm.String(), func(t *testing.T) {
				clock := newManualClock() // frozen: nothing refills
				s := sc.new(t, clock)
				limit := int64(l.Capacity())
				var admitted atomic.Int64
				var wg sync.WaitGroup
				for g := 0; g < 64; g++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range 10 {
							d, err := s.Check(context.Background(), one("hot", "p", l, 1))
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

func TestRejectedMultiPolicyCheckConsumesNothing(t *testing.T) {
	for _, sc := range storeCases {
		t.Run(sc.name, func(t *testing.T) {
			clock := newManualClock()
			s := sc.new(t, clock)
			burst := Limit{Algorithm: TokenBucket, Rate: 1, Burst: 5}
			daily := Limit{Algorithm: FixedWindow, Count: 1000, Window: 24 * time.Hour}
			req := Request{Subject: "bob", Checks: []Check{
				{Policy: "daily", Limit: daily, Cost: 1},
				{Policy: "burst", Limit: burst, Cost: 1},
			}}
			for i := range 5 {
				if d := mustCheck(t, s, req); !d.Allowed {
					t.Fatalf("check %d rejected, want allowed", i)
				}
			}
			for range 50 {
				d := mustCheck(t, s, req)
				if d.Allowed {
					t.Fatal("check past the burst allowed")
				}
				if d.Decider != 1 {
					t.Fatalf("Decider = %d, want 1 (burst)", d.Decider)
				}
			}
			// Read the daily quota without spending.
			peek := mustCheck(t, s, Request{Subject: "bob", Checks: []Check{{Policy: "daily", Limit: daily, Cost: 0}}})
			if got := peek.Results[0].Remaining; got != 995 {
				t.Errorf("daily remaining after 5 allowed and 50 rejected = %d, want 995", got)
			}
		})
	}
}

func TestRetryAfterIsHonest(t *testing.T) {
	for _, sc := range storeCases {
		for _, l := range algorithmLimits {
			t.Run(sc.name+"/"+l.Algorithm.String(), func(t *testing.T) {
				clock := newManualClock()
				clock.Advance(333 * time.Millisecond)
				s := sc.new(t, clock)
				for i := range 200 {
					cost := int64(1 + i%3)
					d := mustCheck(t, s, one("r", "p", l, cost))
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
						if mustCheck(t, s, one("r", "p", l, 0)).Results[0].Remaining >= cost && l.Algorithm != SlidingWindowCounter {
							t.Fatalf("RetryAfter %v too long: cost %d fits 1ms earlier", retry, cost)
						}
						clock.Advance(time.Millisecond)
					} else {
						clock.Advance(retry)
					}
					if d2 := mustCheck(t, s, one("r", "p", l, cost)); !d2.Allowed {
						t.Fatalf("check %d: rejected again after waiting RetryAfter %v (new retry %v)", i, retry, d2.RetryAfter())
					}
				}
			})
		}
	}
}

func TestScaleChangesWithoutReset(t *testing.T) {
	for _, sc := range storeCases {
		t.Run(sc.name, func(t *testing.T) {
			clock := newManualClock()
			s := sc.new(t, clock)
			l := Limit{Algorithm: TokenBucket, Rate: 10, Burst: 100}
			req := func(scale float64) Request {
				return Request{Subject: "g", Checks: []Check{{Policy: "global", Limit: l, Cost: 1, Scale: scale}}}
			}
			for range 30 {
				mustCheck(t, s, req(0.5)) // capacity 50: 30 spent, 20 left
			}
			d := mustCheck(t, s, req(0.25)) // capacity 25: still 20 left, so 19 after
			if got := d.Results[0].Remaining; got != 19 {
				t.Errorf("remaining after shrinking the share = %d, want 19 (state kept, not reset)", got)
			}
			if got := d.Results[0].Limit; got != 25 {
				t.Errorf("limit at scale 0.25 = %d, want 25", got)
			}
		})
	}
}

// TestRaisedScaleAfterRejectionsAdmitsTheRate covers a region whose share
// of a global limit is too small for a check's cost (it lent the share
// away): it rejects a subject's first checks, then the share is raised and
// the subject is offered ten times the rate. Over the following interval
// a token bucket admits at most the rate × interval plus what it held at
// the small share, not a full burst at the new one: the rejected checks
// stored a full bucket at the small share, refilled from there. For the
// other algorithms a fresh state reads as empty (nothing kept could grant
// more), so the rejected subject admits no more than one never seen.
func TestRaisedScaleAfterRejectionsAdmitsTheRate(t *testing.T) {
	const (
		small    = 0.001
		interval = time.Second
		step     = time.Millisecond
	)
	limits := []Limit{
		{Algorithm: TokenBucket, Rate: 100, Burst: 50},
		{Algorithm: LeakyBucket, Rate: 100, Burst: 50},
		{Algorithm: FixedWindow, Count: 100, Window: time.Second},
		{Algorithm: SlidingWindowLog, Count: 100, Window: time.Second},
		{Algorithm: SlidingWindowCounter, Count: 100, Window: time.Second},
	}
	for _, sc := range storeCases {
		for _, l := range limits {
			t.Run(sc.name+"/"+l.Algorithm.String(), func(t *testing.T) {
				clock := newManualClock()
				clock.Advance(250 * time.Millisecond) // off any window boundary
				s := sc.new(t, clock)
				req := func(subject string, scale float64) Request {
					return Request{Subject: subject, Checks: []Check{{Policy: "global", Limit: l, Cost: 1, Scale: scale}}}
				}
				// Rejected at the small share: first as a subject never
				// seen, then as one the store holds.
				for range 2 {
					if d := mustCheck(t, s, req("alice", small)); d.Allowed {
						t.Fatalf("Check(cost 1, scale %v) = allowed, want rejected", small)
					}
					clock.Advance(500 * time.Millisecond)
				}
				mustCheck(t, s, req("alice", small))
				admitted := map[string]int{}
				for el := time.Duration(0); el < interval; el += step {
					for _, subject := range []string{"alice", "bob"} {
						if mustCheck(t, s, req(subject, 1)).Allowed {
							admitted[subject]++
						}
					}
					clock.Advance(step)
				}
				bound := float64(admitted["bob"]) // bob: never seen before the raise
				if l.Algorithm == TokenBucket {
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

func TestCheckRejectsBadRequests(t *testing.T) {
	good := Limit{Algorithm: TokenBucket, Rate: 1, Burst: 1}
	tests := []struct {
		name string
		req  Request
	}{
		{"empty subject", Request{Checks: []Check{{Policy: "p", Limit: good, Cost: 1}}}},
		{"no policy name", Request{Subject: "s", Checks: []Check{{Limit: good, Cost: 1}}}},
		{"negative cost", Request{Subject: "s", Checks: []Check{{Policy: "p", Limit: good, Cost: -1}}}},
		{"invalid limit", Request{Subject: "s", Checks: []Check{{Policy: "p", Limit: Limit{Algorithm: TokenBucket}, Cost: 1}}}},
		{"duplicate policy", Request{Subject: "s", Checks: []Check{{Policy: "p", Limit: good, Cost: 1}, {Policy: "p", Limit: good, Cost: 1}}}},
		{"scale above one", Request{Subject: "s", Checks: []Check{{Policy: "p", Limit: good, Cost: 1, Scale: 2}}}},
		{"too many policies", Request{Subject: "s", Checks: func() []Check {
			var cs []Check
			for i := range MaxChecks + 1 {
				cs = append(cs, Check{Policy: fmt.Sprint(i), Limit: good, Cost: 1})
			}
			return cs
		}()}},
	}
	for _, sc := range storeCases {
		for _, tt := range tests {
			t.Run(sc.name+"/"+tt.name, func(t *testing.T) {
				s := sc.new(t, newManualClock())
				if _, err := s.Check(context.Background(), tt.req); err == nil {
					t.Errorf("Check(%s) = nil error, want one", tt.name)
				}
			})
		}
	}
}

// TestAlgorithmSwitchKeepsStateUntilCommit checks that a check under
// another algorithm which is rejected or spends nothing leaves the stored
// state alone, so switching a policy's algorithm back and forth does not
// hand out a fresh bucket.
func TestAlgorithmSwitchKeepsStateUntilCommit(t *testing.T) {
	for _, sc := range storeCases {
		t.Run(sc.name, func(t *testing.T) {
			clock := newManualClock()
			s := sc.new(t, clock)
			tb := Limit{Algorithm: TokenBucket, Rate: 0.001, Burst: 5}
			fw := Limit{Algorithm: FixedWindow, Count: 5, Window: time.Hour}
			mustCheck(t, s, one("sw", "p", tb, 5))
			mustCheck(t, s, one("sw", "p", fw, 0))
			if d := mustCheck(t, s, one("sw", "p", tb, 1)); d.Allowed {
				t.Error("token bucket spent, peeked under another algorithm, then allowed again")
			}
		})
	}
}

// TestScaledStateOutlivesItsScaledTTL spends part of a bucket at half
// share and reads it at full share after the half-share refill time: the
// state must still be there (its TTL is the full-share refill time).
func TestScaledStateOutlivesItsScaledTTL(t *testing.T) {
	for _, sc := range storeCases {
		t.Run(sc.name, func(t *testing.T) {
			clock := newManualClock()
			s := sc.new(t, clock)
			l := Limit{Algorithm: TokenBucket, Rate: 10, Burst: 100}
			req := func(scale float64, cost int64) Request {
				return Request{Subject: "ttl", Checks: []Check{{Policy: "g", Limit: l, Cost: cost, Scale: scale}}}
			}
			mustCheck(t, s, req(0.5, 10)) // 40 of 50 left; refills in 2 s at half share
			clock.Advance(3500 * time.Millisecond)
			d := mustCheck(t, s, req(1, 0))
			if got := d.Results[0].Remaining; got != 75 {
				t.Errorf("remaining at full share 3.5 s later = %d, want 75 (40 + 3.5 s x 10/s)", got)
			}
		})
	}
}

// TestLeakyMeterEqualsTokenBucket pins down what docs/algorithms.md tells
// users: the leaky bucket as a meter admits exactly what a token bucket
// of the same rate and burst admits (its level is the bucket's missing
// tokens); only the way one thinks of it differs.
func TestLeakyMeterEqualsTokenBucket(t *testing.T) {
	clock := newManualClock()
	s := NewMemoryStore(MemoryConfig{Clock: clock})
	tb := Limit{Algorithm: TokenBucket, Rate: 7, Burst: 15}
	lb := Limit{Algorithm: LeakyBucket, Rate: 7, Burst: 15}
	for i := range 5000 {
		cost := int64(1 + i%4)
		a := mustCheck(t, s, one("tb", "p", tb, cost))
		b := mustCheck(t, s, one("lb", "p", lb, cost))
		if a.Allowed != b.Allowed {
			t.Fatalf("check %d: token bucket allowed=%v, leaky bucket allowed=%v", i, a.Allowed, b.Allowed)
		}
		clock.Advance(time.Duration(i%97) * time.Millisecond)
	}
}

// TestLargeWindowCountsAreExact fills windows of up to 1e12 units, the
// largest valid Count, in large checks and then cost-1 checks, and
// requires every unit of the limit to be admitted, one unit at a time
// where it ends, with the exact remaining count after each check: window
// counts above 2^29 are kept exactly, not rounded to 29 significant bits
// (which counted a cost-1 check there as 2, so that a window of 600 000 000
// admitted about 568 000 000). The sliding window counter is filled again
// half way into the next window, where its previous count weighs half.
func TestLargeWindowCountsAreExact(t *testing.T) {
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
	windows := []Limit{
		{Algorithm: FixedWindow, Window: time.Hour},
		{Algorithm: SlidingWindowCounter, Window: time.Millisecond},
	}
	for _, sc := range storeCases {
		for _, wl := range windows {
			for _, cc := range counts {
				t.Run(sc.name+"/"+wl.Algorithm.String()+"/"+cc.name, func(t *testing.T) {
					clock := newManualClock()
					clock.Set(clock.Now().Truncate(time.Hour))
					s := sc.new(t, clock)
					l := wl
					l.Count = cc.count
					c := Check{Policy: "p", Limit: l, Scale: cc.scale}
					full := int64(c.effective().Count)
					spendExactly(t, s, "big", c, full)
					if l.Algorithm == FixedWindow {
						clock.Advance(l.Window)
						spendExactly(t, s, "big", c, full)
						return
					}
					clock.Advance(l.Window + l.Window/2)
					spendExactly(t, s, "big", c, int64(math.Floor(c.effective().Count-float64(full)/2)))
				})
			}
		}
	}
}

// spendExactly spends the want units c's limit has left for subject, in
// large checks and then ten of cost 1, requiring each to be allowed with
// exactly what is left as remaining, and then that one more unit is
// refused while a cost-0 check is still allowed.
func spendExactly(t *testing.T, s checker, subject string, c Check, want int64) {
	t.Helper()
	check := func(cost int64) Result {
		c.Cost = cost
		return mustCheck(t, s, Request{Subject: subject, Checks: []Check{c}}).Results[0]
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

// TestResetForgetsState spends two policies of one subject and one of
// another, resets one policy of the first, and requires exactly that state
// to read as a subject never seen.
func TestResetForgetsState(t *testing.T) {
	for _, sc := range storeCases {
		t.Run(sc.name, func(t *testing.T) {
			clock := newManualClock()
			s := sc.new(t, clock)
			r, ok := s.(interface {
				Reset(ctx context.Context, subject string, policies []string) error
			})
			if !ok {
				t.Fatalf("%T has no Reset", s)
			}
			ctx := context.Background()
			tb := Limit{Algorithm: TokenBucket, Rate: 1, Burst: 5}
			fw := Limit{Algorithm: FixedWindow, Count: 5, Window: time.Hour}
			both := func(sub string, cost int64) Request {
				return Request{Subject: sub, Checks: []Check{{Policy: "a", Limit: tb, Cost: cost}, {Policy: "b", Limit: fw, Cost: cost}}}
			}
			mustCheck(t, s, both("s1", 5))
			mustCheck(t, s, one("s2", "a", tb, 5))
			if err := r.Reset(ctx, "s1", []string{"a", "never-used"}); err != nil {
				t.Fatal(err)
			}
			d := mustCheck(t, s, both("s1", 0))
			if got := d.Results[0].Remaining; got != 5 {
				t.Errorf("s1/a remaining after reset = %d, want 5 (full)", got)
			}
			if got := d.Results[1].Remaining; got != 0 {
				t.Errorf("s1/b remaining = %d, want 0 (not reset)", got)
			}
			if got := mustCheck(t, s, one("s2", "a", tb, 0)).Results[0].Remaining; got != 0 {
				t.Errorf("s2/a remaining = %d, want 0 (another subject)", got)
			}
			if err := r.Reset(ctx, "", []string{"a"}); !errors.Is(err, ErrBadRequest) {
				t.Errorf("Reset of an empty subject = %v, want ErrBadRequest", err)
			}
		})
	}
}
