package httplimit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sluice-rl/sluice/client"
	"github.com/sluice-rl/sluice/client/httplimit"
	"github.com/sluice-rl/sluice/client/internal/daemontest"
	"github.com/sluice-rl/sluice/client/local"
	"github.com/sluice-rl/sluice/quota"
)

// byUser limits by the X-User header.
func byUser(r *http.Request) (quota.SubjectFields, error) {
	u := r.Header.Get("X-User")
	if u == "" {
		return quota.SubjectFields{}, errors.New("X-User: required")
	}
	return quota.SubjectFields{User: u}, nil
}

// hello counts the requests that reach it.
type hello struct{ served int }

func (h *hello) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	h.served++
	io.WriteString(w, "hello\n")
}

// limitedServer serves hello behind the middleware with checker.
func limitedServer(t *testing.T, checker httplimit.Checker, onError func(*http.Request, error)) (*httptest.Server, *hello) {
	t.Helper()
	mw, err := httplimit.New(httplimit.Config{Checker: checker, Subject: byUser, OnError: onError})
	if err != nil {
		t.Fatal(err)
	}
	h := &hello{}
	srv := httptest.NewServer(mw(h))
	t.Cleanup(srv.Close)
	return srv, h
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

func get(t *testing.T, url, user string) answer {
	t.Helper()
	req, _ := http.NewRequest("GET", url+"/v1/orders", nil)
	if user != "" {
		req.Header.Set("X-User", user)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return answer{res.StatusCode, res.Header, b}
}

func checkers(t *testing.T) map[string]httplimit.Checker {
	policies := []quota.Policy{daemontest.Policy("burst", 0.01, 2)}
	url, stop := daemontest.Start(policies)
	t.Cleanup(stop)
	c, err := client.New(client.Config{Server: url})
	if err != nil {
		t.Fatal(err)
	}
	reg := quota.NewRegistry(quota.RegistryConfig{})
	if err := reg.Seed(context.Background(), "test", policies); err != nil {
		t.Fatal(err)
	}
	return map[string]httplimit.Checker{"daemon": c, "local": local.New(nil, reg)}
}

// TestLimitsAfterTheLimit: through a daemon and in-process alike, the
// first two requests reach the handler with the RateLimit fields, the
// third is a 429 problem with them and Retry-After, and the handler never
// sees it.
func TestLimitsAfterTheLimit(t *testing.T) {
	for name, checker := range checkers(t) {
		t.Run(name, func(t *testing.T) {
			srv, h := limitedServer(t, checker, nil)
			want := []struct {
				status           int
				rateLimit, retry string
			}{
				{200, `"burst";r=1;t=100`, ""},
				{200, `"burst";r=0;t=200`, ""},
				{429, `"burst";r=0;t=100`, "100"},
			}
			for i, w := range want {
				a := get(t, srv.URL, "42")
				if a.status != w.status || a.header.Get("RateLimit") != w.rateLimit || a.header.Get("Retry-After") != w.retry ||
					a.header.Get("RateLimit-Policy") != `"burst";q=2;w=200` {
					t.Errorf("request %d = %d RateLimit %q Retry-After %q Policy %q, want %d %q %q",
						i, a.status, a.header.Get("RateLimit"), a.header.Get("Retry-After"), a.header.Get("RateLimit-Policy"), w.status, w.rateLimit, w.retry)
				}
			}
			a := get(t, srv.URL, "42")
			var p client.Problem
			if a.header.Get("Content-Type") != "application/problem+json" || json.Unmarshal(a.body, &p) != nil ||
				p.Status != 429 || p.Instance != "/v1/orders" || len(p.ViolatedPolicies) != 1 || p.ViolatedPolicies[0] != "burst" {
				t.Errorf("429 body %s (%s), want a problem naming burst", a.body, a.header.Get("Content-Type"))
			}
			if h.served != 2 {
				t.Errorf("handler served %d requests, want 2", h.served)
			}
			if a := get(t, srv.URL, "43"); a.status != 200 {
				t.Errorf("another user: %d, want 200", a.status)
			}
			if a := get(t, srv.URL, ""); a.status != 400 || h.served != 3 {
				t.Errorf("no subject: %d (served %d), want 400 and no call of the handler", a.status, h.served)
			}
		})
	}
}

func TestDaemonDown(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + l.Addr().String()
	l.Close()
	for _, tc := range []struct {
		mode   client.FailureMode
		status int
		retry  string
		served int
	}{
		{client.FailOpen, 200, "", 1},
		{client.FailClosed, 503, "1", 0},
		{client.FailError, 503, "", 0},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			c, err := client.New(client.Config{Server: down, OnFailure: tc.mode})
			if err != nil {
				t.Fatal(err)
			}
			var errs []error
			srv, h := limitedServer(t, c, func(_ *http.Request, err error) { errs = append(errs, err) })
			a := get(t, srv.URL, "42")
			if a.status != tc.status || a.header.Get("Retry-After") != tc.retry || h.served != tc.served || a.header.Get("RateLimit") != "" {
				t.Errorf("daemon down = %d Retry-After %q RateLimit %q served %d, want %d %q none %d",
					a.status, a.header.Get("Retry-After"), a.header.Get("RateLimit"), h.served, tc.status, tc.retry, tc.served)
			}
			if len(errs) != 1 || !errors.Is(errs[0], client.ErrUnavailable) {
				t.Errorf("OnError got %v, want one ErrUnavailable", errs)
			}
			if tc.status == 503 && a.header.Get("Content-Type") != "application/problem+json" {
				t.Errorf("503 Content-Type %q", a.header.Get("Content-Type"))
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	if _, err := httplimit.New(httplimit.Config{Subject: byUser}); err == nil {
		t.Error("New without a Checker succeeded")
	}
	if _, err := httplimit.New(httplimit.Config{Checker: local.New(nil, quota.NewRegistry(quota.RegistryConfig{}))}); err == nil {
		t.Error("New without Subject succeeded")
	}
}

// TestSecurityPoliciesAreNotNamed: a 429 from a class security policy
// names no policy to the client, though the daemon names it to its caller.
func TestSecurityPoliciesAreNotNamed(t *testing.T) {
	policies := []quota.Policy{{ID: "login-guard", Algorithm: "token_bucket", RatePerSec: 0.01, Burst: 1,
		Mode: quota.ModeEnforce, Class: quota.ClassSecurity}}
	url, stop := daemontest.Start(policies)
	defer stop()
	c, err := client.New(client.Config{Server: url})
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := limitedServer(t, c, nil)
	get(t, srv.URL, "9")
	a := get(t, srv.URL, "9")
	if a.status != 429 || bytes.Contains(a.body, []byte("login-guard")) || a.header.Get("RateLimit") != "" {
		t.Errorf("security rejection = %d %s RateLimit %q, want 429 naming no policy and no RateLimit", a.status, a.body, a.header.Get("RateLimit"))
	}
}
