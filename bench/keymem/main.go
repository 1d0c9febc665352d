// Command keymem measures what Sluice's state costs Redis per subject: it
// decides one check for each of -n distinct subjects (one token bucket
// policy, the daemon's Redis store and script) against the server named
// by -store, then reads INFO memory and DBSIZE and prints
//
//	KEYMEM subjects=20000000 keys=20000000 used_memory=... bytes_per_key=... baseline=...
//
// bytes_per_key is (used_memory after - used_memory before) / keys: what
// one more subject costs, Redis's own per-key overhead included. Run it
// against an empty server: the keys it writes expire with their bucket's
// refill time (the store's PX), so read soon after.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/engine/redisstore"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "keymem:", err)
		os.Exit(1)
	}
}

func run() error {
	store := flag.String("store", "redis://127.0.0.1:6379", "Redis URL, as sluice serve --store takes it")
	n := flag.Int("n", 1_000_000, "distinct subjects")
	callers := flag.Int("callers", 64, "checks in flight at once")
	flag.Parse()
	c, err := redisstore.NewClient(*store)
	if err != nil {
		return err
	}
	ctx := context.Background()
	before, err := usedMemory(ctx, c)
	if err != nil {
		return err
	}
	s := redisstore.New(c, redisstore.Config{Timeout: 5 * time.Second})
	// A refill of an hour: every key outlives the measurement.
	limit := engine.Limit{Algorithm: engine.TokenBucket, Rate: 1.0 / 3600, Burst: 10}
	var next, failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range *callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(*n) {
					return
				}
				req := engine.Request{Subject: "user:" + strconv.FormatInt(i, 10),
					Checks: []engine.Check{{Policy: "api", Limit: limit, Cost: 1}}}
				if _, err := s.Check(ctx, req); err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	after, err := usedMemory(ctx, c)
	if err != nil {
		return err
	}
	keys, err := c.DBSize(ctx).Result()
	if err != nil {
		return err
	}
	if keys == 0 {
		return fmt.Errorf("no keys written (%d checks failed)", failed.Load())
	}
	fmt.Printf("KEYMEM subjects=%d keys=%d failed=%d used_memory=%d baseline=%d bytes_per_key=%.1f seconds=%.0f\n",
		*n, keys, failed.Load(), after, before, float64(after-before)/float64(keys), took.Seconds())
	return nil
}

// usedMemory is INFO memory's used_memory, summed over a Cluster's
// primaries.
func usedMemory(ctx context.Context, c redis.UniversalClient) (int64, error) {
	read := func(ctx context.Context, cl *redis.Client) (int64, error) {
		info, err := cl.Info(ctx, "memory").Result()
		if err != nil {
			return 0, err
		}
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
				return strconv.ParseInt(v, 10, 64)
			}
		}
		return 0, fmt.Errorf("INFO memory has no used_memory")
	}
	if cc, ok := c.(*redis.ClusterClient); ok {
		var sum atomic.Int64
		err := cc.ForEachMaster(ctx, func(ctx context.Context, cl *redis.Client) error {
			v, err := read(ctx, cl)
			sum.Add(v)
			return err
		})
		return sum.Load(), err
	}
	cl, ok := c.(*redis.Client)
	if !ok {
		return 0, fmt.Errorf("unexpected client %T", c)
	}
	return read(ctx, cl)
}
