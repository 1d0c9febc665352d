package region

import (
	"net/http"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/redistest"
)

// TestRedisDownAnswersByPolicyClass runs the daemon on a real redis-server,
// kills it, and checks what gateways see: a quota policy still answers
// (degraded, within its in-process limit), a security policy answers 503
// with a problem document and Retry-After, and nothing is a 500.
func TestRedisDownAnswersByPolicyClass(t *testing.T) {
	srv := redistest.Start(t)
	h := newHarness(t, func(c *Config) {
		c.Store = "redis://" + srv.Addr()
		c.StoreTimeout = 50 * time.Millisecond // the test machine is shared
	})
	h.putPolicy("orders", `{"match":{"routes":["/v1/orders"]},"algorithm":"token_bucket","rate_per_sec":1,"burst":5,"mode":"enforce"}`)
	h.putPolicy("login", `{"match":{"routes":["/v1/login"]},"algorithm":"sliding_window_counter","limit":5,"window":900,"class":"security","mode":"enforce"}`)
	orders := `{"user":"alice","route":"/v1/orders","method":"GET"}`
	login := `{"user":"alice","route":"/v1/login","method":"POST"}`
	if r := h.do("POST", "/v1/check", orders); r.status != 200 || r.json(t)["degraded"] != false {
		t.Fatalf("with Redis up: %d %s", r.status, r.body)
	}
	if r := h.do("POST", "/v1/check", login); r.status != 200 {
		t.Fatalf("login with Redis up: %d %s", r.status, r.body)
	}

	srv.Kill()
	allowed := 0
	for i := range 20 {
		r := h.do("POST", "/v1/check", orders)
		switch r.status {
		case http.StatusOK:
			allowed++
		case http.StatusTooManyRequests:
		default:
			t.Fatalf("quota check %d with Redis down = %d %s, want 200 or 429", i, r.status, r.body)
		}
		if r.json(t)["degraded"] != true {
			t.Fatalf("quota check %d with Redis down not marked degraded: %s", i, r.body)
		}
	}
	// open: the in-process limit is twice the policy (burst 10).
	if allowed != 10 {
		t.Errorf("quota checks allowed with Redis down = %d of 20, want 10 (2x burst 5)", allowed)
	}
	r := h.do("POST", "/v1/check", login)
	if r.status != http.StatusServiceUnavailable {
		t.Fatalf("security check with Redis down = %d %s, want 503", r.status, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("503 Content-Type = %q, want application/problem+json", ct)
	}
	if r.header.Get("Retry-After") == "" {
		t.Error("503 without Retry-After")
	}
	if ra := r.header.Get("RateLimit"); ra != "" {
		t.Errorf("security policy leaked into RateLimit header: %q", ra)
	}
}
