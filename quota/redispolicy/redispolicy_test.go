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
