package rls

import (
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-rl/sluice/quota"
)

// overLimitFiles are two domains of one daemon: tokens counts hits over
// the limit (the Sluice field count_over_limit), plain does not.
const overLimitFiles = `domain: tokens
count_over_limit: true
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: token_bucket}
  - key: route
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: closed
    rate_limit: {unit: hour, requests_per_unit: 0}
`

const plainFile = `domain: plain
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: token_bucket}
`

func overLimitPolicies(t *testing.T) []quota.Policy {
	t.Helper()
	var ps []quota.Policy
	for _, f := range []string{overLimitFiles, plainFile} {
		_, got, err := ParseEnvoyConfig("f.yaml", []byte(f))
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, got...)
	}
	return ps
}

func remaining(r *rlsv3.RateLimitResponse) []uint32 {
	out := make([]uint32, len(r.Statuses))
	for i, s := range r.Statuses {
		out[i] = s.LimitRemaining
	}
	return out
}

// TestCountOverLimitPerDomain: in a domain with count_over_limit, a
// request over the limit still counts its hits in every descriptor (a
// token bucket into debt, a window past nothing else), so the next
// requests are refused until the debt is paid; in a domain without it
// the same request spends nothing.
func TestCountOverLimitPerDomain(t *testing.T) {
	c := rlsv3.NewRateLimitServiceClient(startRLS(t, overLimitPolicies(t)))
	both := func(user string) []*rlv3.RateLimitDescriptor {
		return []*rlv3.RateLimitDescriptor{desc("user", user), desc("route", "/chat")}
	}
	if r := ask(t, c, call{domain: "tokens", ds: both("ann"), hits: 4}); codesOf(r) != "OK OK OK" {
		t.Fatalf("4 hits = %s, want OK", codesOf(r))
	}
	// 15 more: the user's bucket of 10 is over, yet both descriptors count
	// them, as envoyproxy/ratelimit counts them.
	r := ask(t, c, call{domain: "tokens", ds: both("ann"), hits: 15})
	if codesOf(r) != "OVER_LIMIT OVER_LIMIT OK" || remaining(r)[1] != 81 {
		t.Fatalf("15 more hits = %s remaining %v, want OVER_LIMIT OVER_LIMIT OK with 81 left on the route (4+15 counted)", codesOf(r), remaining(r))
	}
	if header(r, "Retry-After") == "" {
		t.Errorf("over the limit without Retry-After: %v", r.ResponseHeadersToAdd)
	}
	// The user is 9 hits in debt: a read (hits_addend 0) is refused now.
	read := &rlv3.RateLimitDescriptor{Entries: desc("user", "ann").Entries, HitsAddend: wrapperspb.UInt64(0)}
	if r := ask(t, c, call{domain: "tokens", ds: []*rlv3.RateLimitDescriptor{read}}); codesOf(r) != "OVER_LIMIT OVER_LIMIT" {
		t.Errorf("a read after the debt = %s, want OVER_LIMIT", codesOf(r))
	}
	// Another user's request is admitted, and the route counted 19 before it.
	if r := ask(t, c, call{domain: "tokens", ds: both("bob")}); codesOf(r) != "OK OK OK" || remaining(r)[1] != 80 {
		t.Errorf("bob = %s remaining %v, want OK with 80 left on the route", codesOf(r), remaining(r))
	}
	// A policy of limit 0 denies, and the other descriptors still count.
	r = ask(t, c, call{domain: "tokens", ds: []*rlv3.RateLimitDescriptor{desc("closed", "x"), desc("route", "/chat")}, hits: 5})
	if codesOf(r) != "OVER_LIMIT OVER_LIMIT OK" || remaining(r)[1] != 75 {
		t.Errorf("limit 0 beside the route = %s remaining %v, want OVER_LIMIT with 75 left on the route", codesOf(r), remaining(r))
	}

	// Without count_over_limit nothing is spent when over.
	if r := ask(t, c, call{domain: "plain", ds: []*rlv3.RateLimitDescriptor{desc("user", "ann")}, hits: 11}); codesOf(r) != "OVER_LIMIT OVER_LIMIT" {
		t.Fatalf("11 hits of 10 = %s, want OVER_LIMIT", codesOf(r))
	}
	if r := ask(t, c, call{domain: "plain", ds: []*rlv3.RateLimitDescriptor{desc("user", "ann")}, hits: 10}); codesOf(r) != "OK OK" {
		t.Errorf("10 hits after a rejected 11 = %s, want OK (nothing was spent)", codesOf(r))
	}
}

// TestCountOverLimitDaemonWide: Config.CountOverLimit counts over the
// limit in every domain, the policies' own field or not.
func TestCountOverLimitDaemonWide(t *testing.T) {
	c := rlsv3.NewRateLimitServiceClient(startRLSWith(t, "memory", overLimitPolicies(t), func(c *Config) { c.CountOverLimit = true }))
	one := []*rlv3.RateLimitDescriptor{desc("user", "ann")}
	if r := ask(t, c, call{domain: "plain", ds: one, hits: 12}); codesOf(r) != "OVER_LIMIT OVER_LIMIT" {
		t.Fatalf("12 hits of 10 = %s, want OVER_LIMIT", codesOf(r))
	}
	if r := ask(t, c, call{domain: "plain", ds: one, hits: 1}); codesOf(r) != "OVER_LIMIT OVER_LIMIT" {
		t.Errorf("1 hit after 12 counted of 10 = %s, want OVER_LIMIT (2 in debt)", codesOf(r))
	}
}

// TestCountOverLimitBadConfig: count_over_limit must be a boolean, and a
// sliding_window_log cannot count past its limit.
func TestCountOverLimitBadConfig(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"domain: d\ncount_over_limit: maybe\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n", "count_over_limit: want true or false"},
		{"domain: d\ncount_over_limit: true\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: sliding_window_log}\n", "count_over_limit"},
	} {
		_, _, err := ParseEnvoyConfig("f.yaml", []byte(tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseEnvoyConfig(%q) = %v, want an error naming %s", tc.yaml, err, tc.want)
		}
	}
	_, ps, err := ParseEnvoyConfig("f.yaml", []byte("domain: d\ncount_over_limit: yes\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true}\n  - key: j\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if ps[0].CountOverLimit || !ps[1].CountOverLimit {
		t.Errorf("count_over_limit: yes gives unlimited %v, limited %v; want false, true", ps[0].CountOverLimit, ps[1].CountOverLimit)
	}
}
