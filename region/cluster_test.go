package region

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/internal/testwait"
	"github.com/sluice-rl/sluice/quota"
)

// startClusterDaemon serves a daemon on the Redis Cluster at url, with its
// background work (the policy watcher) running.
func startClusterDaemon(t *testing.T, url string) *liveDaemon {
	t.Helper()
	cfg := DefaultConfig()
	cfg.AdminToken = testToken
	cfg.Policies = []quota.Policy{} // none but the test's
	cfg.Store = url
	cfg.StoreTimeout = 100 * time.Millisecond // the test machine is shared
	cfg.PolicyRefresh = time.Minute           // changes must arrive by pub/sub
	cfg.ShutdownTimeout = time.Second
	return serveDaemon(t, cfg)
}

// TestDaemonsOnRedisCluster runs two daemons on one real Redis Cluster
// (3 primaries): limits are exact across both, whichever primary holds a
// subject, and a policy changed through one daemon is enforced by the
// other through the cluster's pub/sub, without a restart.
func TestDaemonsOnRedisCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	url := "redis-cluster://" + strings.Join(cl.Addrs(), ",")
	a := startClusterDaemon(t, url)
	b := startClusterDaemon(t, url)
	if code, body := a.admin(t, "PUT", "/v1/policies/burst", `{"algorithm":"token_bucket","rate_per_sec":0.01,"burst":20,"mode":"enforce"}`); code != 200 && code != 201 {
		t.Fatalf("PUT = %d %s", code, body)
	}
	testwait.For(t, 5*time.Second, "the policy to reach the second daemon", func() bool {
		_, ok := b.d.Registry().Get("burst")
		return ok
	})

	primaries := map[string]bool{}
	for s := range 12 {
		user := fmt.Sprint("u", s)
		primaries[cl.PrimaryForKey("rl:{user:"+user+"}:burst").Addr()] = true
		check := `{"user":"` + user + `","route":"/v1/orders","method":"GET"}`
		allowed := 0
		for i := range 30 {
			l := a
			if i%2 == 1 {
				l = b
			}
			code, body := l.admin(t, "POST", "/v1/check", check)
			var dec struct{ Degraded bool }
			json.Unmarshal([]byte(body), &dec)
			switch {
			case dec.Degraded:
				t.Fatalf("check on the cluster was degraded: %s", body)
			case code == 200:
				allowed++
			case code != 429:
				t.Fatalf("check = %d %s", code, body)
			}
		}
		if allowed != 20 {
			t.Errorf("%s: two daemons on one cluster allowed %d of 30, want exactly the burst of 20", user, allowed)
		}
	}
	if len(primaries) < 2 {
		t.Errorf("the subjects landed on %d primaries; the test wants several", len(primaries))
	}

	// A change made through b is enforced by a.
	if code, body := b.admin(t, "PUT", "/v1/policies/burst", `{"algorithm":"fixed_window","limit":1000,"window":3600,"mode":"enforce"}`); code != 200 {
		t.Fatalf("PUT through b = %d %s", code, body)
	}
	testwait.For(t, 5*time.Second, "the change to reach the first daemon", func() bool {
		p, _ := a.d.Registry().Get("burst")
		return p.Algorithm == "fixed_window"
	})
	if code, body := a.admin(t, "POST", "/v1/check", `{"user":"u0","route":"/v1/orders","method":"GET"}`); code != 200 {
		t.Errorf("after the change, check = %d %s, want 200", code, body)
	}
}
