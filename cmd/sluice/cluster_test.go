package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/internal/testwait"
)

// TestServeOnRedisCluster runs two `sluice serve` processes on a Redis
// Cluster of three primaries: a policy put through one is enforced by the
// other, every subject gets exactly its limit however the two daemons
// share its checks, and the subjects' states are spread over all three
// primaries (so the script runs on each, keyed by its hash tag).
func TestServeOnRedisCluster(t *testing.T) {
	bin := buildSluice(t)
	cluster := redistest.StartCluster(t, 3, 0)
	store := "redis-cluster://" + strings.Join(cluster.Addrs(), ",")
	empty := writeFile(t, "policies.json", "[]")
	// A store timeout the shared test machine meets even under -race: a
	// timed-out call would be decided by the fallback, not exactly.
	a := startDaemon(t, bin, "--store", store, "--policies", empty, "--store-timeout", "250ms")
	b := startDaemon(t, bin, "--store", store, "--policies", empty, "--store-timeout", "250ms")

	if r := a.admin("PUT", "/v1/policies/per-user", `{"algorithm":"fixed_window","limit":5,"window":3600,"mode":"enforce"}`); r.status != 201 {
		t.Fatalf("PUT on a = %d %s", r.status, r.body)
	}
	testwait.For(t, 5*time.Second, "daemon b to apply the policy put through a", func() bool {
		return strings.Contains(b.admin("GET", "/v1/policies/per-user/versions", "").body, `"in_force":1`)
	})

	const subjects, tries = 24, 8
	for i := range subjects {
		check := fmt.Sprintf(`{"user":"user-%d","route":"/orders"}`, i)
		if allowed := allowedAcross(t, a, b, check, tries); allowed != 5 {
			t.Errorf("user-%d: %d of %d checks allowed across two daemons, want exactly the limit 5", i, allowed, tries)
		}
	}

	// Where did the states go? Each primary must hold some.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	total := 0
	for _, n := range cluster.Nodes() {
		keys, err := n.Client(t).Keys(ctx, "rl:*").Result()
		if err != nil {
			t.Fatalf("KEYS on %s: %v", n.Addr(), err)
		}
		t.Logf("primary %s holds %d limiter states", n.Addr(), len(keys))
		if len(keys) == 0 {
			t.Errorf("primary %s holds no limiter state: subjects did not spread over the cluster", n.Addr())
		}
		total += len(keys)
	}
	if total != subjects {
		t.Errorf("%d limiter states in the cluster, want one per subject (%d)", total, subjects)
	}
}
