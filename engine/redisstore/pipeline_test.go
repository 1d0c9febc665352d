package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/engine/limiter"
	"github.com/sluice-rl/sluice/engine/storetest"
	"github.com/sluice-rl/sluice/internal/racedetector"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/internal/testwait"
)

// heldLane stops the single-pipeline lane of s at a paused Redis: Redis
// holds writes (and so scripts) until the returned release is called, and
// one check is already out, so every check made meanwhile waits in the
// lane's queue and goes out with the others in one batch on release.
func heldLane(t *testing.T, srv *redistest.Server, s *Store) (ln *lane, release func()) {
	t.Helper()
	ctx := context.Background()
	admin := srv.Client(t)
	if err := admin.Do(ctx, "CLIENT", "PAUSE", "30000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	unpaused := false
	release = func() {
		if !unpaused {
			unpaused = true
			if err := admin.Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(release)
	go s.Check(ctx, storetest.One("first", "p", engine.Limit{Algorithm: engine.TokenBucket, Rate: 1, Burst: 1}, 1))
	ln = s.lane(ctx, "first")
	testwait.For(t, 30*time.Second, "the first check sent", func() bool {
		ln.mu.Lock()
		defer ln.mu.Unlock()
		return ln.running == 1 && len(ln.queue) == 0
	})
	return ln, release
}

// queued reports how many checks wait in ln.
func queued(ln *lane) int {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	return len(ln.queue)
}

// TestRedisPipelineFailsOnlyBadChecks sends good checks and checks whose
// keys hold the wrong type of value in one pipeline to a real Redis: the
// wrong-type calls fail and are decided by their policies' failure modes
// (open: the fallback allows; closed: unavailable), every other check is
// decided by Redis.
func TestRedisPipelineFailsOnlyBadChecks(t *testing.T) {
	srv := redistest.Start(t)
	c := daemonClient(t, srv)
	// Long deadlines: the batch waits for a paused Redis on purpose.
	store := New(c, Config{Timeout: 10 * time.Second, Pipelines: 1})
	lim := limiter.New(limiter.Config{Store: store, Timeout: 10 * time.Second, DenyCacheSize: -1})
	ctx := context.Background()
	l := engine.Limit{Algorithm: engine.TokenBucket, Rate: 10, Burst: 10}
	storetest.MustCheck(t, store, storetest.One("warm", "p", l, 0)) // load the script
	for _, sub := range []string{"bad-open", "bad-closed"} {
		if err := c.HSet(ctx, store.Key(sub, "p"), "f", "v").Err(); err != nil {
			t.Fatal(err)
		}
	}

	ln, release := heldLane(t, srv, store)
	tests := []struct {
		subject   string
		onFailure engine.Failure
		want      limiter.Source
	}{
		{"good-0", engine.FailOpen, limiter.FromStore},
		{"bad-open", engine.FailOpen, limiter.FromFallback},
		{"good-1", engine.FailClosed, limiter.FromStore},
		{"bad-closed", engine.FailClosed, limiter.FromFallback},
		{"good-2", engine.FailLocal, limiter.FromStore},
	}
	outs := make([]limiter.Outcome, len(tests))
	errs := make([]error, len(tests))
	var wg sync.WaitGroup
	for i, tc := range tests {
		wg.Go(func() {
			req := engine.Request{Subject: tc.subject, Checks: []engine.Check{{Policy: "p", Limit: l, Cost: 1, OnFailure: tc.onFailure}}}
			outs[i], errs[i] = lim.Check(ctx, req)
		})
	}
	testwait.For(t, 30*time.Second, "every check queued", func() bool { return queued(ln) == len(tests) })
	release() // the queued checks go out together
	wg.Wait()

	for i, tc := range tests {
		o, err := outs[i], errs[i]
		if err != nil {
			t.Errorf("Check(%s) error %v, want an outcome", tc.subject, err)
			continue
		}
		if o.Source != tc.want {
			t.Errorf("Check(%s).Source = %v (err %v), want %v", tc.subject, o.Source, o.Err, tc.want)
		}
		bad := tc.want == limiter.FromFallback
		if o.Degraded != bad || o.Unavailable != (bad && tc.onFailure == engine.FailClosed) || o.Allowed != (tc.onFailure != engine.FailClosed || !bad) {
			t.Errorf("Check(%s) = degraded %v unavailable %v allowed %v, want degraded %v, unavailable only if closed, allowed unless unavailable",
				tc.subject, o.Degraded, o.Unavailable, o.Allowed, bad)
		}
		if bad && !errors.As(o.Err, new(redis.Error)) {
			t.Errorf("Check(%s).Err = %v, want the script's Redis error", tc.subject, o.Err)
		}
	}
	// The two wrong-type keys failed; the good ones stayed in the store.
	if st := lim.Stats(); st.StoreErrors != 2 {
		t.Errorf("store errors = %d, want 2 (the two wrong-type keys)", st.StoreErrors)
	}
	for _, sub := range []string{"good-0", "good-1", "good-2"} {
		if n, err := c.Exists(ctx, store.Key(sub, "p")).Result(); err != nil || n != 1 {
			t.Errorf("state of %s in Redis: exists=%d err=%v, want written", sub, n, err)
		}
	}
}

// TestRedisQueueWaitIsNotFailure holds a lane while checks pile up behind
// it past the queue's bound: they are decided by the fallback as busy, not
// as store errors, and the breaker, which opens after five failures, stays
// closed.
func TestRedisQueueWaitIsNotFailure(t *testing.T) {
	srv := redistest.Start(t)
	c := daemonClient(t, srv)
	store := New(c, Config{Timeout: 10 * time.Second, Pipelines: 1})
	lim := limiter.New(limiter.Config{Store: store, Timeout: 10 * time.Second, DenyCacheSize: -1,
		Breaker: limiter.BreakerConfig{MinCalls: 5}})
	ctx := context.Background()
	l := engine.Limit{Algorithm: engine.TokenBucket, Rate: 10, Burst: 10}
	storetest.MustCheck(t, store, storetest.One("warm", "p", l, 0))

	ln, release := heldLane(t, srv, store)
	// From now on every queued check has waited too long.
	ln.mu.Lock()
	store.queueWait = time.Nanosecond
	ln.mu.Unlock()
	const n = 20
	outs := make([]limiter.Outcome, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			outs[i], _ = lim.Check(ctx, storetest.One(fmt.Sprint("s", i), "p", l, 1))
		})
	}
	testwait.For(t, 30*time.Second, "every check queued", func() bool { return queued(ln) == n })
	release()
	wg.Wait()

	for i, o := range outs {
		if !o.Degraded || !errors.Is(o.Err, engine.ErrStoreBusy) {
			t.Errorf("check %d: degraded %v err %v, want degraded by engine.ErrStoreBusy", i, o.Degraded, o.Err)
		}
	}
	st := lim.Stats()
	if st.StoreErrors != 0 || st.StoreBusy != n || st.BreakerOpens != 0 || st.Breakers["store"] != "closed" {
		t.Errorf("stats %+v, want %d busy, no store error, breaker closed", st, n)
	}
	// The store still decides.
	ln.mu.Lock()
	store.queueWait = time.Minute
	ln.mu.Unlock()
	if o, err := lim.Check(ctx, storetest.One("after", "p", l, 1)); err != nil || o.Source != limiter.FromStore {
		t.Errorf("check after the burst: source %v err %v, want decided by the store", o.Source, err)
	}
}

// TestRedisFloodOneKeyStaysOnStore floods one key of a real Redis from
// 1000 goroutines through a Limiter: their checks pile up in the store's
// queue behind a held batch until the oldest has waited twice the
// Limiter's deadline, then drain, and the goroutines keep checking. Time in
// the queue is not Redis's round trip: the breaker never opens and every
// decision comes from the store. (Counted from the call, as a deadline
// around the whole store call counts it, every one of the held checks
// would have failed.) The deadline is 300 ms (1.5 s under the race
// detector) rather than the production 5 ms only because the test machine
// is shared: a stalled process can miss a few milliseconds by itself.
func TestRedisFloodOneKeyStaysOnStore(t *testing.T) {
	srv := redistest.Start(t)
	// The store's deadline is a minute, and so is the client's bound on
	// a read: at the production 1 s, a batch read while the race detector
	// and a thousand goroutines kept the reader from running for a second
	// failed, and the client does not send a script twice.
	c, err := NewClientWith("redis://"+srv.Addr(), ClientConfig{IOTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	deadline := 300 * time.Millisecond
	if racedetector.Enabled {
		deadline *= 5 // the detector slows every memory access many times over
	}
	// One pipeline, so that holding it holds the queue.
	store := New(c, Config{Timeout: time.Minute, Pipelines: 1})
	lim := limiter.New(limiter.Config{Store: store, Timeout: deadline, DenyCacheSize: -1})
	ctx := context.Background()
	// Every check allowed, so every check must reach Redis.
	req := storetest.One("hot", "p", engine.Limit{Algorithm: engine.TokenBucket, Rate: 1e9, Burst: 1e9}, 1)
	storetest.MustCheck(t, store, req) // load the script

	ln, release := heldLane(t, srv, store)
	const callers, each = 1000, 5
	var notStore, errs atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for range each {
				o, err := lim.Check(ctx, req)
				switch {
				case err != nil:
					errs.Add(1)
				case o.Source != limiter.FromStore:
					if notStore.Add(1) == 1 {
						firstErr.Store(fmt.Sprint(o.Source, ": ", o.Err))
					}
				}
			}
		})
	}
	testwait.For(t, 10*time.Second, "every caller queued", func() bool { return queued(ln) == callers })
	testwait.For(t, 10*time.Second, "the oldest check queued for twice the deadline", func() bool {
		ln.mu.Lock()
		defer ln.mu.Unlock()
		return time.Since(ln.queue[0].queuedAt) > 2*deadline
	})
	release()
	wg.Wait()

	st := lim.Stats()
	if errs.Load() != 0 || notStore.Load() != 0 {
		t.Errorf("%d errors and %d decisions not from the store in %d checks, want none (first: %v)",
			errs.Load(), notStore.Load(), callers*each, firstErr.Load())
	}
	if st.BreakerOpens != 0 || st.StoreErrors != 0 || st.StoreBusy != 0 {
		t.Errorf("breaker opened %d times, %d store errors, %d busy, want none", st.BreakerOpens, st.StoreErrors, st.StoreBusy)
	}
	if st.StoreCalls != callers*each {
		t.Errorf("store calls %d, want %d", st.StoreCalls, callers*each)
	}
}

