package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/internal/manualclock"
	"github.com/sluice-rl/sluice/internal/redistest"
)

// TestRedisConformance drives the memory store and the Redis store through
// the same random sequences of checks on the same virtual clock and
// requires identical decisions, every field of every policy's result.
// Sequences mix time steps (zero, tiny, long enough to expire state, and
// small steps backwards), costs (zero, one, up to and beyond what is left
// and beyond the capacity), fractional limits and changes of scale (among
// them a share so small that a subject's first checks are rejected, when a
// token bucket full at it is stored all the same), deposits into token
// buckets (Check.Deposit), for each algorithm
// alone and for several policies per check.
//
// Even seeds keep each policy's scale fixed and take long steps that
// expire state; odd seeds change scales but keep the whole run under a
// second, so no state expires. Both stores expire state after ttl(), and
// past it a missing state decides as the kept one would, unless the scale
// changed in between: a bucket whose share grew (or whose drain slowed)
// after its state expired starts afresh instead of from its old level.
// That is the stores' shared behaviour in production; here the Redis keys
// outlive virtual time (virtualTTLPad), so the two would differ.
func TestRedisConformance(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	const seeds, steps = 40, 200
	kinds := []engine.Algorithm{engine.TokenBucket, engine.LeakyBucket, engine.FixedWindow, engine.SlidingWindowLog, engine.SlidingWindowCounter, 0}
	for _, kind := range kinds {
		name := "mixed"
		if kind != 0 {
			name = kind.String()
		}
		t.Run(name, func(t *testing.T) {
			for seed := range uint64(seeds) {
				rng := rand.New(rand.NewPCG(seed, uint64(kind)))
				clock := manualclock.New()
				clock.Advance(time.Duration(rng.Int64N(int64(24 * time.Hour))))
				mem := engine.NewMemoryStore(engine.MemoryConfig{Clock: clock})
				red := New(client, Config{Timeout: time.Second, Prefix: fmt.Sprintf("conf:%s:%d:", name, seed)})
				setVirtualClock(red, clock)

				n := 1
				if kind == 0 {
					n = 2 + rng.IntN(3)
				}
				checks := make([]engine.Check, n)
				for i := range checks {
					alg := kind
					if alg == 0 {
						alg = engine.Algorithm(1 + rng.IntN(5))
					}
					checks[i] = engine.Check{Policy: fmt.Sprintf("p%d", i), Limit: randomLimit(rng, alg)}
				}
				subjects := []string{"alice", "{bob}", "=carol"}
				rescale := seed%2 == 1
				randomScale := func() float64 {
					return []float64{0, 1, 0.5, 0.001, 0.05 + 0.95*rng.Float64()}[rng.IntN(5)]
				}
				for i := range checks {
					checks[i].Scale = randomScale()
				}
				var history []string
				for step := range steps {
					if rescale {
						clock.Advance(time.Duration(rng.Int64N(int64(5*time.Millisecond))) - time.Millisecond)
					} else {
						clock.Advance(randomStep(rng, checks))
					}
					for i := range checks {
						c := &checks[i]
						if rescale && rng.IntN(20) == 0 {
							c.Scale = randomScale()
						}
						c.Cost = randomCost(rng, c.Effective())
					}
					req := engine.Request{Subject: subjects[rng.IntN(len(subjects))], Checks: append([]engine.Check(nil), checks...)}
					if n == 1 && checks[0].Limit.Algorithm == engine.TokenBucket && rng.IntN(6) == 0 {
						// A deposit: units handed back, up to the burst.
						req.Checks[0].Deposit, req.Checks[0].Cost = true, max(1, req.Checks[0].Cost)
					}
					history = append(history, fmt.Sprintf("step %d at %d µs: %s", step, clock.Now().UnixMicro(), describeRequest(req)))
					dm, errm := mem.Check(context.Background(), req)
					dr, errr := red.Check(context.Background(), req)
					if errm != nil || errr != nil {
						t.Fatalf("seed %d step %d: memory error %v, redis error %v", seed, step, errm, errr)
					}
					if dm != dr {
						tail := history[max(0, len(history)-8):]
						t.Fatalf("seed %d step %d: decisions differ\nmemory %+v\nredis  %+v\nlast steps:\n  %s",
							seed, step, dm, dr, strings.Join(tail, "\n  "))
					}
				}
			}
		})
	}
}

// randomLimit draws a valid limit, often with fractional parameters.
func randomLimit(rng *rand.Rand, alg engine.Algorithm) engine.Limit {
	pick := func(whole, frac float64) float64 {
		if rng.IntN(2) == 0 {
			return float64(1 + rng.IntN(int(whole)))
		}
		return 1 + rng.Float64()*frac
	}
	l := engine.Limit{Algorithm: alg}
	if !alg.Windowed() {
		l.Rate = []float64{0.01 + rng.Float64(), pick(1000, 1000), 1e6 * rng.Float64(), 3}[rng.IntN(4)]
		l.Burst = pick(100, 100)
		return l
	}
	windows := []time.Duration{time.Millisecond, 7 * time.Millisecond, 100 * time.Millisecond, time.Second,
		1500 * time.Millisecond, time.Minute, 24 * time.Hour}
	l.Window = windows[rng.IntN(len(windows))]
	if rng.IntN(3) == 0 {
		l.Window = time.Duration(1+rng.IntN(5000)) * time.Millisecond
	}
	l.Count = pick(200, 200)
	if alg == engine.SlidingWindowLog {
		l.Count = pick(40, 40)
	}
	return l
}

// randomStep draws how far the clock moves before a check: often not at
// all or a little, sometimes a good part of a window or refill, sometimes
// far enough to expire state, sometimes a little backwards.
func randomStep(rng *rand.Rand, checks []engine.Check) time.Duration {
	l := checks[rng.IntN(len(checks))].Limit
	scale := l.Window
	if !l.Algorithm.Windowed() {
		scale = time.Duration(l.Burst / l.Rate * float64(time.Second))
	}
	scale = max(scale, time.Microsecond)
	switch r := rng.IntN(20); {
	case r < 5:
		return 0
	case r < 10:
		return time.Duration(rng.Int64N(int64(time.Millisecond)))
	case r < 16:
		return time.Duration(rng.Int64N(int64(scale)/4 + 1))
	case r < 18:
		return time.Duration(rng.Int64N(int64(2*scale) + 1))
	case r < 19:
		return scale*3 + time.Duration(rng.Int64N(int64(5*time.Second)))
	default:
		return -time.Duration(rng.Int64N(int64(5 * time.Millisecond)))
	}
}

// randomCost draws a cost for the effective limit: zero, one, anything up
// to its capacity, and now and then more than the capacity.
func randomCost(rng *rand.Rand, l engine.Limit) int64 {
	capacity := int64(l.Capacity())
	switch r := rng.IntN(20); {
	case r < 3:
		return 0
	case r < 11:
		return 1
	case r < 19:
		return 1 + rng.Int64N(max(capacity, 1))
	default:
		return capacity + 1 + rng.Int64N(3)
	}
}

func describeRequest(req engine.Request) string {
	var b strings.Builder
	fmt.Fprintf(&b, "subject %q", req.Subject)
	for _, c := range req.Checks {
		l := c.Limit
		fmt.Fprintf(&b, "; %s %s rate %v burst %v count %v window %v cost %d scale %v",
			c.Policy, l.Algorithm, l.Rate, l.Burst, l.Count, l.Window, c.Cost, c.Scale)
	}
	return b.String()
}
