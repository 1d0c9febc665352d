package redisstore

import (
	"context"
	"encoding/csv"
	"fmt"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/engine/storetest"
	"github.com/sluice-rl/sluice/internal/redistest"
)

// redisBenchCallers is how many checks are in flight at once against Redis.
const redisBenchCallers = 64

// redisBenchSubjects is how many subjects the Redis benchmarks spread over.
const redisBenchSubjects = 100000

// redisBenchLimit is the one policy of the Redis benchmarks: generous enough
// that nearly every check is allowed and so writes its state.
var redisBenchLimit = engine.Limit{Algorithm: engine.TokenBucket, Rate: 100, Burst: 1000}

// BenchmarkRedisCheck measures the Redis store with 64 concurrent callers,
// one token bucket policy, over 100 000 subjects (checks/s), and then the
// limits of the same server: redis-benchmark running the same script with
// EVALSHA from 64 connections, one command per round trip
// (raw_evalsha_c64) and 16 per round trip (raw_evalsha_p16_c64, the
// physical limit that a pipelining client can approach), in evalsha/s.
// All run against one redis-server that the benchmark starts, so they
// compare like with like.
func BenchmarkRedisCheck(b *testing.B) {
	srv := redistest.Start(b)
	c := daemonClient(b, srv)
	// A long timeout: this measures throughput, and on a loaded machine
	// some calls outlast the 5 ms default, which would count failures as
	// work done.
	s := New(c, Config{Timeout: time.Second})
	subjects := make([]string, redisBenchSubjects)
	for i := range subjects {
		subjects[i] = "s" + strconv.Itoa(i)
	}
	// Load the script and open connections before measuring.
	warm, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := s.Check(warm, storetest.One("warm", "p", redisBenchLimit, 0)); err != nil {
		b.Fatal(err)
	}

	b.Run("store_c64", func(b *testing.B) {
		b.SetParallelism((redisBenchCallers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
		var next, failed atomic.Int64
		b.ReportAllocs()
		cpu0, rcpu0 := processCPU(b), redisCPU(b, c)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			i := int(next.Add(7919)) // each caller walks the subjects from its own place
			ctx := context.Background()
			for pb.Next() {
				i = (i + 7919) % redisBenchSubjects
				if _, err := s.Check(ctx, storetest.One(subjects[i], "p", redisBenchLimit, 1)); err != nil {
					failed.Add(1)
				}
			}
		})
		b.StopTimer()
		b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/check")
		b.ReportMetric(float64(redisCPU(b, c)-rcpu0)/float64(b.N), "redis-cpu-ns/check")
		b.ReportMetric(float64(int64(b.N)-failed.Load())/b.Elapsed().Seconds(), "checks/s")
		b.ReportMetric(float64(failed.Load()), "errors")
	})

	rawEvalSHA := func(pipeline int) func(b *testing.B) {
		return func(b *testing.B) {
			// The same script, key shape and arguments as a call of one
			// store check (one check of one policy);
			// redis-benchmark puts a random subject into __rand_int__.
			args := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(srv.Port()),
				"-c", strconv.Itoa(redisBenchCallers), "-P", strconv.Itoa(pipeline),
				"-n", strconv.Itoa(max(b.N, redisBenchCallers*pipeline)),
				"-r", strconv.Itoa(redisBenchSubjects), "--csv",
				"EVALSHA", s.ScriptSHA(), "1", s.Key("s__rand_int__", "p"),
				"", "0", "1", "1", strconv.Itoa(int(engine.TokenBucket)),
				strconv.FormatFloat(redisBenchLimit.Rate, 'g', -1, 64), strconv.FormatFloat(redisBenchLimit.Burst, 'g', -1, 64), "0", "1", "1"}
			b.ResetTimer()
			out, err := exec.Command("redis-benchmark", args...).CombinedOutput()
			b.StopTimer()
			if err != nil {
				b.Fatalf("redis-benchmark: %v\n%s", err, out)
			}
			rps, err := redisBenchmarkRPS(string(out))
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(rps, "evalsha/s")
		}
	}
	b.Run("raw_evalsha_c64", rawEvalSHA(1))
	b.Run("raw_evalsha_p16_c64", rawEvalSHA(16))
}

// processCPU is the CPU time this process has used, user and system, in
// nanoseconds: the store's cost per check, robust to a busy machine where
// throughput is not.
func processCPU(b *testing.B) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// redisCPU is the CPU time redis-server has used, user and system, in
// nanoseconds (INFO cpu, in microseconds).
func redisCPU(b *testing.B, c redis.UniversalClient) int64 {
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for line := range strings.SplitSeq(info, "\r\n") {
		k, v, _ := strings.Cut(line, ":")
		if k == "used_cpu_user" || k == "used_cpu_sys" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatalf("INFO cpu: %s: %v", line, err)
			}
			total += f
		}
	}
	return int64(total * 1e9)
}

// redisBenchmarkRPS reads the requests per second from redis-benchmark's
// --csv output: a header line, then "test","rps",...
func redisBenchmarkRPS(out string) (float64, error) {
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil || len(recs) < 2 || len(recs[1]) < 2 || recs[0][1] != "rps" {
		return 0, fmt.Errorf("unexpected redis-benchmark output (%v):\n%s", err, out)
	}
	if strings.Contains(out, "ERR") || strings.Contains(out, "NOSCRIPT") {
		return 0, fmt.Errorf("redis-benchmark reported an error:\n%s", out)
	}
	return strconv.ParseFloat(recs[1][1], 64)
}

// BenchmarkRedisBytesPerSubject fills Redis with 10 000 token bucket
// subjects through the store and reports MEMORY USAGE averaged over 1 000
// of them. Keys look like rl:{user:123456}:api (20 bytes); see
// TestRedisStateIsCompact for how the figure steps with key length.
func BenchmarkRedisBytesPerSubject(b *testing.B) {
	srv := redistest.Start(b)
	c := srv.Client(b)
	s := New(c, Config{Timeout: time.Second})
	ctx := context.Background()
	subject := func(i int) string { return "user:" + strconv.Itoa(100000+i) }
	// A slow refill keeps every state alive (TTL) while the fill runs.
	l := engine.Limit{Algorithm: engine.TokenBucket, Rate: 1, Burst: 100}
	for i := range 10000 {
		if _, err := s.Check(ctx, storetest.One(subject(i), "api", l, 1)); err != nil {
			b.Fatal(err)
		}
	}
	per, err := redisBytesPerSubject(ctx, c, s, 1000, subject, "api")
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
	}
	b.ReportMetric(per, "bytes/subject")
}
