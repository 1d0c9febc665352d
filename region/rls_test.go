package region

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/share"
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

// The coordinator names a global descriptor policy's keys by the state a
// descriptor spends (one key per descriptor value, as the rate limit
// service tracks them); the daemon resolves each to its policy for its
// limit, bucket, quota window and token checks, as it does a policy id.
func TestGlobalDescriptorStatesResolve(t *testing.T) {
	h := newHarness(t, nil)
	h.putPolicy("per-ip", `{"algorithm":"token_bucket","rate_per_sec":100,"burst":100,"mode":"enforce","scope":"global","match":{"domain":"d","descriptors":[{"key":"ip"}]}}`)
	h.putPolicy("daily", `{"algorithm":"fixed_window","limit":1000,"window":86400,"mode":"enforce","scope":"global","match":{"domain":"d","descriptors":[{"key":"user"}]}}`)
	h.putPolicy("local", `{"algorithm":"token_bucket","rate_per_sec":5,"burst":5,"mode":"enforce","match":{"domain":"d","descriptors":[{"key":"ip"}]}}`)
	ip := "per-ip\x1fip\x1e192.0.2.7"
	tests := []struct {
		state  string
		limit  float64
		bucket bool
		window time.Duration
	}{
		{ip, 100, true, 0},
		{"per-ip", 100, true, 0}, // spread descriptors: the state is the policy id
		{"daily\x1fuser\x1eann", 1000.0 / 86400, false, 24 * time.Hour},
		{"local\x1fip\x1e192.0.2.7", 0, false, 0},
		{"unknown\x1fip\x1e192.0.2.7", 0, false, 0},
	}
	for _, tt := range tests {
		l, lok := h.d.globalLimit(tt.state)
		w, _ := h.d.globalQuota(tt.state)
		if l != tt.limit || lok != (tt.limit > 0) || h.d.globalBucket(tt.state) != tt.bucket || w != tt.window {
			t.Errorf("%q: limit %v %v, bucket %v, quota window %v; want %v, %v, %v", tt.state, l, lok, h.d.globalBucket(tt.state), w, tt.limit, tt.bucket, tt.window)
		}
	}
	c, ok := h.d.tokenBucketCheck(share.Key{Policy: ip, Subject: "rls:d"})
	if !ok || c.Policy != ip || c.Limit.Rate != 100 || c.OnFailure != engine.FailClosed {
		t.Errorf("tokenBucketCheck = %+v, %v, want a check of the descriptor's own state at rate 100", c, ok)
	}
}
