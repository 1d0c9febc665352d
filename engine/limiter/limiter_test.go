package limiter

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/internal/manualclock"
)

// faultyStore wraps a MemoryStore, counts calls and fails on demand. The
// limiter logic under test does not depend on which store fails; the tests
// against a real Redis that is killed and paused are in redis_failure_test.go.
type faultyStore struct {
	inner *engine.MemoryStore
	calls atomic.Int64
	fail  atomic.Bool
}

var errStoreDown = errors.New("store down")

func (s *faultyStore) Check(ctx context.Context, req engine.Request) (engine.Decision, error) {
	s.calls.Add(1)
	if s.fail.Load() {
		return engine.Decision{}, errStoreDown
	}
	return s.inner.Check(ctx, req)
}

func newFaulty(clock engine.Clock) *faultyStore {
	return &faultyStore{inner: engine.NewMemoryStore(engine.MemoryConfig{Clock: clock})}
}

func TestDenyCacheSavesStoreCallsAndHonoursRaisedLimit(t *testing.T) {
	clock := manualclock.New()
	st := newFaulty(clock)
	lim := New(Config{Store: st, Clock: clock})
	check := func(count float64, version uint64) Outcome {
		t.Helper()
		o, err := lim.Check(context.Background(), engine.Request{Subject: "hammer", Checks: []engine.Check{{
			Policy: "p", Version: version, Cost: 1,
			Limit: engine.Limit{Algorithm: engine.FixedWindow, Count: count, Window: time.Minute},
		}}})
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	for range 10 {
		check(10, 1)
	}
	before := st.calls.Load()
	const hammer = 1000
	for range hammer {
		clock.Advance(time.Millisecond) // 1 s in all: still within the window
		if o := check(10, 1); o.Allowed {
			t.Fatal("hammering key allowed")
		}
	}
	calls := st.calls.Load() - before
	if calls > hammer/10 {
		t.Errorf("store calls while hammering = %d of %d checks, want a drop of at least 90%%", calls, hammer)
	}
	// The operator raises the limit: the next check must see it.
	if o := check(100, 2); !o.Allowed || o.Source != FromStore || o.Results[0].Limit != 100 {
		t.Errorf("first check after raising the limit: allowed=%v source=%v, want allowed from the store", o.Allowed, o.Source)
	}
}

func TestDenyCacheExpiresAtRetryTime(t *testing.T) {
	clock := manualclock.New()
	st := newFaulty(clock)
	lim := New(Config{Store: st, Clock: clock})
	req := engine.Request{Subject: "s", Checks: []engine.Check{{Policy: "p", Cost: 1, Limit: engine.Limit{Algorithm: engine.TokenBucket, Rate: 2, Burst: 1}}}}
	ctx := context.Background()
	lim.Check(ctx, req)
	o, _ := lim.Check(ctx, req)
	if o.Allowed || o.RetryAfter() != 500*time.Millisecond {
		t.Fatalf("second check: allowed=%v retry=%v, want rejected, 500ms", o.Allowed, o.RetryAfter())
	}
	clock.Advance(200 * time.Millisecond)
	o, _ = lim.Check(ctx, req)
	if o.Source != FromDenyCache || o.RetryAfter() != 300*time.Millisecond {
		t.Errorf("cached: source=%v retry=%v, want deny_cache, 300ms", o.Source, o.RetryAfter())
	}
	clock.Advance(300 * time.Millisecond)
	if o, _ := lim.Check(ctx, req); !o.Allowed || o.Source != FromStore {
		t.Errorf("at the retry time: allowed=%v source=%v, want allowed by the store", o.Allowed, o.Source)
	}
}

func TestStoreFailureFollowsEachPolicysMode(t *testing.T) {
	tb := engine.Limit{Algorithm: engine.TokenBucket, Rate: 1, Burst: 10}
	tests := []struct {
		name        string
		mode        engine.Failure
		daemons     int
		wantAllowed int
		unavailable bool
	}{
		{"open allows twice the limit", engine.FailOpen, 1, 20, false},
		{"local divides by live daemons", engine.FailLocal, 5, 2, false},
		{"closed rejects as unavailable", engine.FailClosed, 1, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := manualclock.New()
			st := newFaulty(clock)
			st.fail.Store(true)
			lim := New(Config{Store: st, Clock: clock, Daemons: func() int { return tt.daemons }})
			allowed := 0
			for range 100 {
				o, err := lim.Check(context.Background(), engine.Request{Subject: "s", Checks: []engine.Check{{Policy: "p", Cost: 1, Limit: tb, OnFailure: tt.mode}}})
				if err != nil {
					t.Fatalf("Check returned %v, want a degraded decision", err)
				}
				if !o.Degraded || o.Source != FromFallback {
					t.Fatalf("degraded=%v source=%v, want a degraded fallback decision", o.Degraded, o.Source)
				}
				if o.Unavailable != tt.unavailable {
					t.Fatalf("Unavailable = %v, want %v", o.Unavailable, tt.unavailable)
				}
				if o.Allowed {
					allowed++
				}
			}
			if allowed != tt.wantAllowed {
				t.Errorf("allowed %d of 100 with the store down, want %d", allowed, tt.wantAllowed)
			}
		})
	}
}

