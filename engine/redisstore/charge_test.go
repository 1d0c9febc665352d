package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/engine/storetest"
	"github.com/sluice-rl/sluice/internal/manualclock"
	"github.com/sluice-rl/sluice/internal/redistest"
)

// TestRedisClusterCharges holds the Redis store on a Cluster to the
// charge semantics every store shares: a charge and its reservation live
// under the subject's hash tag, so one call reaches one node.
func TestRedisClusterCharges(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	client := cl.Client(t)
	var n atomic.Int64
	storetest.RunCharges(t, storetest.Case{Name: "cluster", New: func(t *testing.T, clock engine.Clock) storetest.Checker {
		s := New(client, Config{Timeout: time.Second, Prefix: fmt.Sprintf("charge%d:", n.Add(1))})
		setVirtualClock(s, clock)
		return s
	}})
}

// TestRedisChargeConformance drives the memory store and the Redis store
// through the same random checks, charges, reservations and settlements
// of several policies of every chargeable algorithm on one virtual clock,
// and requires the same results and the same errors at every step.
func TestRedisChargeConformance(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	ctx := context.Background()
	for seed := range uint64(12) {
		rng := rand.New(rand.NewPCG(seed, 28))
		clock := manualclock.New()
		clock.Advance(time.Duration(rng.Int64N(int64(24 * time.Hour))))
		mem := engine.NewMemoryStore(engine.MemoryConfig{Clock: clock})
		red := New(client, Config{Timeout: time.Second, Prefix: fmt.Sprintf("chconf:%d:", seed)})
		setVirtualClock(red, clock)
		algs := []engine.Algorithm{engine.TokenBucket, engine.LeakyBucket, engine.FixedWindow, engine.SlidingWindowCounter}
		checks := make([]engine.Check, 1+rng.IntN(3))
		for i := range checks {
			checks[i] = engine.Check{Policy: fmt.Sprint("p", i), Limit: randomLimit(rng, algs[rng.IntN(len(algs))])}
		}
		for step := range 200 {
			clock.Advance(randomStep(rng, checks))
			for i := range checks {
				checks[i].Cost = randomCost(rng, checks[i].Limit) * int64(1+rng.IntN(3))
			}
			id := fmt.Sprint("r", rng.IntN(3))
			var dm, dr engine.Decision
			var em, er error
			switch rng.IntN(4) {
			case 0:
				req := engine.Request{Subject: "s", Checks: checks}
				for i := range checks {
					checks[i].Cost = randomCost(rng, checks[i].Limit)
				}
				dm, em = mem.Check(ctx, req)
				dr, er = red.Check(ctx, req)
			case 1:
				req := engine.ChargeRequest{Subject: "s", Checks: checks}
				dm, em = mem.Charge(ctx, req)
				dr, er = red.Charge(ctx, req)
			case 2:
				ttl := time.Duration(1+rng.IntN(2000)) * time.Millisecond
				held := checks[:1+rng.IntN(len(checks))]
				em = mem.Reserve(ctx, "s", id, held, ttl)
				er = red.Reserve(ctx, "s", id, held, ttl)
			default:
				req := engine.ChargeRequest{Subject: "s", Checks: checks, Reservation: id}
				dm, em = mem.Charge(ctx, req)
				dr, er = red.Charge(ctx, req)
			}
			if (em == nil) != (er == nil) || (em != nil && errors.Is(em, engine.ErrUnknownReservation) != errors.Is(er, engine.ErrUnknownReservation)) {
				t.Fatalf("seed %d step %d: errors differ: memory %v, redis %v", seed, step, em, er)
			}
			if dm != dr {
				t.Fatalf("seed %d step %d: decisions differ\nmemory %+v\nredis  %+v", seed, step, dm, dr)
			}
		}
	}
}

// TestChargeScriptSplicesRedisParts checks that the charge script runs
// redis.lua's own text of the state layout: every marker is replaced, and
// each shared part appears once, as redis.lua has it.
func TestChargeScriptSplicesRedisParts(t *testing.T) {
	for line := range strings.Lines(chargeScript) {
		if strings.HasPrefix(line, "-- <shared:") {
			t.Fatalf("chargeScript still holds the marker %q", line)
		}
	}
	for _, name := range []string{"clock", "buckets", "counts", "codec", "refill", "drain", "windows"} {
		_, rest, _ := strings.Cut(redisScript, "-- <shared: "+name+">\n")
		part, _, ok := strings.Cut(rest, "-- </shared: "+name+">\n")
		if !ok || part == "" {
			t.Fatalf("redis.lua has no shared part %q", name)
		}
		if n := strings.Count(chargeScript, part); n != 1 {
			t.Errorf("chargeScript holds redis.lua's %q part %d times, want 1", name, n)
		}
	}
	for _, fn := range []string{"local function load(", "local function encode(", "local function ttl(", "local function stored_count(",
		"local function refill(", "local function drain(", "local function fixed_roll(", "local function sliding_roll("} {
		if n := strings.Count(chargeScript, fn); n != 1 {
			t.Errorf("chargeScript defines %q %d times, want 1", fn, n)
		}
	}
}
