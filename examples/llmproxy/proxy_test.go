package main

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/client/local"
	"github.com/sluice-rl/sluice/engine/limiter"
	"github.com/sluice-rl/sluice/internal/manualclock"
	"github.com/sluice-rl/sluice/quota"
)

// fakeCompletions is a completion API that uses a random number of
// tokens, 1 to most, for each completion, and remembers what it reported.
type fakeCompletions struct {
	mu   sync.Mutex
	rng  *rand.Rand
	most int64
	last int64
}

func (f *fakeCompletions) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	f.mu.Lock()
	n := 1 + f.rng.Int64N(f.most)
	f.last = n
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"choices": []any{map[string]any{"text": "…"}}, "usage": map[string]int64{"total_tokens": n}})
}

// TestBudgetsHoldAgainstRandomCompletions runs the proxy, over real HTTP,
// against a backend reporting random token counts, for two API keys over
// three virtual days: each key's tokens in every UTC minute and every UTC
// day stay within the budget plus one completion's most (the documented
// bound for a client that sends one request at a time), and each day's
// budget is used, not left idle.
func TestBudgetsHoldAgainstRandomCompletions(t *testing.T) {
	const perMinute, perDay, most = 2000, 20000, 300
	clock := manualclock.New()
	backend := &fakeCompletions{rng: rand.New(rand.NewPCG(1, 2)), most: most}
	bsrv := httptest.NewServer(backend)
	t.Cleanup(bsrv.Close)
	reg := quota.NewRegistry(quota.RegistryConfig{})
	if err := reg.Seed(context.Background(), "test", policies(perMinute, perDay)); err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(bsrv.URL)
	h, err := newProxy(u, local.New(limiter.New(limiter.Config{Clock: clock}), reg), func(_ *http.Request, err error) { t.Errorf("proxy: %v", err) })
	if err != nil {
		t.Fatal(err)
	}
	psrv := httptest.NewServer(h)
	t.Cleanup(psrv.Close)

	type window struct {
		key string
		n   int64
	}
	minutes, days := map[window]int64{}, map[window]int64{}
	end := clock.Now().Add(3 * 24 * time.Hour)
	keys := []string{"alice", "bob"}
	for i := 0; clock.Now().Before(end); i++ {
		key := keys[i%2]
		req, _ := http.NewRequest("POST", psrv.URL+"/v1/completions", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		now := clock.Now().Unix()
		switch res.StatusCode {
		case http.StatusOK:
			minutes[window{key, now / 60}] += backend.last
			days[window{key, now / 86400}] += backend.last
			clock.Advance(time.Second)
		case http.StatusTooManyRequests:
			// Half the Retry-After: the clock is both keys', and the
			// other may still be within its budgets.
			retry, _ := strconv.Atoi(res.Header.Get("Retry-After"))
			clock.Advance(time.Duration(max(retry, 1)) * time.Second / 2)
		default:
			t.Fatalf("proxy answered %d", res.StatusCode)
		}
	}
	for w, n := range minutes {
		if n > perMinute+most {
			t.Errorf("%s used %d tokens in minute %d, more than %d + %d", w.key, n, w.n, perMinute, most)
		}
	}
	whole := 0
	for w, n := range days {
		if n > perDay+most {
			t.Errorf("%s used %d tokens on day %d, more than %d + %d", w.key, n, w.n, perDay, most)
		}
		if start := time.Unix(w.n*86400, 0); !start.Before(manualclock.Start) && start.Add(24*time.Hour).Before(end) {
			whole++
			if n <= perDay {
				t.Errorf("%s used %d tokens on day %d, want the budget of %d used up (demand exceeds it)", w.key, n, w.n, perDay)
			}
		}
	}
	if whole < 2 {
		t.Errorf("%d whole days measured, want at least one per key", whole)
	}
	t.Logf("%d key-minutes and %d key-days measured", len(minutes), len(days))
}
