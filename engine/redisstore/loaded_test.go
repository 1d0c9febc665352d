package redisstore

import (
	"context"
	"fmt"
	"os/exec"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/engine/limiter"
	"github.com/sluice-rl/sluice/internal/redistest"
)

// loadMachine keeps every core of the machine busy until the test ends,
// with a process per core that never blocks (yes, writing to nothing), as
// a concurrent test run loads a CI machine: the daemon and the Redis
// servers then all wait for CPU.
func loadMachine(t *testing.T) {
	t.Helper()
	for range runtime.NumCPU() {
		cmd := exec.Command("yes")
		if err := cmd.Start(); err != nil {
			t.Fatalf("starting a CPU hog: %v", err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
}

// loadedPolicy is a policy of loadedAdmitsWithinLimit and what it admitted.
type loadedPolicy struct {
	name string
	l    engine.Limit
	on   engine.Failure
	// store and fallback count the admissions by who decided them,
	// degraded the answers without the store, denied the rest.
	store, fallback, degraded, denied atomic.Int64
	firstErr                          atomic.Pointer[error]
	// windows counts a fixed window's admissions by window, of the
	// checks that began and ended within one window.
	mu      sync.Mutex
	windows map[int64]int
}

// loadedAdmitsWithinLimit floods a few subjects of a small fixed-window
// and a small token-bucket policy through two limiters (two daemons of a
// region sharing the store at url(0) and url(1)), from many callers, for
// several windows, on a machine whose every core is taken by CPU hogs.
// Redis answers; the machine is slow. No window may admit more than its
// limit: a reply that comes late because the machine did not run the
// daemon or the Redis server is Redis's decision, and deciding the check
// by the fallback as well would admit it twice.
func loadedAdmitsWithinLimit(t *testing.T, url func(i int) string) {
	const daemons = 2
	lims := make([]*limiter.Limiter, daemons)
	for i := range lims {
		c, err := NewClient(url(i))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		s := New(c, Config{})
		if err := s.Warm(context.Background()); err != nil {
			t.Fatal(err)
		}
		// No deny cache: every check goes to the store.
		lims[i] = limiter.New(limiter.Config{Store: s, DenyCacheSize: -1, Daemons: func() int { return daemons }})
	}
	const window = time.Second
	fw := engine.Limit{Algorithm: engine.FixedWindow, Count: 8, Window: window}
	tb := engine.Limit{Algorithm: engine.TokenBucket, Rate: 8, Burst: 8}
	run := fmt.Sprint(time.Now().UnixNano())
	const subjects = 6
	policies := make([][]*loadedPolicy, subjects)
	for i := range policies {
		policies[i] = []*loadedPolicy{
			{name: "api", l: fw, on: engine.FailLocal, windows: map[int64]int{}},
			{name: "login", l: fw, on: engine.FailClosed, windows: map[int64]int{}},
			{name: "bucket", l: tb, on: engine.FailLocal},
		}
	}

	loadMachine(t)
	const windows = 5
	// Start on a window's edge: the run then touches windows+1 windows.
	start := time.Now().Truncate(window).Add(window)
	end := start.Add(windows * window)
	time.Sleep(time.Until(start))
	ctx := context.Background()
	var wg sync.WaitGroup
	for g := range 96 {
		lim := lims[g%daemons]
		wg.Go(func() {
			for n := g; time.Now().Before(end); n++ {
				si := n % subjects
				p := policies[si][(n/subjects)%len(policies[si])]
				began := time.Now()
				o, err := lim.Check(ctx, engine.Request{Subject: fmt.Sprintf("loaded-%s-%d", run, si),
					Checks: []engine.Check{{Policy: p.name, Limit: p.l, Cost: 1, OnFailure: p.on}}})
				if err != nil {
					t.Error(err)
					return
				}
				if o.Degraded {
					p.firstErr.CompareAndSwap(nil, &o.Err)
				}
				switch {
				case o.Degraded && o.Allowed:
					p.degraded.Add(1)
					p.fallback.Add(1)
				case o.Degraded:
					p.degraded.Add(1)
				case o.Allowed:
					p.store.Add(1)
				default:
					p.denied.Add(1)
				}
				// Redis's clock is this machine's: a check decided
				// between began and now is of their window if they
				// share one.
				if w := began.UnixNano() / int64(window); o.Allowed && p.windows != nil && w == time.Now().UnixNano()/int64(window) {
					p.mu.Lock()
					p.windows[w]++
					p.mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	for i, lim := range lims {
		st := lim.Stats()
		t.Logf("daemon %d: %d store calls, %d errors, %d busy, %d degraded", i, st.StoreCalls, st.StoreErrors, st.StoreBusy, st.Degraded)
	}
	touched := float64(elapsed/window) + 1
	for si := range policies {
		for _, p := range policies[si] {
			admitted := p.store.Load() + p.fallback.Load()
			// A fixed window admits its count in each window the run
			// touched; a bucket its burst and its refill over the run.
			bound := p.l.Count * touched
			if p.l.Algorithm == engine.TokenBucket {
				bound = p.l.Burst + p.l.Rate*elapsed.Seconds()
			}
			t.Logf("subject %d %s: %d admitted by the store, %d by the fallback (%d degraded answers), %d denied; at most %.0f",
				si, p.name, p.store.Load(), p.fallback.Load(), p.degraded.Load(), p.denied.Load(), bound)
			if err := p.firstErr.Load(); err != nil {
				t.Logf("subject %d %s: the first degraded answer's error: %v", si, p.name, *err)
			}
			if float64(admitted) > bound {
				t.Errorf("subject %d %s admitted %d (%d by the store, %d by the fallback) in %v, want at most %.0f",
					si, p.name, admitted, p.store.Load(), p.fallback.Load(), elapsed.Round(time.Millisecond), bound)
			}
			for w, n := range p.windows {
				if float64(n) > p.l.Count {
					t.Errorf("subject %d %s admitted %d in the window from %s, want at most %.0f",
						si, p.name, n, time.Unix(0, w*int64(window)).UTC().Format("15:04:05"), p.l.Count)
				}
			}
		}
	}
}

// TestRedisLoadedAdmitsWithinLimit runs loadedAdmitsWithinLimit on a
// single server.
func TestRedisLoadedAdmitsWithinLimit(t *testing.T) {
	srv := redistest.Start(t)
	loadedAdmitsWithinLimit(t, func(int) string { return "redis://" + srv.Addr() })
}

// TestRedisClusterLoadedAdmitsWithinLimit runs loadedAdmitsWithinLimit on
// a Cluster of three primaries, each daemon knowing it by another node.
func TestRedisClusterLoadedAdmitsWithinLimit(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	loadedAdmitsWithinLimit(t, func(i int) string { return "redis-cluster://" + cl.Addrs()[i%len(cl.Addrs())] })
}
