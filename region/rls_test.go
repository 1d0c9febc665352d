package region

import (
	"context"
	"testing"

	"github.com/sluice-rl/sluice/quota"
)

// Descriptor policies limit rate limit service descriptors only: they are
// not in an HTTP check, nor in a subject's usage report, even when one is
// unlimited or denies all and so has no engine limit.
func TestDescriptorPoliciesStayOutOfHTTP(t *testing.T) {
	h := newHarness(t, nil)
	h.putPolicy("web", `{"algorithm":"fixed_window","limit":10,"window":60,"mode":"enforce"}`)
	h.putPolicy("free", `{"unlimited":true,"mode":"enforce","match":{"domain":"d","descriptors":[{"key":"ldap"}]}}`)
	h.putPolicy("blocked", `{"algorithm":"fixed_window","limit":0,"window":1,"mode":"enforce","match":{"domain":"d","descriptors":[{"key":"ip","value":"50.0.0.5"}]}}`)
	h.putPolicy("per-ip", `{"algorithm":"fixed_window","limit":2,"window":60,"mode":"enforce","match":{"domain":"d","descriptors":[{"key":"ip"}]}}`)
	r := h.do("POST", "/v1/check", `{"ip":"192.0.2.7","route":"/a"}`)
	if m := r.json(t); r.status != 200 || m["policy"] != "web" || len(m["policies"].([]any)) != 1 {
		t.Fatalf("check = %d %s, want only the web policy", r.status, r.body)
	}
	r = h.admin("GET", "/v1/keys/ip:192.0.2.7/usage", "")
	if r.status != 200 {
		t.Fatalf("usage = %d %s, want 200", r.status, r.body)
	}

	// DecideStates spends each state apart, all or nothing.
	reg := h.d.Registry()
	m := reg.AppendMatchDescriptor(nil, "d", []quota.DescriptorEntry{{Key: "ip", Value: "192.0.2.7"}})
	if len(m) != 1 {
		t.Fatalf("AppendMatchDescriptor = %d policies, want per-ip", len(m))
	}
	a := quota.Applied{Policy: m[0].Policy, Limit: m[0].Limit, Cost: 2, State: "per-ip/192.0.2.7"}
	b := quota.Applied{Policy: m[0].Policy, Limit: m[0].Limit, Cost: 1, State: "per-ip/192.0.2.8"}
	v, err := h.d.DecideStates(context.Background(), "rls:d", []quota.Applied{a, b})
	if err != nil || !v.Allowed || v.Results[0].Remaining != 0 || v.Results[1].Remaining != 1 {
		t.Fatalf("DecideStates = %+v, %v, want both admitted, 0 and 1 left", v, err)
	}
	if v.RateLimitPolicy != `"per-ip";q=2;w=60` {
		t.Errorf("RateLimit-Policy = %q, want the policy once", v.RateLimitPolicy)
	}
	v, err = h.d.DecideStates(context.Background(), "rls:d", []quota.Applied{b, a})
	if err != nil || v.Allowed || v.Results[0].Remaining != 1 || v.RetryAfterHeader == "" {
		t.Fatalf("DecideStates again = %+v, %v, want rejected with nothing spent", v, err)
	}
}
