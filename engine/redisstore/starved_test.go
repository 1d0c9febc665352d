package redisstore

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/engine/limiter"
	"github.com/sluice-rl/sluice/internal/redistest"
)

// floodStarved floods one subject from 50 goroutines for dur through a
// limiter with the default 5 ms deadline on s, while goroutines that never
// block take the daemon's only thread (GOMAXPROCS 1): every goroutine of
// the daemon, the one reading Redis's replies among them, waits for its
// turn for milliseconds, far past the deadline, while Redis, on the other
// core, answers on time. No deadline may then pass for Redis's failure:
// every check is decided by the store and the admissions are those of the
// policy, within one burst of exact. The deny cache is off, so that every
// check goes to the store.
//
// With a goroutine spinning on the daemon's only thread the daemon's
// stalls reach 50 to 100 ms on a shared two-core machine; the deadline
// watch tells them from Redis's own delays by its timer's lateness, by
// goroutines waiting to run, and by replies waiting unread in the sockets
// (unreadConns), and a check queued meanwhile is sent rather than failed
// as busy.
func floodStarved(t *testing.T, s *Store) {
	l := engine.Limit{Algorithm: engine.TokenBucket, Rate: 100, Burst: 100}
	lim := limiter.New(limiter.Config{Store: s, DenyCacheSize: -1})
	ctx := context.Background()
	if err := s.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	subject := fmt.Sprint("hot-", time.Now().UnixNano())
	req := engine.Request{Subject: subject, Checks: []engine.Check{{Policy: "p", Limit: l, Cost: 1}}}

	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var stop atomic.Bool
	var hogs sync.WaitGroup
	for range 1 {
		hogs.Go(func() {
			for n := 0; !stop.Load(); n++ {
			}
		})
	}
	const dur = 2 * time.Second
	var checks, allowed, notStore atomic.Int64
	var firstMiss atomic.Value
	start := time.Now()
	end := start.Add(dur)
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			for time.Now().Before(end) {
				o, err := lim.Check(ctx, req)
				if err != nil {
					t.Error(err)
					return
				}
				checks.Add(1)
				if o.Allowed {
					allowed.Add(1)
				}
				if o.Source != limiter.FromStore && notStore.Add(1) == 1 {
					firstMiss.Store(fmt.Sprint(o.Source, ": ", o.Err))
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	stop.Store(true)
	hogs.Wait()

	st := lim.Stats()
	t.Logf("%d checks in %v, %d allowed, %d not by the store (first: %v); store errors %d, busy %d, breaker opens %d",
		checks.Load(), elapsed.Round(time.Millisecond), allowed.Load(), notStore.Load(), firstMiss.Load(), st.StoreErrors, st.StoreBusy, st.BreakerOpens)
	if notStore.Load() != 0 || st.StoreErrors != 0 || st.StoreBusy != 0 {
		t.Errorf("%d of %d checks not decided by the store (%d store errors, %d busy), want all by the store",
			notStore.Load(), checks.Load(), st.StoreErrors, st.StoreBusy)
	}
	// exact is what the bucket holds over the run; the run's start and
	// end on Redis's clock are within the wall-clock elapsed time.
	exact := l.Burst + l.Rate*elapsed.Seconds()
	if got := float64(allowed.Load()); got > exact+l.Burst || got < exact-l.Burst {
		t.Errorf("admitted %v, want within one burst (%v) of %.0f", got, l.Burst, exact)
	}
}

// TestRedisHotSubjectStarvedDaemon floods one subject on a single server
// from a daemon starved of CPU (floodStarved).
func TestRedisHotSubjectStarvedDaemon(t *testing.T) {
	srv := redistest.Start(t)
	floodStarved(t, New(daemonClient(t, srv), Config{}))
}

// TestRedisClusterHotSubjectStarvedDaemon floods one subject on a Cluster
// from a daemon starved of CPU (floodStarved).
func TestRedisClusterHotSubjectStarvedDaemon(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	c, err := NewClient("redis-cluster://" + cl.Addrs()[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	floodStarved(t, New(c, Config{}))
}
