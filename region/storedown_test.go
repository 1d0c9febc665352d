package region

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/quota"
)

// checkOnce posts one check to a live daemon and returns its status and
// decoded body.
func checkOnce(t *testing.T, l *liveDaemon, body string) (int, map[string]any) {
	t.Helper()
	res, err := http.Post(l.base+"/v1/check", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST /v1/check: %v", err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	return res.StatusCode, m
}

// localPolicy is an on_store_failure "local" policy of rate per second and
// burst 2 on /v1/orders.
func localPolicy(rate float64) quota.Policy {
	return quota.Policy{ID: "orders", Match: quota.Match{Routes: []string{"/v1/orders"}}, Algorithm: "token_bucket",
		RatePerSec: rate, Burst: 2, Mode: quota.ModeEnforce, OnStoreFailure: quota.FailLocal}
}

const ordersCheck = `{"user":"alice","route":"/v1/orders","method":"GET"}`

// TestLocalFallbackSharedByRegionDaemons: three daemons of one region on
// one Redis, which is then killed. Each divides the "local" policy's rate
// by the live daemons of its region in the gossip membership, so together
// they admit the policy's rate, not three times it.
func TestLocalFallbackSharedByRegionDaemons(t *testing.T) {
	srv := redistest.Start(t)
	const rate = 20.0
	var ds []*liveDaemon
	for i, node := range []string{"eu-1", "eu-2", "eu-3"} {
		cfg := DefaultConfig()
		cfg.AdminToken = testToken
		cfg.Policies = []quota.Policy{localPolicy(rate)}
		cfg.Listen = "127.0.0.1:0"
		cfg.ShutdownTimeout = time.Second
		cfg.Store = "redis://" + srv.Addr()
		cfg.StoreTimeout = 50 * time.Millisecond
		cfg.Gossip = &GossipConfig{Region: "eu", Node: node, Listen: "127.0.0.1:0", Interval: time.Second, Dev: true, Preset: "local"}
		if i > 0 {
			cfg.Gossip.Join = []string{ds[0].d.Gossip().Addr()}
		}
		ds = append(ds, serveDaemon(t, cfg))
	}
	eventually(t, "three live daemons in eu on each", 15*time.Second, func() bool {
		for _, l := range ds {
			if l.d.localDaemons() != 3 {
				return false
			}
		}
		return true
	})
	srv.Kill()

	// Offer each daemon far more than the rate for a few seconds.
	const span = 4 * time.Second
	var mu sync.Mutex
	allowed, degraded := 0, 0
	start := time.Now()
	var wg sync.WaitGroup
	for _, l := range ds {
		wg.Go(func() {
			for time.Since(start) < span {
				code, body := checkOnce(t, l, ordersCheck)
				mu.Lock()
				if code == http.StatusOK {
					allowed++
				} else if code != http.StatusTooManyRequests {
					t.Errorf("check with Redis down = %d %v, want 200 or 429", code, body)
				}
				if body["degraded"] == true {
					degraded++
				}
				mu.Unlock()
				<-time.After(10 * time.Millisecond) // pacing: about 100 checks a second per daemon
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	got := float64(allowed) / elapsed
	t.Logf("3 daemons, Redis down: %d admitted in %.2f s = %.1f/s (policy rate %.0f/s), %d degraded answers", allowed, elapsed, got, rate, degraded)
	if degraded == 0 {
		t.Fatal("no answer was degraded: the store was not down")
	}
	if got > 1.1*rate {
		t.Errorf("admitted %.1f/s together, want within 1.1x the rate %.0f/s", got, rate)
	}
	if got < 0.5*rate {
		t.Errorf("admitted %.1f/s together, want about the rate %.0f/s", got, rate)
	}
}
