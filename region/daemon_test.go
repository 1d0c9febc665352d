package region

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/quota"
)

const testToken = "test-admin-token"

type harness struct {
	t      *testing.T
	d      *Daemon
	url    string // the data-plane listener, served as Serve serves it
	client *http.Client
}

func newHarness(t *testing.T, mutate func(*Config)) *harness {
	t.Helper()
	cfg := DefaultConfig()
	cfg.AdminToken = testToken
	cfg.Policies = []quota.Policy{}
	if mutate != nil {
		mutate(&cfg)
	}
	reg := prometheus.NewRegistry()
	d, err := New(context.Background(), cfg, slog.New(slog.DiscardHandler), reg, reg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(d.close)
	url := serveData(t, d)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &harness{t: t, d: d, url: url, client: &http.Client{Transport: tr}}
}

// serveData serves d's data-plane routes on the server Serve uses for
// them, on a loopback port, and returns its base URL: tests through it go
// through the request conversion gateways go through.
func serveData(t testing.TB, d *Daemon) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fs := d.fastServer(d.Handler())
	done := make(chan error, 1)
	go func() { done <- fs.Serve(ln) }()
	t.Cleanup(func() {
		if err := fs.Shutdown(); err != nil {
			t.Errorf("shutting the data-plane server down: %v", err)
		}
		ln.Close() // Shutdown does nothing to a Serve that has not begun
		if err := <-done; err != nil {
			t.Errorf("data-plane server: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}

type resp struct {
	status int
	header http.Header
	body   []byte
}

func (r resp) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("body %q is not JSON: %v", r.body, err)
	}
	return m
}

func (h *harness) do(method, path, body string, hdr ...string) resp {
	h.t.Helper()
	req, err := http.NewRequest(method, h.url+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := h.client.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return resp{res.StatusCode, res.Header, b}
}

func (h *harness) admin(method, path, body string, hdr ...string) resp {
	h.t.Helper()
	return h.do(method, path, body, append([]string{"Authorization", "Bearer " + testToken}, hdr...)...)
}

func (h *harness) putPolicy(id, doc string) resp {
	h.t.Helper()
	r := h.admin("PUT", "/v1/policies/"+id, doc)
	if r.status != 200 && r.status != 201 {
		h.t.Fatalf("PUT policy %s = %d %s", id, r.status, r.body)
	}
	return r
}

func TestTokenBucketBurst(t *testing.T) {
	h := newHarness(t, nil)
	h.putPolicy("burst", `{"algorithm":"token_bucket","rate_per_sec":1,"burst":100,"mode":"enforce"}`)
	check := `{"user":"alice","route":"/v1/orders","method":"GET"}`
	for i := 1; i <= 100; i++ {
		r := h.do("POST", "/v1/check", check)
		if r.status != 200 {
			t.Fatalf("check %d = %d %s, want 200", i, r.status, r.body)
		}
	}
	r := h.do("POST", "/v1/check", check)
	if r.status != 429 {
		t.Fatalf("check 101 = %d, want 429", r.status)
	}
	if got := r.header.Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After = %q, want 1", got)
	}
	if got := r.header.Get("RateLimit"); got != `"burst";r=0;t=1` {
		t.Errorf("RateLimit = %q, want \"burst\";r=0;t=1", got)
	}
	if got := r.header.Get("RateLimit-Policy"); got != `"burst";q=100;w=100` {
		t.Errorf("RateLimit-Policy = %q", got)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type = %q", ct)
	}
	m := r.json(t)
	if m["type"] != ProblemQuotaExceeded || m["allowed"] != false || m["policy"] != "burst" {
		t.Errorf("body = %s", r.body)
	}
	if vp, _ := m["violated-policies"].([]any); len(vp) != 1 || vp[0] != "burst" {
		t.Errorf("violated-policies = %v", m["violated-policies"])
	}
}

func TestAuthzAndSecurityNeverInHeaders(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Policies = quota.DefaultPolicies() })
	r := h.do("GET", "/v1/authz", "", "X-Original-URI", "/login?x=1", "X-Original-Method", "POST")
	if r.status != 200 {
		t.Fatalf("authz = %d %s", r.status, r.body)
	}
	if got := r.header.Get("RateLimit"); strings.Contains(got, "login") || !strings.Contains(got, "anonymous-per-ip") {
		t.Errorf("RateLimit = %q: want anonymous-per-ip and never the security policy", got)
	}
	for i := 0; i < 4; i++ {
		h.do("GET", "/v1/authz", "", "X-Original-URI", "/login", "X-Original-Method", "POST")
	}
	r = h.do("GET", "/v1/authz", "", "X-Original-URI", "/login", "X-Original-Method", "POST")
	if r.status != 429 {
		t.Fatalf("6th login = %d, want 429", r.status)
	}
	if strings.Contains(string(r.body), `"login"`) || strings.Contains(r.header.Get("RateLimit"), "login") {
		t.Errorf("security policy leaked: %s %v", r.body, r.header)
	}
	if m := r.json(t); m["type"] != ProblemAbnormalUsage {
		t.Errorf("type = %v", m["type"])
	}
	// Envoy-style prefix path.
	r = h.do("DELETE", "/v1/authz/v1/things", "")
	if r.status != 200 {
		t.Errorf("envoy-style authz = %d %s", r.status, r.body)
	}
	// nginx mode.
	h.putPolicy("tiny", `{"algorithm":"fixed_window","limit":1,"window":3600,"mode":"enforce","match":{"routes":["/tiny"]}}`)
	h.do("GET", "/v1/authz?deny_status=403", "", "X-Original-URI", "/tiny", "X-Original-Method", "GET")
	r = h.do("GET", "/v1/authz?deny_status=403", "", "X-Original-URI", "/tiny", "X-Original-Method", "GET")
	if r.status != 403 || r.header.Get("X-Sluice-Status") != "429" || r.header.Get("Retry-After") == "" {
		t.Errorf("deny_status=403: %d %v", r.status, r.header)
	}
}

func TestShadowWouldReject(t *testing.T) {
	h := newHarness(t, nil)
	h.putPolicy("strict", `{"algorithm":"token_bucket","rate_per_sec":0.001,"burst":1}`) // no mode: shadow
	h.putPolicy("loose", `{"algorithm":"token_bucket","rate_per_sec":100,"burst":100,"mode":"enforce"}`)
	check := `{"subject":"s1","route":"/x"}`
	h.do("POST", "/v1/check", check)
	r := h.do("POST", "/v1/check", check)
	if r.status != 200 {
		t.Fatalf("shadow rejected: %d %s", r.status, r.body)
	}
	m := r.json(t)
	if m["would_reject"] != true {
		t.Errorf("would_reject = %v in %s", m["would_reject"], r.body)
	}
	if strings.Contains(r.header.Get("RateLimit"), "strict") {
		t.Errorf("shadow policy in headers: %q", r.header.Get("RateLimit"))
	}
	met := h.do("GET", "/metrics", "")
	if !strings.Contains(string(met.body), `sluice_shadow_would_reject_total{policy="strict"} 1`) {
		t.Errorf("metric missing:\n%s", met.body)
	}
}

func TestBadPolicyKeepsOldAndRollback(t *testing.T) {
	h := newHarness(t, nil)
	h.putPolicy("p", `{"algorithm":"token_bucket","rate_per_sec":1,"burst":5,"mode":"enforce"}`)
	r := h.admin("PUT", "/v1/policies/p", `{"algorithm":"token_bucket","rate_per_sec":1,"burst":-5,"mode":"enforce"}`)
	if r.status != 400 || !strings.Contains(string(r.body), `"field":"burst"`) {
		t.Fatalf("bad policy = %d %s", r.status, r.body)
	}
	if p, _ := h.d.reg.Get("p"); p.Version != 1 || p.Burst != 5 {
		t.Fatalf("in force = %+v, want version 1", p)
	}
	r = h.admin("PUT", "/v1/policies/p", `{"algorithm":"token_bucket","rate_per_sec":1,"burst":7,"mode":"enforce"}`, "If-Match", `"9"`)
	if r.status != 412 {
		t.Fatalf("stale If-Match = %d %s", r.status, r.body)
	}
	r = h.admin("PUT", "/v1/policies/p", `{"algorithm":"token_bucket","rate_per_sec":1,"burst":7,"mode":"enforce"}`, "If-Match", `"1"`)
	if r.status != 200 || r.header.Get("ETag") != `"2"` {
		t.Fatalf("put v2 = %d %v %s", r.status, r.header, r.body)
	}
	r = h.admin("POST", "/v1/policies/p/rollback", "")
	if r.status != 200 {
		t.Fatalf("rollback = %d %s", r.status, r.body)
	}
	if p, _ := h.d.reg.Get("p"); p.Version != 3 || p.Burst != 5 {
		t.Fatalf("after rollback = %+v, want version 3 with burst 5", p)
	}
	r = h.admin("GET", "/v1/policies/p/versions", "")
	if m := r.json(t); m["in_force"] != float64(3) {
		t.Errorf("versions = %s", r.body)
	}
	if n := len(h.d.audit.Last(100)); n != 3 {
		t.Errorf("audit entries = %d, want 3 (put, put, rollback)", n)
	}
}

func TestAdminFlow(t *testing.T) {
	h := newHarness(t, nil)
	h.putPolicy("pro", `{"match":{"tier":"pro"},"algorithm":"fixed_window","limit":10,"window":3600,"mode":"enforce"}`)
	r := h.admin("PUT", "/v1/keys/key-123", `{"tier":"pro"}`)
	if r.status != 200 {
		t.Fatalf("put key = %d %s", r.status, r.body)
	}
	subject := r.json(t)["subject"].(string)
	r = h.do("POST", "/v1/check", `{"api_key":"key-123","route":"/a"}`)
	if m := r.json(t); m["tier"] != "pro" || m["policy"] != "pro" || m["remaining"] != float64(9) {
		t.Fatalf("check = %s", r.body)
	}
	r = h.admin("GET", "/v1/keys/"+subject+"/usage", "")
	if r.status != 200 || !strings.Contains(string(r.body), `"remaining":9`) {
		t.Fatalf("usage = %d %s", r.status, r.body)
	}
	r = h.admin("POST", "/v1/overrides", `{"id":"o1","subject":"`+subject+`","policy":"pro","limit":100,"expires_at":"2999-01-01T00:00:00Z"}`)
	if r.status != 201 {
		t.Fatalf("override = %d %s", r.status, r.body)
	}
	r = h.do("POST", "/v1/check", `{"api_key":"key-123","route":"/a"}`)
	if m := r.json(t); m["limit"] != float64(100) {
		t.Fatalf("check with override = %s", r.body)
	}
	if r = h.admin("DELETE", "/v1/overrides/o1", ""); r.status != 204 {
		t.Fatalf("delete override = %d", r.status)
	}
	if r = h.admin("DELETE", "/v1/overrides/o1", ""); r.status != 404 {
		t.Fatalf("delete again = %d", r.status)
	}
	r = h.admin("GET", "/v1/policies?tier=pro", "")
	if !strings.Contains(string(r.body), `"id":"pro"`) {
		t.Fatalf("list = %s", r.body)
	}
	r = h.do("POST", "/v1/check/batch", `{"checks":[{"api_key":"key-123","route":"/a"},{"route":"/a"}]}`)
	var br BatchResponse
	if err := json.Unmarshal(r.body, &br); err != nil || len(br.Results) != 2 || br.Results[0].Status != 200 || br.Results[1].Status != 400 {
		t.Fatalf("batch = %d %s", r.status, r.body)
	}
	if br.Results[1].Problem.Errors[0].Field != "checks[1]" {
		t.Errorf("batch problem field = %+v", br.Results[1].Problem.Errors)
	}
}

// TestAdminRoutesNeedAuth walks the route table: every admin route answers
// 401 without a token and 403 with a wrong one, and never runs its handler.
func TestAdminRoutesNeedAuth(t *testing.T) {
	h := newHarness(t, nil)
	n := 0
	for _, rt := range h.d.Routes() {
		if !rt.Admin {
			continue
		}
		n++
		path := fillPath(rt.Path)
		for _, tc := range []struct {
			auth string
			want int
		}{{"", 401}, {"Basic " + testToken, 401}, {"Bearer wrong", 403}, {"Bearer " + testToken + "x", 403}} {
			var hdr []string
			if tc.auth != "" {
				hdr = []string{"Authorization", tc.auth}
			}
			r := h.do(rt.Method, path, `{}`, hdr...)
			if r.status != tc.want || r.header.Get("Content-Type") != "application/problem+json" {
				t.Errorf("%s %s with %q = %d %s, want %d problem", rt.Method, path, tc.auth, r.status, r.header.Get("Content-Type"), tc.want)
			}
		}
	}
	if n < 8 {
		t.Fatalf("only %d admin routes in the table", n)
	}
	// No token configured: the admin API is off.
	off := newHarness(t, func(c *Config) { c.AdminToken = "" })
	for _, rt := range off.d.Routes() {
		if rt.Admin {
			if r := off.do(rt.Method, fillPath(rt.Path), "{}", "Authorization", "Bearer "); r.status != 401 && r.status != 403 {
				t.Errorf("%s %s without configured token = %d", rt.Method, rt.Path, r.status)
			}
		}
	}
}

func fillPath(p string) string {
	r := strings.NewReplacer("{id}", "x", "{api_key}", "k", "{subject}", "user:1", "{path...}", "a/b")
	return r.Replace(p)
}

func TestBadInputIsProblem(t *testing.T) {
	h := newHarness(t, nil)
	h.putPolicy("p", `{"algorithm":"token_bucket","rate_per_sec":1,"burst":5,"mode":"enforce"}`)
	big := `{"user":"u","route":"/` + strings.Repeat("a", 2<<20) + `"}`
	cases := []struct {
		name, method, path, body string
		admin                    bool
		status                   int
		field                    string
	}{
		{"malformed", "POST", "/v1/check", `{"user":`, false, 400, ""},
		{"unknown field", "POST", "/v1/check", `{"user":"u","route":"/","x":1}`, false, 400, "x"},
		{"wrong type", "POST", "/v1/check", `{"user":"u","route":"/","cost":"1"}`, false, 400, "cost"},
		{"negative cost", "POST", "/v1/check", `{"user":"u","route":"/","cost":-1}`, false, 400, "cost"},
		{"cost too large", "POST", "/v1/check", `{"user":"u","route":"/","cost":6}`, false, 400, "cost"},
		{"no subject", "POST", "/v1/check", `{"route":"/"}`, false, 400, ""},
		{"two subjects", "POST", "/v1/check", `{"user":"u","subject":"s","route":"/"}`, false, 400, ""},
		{"ip beside subject", "POST", "/v1/check", `{"subject":"s","ip":"1.2.3.4","route":"/"}`, false, 400, ""},
		{"bad ip", "POST", "/v1/check", `{"ip":"1.2.3","route":"/"}`, false, 400, "ip"},
		{"bad route", "POST", "/v1/check", `{"user":"u","route":"x"}`, false, 400, "route"},
		{"bad tier", "POST", "/v1/check", `{"user":"u","route":"/","tier":"A B"}`, false, 400, "tier"},
		{"huge body", "POST", "/v1/check", big, false, 413, ""},
		{"trailing data", "POST", "/v1/check", `{"user":"u","route":"/"} {}`, false, 400, ""},
		{"batch too big", "POST", "/v1/check/batch", `{"checks":[` + strings.Repeat(`{"user":"u","route":"/"},`, 100) + `{"user":"u","route":"/"}]}`, false, 400, "checks"},
		{"authz no method", "GET", "/v1/authz", "", false, 400, "X-Original-Method"},
		{"invalid glob", "PUT", "/v1/policies/q", `{"algorithm":"token_bucket","rate_per_sec":1,"burst":1,"match":{"routes":["v1/**x"]}}`, true, 400, "match.routes[0]"},
		{"unknown algorithm", "PUT", "/v1/policies/q", `{"algorithm":"magic"}`, true, 400, "algorithm"},
		{"unknown policy field", "PUT", "/v1/policies/q", `{"algorithm":"token_bucket","rate_per_sec":1,"burst":1,"colour":"red"}`, true, 400, "colour"},
		{"id mismatch", "PUT", "/v1/policies/q", `{"id":"r","algorithm":"token_bucket","rate_per_sec":1,"burst":1}`, true, 400, "id"},
		{"bad if-match", "PUT", "/v1/policies/q", `{}`, true, 400, "If-Match"},
		{"override expired", "POST", "/v1/overrides", `{"id":"o","subject":"u","policy":"p","burst":9,"expires_at":"2000-01-01T00:00:00Z"}`, true, 400, "expires_at"},
		{"key bad tier", "PUT", "/v1/keys/k", `{"tier":"NO"}`, true, 400, "tier"},
		{"unknown route", "GET", "/nope", "", false, 404, ""},
		{"wrong method", "DELETE", "/v1/check", "", false, 405, ""},
		{"rollback unknown", "POST", "/v1/policies/zzz/rollback", "", true, 404, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var hdr []string
			if tc.admin {
				hdr = []string{"Authorization", "Bearer " + testToken}
			}
			if tc.name == "bad if-match" {
				hdr = append(hdr, "If-Match", "abc")
			}
			r := h.do(tc.method, tc.path, tc.body, hdr...)
			if r.status != tc.status {
				t.Fatalf("%s %s = %d %s, want %d", tc.method, tc.path, r.status, r.body, tc.status)
			}
			if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
				t.Fatalf("Content-Type = %q", ct)
			}
			var p Problem
			if err := json.Unmarshal(r.body, &p); err != nil || p.Status != tc.status || p.Type == "" {
				t.Fatalf("body %s: %v", r.body, err)
			}
			if tc.field != "" {
				found := false
				for _, e := range p.Errors {
					found = found || e.Field == tc.field
				}
				if !found {
					t.Errorf("errors %+v do not name %q", p.Errors, tc.field)
				}
			}
		})
	}
}

