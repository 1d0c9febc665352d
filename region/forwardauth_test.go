package region

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A plain /v1/authz call that carries only the other header pair comes
// from a gateway set up for the other --forward-auth-headers mode: it is
// let through (200, which every shipped gateway passes), counted, and
// refused with 503 only where a policy fails closed, nginx's deny_status
// included. Anything short of the whole other pair stays a 400.
func TestAuthzMisconfiguredHeaderPair(t *testing.T) {
	tests := []struct {
		mode   string
		hdr    []string
		query  string
		status int
		sluice string // X-Sluice-Status, "" for none
	}{
		{ForwardAuthOriginal, []string{"X-Forwarded-Method", "GET", "X-Forwarded-Uri", "/orders"}, "", 200, ""},
		{ForwardAuthOriginal, []string{"X-Forwarded-Method", "POST", "X-Forwarded-Uri", "/login"}, "", 503, "503"},
		{ForwardAuthOriginal, []string{"X-Forwarded-Method", "POST", "X-Forwarded-Uri", "/login"}, "?deny_status=403", 403, "503"},
		{ForwardAuthOriginal, []string{"X-Forwarded-Method", "GET", "X-Forwarded-Uri", "/orders"}, "?deny_status=403", 200, ""},
		{ForwardAuthForwarded, []string{"X-Original-Method", "GET", "X-Original-URI", "/orders"}, "", 200, ""},
		{ForwardAuthForwarded, []string{"X-Original-Method", "POST", "X-Original-URI", "/v1/login"}, "", 503, "503"},
		// Not the whole other pair, or some of the configured one: the
		// call is malformed, as before.
		{ForwardAuthOriginal, []string{"X-Forwarded-Method", "GET"}, "", 400, ""},
		{ForwardAuthOriginal, []string{"X-Forwarded-Method", "GET", "X-Forwarded-Uri", ""}, "", 400, ""},
		{ForwardAuthOriginal, []string{"X-Forwarded-Method", "GET", "X-Forwarded-Uri", "/orders", "X-Original-URI", "/orders"}, "", 400, ""},
		// A malformed other pair names no route: let through.
		{ForwardAuthOriginal, []string{"X-Forwarded-Method", "G E T", "X-Forwarded-Uri", "/login"}, "", 200, ""},
	}
	for _, tt := range tests {
		t.Run(tt.mode+" "+strings.Join(tt.hdr, " ")+tt.query, func(t *testing.T) {
			h := loginHarness(t, func(c *Config) { c.ForwardAuthHeaders = tt.mode })
			r := h.do("GET", "/v1/authz"+tt.query, "", tt.hdr...)
			if r.status != tt.status || r.header.Get("X-Sluice-Status") != tt.sluice {
				t.Fatalf("authz = %d (X-Sluice-Status %q) %s, want %d (%q)", r.status, r.header.Get("X-Sluice-Status"), r.body, tt.status, tt.sluice)
			}
			want := 1.0
			if tt.status == 400 {
				want = 0
			}
			if got := testutil.ToFloat64(h.d.faMisconfig.count); got != want {
				t.Errorf("sluice_forward_auth_misconfigured_total = %v, want %v", got, want)
			}
			if tt.status == 503 && r.header.Get("Retry-After") == "" {
				t.Errorf("a fail-closed refusal without Retry-After: %v", r.header)
			}
			// Nothing is spent: the login budget is whole afterwards.
			if tt.sluice == "503" && tt.mode == ForwardAuthOriginal {
				h.spendLogins()
			}
		})
	}
}

// due allows one log line a second, reporting the calls since the last.
func TestForwardAuthMisconfigLogOncePerSecond(t *testing.T) {
	var m forwardAuthMisconfig
	t0 := time.Unix(1000, 0)
	steps := []struct {
		at    time.Duration
		calls int64 // 0: no line
	}{
		{0, 1}, {10 * time.Millisecond, 0}, {500 * time.Millisecond, 0}, {999 * time.Millisecond, 0},
		{time.Second, 4}, {1500 * time.Millisecond, 0}, {5 * time.Second, 2},
	}
	for _, s := range steps {
		n, ok := m.due(t0.Add(s.at))
		if ok != (s.calls > 0) || n != s.calls {
			t.Errorf("due at +%v = %d, %v; want %d, %v", s.at, n, ok, s.calls, s.calls > 0)
		}
	}
}
