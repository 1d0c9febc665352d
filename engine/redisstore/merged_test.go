package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/engine/storetest"
	"github.com/sluice-rl/sluice/internal/manualclock"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/internal/testwait"
)

// sendMerged sends reqs as one batch of s, as a lane would, and returns
// each check's script reply.
func sendMerged(t *testing.T, s *Store, reqs []engine.Request) []answer {
	t.Helper()
	batch := make([]*queuedCheck, len(reqs))
	for i, req := range reqs {
		batch[i] = s.newQueuedCheck(req, time.Second)
		batch[i].state.Store(checkSent)
	}
	s.exec(context.Background(), batch)
	out := make([]answer, len(batch))
	for i, p := range batch {
		out[i] = <-p.done
	}
	return out
}

// TestRedisMergedCallDecidesAsOneByOne sends batches as one script call,
// as the store does on a single server, and compares every decision with
// the memory store's for the same checks one by one, in the batch's order,
// at the same time: all five algorithms, several policies per check, a
// subject several times in one batch.
func TestRedisMergedCallDecidesAsOneByOne(t *testing.T) {
	srv := redistest.Start(t)
	_ = mergedDecidesAsOneByOne(t, srv.Client(t), []string{"alice", "{bob}", "=carol", "dave"})
}

// mergedDecidesAsOneByOne sends random batches of checks of subjects
// through client, as merged calls, and requires every decision to be the
// memory store's for the same checks one by one.
// It returns the number of checks sent.
func mergedDecidesAsOneByOne(t *testing.T, client Scripter, subjects []string) int {
	ctx := context.Background()
	sent := 0
	for seed := range uint64(30) {
		rng := rand.New(rand.NewPCG(seed, 7))
		clock := manualclock.New()
		clock.Advance(time.Duration(rng.Int64N(int64(24 * time.Hour))))
		mem := engine.NewMemoryStore(engine.MemoryConfig{Clock: clock})
		red := New(client, Config{Timeout: time.Second, Prefix: fmt.Sprintf("merged:%d:", seed)})
		setVirtualClock(red, clock)
		if !red.merge && !red.crossSlot.Load() {
			t.Fatal("the store does not merge a batch into one call")
		}
		sets := make([][]engine.Check, 4)
		for i := range sets {
			for j := range 1 + rng.IntN(3) {
				alg := engine.Algorithm(1 + rng.IntN(5))
				sets[i] = append(sets[i], engine.Check{Policy: fmt.Sprintf("s%dp%d", i, j), Limit: randomLimit(rng, alg)})
			}
		}
		for step := range 60 {
			clock.Advance(randomStep(rng, sets[rng.IntN(len(sets))]))
			reqs := make([]engine.Request, 2+rng.IntN(7))
			for i := range reqs {
				checks := append([]engine.Check(nil), sets[rng.IntN(len(sets))]...)
				for j := range checks {
					checks[j].Cost = randomCost(rng, checks[j].Effective())
				}
				reqs[i] = engine.Request{Subject: subjects[rng.IntN(len(subjects))], Checks: checks}
			}
			answers := sendMerged(t, red, reqs)
			sent += len(reqs)
			for i, req := range reqs {
				if answers[i].err != nil {
					t.Fatalf("seed %d step %d check %d: %v", seed, step, i, answers[i].err)
				}
				dr, err := scriptDecision(req, answers[i].v)
				if err != nil {
					t.Fatalf("seed %d step %d check %d: %v", seed, step, i, err)
				}
				dm, err := mem.Check(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				if dm != dr {
					t.Fatalf("seed %d step %d check %d of %d (%s): decisions differ\nmemory %+v\nmerged %+v",
						seed, step, i, len(reqs), describeRequest(req), dm, dr)
				}
			}
		}
	}
	return sent
}

// TestRedisMergedCallFailsOnlyBadChecks puts checks whose keys hold another
// type of value among good ones in one script call: each bad check gets
// Redis's error and writes nothing, not even the state of its policies
// whose keys are good; every other check is decided and written.
func TestRedisMergedCallFailsOnlyBadChecks(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	s := New(c, Config{Timeout: time.Second})
	tb := engine.Limit{Algorithm: engine.TokenBucket, Rate: 10, Burst: 10}
	sw := engine.Limit{Algorithm: engine.SlidingWindowCounter, Count: 5, Window: time.Second}
	two := func(subject string) engine.Request {
		return engine.Request{Subject: subject, Checks: []engine.Check{{Policy: "a", Limit: tb, Cost: 1}, {Policy: "b", Limit: sw, Cost: 1}}}
	}
	reqs := []engine.Request{storetest.One("good-1", "a", tb, 1), two("bad-2"), two("good-3"), storetest.One("bad-4", "a", tb, 1), two("good-5")}
	for _, k := range []string{s.Key("bad-2", "b"), s.Key("bad-4", "a")} {
		if err := c.HSet(ctx, k, "f", "v").Err(); err != nil {
			t.Fatal(err)
		}
	}
	answers := sendMerged(t, s, reqs)
	for i, req := range reqs {
		a := answers[i]
		if strings.HasPrefix(req.Subject, "bad") {
			var reply redis.Error
			if !errors.As(a.err, &reply) || !strings.Contains(a.err.Error(), "WRONGTYPE") {
				t.Errorf("check %d (%s): error %v, want Redis's WRONGTYPE error", i, req.Subject, a.err)
			}
			continue
		}
		if a.err != nil {
			t.Errorf("check %d (%s): error %v, want a decision", i, req.Subject, a.err)
			continue
		}
		d, err := scriptDecision(req, a.v)
		if err != nil || !d.Allowed {
			t.Errorf("check %d (%s) = %+v, %v; want allowed", i, req.Subject, d, err)
		}
		for _, ch := range req.Checks {
			if n, err := c.Exists(ctx, s.Key(req.Subject, ch.Policy)).Result(); err != nil || n != 1 {
				t.Errorf("state of %s under %s: exists=%d err=%v, want written", req.Subject, ch.Policy, n, err)
			}
		}
	}
	if n, err := c.Exists(ctx, s.Key("bad-2", "a")).Result(); err != nil || n != 0 {
		t.Errorf("state of bad-2 under its good policy: exists=%d err=%v, want nothing written by a failed check", n, err)
	}
}

// TestRedisMergedCallAfterScriptFlush sends a batch as one call to a server
// that has lost the script (a restart, SCRIPT FLUSH): the store sends it
// again with EVAL, and every check is decided.
func TestRedisMergedCallAfterScriptFlush(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	s := New(c, Config{Timeout: time.Second})
	tb := engine.Limit{Algorithm: engine.TokenBucket, Rate: 10, Burst: 10}
	storetest.MustCheck(t, s, storetest.One("warm", "p", tb, 0)) // the script is loaded
	if err := c.ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	reqs := []engine.Request{storetest.One("a", "p", tb, 1), storetest.One("b", "p", tb, 1), storetest.One("a", "p", tb, 1)}
	for i, a := range sendMerged(t, s, reqs) {
		d, err := scriptDecision(reqs[i], a.v)
		if a.err != nil || err != nil || !d.Allowed {
			t.Errorf("check %d (%s) after SCRIPT FLUSH = %+v, %v, %v; want allowed", i, reqs[i].Subject, d, a.err, err)
		}
		if want := int64(9 - i/2); d.Results[0].Remaining != want {
			t.Errorf("check %d (%s): remaining %d, want %d", i, reqs[i].Subject, d.Results[0].Remaining, want)
		}
	}
}

// TestRedisLaneGathers shows a busy Cluster lane waiting for its batch to
// fill: with checks arriving fast, a flush waits until gatherBatch checks
// are queued and sends them in one script call; on a lane that has seen no
// load a lone check goes out at once, without waiting for the window.
// A Cluster lane is the one that gathers: a single server's sends a
// second batch beside one in flight instead. The window is lengthened
// from its 1 ms to twelve seconds (a fifth of a one-minute deadline), so
// that the sixteen goroutines of the test, which a loaded machine may
// start over more than a millisecond, all join it.
func TestRedisLaneGathers(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	c, err := NewClient("redis-cluster://" + strings.Join(cl.Addrs(), ","))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	s := New(c, Config{Timeout: time.Minute})
	s.gatherCap = time.Minute
	ctx := context.Background()
	if err := s.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	l := engine.Limit{Algorithm: engine.TokenBucket, Rate: 10, Burst: 10}

	// The flush that sent Warm's last check keeps the rate it measured, one
	// check per round trip, until it finds its queue empty. On a loaded
	// machine the lone check can come first, and over a twelve-second
	// window that rate is a load worth waiting for; a lane idle since
	// Warm has none.
	ln := s.lane(ctx, "lone")
	ln.mu.Lock()
	ln.rate = 0
	ln.mu.Unlock()
	start := time.Now()
	storetest.MustCheck(t, s, storetest.One("lone", "p", l, 1))
	if took := time.Since(start); took >= s.timeout/5 {
		t.Fatalf("a lone check on an idle lane took %v, want it sent at once, not after the %v window", took, s.timeout/5)
	}

	// Sixteen subjects held by the lone check's primary share its lane, and
	// the flush that sent the lone check gives up its slot only after
	// answering it, in a last take that records the arrivals it saw, none.
	// Were that take to come after the lines below, the first busy check
	// would find no callers to wait for and go out alone, the other
	// fifteen in a second call.
	primary := s.Shard(ctx, "lone")
	var busy []string
	for i := 0; len(busy) < gatherBatch; i++ {
		if sub := fmt.Sprint("busy-", i); s.Shard(ctx, sub) == primary {
			busy = append(busy, sub)
		}
	}
	testwait.For(t, 10*time.Second, "the lone check's flush to end", func() bool {
		ln.mu.Lock()
		defer ln.mu.Unlock()
		return ln.running == 0
	})
	ln.mu.Lock()
	ln.rate = 1e6                // a million checks a second: a batch fills at once
	ln.lastArrived = gatherBatch // from as many callers
	ln.takenAt = time.Now()
	ln.mu.Unlock()
	calls0 := scriptCalls(t, cl)
	var wg sync.WaitGroup
	for _, sub := range busy {
		wg.Go(func() { storetest.MustCheck(t, s, storetest.One(sub, "p", l, 1)) })
	}
	wg.Wait()
	if calls := scriptCalls(t, cl) - calls0; calls != 1 {
		t.Errorf("%d checks on a busy lane took %d script calls, want one", gatherBatch, calls)
	}
}

// TestRedisLaneSecondBatch holds one batch in flight on a lane (its slot
// taken, as a flush waiting for Redis holds it) and sends a lone check: a
// single server's lane sends it beside the batch in flight, while a
// Cluster lane keeps it queued until its batch is full or the one in
// flight returns.
func TestRedisLaneSecondBatch(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cluster bool
		sent    bool
	}{
		{name: "single server sends it", sent: true},
		{name: "cluster holds it", cluster: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, calls := "", func() int64 { return 0 }
			if tc.cluster {
				cl := redistest.StartCluster(t, 3, 0)
				url, calls = "redis-cluster://"+strings.Join(cl.Addrs(), ","), func() int64 { return scriptCalls(t, cl) }
			} else {
				srv := redistest.Start(t)
				admin := srv.Client(t)
				url, calls = "redis://"+srv.Addr(), func() int64 { return nodeScriptCalls(t, admin) }
			}
			c, err := NewClient(url)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			s := New(c, Config{Timeout: time.Minute})
			ctx := context.Background()
			if err := s.Warm(ctx); err != nil {
				t.Fatal(err)
			}
			ln := s.lane(ctx, "second")
			testwait.For(t, 10*time.Second, "Warm's flush to end", func() bool {
				ln.mu.Lock()
				defer ln.mu.Unlock()
				return ln.running == 0
			})
			ln.mu.Lock()
			ln.running, ln.rate = 1, 0 // a batch in flight; no load to gather for
			ln.mu.Unlock()
			t.Cleanup(func() {
				ln.mu.Lock()
				ln.running--
				ln.mu.Unlock()
			})

			calls0 := calls()
			// Held, the check waits in the queue until its caller leaves;
			// sent, it is answered well within the bound.
			cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			l := engine.Limit{Algorithm: engine.TokenBucket, Rate: 10, Burst: 10}
			_, err = s.Check(cctx, storetest.One("second", "p", l, 1))
			sent := calls() - calls0
			if tc.sent && (err != nil || sent != 1) {
				t.Errorf("beside a batch in flight: err %v, %d script calls; want the check sent and decided at once", err, sent)
			}
			if !tc.sent && (!errors.Is(err, context.DeadlineExceeded) || sent != 0) {
				t.Errorf("beside a batch in flight: err %v, %d script calls; want the check held in the queue until its caller left", err, sent)
			}
		})
	}
}

