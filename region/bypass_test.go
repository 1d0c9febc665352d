package region

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-rl/sluice/quota"
)

// The default login policy allows 5 POSTs to /login per 15 minutes per
// subject. These tests spend them with five plain POST /login, then try
// every known way around the limit, against /v1/authz and /v1/check
// directly. The harness's peer is 127.0.0.1.

// loginHarness is a daemon with the default policies.
func loginHarness(t *testing.T, mutate func(*Config)) *harness {
	t.Helper()
	return newHarness(t, func(c *Config) {
		c.Policies = quota.DefaultPolicies()
		if mutate != nil {
			mutate(c)
		}
	})
}

// authz asks /v1/authz (nginx's header pair) about method uri.
func (h *harness) authz(method, uri string, hdr ...string) resp {
	h.t.Helper()
	return h.do("GET", "/v1/authz", "", append([]string{"X-Original-Method", method, "X-Original-URI", uri}, hdr...)...)
}

// spendLogins makes five plain POST /login, each allowed.
func (h *harness) spendLogins(hdr ...string) {
	h.t.Helper()
	for i := range 5 {
		if r := h.authz("POST", "/login", hdr...); r.status != 200 {
			h.t.Fatalf("plain POST /login #%d = %d %s, want 200", i+1, r.status, r.body)
		}
	}
}

var longToken = strings.Repeat("eyJhbGciOiJSUzI1NiJ9", 45) // 900 bytes, like a JWT

func TestAuthzNoWayAroundLogin(t *testing.T) {
	type attempt struct {
		name        string
		method, uri string // of a plain /v1/authz call
		path        string // else the call is POST /v1/authz<path> (Envoy)
		hdr         []string
	}
	var tries []attempt
	for _, u := range []string{"/login", "/%6Cogin", "/%6cogin", "//login", "/login/", "/./login", "/x/../login", "/%2e/login", "/x/..%2Flogin", "/login?x=1", "http://api.example/login/"} {
		tries = append(tries, attempt{name: "uri " + u, method: "POST", uri: u})
	}
	for _, p := range []string{"/login", "/%6Cogin", "//login", "/login/", "/./login", "/x/../login"} {
		tries = append(tries, attempt{name: "envoy " + p, path: p})
	}
	tries = append(tries,
		attempt{"lower-case method", "post", "/login", "", nil},
		attempt{"x-forwarded-method", "POST", "/login", "", []string{"X-Forwarded-Method", "GET"}},
		attempt{"x-forwarded-uri", "POST", "/login", "", []string{"X-Forwarded-Uri", "/elsewhere"}},
		attempt{"envoy path with x-original headers", "", "", "/login", []string{"X-Original-Method", "GET", "X-Original-URI", "/elsewhere"}},
		attempt{"rotating forwarded", "POST", "/login", "", []string{"Forwarded", "for=198.51.100.77"}},
		attempt{"rotating x-forwarded-for", "POST", "/login", "", []string{"X-Forwarded-For", "198.51.100.77"}},
		attempt{"rotating x-real-ip", "POST", "/login", "", []string{"X-Real-IP", "198.51.100.77"}},
		attempt{"tier header", "POST", "/login", "", []string{"X-Sluice-Tier", "pro"}},
		attempt{"user header", "POST", "/login", "", []string{"X-User-Id", "someone-else"}},
		attempt{"invented bearer", "POST", "/login", "", []string{"Authorization", "Bearer invented-77"}},
		attempt{"invented x-api-key", "POST", "/login", "", []string{"X-API-Key", "invented-77"}},
		attempt{"900-byte bearer", "POST", "/login", "", []string{"Authorization", "Bearer " + longToken}},
		attempt{"malformed x-api-key", "POST", "/login", "", []string{"X-API-Key", "a\tb"}},
	)
	for _, tt := range tries {
		t.Run(tt.name, func(t *testing.T) {
			h := loginHarness(t, func(c *Config) { c.UserHeader = "X-User-Id" })
			h.spendLogins()
			var r resp
			if tt.path != "" {
				r = h.do("POST", "/v1/authz"+tt.path, "", tt.hdr...)
			} else {
				r = h.authz(tt.method, tt.uri, tt.hdr...)
			}
			if r.status != 429 {
				t.Errorf("after five POST /login, %s = %d %s, want 429", tt.name, r.status, r.body)
			}
		})
	}
}

