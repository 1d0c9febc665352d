package storetest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/internal/manualclock"
)

// spanTests are Run's tests of requests whose checks name subjects of
// their own (engine.Check.Subject), which a Redis Cluster refuses.
var spanTests = []struct {
	name string
	run  func(*testing.T, []Case)
}{
	{"ChecksOfOtherSubjectsSpendTheirOwnState", checksOfOtherSubjectsSpendTheirOwnState},
	{"ChecksAcrossSubjectsAllOrNothing", checksAcrossSubjectsAllOrNothing},
	{"ChecksAcrossSubjectsAtomicUnderConcurrency", checksAcrossSubjectsAtomicUnderConcurrency},
	{"ChargeAcrossSubjects", chargeAcrossSubjects},
}

// spanning is a request of subject "domain" with one check of policy p
// under each of subjects.
func spanning(l engine.Limit, cost int64, subjects ...string) engine.Request {
	req := engine.Request{Subject: "domain"}
	for _, s := range subjects {
		req.Checks = append(req.Checks, engine.Check{Policy: "p", Limit: l, Cost: cost, Subject: s})
	}
	return req
}

// remaining reads subject's state under policy p without spending.
func remaining(t *testing.T, s Checker, subject string, l engine.Limit) int64 {
	t.Helper()
	return MustCheck(t, s, One(subject, "p", l, 0)).Results[0].Remaining
}

// A check naming a subject spends that subject's state, the same one a
// request of that subject reads; a check naming none, the request's.
func checksOfOtherSubjectsSpendTheirOwnState(t *testing.T, storeCases []Case) {
	for _, sc := range storeCases {
		t.Run(sc.Name, func(t *testing.T) {
			s := sc.New(t, manualclock.New())
			l := engine.Limit{Algorithm: engine.FixedWindow, Count: 10, Window: time.Hour}
			req := engine.Request{Subject: "domain", Checks: []engine.Check{
				{Policy: "p", Limit: l, Cost: 1, Subject: "a"},
				{Policy: "p", Limit: l, Cost: 2, Subject: "b"},
				{Policy: "q", Limit: l, Cost: 3},
			}}
			if d := MustCheck(t, s, req); !d.Allowed {
				t.Fatalf("first request rejected: %+v", d.Policies())
			}
			for subject, want := range map[string]int64{"a": 9, "b": 8, "domain": 10} {
				if got := remaining(t, s, subject, l); got != want {
					t.Errorf("%s's p: remaining %d, want %d", subject, got, want)
				}
			}
			if got := MustCheck(t, s, One("domain", "q", l, 0)).Results[0].Remaining; got != 7 {
				t.Errorf("domain's q: remaining %d, want 7", got)
			}
		})
	}
}

// A request spanning subjects is decided as one: when one subject's state
// rejects, no other subject's is spent.
func checksAcrossSubjectsAllOrNothing(t *testing.T, storeCases []Case) {
	for _, sc := range storeCases {
		for _, l := range AlgorithmLimits {
			t.Run(sc.Name+"/"+l.Algorithm.String(), func(t *testing.T) {
				s := sc.New(t, manualclock.New()) // frozen: nothing refills
				subjects := make([]string, 8)     // enough to fall in several shards
				for i := range subjects {
					subjects[i] = fmt.Sprintf("s%d", i)
				}
				capacity := int64(l.Capacity())
				// The last subject is nearly spent beforehand.
				last := subjects[len(subjects)-1]
				for range capacity - 2 {
					if d := MustCheck(t, s, One(last, "p", l, 1)); !d.Allowed {
						t.Fatalf("spending %s beforehand: rejected", last)
					}
				}
				for i := range 2 {
					if d := MustCheck(t, s, spanning(l, 1, subjects...)); !d.Allowed {
						t.Fatalf("spanning request %d rejected with %d left on %s", i, 2-i, last)
					}
				}
				for range 5 {
					d := MustCheck(t, s, spanning(l, 1, subjects...))
					if d.Allowed {
						t.Fatalf("spanning request allowed with %s spent", last)
					}
					if d.Decider != len(subjects)-1 {
						t.Fatalf("Decider = %d, want %d (%s)", d.Decider, len(subjects)-1, last)
					}
				}
				for _, sub := range subjects[:len(subjects)-1] {
					if got := remaining(t, s, sub, l); got != capacity-2 {
						t.Errorf("%s: remaining %d after 2 admitted and 5 rejected, want %d", sub, got, capacity-2)
					}
				}
			})
		}
	}
}

// Concurrent requests over the same subjects, named in opposite orders,
// neither deadlock nor split: every subject ends with exactly the
// admissions the requests were told of.
func checksAcrossSubjectsAtomicUnderConcurrency(t *testing.T, storeCases []Case) {
	for _, sc := range storeCases {
		t.Run(sc.Name, func(t *testing.T) {
			s := sc.New(t, manualclock.New())
			l := engine.Limit{Algorithm: engine.TokenBucket, Rate: 1, Burst: 50}
			forward := []string{"x0", "x1", "x2", "x3", "x4", "x5"}
			backward := []string{"x5", "x4", "x3", "x2", "x1", "x0"}
			var admitted atomic.Int64
			var wg sync.WaitGroup
			for g := range 32 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					subjects := forward
					if g%2 == 1 {
						subjects = backward
					}
					for range 10 {
						d, err := s.Check(context.Background(), spanning(l, 1, subjects...))
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
			if got := admitted.Load(); got != 50 {
				t.Errorf("32 goroutines x 10 spanning checks admitted %d, want exactly 50", got)
			}
			for _, sub := range forward {
				if got := remaining(t, s, sub, l); got != 0 {
					t.Errorf("%s: remaining %d, want 0 (every admission spent every subject)", sub, got)
				}
			}
		})
	}
}

// A charge after the fact may span subjects too: each check charges its
// own subject's state.
func chargeAcrossSubjects(t *testing.T, storeCases []Case) {
	for _, sc := range storeCases {
		t.Run(sc.Name, func(t *testing.T) {
			clock := manualclock.New()
			ch := charging(t, sc, clock)
			l := engine.Limit{Algorithm: engine.FixedWindow, Count: 10, Window: time.Hour}
			req := engine.ChargeRequest{Subject: "domain", Checks: []engine.Check{
				{Policy: "p", Limit: l, Cost: 4, Subject: "a"},
				{Policy: "p", Limit: l, Cost: 12, Subject: "b"},
			}}
			d := MustCharge(t, ch, req)
			if d.Allowed || d.Results[0].Remaining != 6 || d.Results[1].Remaining != 0 {
				t.Errorf("charge of 4 on a and 12 on b of 10: %+v, want a within (6 left) and b over", d.Policies())
			}
			if got := remaining(t, ch, "a", l); got != 6 {
				t.Errorf("a: remaining %d, want 6", got)
			}
			if d := MustCheck(t, ch, One("b", "p", l, 1)); d.Allowed {
				t.Errorf("b after a charge of 12 of 10: a check allowed, want rejected")
			}
			if _, err := ch.Charge(context.Background(), engine.ChargeRequest{Subject: "domain", Reservation: "r1", Checks: req.Checks}); err == nil {
				t.Errorf("a settlement spanning subjects: no error, want one (a reservation is of one subject)")
			}
		})
	}
}
