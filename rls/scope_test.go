package rls

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/sluice-rl/sluice/decide"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/engine/limiter"
	"github.com/sluice-rl/sluice/quota"
)

// The Sluice field scope in a rate_limit block makes a global-scope
// descriptor policy; region is the default, and anything else is refused
// with the file, line and field named.
func TestEnvoyScopeField(t *testing.T) {
	_, ps, err := ParseEnvoyConfig("f.yaml", []byte(`domain: d
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 100, algorithm: token_bucket, scope: global}
  - key: j
    rate_limit: {unit: day, requests_per_unit: 1000, scope: global}
  - key: i
    rate_limit: {unit: second, requests_per_unit: 5, scope: region}
  - key: h
    rate_limit: {unit: second, requests_per_unit: 5}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		scope, algorithm string
	}{
		{quota.ScopeGlobal, "token_bucket"},
		{quota.ScopeGlobal, "fixed_window"}, // a global quota
		{quota.ScopeRegion, "fixed_window"},
		{quota.ScopeRegion, "fixed_window"},
	}
	if len(ps) != len(want) {
		t.Fatalf("%d policies, want %d", len(ps), len(want))
	}
	for i, w := range want {
		if ps[i].Scope != w.scope || ps[i].Algorithm != w.algorithm {
			t.Errorf("policy %s = scope %q algorithm %q, want %q %q", ps[i].ID, ps[i].Scope, ps[i].Algorithm, w.scope, w.algorithm)
		}
	}

	bad := []struct {
		name, yaml, want string
	}{
		{"unknown scope", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      scope: planet\n",
			`f.yaml:7: descriptors[0].rate_limit.scope: unknown scope "planet" (want region or global)`},
		{"upper case", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, scope: Global}\n",
			`f.yaml:4: descriptors[0].rate_limit.scope: unknown scope "Global"`},
		{"not a string", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      scope: [global]\n",
			"f.yaml:7: descriptors[0].rate_limit.scope: want a string"},
		{"with unlimited", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, scope: global}\n",
			"descriptors[0].rate_limit.scope: must not be given with unlimited"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := ParseEnvoyConfig("f.yaml", []byte(tt.yaml))
			if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("ParseEnvoyConfig = %v, want one line containing %q", err, tt.want)
			}
		})
	}
}

// recordedShare gives every key half of its limit and records the keys it
// was asked for.
type recordedShare struct {
	mu    sync.Mutex
	asked map[engine.UsageKey]bool
}

func (r *recordedShare) Share(policy, subject string) float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked[engine.UsageKey{Subject: subject, Policy: policy}] = true
	return 0.5
}

// A global descriptor policy is enforced at the region's share of each
// descriptor value's state, in both layouts of a domain's states (one
// subject per domain, or one per descriptor as on a Redis Cluster): the
// share is asked for under exactly the (subject, state) keys whose usage
// the limiter tracks for the coordinator, each key resolves to its policy,
// and a region-scope policy is neither scaled nor tracked.
func TestGlobalDescriptorShares(t *testing.T) {
	for _, spread := range []bool{false, true} {
		t.Run(fmt.Sprintf("spread=%v", spread), func(t *testing.T) {
			reg := quota.NewRegistry(quota.RegistryConfig{})
			ps := []quota.Policy{
				{ID: "per-user", Algorithm: "token_bucket", RatePerSec: 1, Burst: 10, Mode: quota.ModeEnforce, Scope: quota.ScopeGlobal,
					Match: quota.Match{Domain: "api", Descriptors: []quota.DescriptorEntry{{Key: "user"}}}},
				{ID: "per-ip", Algorithm: "token_bucket", RatePerSec: 1, Burst: 10, Mode: quota.ModeEnforce,
					Match: quota.Match{Domain: "api", Descriptors: []quota.DescriptorEntry{{Key: "ip"}}}},
			}
			if err := reg.Seed(t.Context(), "test", ps); err != nil {
				t.Fatal(err)
			}
			lim := limiter.New(limiter.Config{})
			shares := &recordedShare{asked: map[engine.UsageKey]bool{}}
			dc := decide.New(decide.Config{Limiter: lim, Registry: reg, Shares: shares, Track: true})
			s, err := New(Config{Decider: dc, Matcher: reg, SpreadDescriptors: spread})
			if err != nil {
				t.Fatal(err)
			}
			admitted := map[string]int{}
			for range 10 {
				for _, user := range []string{"ann", "bob"} {
					r, err := s.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "api",
						Descriptors: []*rlv3.RateLimitDescriptor{desc("user", user), desc("ip", "192.0.2.7")}})
					if err != nil {
						t.Fatal(err)
					}
					if r.Statuses[0].Code == rlsv3.RateLimitResponse_OK {
						admitted[user]++
					}
				}
			}
			// Half of a burst of 10 each (the bucket refills 1/s): 5, or 6
			// if a second passed.
			for _, user := range []string{"ann", "bob"} {
				if n := admitted[user]; n < 5 || n > 6 {
					t.Errorf("user %s: %d of 10 admitted, want 5 (half of a burst of 10)", user, n)
				}
			}
			usage := lim.DrainUsage()
			if len(usage) != 2 {
				t.Errorf("tracked usage %v, want the two users' states only", usage)
			}
			for k, u := range usage {
				if !shares.asked[k] {
					t.Errorf("usage tracked under %q, which the share was never asked for (asked %v)", k, shares.asked)
				}
				if quota.PolicyOfState(k.Policy) != "per-user" || u.Demand == 0 {
					t.Errorf("usage %q = %+v, want per-user's state with demand", k, u)
				}
			}
			if len(shares.asked) != len(usage) {
				t.Errorf("shares asked for %v, want only the tracked keys %v", shares.asked, usage)
			}
		})
	}
}
