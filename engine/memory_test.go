package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/manualclock"
)

func TestMemoryStoreEvictsLeastRecentlyUsed(t *testing.T) {
	clock := manualclock.New()
	s := NewMemoryStore(MemoryConfig{Clock: clock, MaxKeys: 8, Shards: 1})
	l := Limit{Algorithm: FixedWindow, Count: 10, Window: time.Hour}
	// Recency is kept to the millisecond: a millisecond between checks
	// orders them.
	for i := range 8 {
		mustCheck(t, s, one(fmt.Sprint("s", i), "p", l, 5))
		clock.Advance(time.Millisecond)
	}
	// Use s0 again so s1 becomes the least recently used.
	mustCheck(t, s, one("s0", "p", l, 1))
	clock.Advance(time.Millisecond)
	mustCheck(t, s, one("s8", "p", l, 5))
	if got := s.Evictions(); got != 1 {
		t.Fatalf("Evictions() = %d, want 1", got)
	}
	if got := s.Len(); got != 8 {
		t.Fatalf("Len() = %d, want 8", got)
	}
	peek := func(sub string) int64 {
		return mustCheck(t, s, one(sub, "p", l, 0)).Results[0].Remaining
	}
	if got := peek("s0"); got != 4 {
		t.Errorf("s0 remaining = %d, want 4 (kept: recently used)", got)
	}
	if got := peek("s1"); got != 10 {
		t.Errorf("s1 remaining = %d, want 10 (evicted, so fresh)", got)
	}
	if got := peek("s2"); got != 5 {
		t.Errorf("s2 remaining = %d, want 5 (kept)", got)
	}
}

func TestMemoryStoreExpiresIdleState(t *testing.T) {
	clock := manualclock.New()
	s := NewMemoryStore(MemoryConfig{Clock: clock, Shards: 4})
	tb := Limit{Algorithm: TokenBucket, Rate: 10, Burst: 20}
	for i := range 100 {
		mustCheck(t, s, one(fmt.Sprint("k", i), "p", tb, 20))
	}
	if got := s.Len(); got != 100 {
		t.Fatalf("Len() = %d, want 100", got)
	}
	// Refill takes 2 s; the TTL is refill + 1 s.
	clock.Advance(2 * time.Second)
	s.Sweep()
	if got := s.Len(); got != 100 {
		t.Fatalf("Len() after 2 s = %d, want 100 (not yet expired)", got)
	}
	clock.Advance(2 * time.Second)
	s.Sweep()
	if got := s.Len(); got != 0 {
		t.Fatalf("Len() after 4 s = %d, want 0 (all expired)", got)
	}
	// A fresh state is a full bucket, exactly what the expired one had become.
	if d := mustCheck(t, s, one("k1", "p", tb, 20)); !d.Allowed {
		t.Error("full spend after expiry rejected")
	}
}

// TestMemoryStoreTableSurvivesChurn inserts and removes many keys so that
// the open-addressing deletion is exercised, and checks every live key is
// still found with its own state.
func TestMemoryStoreTableSurvivesChurn(t *testing.T) {
	clock := manualclock.New()
	s := NewMemoryStore(MemoryConfig{Clock: clock, MaxKeys: 512, Shards: 2})
	l := Limit{Algorithm: FixedWindow, Count: 1000, Window: 24 * time.Hour}
	spent := map[string]int64{}
	for i := range 5000 {
		sub := fmt.Sprint("c", i)
		cost := int64(1 + i%7)
		mustCheck(t, s, one(sub, "p", l, cost))
		spent[sub] = cost
	}
	if got := s.Len(); got != 512 {
		t.Fatalf("Len() = %d, want 512", got)
	}
	// The newest 512 subjects (roughly; shards split them) must still hold
	// their exact state.
	kept := 0
	for i := 4999; i >= 4000; i-- {
		sub := fmt.Sprint("c", i)
		d := mustCheck(t, s, one(sub, "p", l, 0))
		switch rem := d.Results[0].Remaining; rem {
		case 1000 - spent[sub]:
			kept++
		case 1000:
		default:
			t.Fatalf("%s remaining = %d, want %d or 1000 (evicted)", sub, rem, 1000-spent[sub])
		}
	}
	if kept < 400 {
		t.Errorf("only %d of the newest 1000 subjects kept their state, want at least 400", kept)
	}
}

