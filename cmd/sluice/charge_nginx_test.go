package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/internal/testwait"
	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/region"
)

// TestNginxChargesAfterTheResponse runs deploy/nginx/charge.conf through a
// real nginx in front of a backend that reports 150 tokens per answer and
// a daemon with a bucket of 100 tokens: the first request is served, and
// its tokens, charged by nginx after the response, put the key past its
// limit, so that the daemon refuses the key's next check.
func TestNginxChargesAfterTheResponse(t *testing.T) {
	cfg := region.DefaultConfig()
	cfg.Policies = []quota.Policy{{ID: "tokens", Algorithm: "token_bucket", RatePerSec: 0.01, Burst: 100, Mode: quota.ModeEnforce}}
	reg := prometheus.NewRegistry()
	d, err := region.New(context.Background(), cfg, slog.New(slog.DiscardHandler), reg, reg)
	if err != nil {
		t.Fatal(err)
	}
	daemon := httptest.NewServer(d.Handler())
	t.Cleanup(daemon.Close)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-Tokens", "150")
		io.WriteString(w, "completion\n")
	}))
	t.Cleanup(backend.Close)

	raw, err := os.ReadFile("../../deploy/nginx/charge.conf")
	if err != nil {
		t.Fatal(err)
	}
	listen := freeLoopbackAddr(t)
	conf := strings.NewReplacer("127.0.0.1:8080", strings.TrimPrefix(daemon.URL, "http://"),
		"listen 80;", "listen "+listen+";", "http://backend", backend.URL).Replace(string(raw))
	startNginx(t, conf, listen)
	check := func() int {
		r, err := http.Post(daemon.URL+"/v1/check", "application/json",
			strings.NewReader(`{"api_key":"k-1","method":"POST","route":"/v1/complete","cost":0}`))
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		return r.StatusCode
	}
	if got := check(); got != 200 {
		t.Fatalf("check before any request = %d, want 200", got)
	}

	req, _ := http.NewRequest("POST", "http://"+listen+"/v1/complete", nil)
	req.Header.Set("X-Api-Key", "k-1")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || string(body) != "completion\n" {
		t.Fatalf("through nginx: %d %q", res.StatusCode, body)
	}
	testwait.For(t, 30*time.Second, "the key is refused after nginx charged its 150 tokens", func() bool { return check() == 429 })
}
