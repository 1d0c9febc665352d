package region

import (
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/quota"
)

// TestAdminChangeOutlivesRestart: on Redis, a change made through the
// admin API to a policy the --policies set configures stays in force when
// a daemon restarts from the same set (a restart is not an edit of the
// file), and gives way when the daemon restarts from an edited one.
func TestAdminChangeOutlivesRestart(t *testing.T) {
	srv := redistest.Start(t)
	start := func(count float64) *liveDaemon {
		cfg := DefaultConfig()
		cfg.AdminToken = testToken
		cfg.Policies = []quota.Policy{{ID: "api", Match: quota.Match{Routes: []string{"/a"}}, Algorithm: "fixed_window",
			Count: count, Window: 5, Mode: quota.ModeEnforce}}
		cfg.Listen = "127.0.0.1:0"
		cfg.ShutdownTimeout = time.Second
		cfg.Store = "redis://" + srv.Addr()
		return serveDaemon(t, cfg)
	}
	count := func(l *liveDaemon) float64 {
		p, ok := l.d.Registry().Get("api")
		if !ok {
			t.Fatal("api not in force")
		}
		return p.Count
	}
	a := start(8)
	if code, body := a.admin(t, "PUT", "/v1/policies/api",
		`{"match":{"routes":["/a"]},"algorithm":"fixed_window","limit":4,"window":5,"mode":"enforce"}`); code != 200 {
		t.Fatalf("PUT = %d %s", code, body)
	}
	a.stop()

	b := start(8)
	if got := count(b); got != 4 {
		t.Errorf("restarted from the same set: api at %g, want the admin API's 4", got)
	}
	b.stop()

	c := start(6)
	if got := count(c); got != 6 {
		t.Errorf("restarted from an edited set: api at %g, want the set's 6", got)
	}
}