func TestMemoryStoreSlidingLogMemoryIsReused(t *testing.T) {
	clock := manualclock.New()
	s := NewMemoryStore(MemoryConfig{Clock: clock, Shards: 1})
	l := Limit{Algorithm: SlidingWindowLog, Count: 10, Window: time.Second}
	for range 1000 {
		mustCheck(t, s, one("log", "p", l, 1))
		clock.Advance(50 * time.Millisecond)
	}
	sh := &s.shards[0]
	for _, lg := range sh.logs {
		if len(lg) > 10 || cap(lg) > 32 {
			t.Errorf("log len %d cap %d, want at most 10 live timestamps in bounded memory", len(lg), cap(lg))
		}
	}
}

func TestMemoryStoreCheckAllocatesNothing(t *testing.T) {
	s := NewMemoryStore(MemoryConfig{})
	req := Request{Subject: "alloc", Checks: []Check{
		{Policy: "a", Limit: Limit{Algorithm: TokenBucket, Rate: 1e6, Burst: 1e6}, Cost: 1},
		{Policy: "b", Limit: Limit{Algorithm: SlidingWindowCounter, Count: 1e9, Window: time.Hour}, Cost: 1},
	}}
	ctx := context.Background()
	s.Check(ctx, req) // first check inserts
	if n := testing.AllocsPerRun(1000, func() { s.Check(ctx, req) }); n != 0 {
		t.Errorf("Check allocates %v times per call, want 0", n)
	}
}

// TestMemoryStoreConcurrentGrowthLosesNothing has many goroutines check
// two policies per subject while the tables grow under them (checks that
// find their states lock entries without the shard's mutex; growth moves
// every entry): no admitted unit may be lost or counted twice.
func TestMemoryStoreConcurrentGrowthLosesNothing(t *testing.T) {
	clock := manualclock.New()
	s := NewMemoryStore(MemoryConfig{Clock: clock, Shards: 2})
	l := Limit{Algorithm: FixedWindow, Count: 1e9, Window: time.Hour}
	const subjects, workers, perWorker = 3000, 8, 6000
	spent := make([]atomic.Int64, subjects)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range perWorker {
				i := r.IntN(subjects)
				cost := int64(1 + r.IntN(3))
				req := Request{Subject: fmt.Sprint("g", i), Checks: []Check{
					{Policy: "a", Limit: l, Cost: cost},
					{Policy: "b", Limit: l, Cost: 2 * cost},
				}}
				d, err := s.Check(context.Background(), req)
				if err != nil || !d.Allowed {
					t.Errorf("check %s: %v allowed=%v", req.Subject, err, d.Allowed)
					return
				}
				spent[i].Add(cost)
			}
		}()
	}
	wg.Wait()
	for i := range subjects {
		d := mustCheck(t, s, Request{Subject: fmt.Sprint("g", i), Checks: []Check{
			{Policy: "a", Limit: l}, {Policy: "b", Limit: l},
		}})
		want := spent[i].Load()
		if got := int64(1e9) - d.Results[0].Remaining; got != want {
			t.Fatalf("g%d policy a spent %d, want %d", i, got, want)
		}
		if got := int64(1e9) - d.Results[1].Remaining; got != 2*want {
			t.Fatalf("g%d policy b spent %d, want %d", i, got, 2*want)
		}
	}
}

