package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/internal/testwait"
)

// TestServeOnRedisSentinel runs two `sluice serve` processes on a Redis
// Sentinel deployment: both start on --store redis-sentinel://, report it
// in /readyz, share a policy put through one, and together admit a subject
// exactly its limit.
func TestServeOnRedisSentinel(t *testing.T) {
	bin := buildSluice(t)
	sd := redistest.StartSentinel(t)
	store := "redis-sentinel://" + redistest.MasterName + "@" + strings.Join(sd.Addrs(), ",")
	empty := writeFile(t, "policies.json", "[]")
	// Exact shared admissions are asserted: a deadline far above the 5 ms
	// default keeps a loaded test machine from deciding on the fallback.
	a := startDaemon(t, bin, "--store", store, "--policies", empty, "--store-timeout", "250ms")
	b := startDaemon(t, bin, "--store", store, "--policies", empty, "--store-timeout", "250ms")

	for _, d := range []*daemon{a, b} {
		r := d.do("GET", "/readyz", "")
		var rd struct{ Status, Store string }
		if err := json.Unmarshal([]byte(r.body), &rd); err != nil || r.status != 200 || rd.Store != "redis-sentinel" {
			t.Fatalf("GET /readyz = %d %s, want 200 with store redis-sentinel", r.status, r.body)
		}
	}
	if r := a.admin("PUT", "/v1/policies/per-user", `{"algorithm":"fixed_window","limit":5,"window":3600,"mode":"enforce"}`); r.status != 201 {
		t.Fatalf("PUT on a = %d %s", r.status, r.body)
	}
	testwait.For(t, 5*time.Second, "daemon b to apply the policy put through a", func() bool {
		return strings.Contains(b.admin("GET", "/v1/policies/per-user/versions", "").body, `"in_force":1`)
	})

	for i := range 3 {
		check := fmt.Sprintf(`{"user":"user-%d","route":"/orders"}`, i)
		if allowed := allowedAcross(t, a, b, check, 8); allowed != 5 {
			t.Errorf("user-%d: %d of 8 checks allowed across two daemons, want exactly the limit 5", i, allowed)
		}
	}
	// The state is on the primary the Sentinels name, where both daemons
	// wrote it.
	keys, err := sd.Primary().Client(t).Keys(t.Context(), "rl:*").Result()
	if err != nil || len(keys) != 3 {
		t.Errorf("KEYS rl:* on the primary = %v, %v, want the 3 subjects' states", keys, err)
	}
}