func TestReadyAndHealth(t *testing.T) {
	h := newHarness(t, nil)
	if r := h.do("GET", "/healthz", ""); r.status != 200 {
		t.Errorf("healthz = %d", r.status)
	}
	// Not serving through Run yet: not ready.
	if r := h.do("GET", "/readyz", ""); r.status != 503 {
		t.Errorf("readyz before Run = %d", r.status)
	}
	h.d.ready.Store(true)
	r := h.do("GET", "/readyz", "")
	if r.status != 200 || !bytes.Contains(r.body, []byte(`"breakers"`)) {
		t.Errorf("readyz = %d %s", r.status, r.body)
	}
}

// TestResetState lets a subject in again by forgetting its state, under
// one named policy and then under all, and refuses what it cannot reset.
func TestResetState(t *testing.T) {
	h := newHarness(t, nil)
	h.putPolicy("a", `{"algorithm":"fixed_window","limit":2,"window":3600,"mode":"enforce"}`)
	h.putPolicy("b", `{"algorithm":"token_bucket","rate_per_sec":0.001,"burst":5,"mode":"enforce"}`)
	check := `{"user":"bob","route":"/orders"}`
	var subject string
	for i := range 2 {
		r := h.do("POST", "/v1/check", check)
		if r.status != 200 {
			t.Fatalf("check %d = %d %s", i, r.status, r.body)
		}
		subject = r.json(t)["subject"].(string)
	}
	if r := h.do("POST", "/v1/check", check); r.status != 429 {
		t.Fatalf("3rd check = %d, want 429 from policy a", r.status)
	}
	path := "/v1/keys/" + url.PathEscape(subject) + "/state"

	r := h.admin("DELETE", path+"?policy=a", "")
	if r.status != 200 || string(r.body) != `{"subject":"`+subject+`","policies":["a"]}`+"\n" {
		t.Fatalf("reset a = %d %s", r.status, r.body)
	}
	r = h.do("POST", "/v1/check", check)
	if r.status != 200 {
		t.Fatalf("check after resetting a = %d %s, want 200", r.status, r.body)
	}
	remaining := func(policy string) float64 {
		t.Helper()
		r := h.admin("GET", "/v1/keys/"+url.PathEscape(subject)+"/usage", "")
		var u Usage
		if err := json.Unmarshal(r.body, &u); err != nil {
			t.Fatalf("usage %s: %v", r.body, err)
		}
		for _, p := range u.Policies {
			if p.ID == policy {
				return float64(p.Remaining)
			}
		}
		t.Fatalf("usage has no policy %s: %s", policy, r.body)
		return 0
	}
	// b was not reset: 5 − 3 checks.
	if got := remaining("b"); got != 2 {
		t.Errorf("b remaining = %v, want 2 (only a was reset)", got)
	}
	if r := h.admin("DELETE", path, ""); r.status != 200 || !strings.Contains(string(r.body), `"policies":["a","b"]`) {
		t.Fatalf("reset all = %d %s", r.status, r.body)
	}
	if a, b := remaining("a"), remaining("b"); a != 2 || b != 5 {
		t.Errorf("after resetting all: a %v b %v remaining, want 2 and 5", a, b)
	}
	for _, tt := range []struct{ query, field string }{
		{"?policy=nope", "policy"},
		{"?tier=pro", "tier"},
	} {
		r := h.admin("DELETE", path+tt.query, "")
		if r.status != 400 || !strings.Contains(string(r.body), `"field":"`+tt.field+`"`) {
			t.Errorf("DELETE %s = %d %s, want 400 naming %s", tt.query, r.status, r.body, tt.field)
		}
	}
	if r := h.do("DELETE", path, ""); r.status != 401 {
		t.Errorf("reset without a token = %d, want 401", r.status)
	}
	found := false
	for _, e := range h.d.audit.Last(100) {
		found = found || (e.Action == "state.reset" && e.Target == subject)
	}
	if !found {
		t.Error("no state.reset entry in the audit log")
	}
}
