package redisstore

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/engine/limiter"
	"github.com/sluice-rl/sluice/engine/storetest"
	"github.com/sluice-rl/sluice/internal/redistest"
)

// BenchmarkRedisClusterCost checks at saturation, 64 concurrent callers
// over 100 000 subjects through a Limiter with the default 5 ms deadline,
// on a single server and on a Cluster of three primaries, and reports
// Redis's CPU per check (INFO cpu, user and system, summed over the
// primaries) and the share of checks the store decided (the rest were
// decided by the fallback); cluster3_call_per_check sends a Cluster batch
// as one call per check, for comparison, and cluster3_one_primary sends
// every check to subjects of one primary, whose batches are then as large
// as a single server's: what a Cluster costs beside a single server at
// the same batch size. A call costs Redis a fixed 30 to 40 µs of CPU
// (wakeup, read, write, the script's setup) beside 5 to 6 µs per check,
// so the cost per check follows the checks per call; each primary of a
// Cluster sees a third of the checks, and 64 callers fill its batches
// less; cluster3_callers_x3 gives each primary as many callers as the
// single server has. Run it with
//
//	go test -run '^$' -bench BenchmarkRedisClusterCost -benchtime 100000x ./engine/redisstore/
func BenchmarkRedisClusterCost(b *testing.B) {
	b.Run("single", func(b *testing.B) {
		srv := redistest.Start(b)
		c := daemonClient(b, srv)
		benchCost(b, c, []*redis.Client{srv.Client(b)}, true, false, redisBenchCallers)
	})
	for _, tc := range []struct {
		name             string
		merged, onePrime bool
		callers          int
	}{
		{"cluster3", true, false, redisBenchCallers},
		{"cluster3_call_per_check", false, false, redisBenchCallers},
		{"cluster3_one_primary", true, true, redisBenchCallers},
		{"cluster3_callers_x3", true, false, 3 * redisBenchCallers},
	} {
		b.Run(tc.name, func(b *testing.B) { benchClusterCost(b, tc.merged, tc.onePrime, tc.callers) })
	}
}

// benchClusterCost runs benchCost on a Cluster of three primaries, with or
// without its merged call per batch, over subjects of every primary or of
// one.
func benchClusterCost(b *testing.B, merged, onePrimary bool, callers int) {
	{
		cl := redistest.StartCluster(b, 3, 0)
		c, err := NewClient("redis-cluster://" + strings.Join(cl.Addrs(), ","))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = c.Close() })
		var nodes []*redis.Client
		for _, n := range cl.Nodes() {
			nodes = append(nodes, n.Client(b))
		}
		benchCost(b, c, nodes, merged, onePrimary, callers)
	}
}

// benchCost runs BenchmarkRedisClusterCost's load on c, whose primaries
// are nodes, from callers goroutines, over subjects of every primary or
// of the first subject's.
func benchCost(b *testing.B, c redis.UniversalClient, nodes []*redis.Client, merged, onePrimary bool, callers int) {
	s := New(c, Config{})
	s.crossSlot.Store(s.cluster && merged)
	lim := limiter.New(limiter.Config{Store: s, DenyCacheSize: -1})
	if err := s.Warm(context.Background()); err != nil {
		b.Fatal(err)
	}
	subjects := make([]string, 0, redisBenchSubjects)
	first := s.Shard(context.Background(), "s0")
	for i := 0; len(subjects) < redisBenchSubjects; i++ {
		if sub := "s" + strconv.Itoa(i); !onePrimary || s.Shard(context.Background(), sub) == first {
			subjects = append(subjects, sub)
		}
	}
	redisCPUSum := func() int64 {
		var n int64
		for _, nc := range nodes {
			n += redisCPU(b, nc)
		}
		return n
	}
	calls := func() int64 {
		var n int64
		for _, nc := range nodes {
			n += nodeScriptCalls(b, nc)
		}
		return n
	}
	calls0 := calls()
	b.SetParallelism((callers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	var next, byStore atomic.Int64
	rcpu0 := redisCPUSum()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(7919))
		ctx := context.Background()
		for pb.Next() {
			i = (i + 7919) % redisBenchSubjects
			o, err := lim.Check(ctx, storetest.One(subjects[i], "p", redisBenchLimit, 1))
			if err == nil && o.Source == limiter.FromStore {
				byStore.Add(1)
			}
		}
	})
	b.StopTimer()
	st := lim.Stats()
	b.ReportMetric(float64(redisCPUSum()-rcpu0)/float64(b.N), "redis-cpu-ns/check")
	b.ReportMetric(100*float64(byStore.Load())/float64(b.N), "%store")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "checks/s")
	b.ReportMetric(float64(st.BreakerOpens), "breaker-opens")
	b.ReportMetric(float64(b.N)/float64(max(calls()-calls0, 1)), "checks/call")
}