// TestRedisLaneWaitsOnlyForItsCallers shows a lane that checks arrive at
// fast, but from one caller that waits for each answer before it sends
// again: a batch can never hold more than that one check, so the flush
// sends it at once instead of waiting out the window (lengthened here to
// twelve seconds) for checks that cannot come.
func TestRedisLaneWaitsOnlyForItsCallers(t *testing.T) {
	srv := redistest.Start(t)
	s := New(daemonClient(t, srv), Config{Timeout: time.Minute})
	s.gatherCap = time.Minute
	ctx := context.Background()
	if err := s.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	l := engine.Limit{Algorithm: engine.TokenBucket, Rate: 10, Burst: 10}
	ln := s.lane(ctx, "loop")
	ln.mu.Lock()
	ln.rate = 1e6 // as fast as a caller in a loop on loopback, and more
	ln.lastArrived = 1
	ln.mu.Unlock()
	start := time.Now()
	storetest.MustCheck(t, s, storetest.One("loop", "p", l, 1))
	if took := time.Since(start); took >= s.timeout/5 {
		t.Fatalf("the check of a lone caller in a loop took %v, want it sent at once, not after the %v window", took, s.timeout/5)
	}
}

// TestGatherWindowIsCapped: the gather window is a fifth of the deadline
// but never more than maxGatherWindow, so a daemon given a long deadline
// does not make every check of a busy lane wait a fifth of it.
func TestGatherWindowIsCapped(t *testing.T) {
	for _, tt := range []struct{ timeout, want time.Duration }{
		{2 * time.Millisecond, 400 * time.Microsecond},
		{DefaultTimeout, time.Millisecond},
		{200 * time.Millisecond, time.Millisecond},
		{5 * time.Second, time.Millisecond},
	} {
		if got := gatherWindow(tt.timeout, maxGatherWindow); got != tt.want {
			t.Errorf("gatherWindow(%v) = %v, want %v", tt.timeout, got, tt.want)
		}
	}
}