// TestBreakerOpensThenProbes: ten failures open the store breaker, an open
// breaker lets no call through, and once OpenFor has passed it lets a probe
// through, which closes it. gobreaker reads time.Now, so the test runs in
// a testing/synctest bubble: OpenFor passes on the bubble's virtual clock,
// to the millisecond, however loaded the machine.
func TestBreakerOpensThenProbes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const openFor = 50 * time.Millisecond
		clock := manualclock.New()
		st := newFaulty(clock)
		st.fail.Store(true)
		lim := New(Config{Store: st, Clock: clock, Breaker: BreakerConfig{MinCalls: 10, OpenFor: openFor}})
		req := engine.Request{Subject: "s", Checks: []engine.Check{{Policy: "p", Cost: 1, Limit: engine.Limit{Algorithm: engine.TokenBucket, Rate: 1e6, Burst: 1e6}}}}
		ctx := context.Background()
		for range 10 {
			lim.Check(ctx, req)
		}
		if got := lim.Stats().Breakers["store"]; got != "open" {
			t.Fatalf("breaker after 10 failures = %q, want open", got)
		}
		opened := time.Now()
		calls := st.calls.Load()
		for range 100 {
			lim.Check(ctx, req)
		}
		if st.calls.Load() != calls {
			t.Fatalf("open breaker let %d calls through", st.calls.Load()-calls)
		}
		st.fail.Store(false)
		time.Sleep(openFor - time.Millisecond)
		if o, _ := lim.Check(ctx, req); o.Source == FromStore {
			t.Fatalf("a check %v after the breaker opened reached the store, want none before OpenFor %v", time.Since(opened), openFor)
		}
		time.Sleep(2 * time.Millisecond)
		if o, _ := lim.Check(ctx, req); o.Source != FromStore {
			t.Fatalf("a check %v after the breaker opened = %v, want the probe, from the store", time.Since(opened), o.Source)
		}
		if got := lim.Stats().Breakers["store"]; got != "closed" {
			t.Errorf("breaker after a good probe = %q, want closed", got)
		}
	})
}

func TestUsageCountsDemandAndAdmissions(t *testing.T) {
	clock := manualclock.New()
	lim := New(Config{Clock: clock})
	l := engine.Limit{Algorithm: engine.FixedWindow, Count: 5, Window: time.Minute}
	for range 8 {
		lim.Check(context.Background(), engine.Request{Subject: "g", Checks: []engine.Check{
			{Policy: "global", Cost: 2, Limit: l, Track: true},
			{Policy: "local", Cost: 1, Limit: engine.Limit{Algorithm: engine.TokenBucket, Rate: 1, Burst: 100}},
		}})
	}
	u := lim.DrainUsage()
	// Remaining and At are the last decision's: 1 of the 5 left, now.
	if got, want := u[engine.UsageKey{Subject: "g", Policy: "global"}], (engine.Usage{Demand: 16, Admitted: 4, Remaining: 1, At: clock.Now()}); got != want {
		t.Errorf("usage = %+v, want %+v", got, want)
	}
	if _, ok := u[engine.UsageKey{Subject: "g", Policy: "local"}]; ok {
		t.Error("untracked policy was counted")
	}
	if u := lim.DrainUsage(); len(u) != 0 {
		t.Errorf("second drain = %v, want empty", u)
	}
}

