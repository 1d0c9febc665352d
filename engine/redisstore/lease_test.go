package redisstore

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/engine/limiter"
	"github.com/sluice-rl/sluice/engine/storetest"
	"github.com/sluice-rl/sluice/internal/manualclock"
	"github.com/sluice-rl/sluice/internal/redistest"
)

// leasePartner is a partner key of 50 000/s with a tenth of a second of
// burst, leased in slices of at most 5 000 tokens.
var leasePartner = engine.Check{Policy: "partner", Limit: engine.Limit{Algorithm: engine.TokenBucket, Rate: 50_000, Burst: 5_000}, Lease: 5_000, Version: 1}

var redisLeaseBound = storetest.LeaseBound{
	Slice:     int64(leasePartner.Limit.Rate * limiter.LeasePeriod.Seconds()),
	TakeBurst: limiter.LeaseTakeBurst, Interval: limiter.LeaseInterval, Lifetime: limiter.LeaseLifetime, Margin: time.Millisecond,
}

// newLeaseRedis is a limiter over a Redis store on a fresh redis-server,
// both on a virtual clock, and a count of the server's script calls
// (INFO commandstats).
func newLeaseRedis(t *testing.T) (*limiter.Limiter, *Store, storetest.Leaser) {
	t.Helper()
	clock := manualclock.New()
	s, srv := newTestRedisStore(t, clock)
	lim := limiter.New(limiter.Config{Store: s, Clock: clock, Timeout: time.Minute, DenyCacheSize: -1})
	c := srv.Client(t)
	return lim, s, storetest.Leaser{Check: lim.Check, Clock: clock, Calls: func() uint64 { return uint64(nodeScriptCalls(t, c)) }}
}

// TestRedisLeaseTrafficWithinBound offers a 50 000/s partner key on
// leases at and over its limit on a real redis-server: Redis sees at most
// 1/LeaseInterval + 1/LeaseLifetime script calls per second for the key
// (counted by Redis itself), far under 200, and the key's admissions stay
// within the bound docs/algorithms.md states of the exact bucket.
func TestRedisLeaseTrafficWithinBound(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	for _, offered := range []float64{50_000, 100_000} {
		t.Run("", func(t *testing.T) {
			lim, _, l := newLeaseRedis(t)
			storetest.LeaseTraffic(t, l, leasePartner.Limit, leasePartner.Lease, offered, 3*time.Second, redisLeaseBound)
			if s := lim.Stats().Leases; s.Takes == 0 || s.Admitted == 0 {
				t.Errorf("no lease was used: %+v", s)
			}
		})
	}
}

// redisRemaining reads the key's bucket as Redis holds it.
func redisRemaining(t *testing.T, s *Store, c engine.Check) int64 {
	t.Helper()
	c.Cost, c.Lease = 0, 0
	d, err := s.Check(context.Background(), engine.Request{Subject: "key", Checks: []engine.Check{c}})
	if err != nil {
		t.Fatal(err)
	}
	return d.Results[0].Remaining
}