// Every spelling of /login spends the same budget: five mixed ones use it up.
func TestAuthzLoginFormsShareOneBudget(t *testing.T) {
	h := loginHarness(t, nil)
	for _, u := range []string{"/%6Cogin", "//login", "/login/", "/./login", "/x/../login"} {
		if r := h.authz("POST", u); r.status != 200 {
			t.Fatalf("POST %s = %d, want 200", u, r.status)
		}
	}
	if r := h.authz("POST", "/login"); r.status != 429 {
		t.Errorf("sixth login attempt = %d, want 429", r.status)
	}
	// Neighbours are other routes.
	for _, u := range []string{"/loginx", "/login/reset", "/Login"} {
		if r := h.authz("POST", u); r.status != 200 {
			t.Errorf("POST %s = %d, want 200 (not the login route)", u, r.status)
		}
	}
}

// With the peer trusted, only the configured client-address header counts:
// rotating it gives each client its own budget, rotating any other
// forwarding header changes nothing.
func TestAuthzOnlyTheConfiguredClientHeaderCounts(t *testing.T) {
	loopback := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	others := map[string][]string{
		"X-Forwarded-For": {"X-Forwarded-For", "198.51.100.%d"},
		"X-Real-IP":       {"X-Real-IP", "198.51.100.%d"},
		"Forwarded":       {"Forwarded", "for=198.51.100.%d"},
	}
	tests := []struct {
		header string
		client []string // the header naming client 203.0.113.9
		left   []string // a client-chosen left part, when the header has one
	}{
		{quota.ClientIPXForwardedFor, []string{"X-Forwarded-For", "203.0.113.9"}, []string{"X-Forwarded-For", "198.51.100.%d, 203.0.113.9"}},
		{quota.ClientIPXRealIP, []string{"X-Real-IP", "203.0.113.9"}, nil},
		{quota.ClientIPForwarded, []string{"Forwarded", "for=203.0.113.9"}, []string{"Forwarded", "for=198.51.100.%d, for=203.0.113.9"}},
		{quota.ClientIPNone, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.header, func(t *testing.T) {
			h := loginHarness(t, func(c *Config) { c.TrustedProxies, c.ClientIPHeader = loopback, tt.header })
			h.spendLogins(tt.client...)
			n := 0
			try := func(what string, hdr []string, want int) {
				t.Helper()
				n++
				hs := append([]string(nil), tt.client...)
				for i := 0; i+1 < len(hdr); i += 2 {
					hs = append(hs, hdr[i], strings.ReplaceAll(hdr[i+1], "%d", strconv.Itoa(n)))
				}
				if r := h.authz("POST", "/login", hs...); r.status != want {
					t.Errorf("%s = %d %s, want %d", what, r.status, r.body, want)
				}
			}
			for name, o := range others {
				if name != tt.header {
					try("rotating "+name, o, 429)
				}
			}
			try("rotating tier", []string{"X-Sluice-Tier", "pro"}, 429)
			if tt.left != nil {
				try("rotating the client-chosen left part", tt.left, 429)
			}
			if o, ok := others[tt.header]; ok {
				// The configured header itself names another client.
				try("another client", o, 200)
			}
		})
	}
}

// A tier header from an untrusted peer buys nothing: the request stays
// anonymous. From a trusted peer it names the tier.
func TestAuthzSpoofedTier(t *testing.T) {
	for _, trusted := range []bool{false, true} {
		t.Run(fmt.Sprint("trusted=", trusted), func(t *testing.T) {
			h := loginHarness(t, func(c *Config) {
				if trusted {
					c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
				}
			})
			r := h.authz("GET", "/v1/orders", "X-Sluice-Tier", "pro", "X-API-Key", "invented")
			want := "anonymous-per-ip"
			if trusted {
				want = "pro-default"
			}
			if r.status != 200 || !strings.Contains(r.header.Get("RateLimit-Policy"), `"`+want+`"`) {
				t.Errorf("GET /v1/orders with X-Sluice-Tier: pro = %d, RateLimit-Policy %q, want 200 under %s", r.status, r.header.Get("RateLimit-Policy"), want)
			}
		})
	}
}

