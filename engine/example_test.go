package engine_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-rl/sluice/engine"
)

// fixedClock stands still, so the example's output does not depend on when
// it runs.
type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time { return c.t }

func ExampleMemoryStore_Check() {
	store := engine.NewMemoryStore(engine.MemoryConfig{Clock: fixedClock{time.Unix(1_700_000_000, 0)}})
	req := engine.Request{
		Subject: "key:8f2a",
		Checks: []engine.Check{
			{Policy: "burst", Limit: engine.Limit{Algorithm: engine.TokenBucket, Rate: 1, Burst: 3}, Cost: 1},
			{Policy: "daily", Limit: engine.Limit{Algorithm: engine.FixedWindow, Count: 1000, Window: 24 * time.Hour}, Cost: 1},
		},
	}
	for range 4 {
		d, err := store.Check(context.Background(), req)
		if err != nil {
			fmt.Println(err)
			return
		}
		burst, daily := d.Results[0], d.Results[1]
		fmt.Printf("allowed=%v burst.remaining=%d daily.remaining=%d retry=%v\n",
			d.Allowed, burst.Remaining, daily.Remaining, d.RetryAfter())
	}
	// Output:
	// allowed=true burst.remaining=2 daily.remaining=999 retry=0s
	// allowed=true burst.remaining=1 daily.remaining=998 retry=0s
	// allowed=true burst.remaining=0 daily.remaining=997 retry=0s
	// allowed=false burst.remaining=0 daily.remaining=997 retry=1s
}

func ExampleDecide() {
	l := engine.Limit{Algorithm: engine.SlidingWindowCounter, Count: 100, Window: time.Minute}
	// 80 units in the previous minute, 30 in this one, 15 s into it:
	// the estimate is 30 + 80 × 45/60 = 90, so 10 more fit.
	start := time.Unix(1_700_000_040, 0) // a minute boundary
	st := engine.State{A: 30, B: 80, T: start.UnixMicro()}
	_, r := engine.Decide(start.Add(15*time.Second), st, l, 10)
	fmt.Println(r.Allowed, r.Remaining)
	_, r = engine.Decide(start.Add(15*time.Second), st, l, 11)
	fmt.Println(r.Allowed, r.RetryAfter)
	// Output:
	// true 0
	// false 750ms
}

func ExampleLimit_Scale() {
	global := engine.Limit{Algorithm: engine.TokenBucket, Rate: 300, Burst: 600}
	share := global.Scale(0.5) // this region enforces half the global limit
	fmt.Println(share.Rate, share.Burst)
	// Output: 150 300
}