// TestMemoryStoreConcurrentEvictionAndSweep churns a small store from many
// goroutines while another sweeps, with states expiring as the clock moves:
// the table stays consistent (every state found is the subject's own, and
// the store holds no more than it may).
func TestMemoryStoreConcurrentEvictionAndSweep(t *testing.T) {
	clock := manualclock.New()
	s := NewMemoryStore(MemoryConfig{Clock: clock, Shards: 4, MaxKeys: 400})
	tb := Limit{Algorithm: TokenBucket, Rate: 100, Burst: 1000}
	logl := Limit{Algorithm: SlidingWindowLog, Count: 50, Window: time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	var bg sync.WaitGroup
	bg.Add(1)
	go func() {
		defer bg.Done()
		for ctx.Err() == nil {
			s.Sweep()
			clock.Advance(50 * time.Millisecond)
		}
	}()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 2))
			for range 20000 {
				sub := fmt.Sprint("e", r.IntN(2000))
				checks := []Check{{Policy: "tb", Limit: tb, Cost: 1}}
				if r.IntN(4) == 0 {
					checks = append(checks, Check{Policy: "log", Limit: logl, Cost: 1})
				}
				d, err := s.Check(context.Background(), Request{Subject: sub, Checks: checks})
				if err != nil {
					t.Error(err)
					return
				}
				// A bucket never refills past its burst, however its state
				// moved between tables.
				if r := d.Results[0]; r.Remaining < 0 || r.Remaining > 1000 {
					t.Errorf("%s remaining %d outside [0, 1000]", sub, r.Remaining)
					return
				}
			}
		}()
	}
	wg.Wait()
	cancel()
	bg.Wait()
	if n := s.Len(); n > 400 {
		t.Errorf("Len() = %d, want at most MaxKeys 400", n)
	}
	if s.Evictions() == 0 {
		t.Error("no evictions: the test did not exercise them")
	}
}

// TestMemoryStoreMatchesModelThroughSweeps checks the table against a plain
// map while states expire and are swept at different times (each removal
// shifts later entries back) and the table grows: every subject's count
// must be exactly what the model says.
func TestMemoryStoreMatchesModelThroughSweeps(t *testing.T) {
	clock := manualclock.New()
	s := NewMemoryStore(MemoryConfig{Clock: clock, Shards: 2})
	r := rand.New(rand.NewPCG(3, 4))
	type state struct {
		count int64
		start time.Time // window start, windows aligned as the store aligns them
	}
	windows := []time.Duration{time.Second, 3 * time.Second, 10 * time.Second}
	limitOf := func(i int) Limit {
		return Limit{Algorithm: FixedWindow, Count: 1e6, Window: windows[i%len(windows)]}
	}
	model := map[int]state{}
	const subjects = 600
	for step := range 20000 {
		i := r.IntN(subjects)
		l := limitOf(i)
		cost := int64(1 + r.IntN(5))
		mustCheck(t, s, one(fmt.Sprint("m", i), "p", l, cost))
		start := clock.Now().Truncate(l.Window)
		if st, ok := model[i]; ok && st.start.Equal(start) {
			model[i] = state{st.count + cost, start}
		} else {
			model[i] = state{cost, start}
		}
		if step%50 == 0 {
			clock.Advance(time.Duration(r.IntN(400)) * time.Millisecond)
			s.Sweep()
		}
		if step%500 == 0 {
			for j := range subjects {
				l := limitOf(j)
				want := int64(1e6)
				if st, ok := model[j]; ok && st.start.Equal(clock.Now().Truncate(l.Window)) {
					want -= st.count
				}
				got := mustCheck(t, s, one(fmt.Sprint("m", j), "p", l, 0)).Results[0].Remaining
				if got != want {
					t.Fatalf("step %d: m%d remaining %d, want %d", step, j, got, want)
				}
			}
		}
	}
	if n := s.Len(); n > subjects {
		t.Errorf("Len() = %d, more than the %d subjects", n, subjects)
	}
}