// TestRedisLeasePolicyChangeAndExpiry holds a lease on Redis, then
// changes the policy's version: the lease's tokens are back in Redis'
// bucket at once and the check is decided there. A lease of the new
// version then expires: the sweep returns it once, and a second sweep, a
// further change and the shutdown return add nothing to the bucket.
func TestRedisLeasePolicyChangeAndExpiry(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	lim, s, l := newLeaseRedis(t)
	ctx := context.Background()
	c := leasePartner
	storetest.Offer(t, l, "key", c, 50_000, 20*time.Millisecond, nil)
	before, st := redisRemaining(t, s, c), lim.Stats().Leases
	if st.Takes == 0 {
		t.Fatalf("no lease after 20 ms at 50 000/s: %+v", st)
	}
	held := int64(st.TokensTaken) - int64(st.Admitted) - int64(st.Takes) // each take spent one check's cost

	c.Version, c.Cost = 2, 1
	if out, err := lim.Check(ctx, engine.Request{Subject: "key", Checks: []engine.Check{c}}); err != nil || !out.Allowed || out.Source != limiter.FromStore {
		t.Fatalf("check of the new version = %+v, %v; want allowed by the store", out, err)
	}
	st = lim.Stats().Leases
	if st.PolicyChanged != 1 || st.Returns != 1 || int64(st.TokensReturned) != held {
		t.Fatalf("after the change: %+v; want one change, one return of %d", st, held)
	}
	if got, want := redisRemaining(t, s, c), min(before+held-1, 5_000); got != want {
		t.Errorf("Redis bucket after the return = %d, want %d (%d + %d returned - 1 checked)", got, want, before, held)
	}

	storetest.Offer(t, l, "key", c, 50_000, 20*time.Millisecond, nil)
	st = lim.Stats().Leases
	held = int64(st.TokensTaken) - int64(st.Admitted) - int64(st.Takes) - int64(st.TokensReturned)
	if held <= 0 {
		t.Fatalf("no lease under the new version: %+v", st)
	}
	l.Clock.Advance(limiter.LeaseLifetime)
	full := redisRemaining(t, s, c)
	c0 := c
	c0.Cost, c0.Lease = full, 0
	if d, err := s.Check(ctx, engine.Request{Subject: "key", Checks: []engine.Check{c0}}); err != nil || !d.Allowed {
		t.Fatalf("emptying the bucket: %+v, %v", d, err)
	}
	lim.SweepLeases(ctx)
	after := redisRemaining(t, s, c)
	if after != held {
		t.Fatalf("Redis bucket after the expired lease's return = %d, want the %d it held", after, held)
	}
	lim.SweepLeases(ctx)
	c.Version, c.Cost = 3, 0
	if _, err := lim.Check(ctx, engine.Request{Subject: "key", Checks: []engine.Check{c}}); err != nil {
		t.Fatal(err)
	}
	lim.ReturnLeases(ctx)
	if got := redisRemaining(t, s, c); got != after {
		t.Errorf("Redis bucket = %d after a second sweep, a change and the shutdown return; want %d", got, after)
	}
	if st := lim.Stats().Leases; st.Returns != 2 || st.Expired != 1 {
		t.Errorf("leases: %+v; want two returns (the change's, the expiry's), one expiry", st)
	}
}

// BenchmarkRedisLease offers a 50 000/s partner key (burst 5 000) at its
// rate to a limiter over a real redis-server, with and without a lease,
// and reports the script calls Redis counted per second of offered
// traffic. The traffic is paced on virtual time, which the store also
// decides on, so the rate is the offered one whatever the machine's speed;
// ns/op is the real cost of a check. The _c64 runs hammer the key from 64
// goroutines on real time instead, as fast as they can (over its limit),
// and report Redis calls per real second.
func BenchmarkRedisLease(b *testing.B) {
	for _, leased := range []bool{false, true} {
		name := "direct"
		if leased {
			name = "leased"
		}
		c := leasePartner
		if !leased {
			c.Lease = 0
		}
		b.Run(name+"_50000ps", func(b *testing.B) {
			clock := manualclock.New()
			s, srv := newTestRedisStore(b, clock)
			lim := limiter.New(limiter.Config{Store: s, Clock: clock, Timeout: time.Minute, DenyCacheSize: -1})
			rc := srv.Client(b)
			c.Cost = 1
			req := engine.Request{Subject: "key", Checks: []engine.Check{c}}
			step := time.Second / 50_000
			calls0 := nodeScriptCalls(b, rc)
			var allowed int
			b.ResetTimer()
			for range b.N {
				out, err := lim.Check(context.Background(), req)
				if err != nil {
					b.Fatal(err)
				}
				if out.Allowed {
					allowed++
				}
				clock.Advance(step)
			}
			b.StopTimer()
			virtual := (time.Duration(b.N) * step).Seconds()
			b.ReportMetric(float64(nodeScriptCalls(b, rc)-calls0)/virtual, "redis-calls/s")
			b.ReportMetric(100*float64(allowed)/float64(b.N), "%allowed")
		})
		b.Run(name+"_c64", func(b *testing.B) {
			srv := redistest.Start(b)
			rc := daemonClient(b, srv)
			s := New(rc, Config{Timeout: time.Second})
			lim := limiter.New(limiter.Config{Store: s, Timeout: time.Second, DenyCacheSize: -1})
			if err := s.Warm(context.Background()); err != nil {
				b.Fatal(err)
			}
			c.Cost = 1
			req := engine.Request{Subject: "key", Checks: []engine.Check{c}}
			calls0 := nodeScriptCalls(b, srv.Client(b))
			b.SetParallelism((redisBenchCallers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := lim.Check(context.Background(), req); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(nodeScriptCalls(b, srv.Client(b))-calls0)/b.Elapsed().Seconds(), "redis-calls/s")
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "checks/s")
		})
	}
}
