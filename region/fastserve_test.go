package region

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-rl/sluice/quota"
)

// rawExchange writes raw to addr, half-closes, and reads every response
// the server answers with before it closes the connection.
func rawExchange(t testing.TB, addr, raw string) []*http.Response {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	c.(*net.TCPConn).CloseWrite()
	all, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading the answer to %q: %v", raw, err)
	}
	var out []*http.Response
	br := bufio.NewReader(bytes.NewReader(all))
	for {
		if _, err := br.Peek(1); err == io.EOF {
			return out
		}
		method, _, _ := strings.Cut(raw, " ")
		res, err := http.ReadResponse(br, &http.Request{Method: method})
		if err != nil {
			t.Fatalf("the answer to %q is not HTTP: %v\n%s", raw, err, all)
		}
		body, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatalf("the answer to %q: body: %v\n%s", raw, err, all)
		}
		res.Body = io.NopCloser(bytes.NewReader(body))
		out = append(out, res)
	}
}

func newLoginDaemon(t testing.TB, reg *prometheus.Registry) *Daemon {
	t.Helper()
	cfg := DefaultConfig()
	cfg.AdminToken = testToken
	cfg.Policies = quota.DefaultPolicies()
	cfg.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	d, err := New(context.Background(), cfg, slog.New(slog.DiscardHandler), reg, reg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(d.close)
	return d
}

// The data-plane server answers every request as net/http's server does
// with the same handler: status, the headers a gateway reads, and body.
// Two daemons with the same policies get the same requests in the same
// order, one behind each server.
func TestDataPlaneServerAnswersAsNetHTTP(t *testing.T) {
	std := httptest.NewServer(newLoginDaemon(t, prometheus.NewRegistry()).Handler())
	t.Cleanup(std.Close)
	fast := strings.TrimPrefix(serveData(t, newLoginDaemon(t, prometheus.NewRegistry())), "http://")

	check := `{"user":"alice","route":"/v1/orders","method":"GET"}`
	post := func(path, ctype, body string) string {
		return "POST " + path + " HTTP/1.1\r\nHost: sluice\r\nContent-Type: " + ctype +
			"\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\nConnection: close\r\n\r\n" + body
	}
	get := func(target string, hdr ...string) string {
		return "GET " + target + " HTTP/1.1\r\nHost: sluice\r\n" + strings.Join(hdr, "") + "Connection: close\r\n\r\n"
	}
	login := get("/v1/authz", "X-Original-Method: POST\r\n", "X-Original-URI: /login\r\n")
	reqs := []struct{ name, raw string }{
		{"check", post("/v1/check", "application/json", check)},
		{"check with query", post("/v1/check?x=1", "application/json", check)},
		{"check, escaped path", post("/v1/%63heck", "application/json", check)},
		{"check, absolute form", post("http://sluice/v1/check", "application/json", check)},
		{"check, double slash", post("//v1/check", "application/json", check)},
		{"check, JSON with parameters", post("/v1/check", "application/json; charset=utf-8", check)},
		{"check, wrong type", post("/v1/check", "text/plain", check)},
		{"check, no type", "POST /v1/check HTTP/1.1\r\nHost: sluice\r\nContent-Length: " + strconv.Itoa(len(check)) + "\r\nConnection: close\r\n\r\n" + check},
		{"check, two types", "POST /v1/check HTTP/1.1\r\nHost: sluice\r\nContent-Type: text/plain\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(check)) + "\r\nConnection: close\r\n\r\n" + check},
		{"check, lower-case type", "POST /v1/check HTTP/1.1\r\nHost: sluice\r\ncontent-type: text/plain\r\nContent-Length: " + strconv.Itoa(len(check)) + "\r\nConnection: close\r\n\r\n" + check},
		{"check, empty body", post("/v1/check", "application/json", "")},
		{"check, body too large", post("/v1/check", "application/json", `{"user":"`+strings.Repeat("a", 70<<10)+`"}`)},
		{"check, bad JSON", post("/v1/check", "application/json", `{"user":`)},
		{"check, unknown field", post("/v1/check", "application/json", `{"usr":"a"}`)},
		{"check, chunked", "POST /v1/check HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" +
			strconv.FormatInt(int64(len(check)), 16) + "\r\n" + check + "\r\n0\r\n\r\n"},
		{"check, HTTP/1.0", "POST /v1/check HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(check)) + "\r\n\r\n" + check},
		{"GET on check", get("/v1/check")},
		{"no such route", get("/v1/nothing")},
		{"unclean path", get("/v1//authz")},
		{"dot segment", get("/v1/./check")},
		{"health", get("/healthz")},
		{"ready", get("/readyz")},
		{"HEAD health", "HEAD /healthz HTTP/1.1\r\nHost: sluice\r\nConnection: close\r\n\r\n"},
		{"login 1", login}, {"login 2", login}, {"login 3", login}, {"login 4", login}, {"login 5", login},
		{"login 6, limited", login},
		{"login 7, deny_status", get("/v1/authz?deny_status=403", "X-Original-Method: POST\r\n", "X-Original-URI: /login\r\n")},
		{"login, escaped", get("/v1/authz", "X-Original-Method: POST\r\n", "X-Original-URI: /%6Cogin\r\n")},
		{"login, Envoy prefix", "POST /v1/authz/x/..%2Flogin HTTP/1.1\r\nHost: sluice\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"},
		{"login, Envoy prefix with query", "POST /v1/authz/login?deny_status=403 HTTP/1.1\r\nHost: sluice\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"},
		{"two URIs", get("/v1/authz", "X-Original-Method: POST\r\n", "X-Original-URI: /a\r\n", "X-Original-URI: /login\r\n")},
		{"lower-case header names", get("/v1/authz", "x-original-method: POST\r\n", "x-original-uri: /login\r\n")},
		{"forwarded client", get("/v1/authz", "X-Original-Method: GET\r\n", "X-Original-URI: /a\r\n", "X-Forwarded-For: 203.0.113.9, 198.51.100.7\r\n")},
		{"two forwarded headers", get("/v1/authz", "X-Original-Method: GET\r\n", "X-Original-URI: /a\r\n", "X-Forwarded-For: 203.0.113.9\r\n", "X-Forwarded-For: 198.51.100.7\r\n")},
		{"no method", get("/v1/authz", "X-Original-URI: /a\r\n")},
		{"admin without token", get("/v1/policies")},
		{"admin with token", get("/v1/policies", "Authorization: Bearer "+testToken+"\r\n")},
	}
	// Values that depend on the instant of the decision.
	clock := regexp.MustCompile(`"(reset_ms|retry_after_ms)":\d+|;t=\d+`)
	compared := []string{"Content-Type", "Cache-Control", "Ratelimit", "Ratelimit-Policy", "Retry-After", "X-Sluice-Status", "Location", "Allow", "Www-Authenticate"}
	for _, rq := range reqs {
		want := rawExchange(t, strings.TrimPrefix(std.URL, "http://"), rq.raw)
		got := rawExchange(t, fast, rq.raw)
		if len(got) != len(want) {
			t.Errorf("%s: %d answers, net/http gave %d", rq.name, len(got), len(want))
			continue
		}
		for i := range want {
			w, g := want[i], got[i]
			if g.StatusCode != w.StatusCode {
				t.Errorf("%s: status %d, net/http %d", rq.name, g.StatusCode, w.StatusCode)
			}
			for _, h := range compared {
				if gv, wv := strings.Join(g.Header.Values(h), "|"), strings.Join(w.Header.Values(h), "|"); clock.ReplaceAllString(gv, "") != clock.ReplaceAllString(wv, "") {
					t.Errorf("%s: %s %q, net/http %q", rq.name, h, gv, wv)
				}
			}
			gb, _ := io.ReadAll(g.Body)
			wb, _ := io.ReadAll(w.Body)
			if clock.ReplaceAllString(string(gb), "") != clock.ReplaceAllString(string(wb), "") {
				t.Errorf("%s: body\n%s\nnet/http\n%s", rq.name, gb, wb)
			}
		}
	}
}

// FuzzDataPlaneServer sends arbitrary bytes as one connection's input to
// the data-plane server: whatever it answers is well-formed HTTP, and no
// handler panics.
func FuzzDataPlaneServer(f *testing.F) {
	check := `{"user":"alice","route":"/v1/orders","method":"GET"}`
	for _, s := range []string{
		"POST /v1/check HTTP/1.1\r\nHost: s\r\nContent-Type: application/json\r\nContent-Length: 52\r\n\r\n" + check,
		"GET /v1/authz HTTP/1.1\r\nHost: s\r\nX-Original-Method: POST\r\nX-Original-URI: /login\r\n\r\n",
		"POST /v1/authz/login HTTP/1.1\r\nHost: s\r\nContent-Length: 0\r\n\r\nGET /healthz HTTP/1.1\r\nHost: s\r\n\r\n",
		"POST /v1/check HTTP/1.1\r\nHost: s\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n",
		"GET /v1/authz HTTP/1.1\r\nHost: s\r\nX-Original-URI: /a\r\n b\r\n\r\n",
		"GET http://x/v1/authz HTTP/1.1\r\n\r\n",
		"\r\n\r\n",
		"GET /\x00 HTTP/1.1\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	reg := prometheus.NewRegistry()
	d := newLoginDaemon(f, reg)
	addr := strings.TrimPrefix(serveData(f, d), "http://")
	f.Fuzz(func(t *testing.T, raw []byte) {
		rawExchange(t, addr, string(raw))
		if n := testutil.ToFloat64(d.m.panics); n != 0 {
			t.Fatalf("%v handler panics after %q", n, raw)
		}
	})
}

// A panic while deciding a check is answered, on the data-plane server's
// direct path for POST /v1/check as on every other route, with a 500
// problem naming the path, counted, and the server goes on serving.
func TestDataPlaneServerRecoversPanics(t *testing.T) {
	d := newLoginDaemon(t, prometheus.NewRegistry())
	addr := strings.TrimPrefix(serveData(t, d), "http://")
	d.dec = nil // every decision now panics on a nil decider
	check := `{"user":"alice","route":"/v1/orders","method":"GET"}`
	for i, target := range []string{"/v1/check", "/v1/check?x=1"} {
		raw := "POST " + target + " HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\nContent-Length: " +
			strconv.Itoa(len(check)) + "\r\nConnection: close\r\n\r\n" + check
		res := rawExchange(t, addr, raw)
		if len(res) != 1 || res[0].StatusCode != http.StatusInternalServerError {
			t.Fatalf("POST %s: %d answers, first %+v; want one 500", target, len(res), res)
		}
		body, _ := io.ReadAll(res[0].Body)
		if ct := res[0].Header.Get("Content-Type"); ct != "application/problem+json" || !strings.Contains(string(body), `"instance":"/v1/check"`) {
			t.Errorf("POST %s: %s %s, want a problem naming /v1/check", target, ct, body)
		}
		if n := testutil.ToFloat64(d.m.panics); n != float64(i+1) {
			t.Errorf("after POST %s: %v panics counted, want %d", target, n, i+1)
		}
	}
}
