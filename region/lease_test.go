package region

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/internal/testwait"
)

// TestLeaseThroughTheDaemon serves a partner policy with a lease from a
// daemon on Redis: checks are admitted from leases (counted in /metrics),
// a new version of the policy drops the lease and is counted, and a lease
// on a policy that cannot be leased is a 400 problem naming the field,
// leaving the last good version in place.
func TestLeaseThroughTheDaemon(t *testing.T) {
	srv := redistest.Start(t)
	h := newHarness(t, func(c *Config) {
		c.Store = "redis://" + srv.Addr()
		c.StoreTimeout = time.Second
	})
	partner := `{"algorithm":"token_bucket","rate_per_sec":50000,"burst":5000,"mode":"enforce","lease":{"max_slice":1000}%s}`
	h.putPolicy("partner", fmt.Sprintf(partner, ""))
	check := `{"api_key":"acme","route":"/v1/x","method":"GET"}`
	burst := func() {
		for range 50 {
			if r := h.do("POST", "/v1/check", check); r.status != 200 {
				t.Fatalf("check = %d %s, want 200", r.status, r.body)
			}
		}
	}
	testwait.For(t, time.Minute, "checks admitted from a lease", func() bool {
		burst()
		return h.d.lim.Stats().Leases.Admitted > 0
	})
	if m := string(h.do("GET", "/metrics", "").body); !strings.Contains(m, "sluice_lease_takes_total") || strings.Contains(m, "sluice_lease_admitted_total 0\n") {
		t.Errorf("/metrics does not show the lease's admissions:\n%s", grepLines(m, "sluice_lease"))
	}

	h.putPolicy("partner", fmt.Sprintf(partner, `,"description":"v2"`))
	if r := h.do("POST", "/v1/check", check); r.status != 200 {
		t.Fatalf("check of the new version = %d %s", r.status, r.body)
	}
	if s := h.d.lim.Stats().Leases; s.PolicyChanged != 1 {
		t.Errorf("after a new version: %+v, want one policy_changed fallback", s)
	}
	if m := string(h.do("GET", "/metrics", "").body); !strings.Contains(m, `sluice_lease_fallbacks_total{reason="policy_changed"} 1`) {
		t.Errorf("/metrics lacks the policy_changed fallback:\n%s", grepLines(m, "sluice_lease"))
	}

	for _, tc := range []struct{ doc, field string }{
		{`{"algorithm":"fixed_window","limit":100,"window":1,"mode":"enforce","lease":{}}`, "lease"},
		{`{"algorithm":"token_bucket","rate_per_sec":50000,"burst":5000,"mode":"enforce","lease":{"max_slice":9000}}`, "lease.max_slice"},
	} {
		r := h.admin("PUT", "/v1/policies/partner", tc.doc)
		if r.status != 400 || r.header.Get("Content-Type") != "application/problem+json" || !strings.Contains(string(r.body), fmt.Sprintf(`"field":%q`, tc.field)) {
			t.Errorf("PUT %s = %d %s, want a 400 problem naming %s", tc.doc, r.status, r.body, tc.field)
		}
	}
	if p, _ := h.d.reg.Get("partner"); p.Version != 2 || p.LeaseSize() != 1000 {
		t.Errorf("after refused versions the policy is %+v, want the last good one (version 2, a lease of 1000)", p)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