// OnStoreCall hears of every call that reached the store, good or failed,
// with its shard, and of none that the open breaker refused.
func TestOnStoreCallSeesEveryStoreCall(t *testing.T) {
	clock := manualclock.New()
	st := newFaulty(clock)
	type call struct {
		shard string
		err   bool
	}
	var calls []call
	lim := New(Config{Store: st, Clock: clock, DenyCacheSize: -1, Breaker: BreakerConfig{MinCalls: 4},
		OnStoreCall: func(shard string, took time.Duration, err error) {
			if took < 0 {
				t.Errorf("took = %v, want >= 0", took)
			}
			calls = append(calls, call{shard, err != nil})
		}})
	req := engine.Request{Subject: "s", Checks: []engine.Check{{Policy: "p", Cost: 1, Limit: engine.Limit{Algorithm: engine.TokenBucket, Rate: 1e6, Burst: 1e6}}}}
	ctx := context.Background()
	lim.Check(ctx, req)
	st.fail.Store(true)
	for range 10 {
		lim.Check(ctx, req) // the breaker opens after 4 calls with half failed
	}
	if len(calls) == 0 || calls[0] != (call{"store", false}) {
		t.Fatalf("first call = %v, want a good call to shard store", calls)
	}
	failed := 0
	for _, c := range calls[1:] {
		if c.err {
			failed++
		}
	}
	if got, want := int64(len(calls)), st.calls.Load(); got != want || got >= 11 {
		t.Errorf("OnStoreCall called %d times, want the store's %d calls, fewer than 11 checks (the breaker refused some)", got, want)
	}
	if failed != len(calls)-1 {
		t.Errorf("%d failed calls reported of %d, want every call after the first", failed, len(calls))
	}
}

// gatedStore answers each check with the next answer the test sends it,
// and counts the calls.
type gatedStore struct {
	answers chan storeAnswer
	calls   atomic.Int64
}

func (s *gatedStore) Check(ctx context.Context, req engine.Request) (engine.Decision, error) {
	s.calls.Add(1)
	a := <-s.answers
	return a.d, a.err
}

// TestDenyCacheProbeAsksTheStoreOnce: when a cached rejection's time is
// up, eight checks of its subject come at once while the store is slow.
// One of them asks the store and the others wait for its answer. Refused
// again, they are answered from the new rejection, with no store call of
// their own. Allowed the subject's last token, one of them asks next and
// the rest wait again (refused, they are answered from the cache).
// Allowed with tokens to spare, or failed, they ask the store at once,
// each for itself.
func TestDenyCacheProbeAsksTheStoreOnce(t *testing.T) {
	refused := storeAnswer{d: engine.Decision{N: 1}}
	refused.d.Results[0] = engine.Result{Limit: 10, RetryAfter: 100 * time.Millisecond, ResetAfter: 100 * time.Millisecond}
	allowed := func(remaining int64) storeAnswer {
		a := storeAnswer{d: engine.Decision{N: 1}}
		a.d.Results[0] = engine.Result{Allowed: true, Limit: 10, Remaining: remaining}
		a.d.Finish([]engine.Check{{Policy: "p", Cost: 1}})
		return a
	}
	for _, tt := range []struct {
		name      string
		probe     storeAnswer
		asking    int64 // store calls out once the probe is answered: the first check's, the probe's and these
		next      storeAnswer
		fromCache int // of the seven that waited
	}{
		{"refused again", refused, 0, refused, 7},
		{"allowed the last token", allowed(0), 1, refused, 6},
		{"allowed with tokens to spare", allowed(5), 7, allowed(4), 0},
		{"failed", storeAnswer{err: errStoreDown}, 7, allowed(4), 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				clock := manualclock.New()
				st := &gatedStore{answers: make(chan storeAnswer)}
				lim := New(Config{Store: st, Clock: clock, Timeout: time.Hour})
				req := engine.Request{Subject: "hot", Checks: []engine.Check{{Policy: "p", Cost: 1, Limit: engine.Limit{Algorithm: engine.TokenBucket, Rate: 10, Burst: 10}}}}
				ctx := context.Background()
				go func() { st.answers <- refused }()
				if o, err := lim.Check(ctx, req); err != nil || o.Allowed {
					t.Fatalf("first check: %+v, %v; want refused", o, err)
				}
				clock.Advance(100 * time.Millisecond)

				outcomes := make(chan Outcome, 8)
				for range 8 {
					go func() {
						o, _ := lim.Check(ctx, req)
						outcomes <- o
					}()
				}
				synctest.Wait()
				if n := st.calls.Load(); n != 2 {
					t.Fatalf("%d store calls with eight checks out after the rejection's time was up, want 2: the first check's and one probe", n)
				}
				st.answers <- tt.probe
				synctest.Wait()
				if n := st.calls.Load(); n != 2+tt.asking {
					t.Errorf("%d store calls once the probe was answered, want %d", n, 2+tt.asking)
				}
				for range tt.asking {
					st.answers <- tt.next
					synctest.Wait()
				}
				fromCache := 0
				for range 8 {
					if o := <-outcomes; o.Source == FromDenyCache {
						fromCache++
					}
				}
				if fromCache != tt.fromCache {
					t.Errorf("%d of the waiting checks answered from the deny cache, want %d", fromCache, tt.fromCache)
				}
			})
		})
	}
}