// A 900-byte bearer token is no key: the request is limited by address,
// never refused as malformed.
func TestAuthzOversizedTokenIsServed(t *testing.T) {
	h := loginHarness(t, nil)
	r := h.authz("GET", "/orders", "Authorization", "Bearer "+longToken)
	if r.status != 200 || !strings.Contains(r.header.Get("RateLimit-Policy"), `"anonymous-per-ip"`) {
		t.Errorf("GET /orders with a 900-byte bearer = %d %s %v, want 200 under anonymous-per-ip", r.status, r.body, r.header)
	}
}

// Invented keys share the address's bucket: five logins each with a new
// key use up the address's budget.
func TestAuthzInventedKeysShareTheAddress(t *testing.T) {
	for _, header := range []string{"Authorization", "X-API-Key"} {
		t.Run(header, func(t *testing.T) {
			h := loginHarness(t, nil)
			key := func(i int) string {
				if header == "Authorization" {
					return fmt.Sprintf("Bearer invented-%d", i)
				}
				return fmt.Sprintf("invented-%d", i)
			}
			for i := range 5 {
				if r := h.authz("POST", "/login", header, key(i)); r.status != 200 {
					t.Fatalf("login #%d = %d", i+1, r.status)
				}
			}
			if r := h.authz("POST", "/login"); r.status != 429 {
				t.Errorf("login without a key after five invented ones = %d, want 429", r.status)
			}
		})
	}
}

// A registered key is its own subject: it does not share the address's
// budget.
func TestAuthzRegisteredKeyIsItsOwnSubject(t *testing.T) {
	h := loginHarness(t, nil)
	if r := h.admin("PUT", "/v1/keys/sk_real_1", `{"tier":"free"}`); r.status != 200 && r.status != 201 {
		t.Fatalf("PUT key = %d %s", r.status, r.body)
	}
	h.spendLogins()
	if r := h.authz("POST", "/login", "X-API-Key", "sk_real_1"); r.status != 200 {
		t.Errorf("login with a registered key after the address's five = %d, want 200", r.status)
	}
}

// --forward-auth-headers forwarded reads X-Forwarded-Method and
// X-Forwarded-Uri, and never the X-Original pair.
func TestAuthzForwardedHeaderPair(t *testing.T) {
	h := loginHarness(t, func(c *Config) { c.ForwardAuthHeaders = ForwardAuthForwarded })
	for i := range 5 {
		if r := h.do("GET", "/v1/authz", "", "X-Forwarded-Method", "POST", "X-Forwarded-Uri", "/login"); r.status != 200 {
			t.Fatalf("login #%d = %d %s", i+1, r.status, r.body)
		}
	}
	tests := []struct {
		name   string
		hdr    []string
		status int
		field  string
	}{
		{"x-original injection", []string{"X-Forwarded-Method", "POST", "X-Forwarded-Uri", "//login", "X-Original-Method", "GET", "X-Original-URI", "/elsewhere"}, 429, ""},
		// A gateway set up for the other pair is the operator's error: let
		// through (misconfiguredAuthz), except where a policy fails closed.
		{"only the x-original pair", []string{"X-Original-Method", "GET", "X-Original-URI", "/elsewhere"}, 200, ""},
		{"only the x-original pair, to a route that fails closed", []string{"X-Original-Method", "POST", "X-Original-URI", "/login"}, 503, ""},
		{"half the x-original pair", []string{"X-Original-Method", "GET"}, 400, "X-Forwarded-Method"},
		{"no uri", []string{"X-Forwarded-Method", "POST"}, 400, "X-Forwarded-Uri"},
	}
	for _, tt := range tests {
		r := h.do("GET", "/v1/authz", "", tt.hdr...)
		if r.status != tt.status || (tt.field != "" && !strings.Contains(string(r.body), `"field":"`+tt.field+`"`)) {
			t.Errorf("%s = %d %s, want %d naming %q", tt.name, r.status, r.body, tt.status, tt.field)
		}
	}
}

