package redisstore

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/engine/limiter"
	"github.com/sluice-rl/sluice/internal/redistest"
)

// benchP99 runs b.N checks one after another and reports the 99th
// percentile latency in microseconds.
func benchP99(b *testing.B, lim *limiter.Limiter) {
	ctx := context.Background()
	l := engine.Limit{Algorithm: engine.TokenBucket, Rate: 1e6, Burst: 1e6}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		req := engine.Request{Subject: fmt.Sprint("p99-", i%1000), Checks: []engine.Check{{Policy: "q", Limit: l, Cost: 1, OnFailure: engine.FailOpen}}}
		start := time.Now()
		if _, err := lim.Check(ctx, req); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-us")
}

// BenchmarkCheckP99 measures one check's p99 latency through the Limiter
// with Redis answering, Redis killed while the breaker stays closed (every
// check tries the store, which refuses at once), Redis hung (paused: every
// check waits out the 5 ms deadline), and Redis killed with the breaker
// open (no store call at all).
func BenchmarkCheckP99(b *testing.B) {
	for _, tc := range []struct {
		name  string
		prep  func(*redistest.Server)
		trips bool
	}{
		{"redis_ok", func(*redistest.Server) {}, false},
		{"redis_down_breaker_closed", func(s *redistest.Server) { s.Kill() }, false},
		{"redis_hung_breaker_closed", func(s *redistest.Server) { s.Pause(time.Hour) }, false},
		{"redis_down_breaker_open", func(s *redistest.Server) { s.Kill() }, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			srv := redistest.Start(b)
			minCalls := uint32(1 << 30) // never opens
			if tc.trips {
				minCalls = 5
			}
			lim := redisLimiter(b, "redis://"+srv.Addr(), limiter.Config{Breaker: limiter.BreakerConfig{MinCalls: minCalls, OpenFor: time.Hour}})
			// Warm the connection pool and the script cache.
			for range 100 {
				lim.Check(context.Background(), engine.Request{Subject: "warm", Checks: []engine.Check{{Policy: "q", Limit: engine.Limit{Algorithm: engine.TokenBucket, Rate: 1e6, Burst: 1e6}, Cost: 1}}})
			}
			tc.prep(srv)
			if tc.trips {
				// The warm-up's successes count too: fail until the
				// failures are half of the window.
				for i := 0; i < 1000 && lim.Stats().Breakers["store"] != "open"; i++ {
					lim.Check(context.Background(), engine.Request{Subject: "trip", Checks: []engine.Check{{Policy: "q", Limit: engine.Limit{Algorithm: engine.TokenBucket, Rate: 1, Burst: 1}, Cost: 1}}})
				}
				if st := lim.Stats().Breakers["store"]; st != "open" {
					b.Fatalf("breaker %q, want open", st)
				}
			}
			benchP99(b, lim)
		})
	}
}

func init() {
	// go-redis logs each failed dial through a process-wide logger; keep
	// benchmark output parseable.
	redis.SetLogger(Logger{slog.New(slog.DiscardHandler)})
}