// TestRedisPipelineOwnDeadlines sends two checks with different deadlines
// in one batch to a Redis that holds scripts: each fails at its own
// deadline, the shorter one first, while the other is still out.
func TestRedisPipelineOwnDeadlines(t *testing.T) {
	srv := redistest.Start(t)
	c := daemonClient(t, srv)
	store := New(c, Config{Timeout: time.Minute, Pipelines: 1})
	// A server that holds scripts on a machine short of CPU looks like
	// one the machine does not run, which the store waits for
	// (cpuPressure): these are the deadlines of a machine with CPU to
	// spare.
	store.pressure = nil
	ctx := context.Background()
	l := engine.Limit{Algorithm: engine.TokenBucket, Rate: 10, Burst: 10}
	storetest.MustCheck(t, store, storetest.One("warm", "p", l, 0))
	admin := srv.Client(t)
	if err := admin.Do(ctx, "CLIENT", "PAUSE", "30000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Do(ctx, "CLIENT", "UNPAUSE") })

	// Take the lane's only slot, so that both checks queue; then send
	// them together.
	ln := store.lane(ctx, "short")
	ln.mu.Lock()
	ln.running = store.pipelines
	ln.mu.Unlock()
	type result struct {
		name string
		err  error
	}
	done := make(chan result, 2)
	for _, tc := range []struct {
		name     string
		deadline time.Duration
	}{{"short", 100 * time.Millisecond}, {"long", 100 * time.Second}} {
		go func() {
			_, err := store.CheckWithin(ctx, storetest.One(tc.name, "p", l, 1), tc.deadline)
			done <- result{tc.name, err}
		}()
	}
	testwait.For(t, 5*time.Second, "both checks queued", func() bool { return queued(ln) == 2 })
	go store.flush(ln) // holds the slot taken above

	first := <-done
	if first.name != "short" || !errors.Is(first.err, context.DeadlineExceeded) {
		t.Fatalf("first answer: %s, %v; want the short deadline's check, failed at its deadline", first.name, first.err)
	}
	select {
	case r := <-done:
		t.Fatalf("check %s answered (%v) at the other's deadline, want still waiting for Redis", r.name, r.err)
	default:
	}
	// Redis answers the long one once it lets scripts run again.
	if err := admin.Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.name != "long" || r.err != nil {
		t.Errorf("second answer: %s, %v; want the long deadline's check decided", r.name, r.err)
	}
}

// TestLaneAdapt shows how a lane sizes its batches from their round trips
// against a 4 ms deadline.
func TestLaneAdapt(t *testing.T) {
	const deadline, maxBatch = 4 * time.Millisecond, 64
	for _, tt := range []struct {
		size, n int
		took    time.Duration
		want    int
	}{
		{16, 16, 100 * time.Microsecond, 20}, // full and fast: grow by a quarter
		{3, 3, 100 * time.Microsecond, 4},    // at least by one
		{60, 60, 100 * time.Microsecond, 64}, // up to the bound
		{16, 5, 100 * time.Microsecond, 16},  // not full: the size was not the limit
		{16, 16, 700 * time.Microsecond, 16}, // between an eighth and a quarter: keep
		{16, 16, 1500 * time.Microsecond, 8}, // over a quarter: halve
		{1, 1, 10 * time.Millisecond, 1},     // never below one
		{8, 8, 1500 * time.Microsecond, 8},   // a small batch is not slowed by its size: keep
		{16, 16, 4 * time.Millisecond, 8},    // a deadline missed: halve
	} {
		ln := &lane{size: tt.size}
		ln.adapt(tt.n, tt.took, deadline, maxBatch)
		if ln.size != tt.want {
			t.Errorf("size %d, batch of %d took %v: adapt -> %d, want %d", tt.size, tt.n, tt.took, ln.size, tt.want)
		}
	}
}