// TestMemoryStoreBoundIsStoreWide checks that MaxKeys bounds the whole
// store, not each shard: one subject (one shard) may hold more than a
// shard's even share without losing a state, and past MaxKeys the store
// stays within MaxKeys plus the shard count, evicting from the shard that
// holds the most rather than from a newcomer's own few states.
func TestMemoryStoreBoundIsStoreWide(t *testing.T) {
	l := Limit{Algorithm: FixedWindow, Count: 10, Window: time.Hour}
	t.Run("one subject under MaxKeys", func(t *testing.T) {
		clock := manualclock.New()
		s := NewMemoryStore(MemoryConfig{Clock: clock, MaxKeys: 200_000})
		const states = 100_000
		for i := range states {
			mustCheck(t, s, one("rls:domain", fmt.Sprint("d", i), l, 1))
		}
		if got := s.Evictions(); got != 0 {
			t.Errorf("Evictions() = %d, want 0: %d states are under MaxKeys 200000", got, states)
		}
		if got := s.Len(); got != states {
			t.Errorf("Len() = %d, want %d", got, states)
		}
		for i := range states {
			if rem := mustCheck(t, s, one("rls:domain", fmt.Sprint("d", i), l, 0)).Results[0].Remaining; rem != 9 {
				t.Fatalf("d%d remaining = %d, want 9 (its window's spend kept)", i, rem)
			}
		}
	})
	t.Run("past MaxKeys", func(t *testing.T) {
		const maxKeys, shards = 1000, 16
		clock := manualclock.New()
		s := NewMemoryStore(MemoryConfig{Clock: clock, MaxKeys: maxKeys, Shards: shards})
		// One subject fills the store, then newcomers arrive.
		for i := range 3 * maxKeys {
			mustCheck(t, s, one("big", fmt.Sprint("d", i), l, 1))
			clock.Advance(time.Millisecond)
		}
		if n := s.Len(); n > maxKeys+shards {
			t.Fatalf("Len() = %d after one subject's %d states, want at most MaxKeys+shards %d", n, 3*maxKeys, maxKeys+shards)
		}
		const newcomers = 50
		for i := range newcomers {
			mustCheck(t, s, one(fmt.Sprint("new", i), "p", l, 1))
			clock.Advance(time.Millisecond)
		}
		if n := s.Len(); n > maxKeys+shards {
			t.Errorf("Len() = %d, want at most MaxKeys+shards %d", n, maxKeys+shards)
		}
		if got, want := int(s.Evictions()), 3*maxKeys+newcomers-s.Len(); got != want {
			t.Errorf("Evictions() = %d, want %d (every state inserted and not held)", got, want)
		}
		for i := range newcomers {
			if rem := mustCheck(t, s, one(fmt.Sprint("new", i), "p", l, 0)).Results[0].Remaining; rem != 9 {
				t.Errorf("new%d remaining = %d, want 9: a newcomer's state went before the big subject's older ones", i, rem)
			}
		}
	})
	t.Run("concurrent", func(t *testing.T) {
		const maxKeys, shards = 400, 8
		clock := manualclock.New()
		s := NewMemoryStore(MemoryConfig{Clock: clock, MaxKeys: maxKeys, Shards: shards})
		var wg sync.WaitGroup
		for w := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(w), 3))
				for range 5000 {
					sub := "big"
					if r.IntN(2) == 0 {
						sub = fmt.Sprint("s", r.IntN(1000))
					}
					req := Request{Subject: sub, Checks: []Check{{Policy: fmt.Sprint("p", r.IntN(2000)), Limit: l, Cost: 1}}}
					if _, err := s.Check(context.Background(), req); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		n := s.Len()
		if n > maxKeys+shards {
			t.Errorf("Len() = %d, want at most MaxKeys+shards %d", n, maxKeys+shards)
		}
		if got := s.count.Load(); got != int64(n) {
			t.Errorf("store-wide count = %d, want Len() %d at rest", got, n)
		}
		if s.Evictions() == 0 {
			t.Error("no evictions: the test did not exercise them")
		}
	})
}
