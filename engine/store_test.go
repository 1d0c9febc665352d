package engine

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/manualclock"
)

// checker is what the tests of this package drive; the tests every store
// must pass are in engine/storetest (stores_test.go runs them here).
type checker interface {
	Check(ctx context.Context, req Request) (Decision, error)
}

var algorithmLimits = []Limit{
	{Algorithm: TokenBucket, Rate: 100, Burst: 10},
	{Algorithm: LeakyBucket, Rate: 100, Burst: 10},
	{Algorithm: FixedWindow, Count: 100, Window: time.Second},
	{Algorithm: SlidingWindowLog, Count: 100, Window: time.Second},
	{Algorithm: SlidingWindowCounter, Count: 100, Window: time.Second},
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

// TestLeakyMeterEqualsTokenBucket pins down what docs/algorithms.md tells
// users: the leaky bucket as a meter admits exactly what a token bucket
// of the same rate and burst admits (its level is the bucket's missing
// tokens); only the way one thinks of it differs.
func TestLeakyMeterEqualsTokenBucket(t *testing.T) {
	clock := manualclock.New()
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
