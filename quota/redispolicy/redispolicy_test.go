package redispolicy

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/internal/testwait"
	"github.com/sluice-rl/sluice/quota"
)

func policy(id string, burst float64) quota.Policy {
	return quota.Policy{ID: id, Algorithm: "token_bucket", RatePerSec: 1, Burst: burst, Mode: quota.ModeEnforce}
}

// TestTwoRegistriesShareState: a change saved through one registry is
// applied by the other's watcher within a second; a concurrent change on a
// stale registry is refused; an unreachable Redis keeps the last good set.
func TestTwoRegistriesShareState(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	storeA, storeB := New(srv.Client(t), Config{}, nil), New(srv.Client(t), Config{}, nil)
	a := quota.NewRegistry(quota.RegistryConfig{Store: storeA})
	b := quota.NewRegistry(quota.RegistryConfig{Store: storeB})
	if err := a.Load(ctx); !errors.Is(err, quota.ErrNoSnapshot) {
		t.Fatalf("Load on empty Redis = %v, want ErrNoSnapshot", err)
	}
	if err := a.Seed(ctx, "test", []quota.Policy{policy("p", 5)}); err != nil {
		t.Fatal(err)
	}
	w := NewWatcher(storeB, b, time.Hour, nil) // only pub/sub can make it in time
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()

	waitBurst := func(want float64) {
		t.Helper()
		testwait.For(t, time.Second, fmt.Sprintf("b to have burst %v", want), func() bool {
			p, ok := b.Get("p")
			return ok && p.Burst == want
		})
	}
	waitBurst(5)
	if _, err := a.Put(ctx, "test", policy("p", 9), nil); err != nil {
		t.Fatal(err)
	}
	waitBurst(9)

	// A registry that has not yet seen a change cannot overwrite it.
	stale := New(srv.Client(t), Config{}, nil)
	staleReg := quota.NewRegistry(quota.RegistryConfig{Store: stale})
	if _, err := staleReg.Put(ctx, "test", policy("q", 1), nil); !errors.Is(err, ErrConcurrentChange) {
		t.Fatalf("stale Put = %v, want ErrConcurrentChange", err)
	}

	// Redis gone: reloads fail, the last good set stays.
	srv.Kill()
	w.Reload(ctx)
	if p, ok := b.Get("p"); !ok || p.Burst != 9 {
		t.Fatalf("after Redis died b has %+v, want the last good set", p)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

// TestLostStateIsPutBack: Redis loses the shared state (a restart without
// persistence, a failover to an empty replica: here the key deleted)
// while two daemons hold revision 2, and a third starts meanwhile and
// seeds the empty Redis with its own set at revision 1. The first watcher
// to reload puts revision 2 back; the third daemon takes it from there; a
// change through either of the first two is then saved, not refused as
// concurrent.
func TestLostStateIsPutBack(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	rdb := srv.Client(t)
	storeA, storeB := New(rdb, Config{}, nil), New(srv.Client(t), Config{}, nil)
	a := quota.NewRegistry(quota.RegistryConfig{Store: storeA})
	b := quota.NewRegistry(quota.RegistryConfig{Store: storeB})
	if err := a.Seed(ctx, "test", []quota.Policy{policy("p", 5)}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Put(ctx, "test", policy("extra", 3), nil); err != nil {
		t.Fatal(err)
	}
	if err := b.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if storeA.Applied() != 2 || storeB.Applied() != 2 {
		t.Fatalf("revisions held %d and %d, want 2 and 2", storeA.Applied(), storeB.Applied())
	}

	if err := rdb.Del(ctx, "{sluice-policies}:state").Err(); err != nil {
		t.Fatal(err)
	}
	storeC := New(srv.Client(t), Config{}, nil)
	c := quota.NewRegistry(quota.RegistryConfig{Store: storeC})
	if err := c.Load(ctx); !errors.Is(err, quota.ErrNoSnapshot) {
		t.Fatalf("Load after the loss = %v, want ErrNoSnapshot", err)
	}
	if err := c.Seed(ctx, "test", []quota.Policy{policy("p", 5)}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Put(ctx, "test", policy("p", 7), nil); !errors.Is(err, ErrConcurrentChange) {
		t.Fatalf("Put before any reload = %v, want ErrConcurrentChange (Redis is at revision 1)", err)
	}

	var results []string
	wa := NewWatcher(storeA, a, time.Hour, nil)
	wa.OnResult(func(r string, _ error) { results = append(results, r) })
	wa.Reload(ctx)
	NewWatcher(storeB, b, time.Hour, nil).Reload(ctx) // a sibling finds it back already
	NewWatcher(storeC, c, time.Hour, nil).Reload(ctx)
	if len(results) != 1 || results[0] != "restored" {
		t.Errorf("a's reload results %v, want [restored]", results)
	}
	if _, ok := c.Get("extra"); !ok || storeC.Applied() != 2 {
		t.Errorf("c after its reload: policy extra present %v, revision %d; want revision 2's set", ok, storeC.Applied())
	}
	if _, err := b.Put(ctx, "test", policy("p", 7), nil); err != nil {
		t.Fatalf("Put after the state was put back = %v", err)
	}
	if _, rev, err := storeA.Fetch(ctx); err != nil || rev != 3 {
		t.Errorf("Redis after the change: revision %d, %v; want 3", rev, err)
	}
}
