package region

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/quota"
)

// TestRedisKeyPrefix: daemons on one redis-server with the same key
// prefix share counters (and policies); a daemon with another prefix
// shares neither; every key written starts with one of the prefixes.
func TestRedisKeyPrefix(t *testing.T) {
	srv := redistest.Start(t)
	pol := quota.Policy{ID: "orders", Match: quota.Match{Routes: []string{"/v1/orders"}}, Algorithm: "fixed_window",
		Count: 3, Window: 3600, Mode: quota.ModeEnforce}
	start := func(prefix string) *liveDaemon {
		cfg := DefaultConfig()
		cfg.AdminToken = testToken
		cfg.Policies = []quota.Policy{pol}
		cfg.Listen = "127.0.0.1:0"
		cfg.ShutdownTimeout = time.Second
		cfg.Store = "redis://" + srv.Addr()
		cfg.StoreTimeout = time.Second // a loaded machine: no fallback answers
		cfg.Redis.KeyPrefix = prefix
		return serveDaemon(t, cfg)
	}
	a1, a2, b := start("deploy-a:"), start("deploy-a:"), start("deploy-b:")
	codes := func(l *liveDaemon, n int) string {
		var out []string
		for range n {
			code, body := checkOnce(t, l, ordersCheck)
			if body["source"] != "store" {
				t.Fatalf("check answered from %v, want the store: %v", body["source"], body)
			}
			out = append(out, http.StatusText(code))
		}
		return strings.Join(out, ",")
	}
	for _, tt := range []struct {
		name string
		l    *liveDaemon
		n    int
		want string
	}{
		{"first daemon of deploy-a", a1, 2, "OK,OK"},
		{"second daemon of deploy-a, same counter", a2, 2, "OK,Too Many Requests"},
		{"deploy-b, a counter of its own", b, 3, "OK,OK,OK"},
		{"deploy-b, then over", b, 1, "Too Many Requests"},
		{"deploy-a, still over", a1, 1, "Too Many Requests"},
	} {
		if got := codes(tt.l, tt.n); got != tt.want {
			t.Errorf("%s: %s, want %s", tt.name, got, tt.want)
		}
	}
	keys, err := srv.Client(t).Keys(context.Background(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var policies []string
	for _, k := range keys {
		if !strings.HasPrefix(k, "deploy-a:") && !strings.HasPrefix(k, "deploy-b:") {
			t.Errorf("key %q starts with neither prefix", k)
		}
		if strings.HasSuffix(k, "{sluice-policies}:state") {
			policies = append(policies, k)
		}
		if strings.HasPrefix(k, "deploy-") && strings.Contains(k, "rl:{") && !strings.Contains(k, ":rl:{") {
			t.Errorf("key %q: the hash tag does not follow the prefix and rl:", k)
		}
	}
	if len(policies) != 2 {
		t.Errorf("policy state keys %v, want one per prefix", policies)
	}
}