// A header sent twice means the gateway appended to a client's header
// instead of replacing it: refused, naming it, never half-believed.
func TestAuthzRepeatedTargetHeader(t *testing.T) {
	h := loginHarness(t, nil)
	req, err := http.NewRequest("GET", h.url+"/v1/authz", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header = http.Header{"X-Original-Method": {"POST"}, "X-Original-Uri": {"/elsewhere", "/login"}}
	res, err := h.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	r := resp{res.StatusCode, res.Header, body}
	if r.status != 400 || !strings.Contains(string(r.body), `"field":"X-Original-URI"`) {
		t.Errorf("repeated X-Original-URI = %d %s, want 400 naming it", r.status, r.body)
	}
}

func TestCheckNoWayAroundLogin(t *testing.T) {
	const ip = `"ip":"192.0.2.10"`
	tests := []struct {
		name string
		body string // a /v1/check body after five {ip, POST /login}
		path string // "/v1/check" unless set
	}{
		{"plain", `{` + ip + `,"method":"POST","route":"/login"}`, ""},
		{"encoded", `{` + ip + `,"method":"POST","route":"/%6Cogin"}`, ""},
		{"double slash", `{` + ip + `,"method":"POST","route":"//login"}`, ""},
		{"trailing slash", `{` + ip + `,"method":"POST","route":"/login/"}`, ""},
		{"dot", `{` + ip + `,"method":"POST","route":"/./login"}`, ""},
		{"dot-dot", `{` + ip + `,"method":"POST","route":"/x/../login"}`, ""},
		{"lower-case method", `{` + ip + `,"method":"post","route":"/login"}`, ""},
		{"invented key beside ip", `{` + ip + `,"api_key":"invented-1","method":"POST","route":"/login"}`, ""},
		{"900-byte key beside ip", `{` + ip + `,"api_key":"` + longToken + `","method":"POST","route":"/login"}`, ""},
		{"batch forms", `{"checks":[{` + ip + `,"method":"POST","route":"/login/"},{` + ip + `,"method":"POST","route":"/%6Cogin"}]}`, "/v1/check/batch"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := loginHarness(t, nil)
			for i := range 5 {
				if r := h.do("POST", "/v1/check", `{`+ip+`,"method":"POST","route":"/login"}`); r.status != 200 {
					t.Fatalf("check #%d = %d %s", i+1, r.status, r.body)
				}
			}
			path := tt.path
			if path == "" {
				path = "/v1/check"
			}
			r := h.do("POST", path, tt.body)
			if path == "/v1/check" {
				if r.status != 429 {
					t.Errorf("%s = %d %s, want 429", tt.name, r.status, r.body)
				}
				return
			}
			var out BatchResponse
			if err := json.Unmarshal(r.body, &out); err != nil || len(out.Results) != 2 {
				t.Fatalf("batch = %d %s: %v", r.status, r.body, err)
			}
			for i, it := range out.Results {
				if it.Status != 429 {
					t.Errorf("batch item %d = %d, want 429", i, it.Status)
				}
			}
		})
	}
}

// On /v1/check, an invented key counts by the ip beside it, else by the
// one shared bucket for unknown keys; never by a bucket of its own.
func TestCheckInventedKeys(t *testing.T) {
	h := loginHarness(t, nil)
	for i := range 5 {
		r := h.do("POST", "/v1/check", fmt.Sprintf(`{"api_key":"invented-%d","method":"POST","route":"/login"}`, i))
		if r.status != 200 || r.json(t)["subject"] != quota.UnknownKeySubject {
			t.Fatalf("invented key #%d = %d %s, want 200 as %s", i+1, r.status, r.body, quota.UnknownKeySubject)
		}
	}
	for _, body := range []string{`{"api_key":"invented-99","method":"POST","route":"/login"}`, `{"api_key":"` + longToken + `","method":"POST","route":"/login"}`} {
		if r := h.do("POST", "/v1/check", body); r.status != 429 {
			t.Errorf("%.60s... = %d %s, want 429 (the shared unknown-key bucket)", body, r.status, r.body)
		}
	}
	r := h.do("POST", "/v1/check", `{"api_key":"invented-7","ip":"192.0.2.20","method":"POST","route":"/login"}`)
	if r.status != 200 || r.json(t)["subject"] != "ip:192.0.2.20" {
		t.Errorf("invented key beside an ip = %d %s, want 200 as ip:192.0.2.20", r.status, r.body)
	}
}

// The usage report's ?route= meets the policies a request to that route
// would meet, in any spelling.
func TestUsageRouteIsCanonical(t *testing.T) {
	h := loginHarness(t, nil)
	for _, route := range []string{"/login", "/login/", "//%6Cogin", "/x/../login"} {
		r := h.admin("GET", "/v1/keys/ip:127.0.0.1/usage?method=POST&route="+url.QueryEscape(route), "")
		if r.status != 200 || !strings.Contains(string(r.body), `"id":"login"`) {
			t.Errorf("usage ?route=%s = %d %s, want the login policy", route, r.status, r.body)
		}
	}
}
