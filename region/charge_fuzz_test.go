package region

import (
	"context"
	"testing"

	"github.com/sluice-rl/sluice/decide"
	"github.com/sluice-rl/sluice/engine/limiter"
	"github.com/sluice-rl/sluice/quota"
)

// FuzzChargeRequest decodes arbitrary bodies of POST /v1/charge and
// charges what decodes: a problem is a 4xx naming a field, and a problem
// of the charge itself leaves every policy's state as it was.
func FuzzChargeRequest(f *testing.F) {
	for _, s := range []string{`{"user":"u","route":"/","cost":5}`, `{"api_key":"k","route":"/a","cost":3,"reservation":"r1"}`,
		`{"ip":"::1","route":"/x?y","cost":-1}`, `{"cost":1e400}`, `{"user":"u","route":"/","cost":1.5}`, `[]`,
		`{"user":"u","route":"/","cost":5,"reservation":""}`, `{"user":"u","user":"v","route":"/","cost":1}`, `null`} {
		f.Add([]byte(s))
	}
	reg := quota.NewRegistry(quota.RegistryConfig{})
	if err := reg.Seed(context.Background(), "fuzz", []quota.Policy{
		{ID: "tokens", Algorithm: "token_bucket", RatePerSec: 1, Burst: 100, Mode: quota.ModeEnforce},
		{ID: "daily", Algorithm: "fixed_window", Count: 1000, Window: 86400, Mode: quota.ModeShadow},
	}); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var in ChargeRequest
		if p := decodeCharge(body, &in); p != nil {
			if p.Status != 400 || len(p.Errors) == 0 {
				t.Fatalf("decode problem %+v", p)
			}
			return
		}
		dc := decide.New(decide.Config{Limiter: limiter.New(limiter.Config{}), Registry: reg})
		_, p := dc.Charge(context.Background(), in)
		if p == nil {
			return
		}
		if p.Status != 400 || len(p.Errors) == 0 {
			t.Fatalf("charge problem %+v", p)
		}
		probe := decide.CheckRequest{SubjectFields: in.SubjectFields, Tier: in.Tier, Method: in.Method, Route: in.Route}
		if _, tp := probe.Target(""); tp != nil {
			return
		}
		zero := int64(0)
		probe.Cost = &zero
		a, cp := dc.Check(context.Background(), probe)
		if cp != nil {
			t.Fatalf("probe check: %+v", cp)
		}
		for _, pr := range a.Decision.Policies {
			if pr.Remaining != pr.Limit {
				t.Fatalf("a refused charge (%s) spent %d of %s", p.Detail, pr.Limit-pr.Remaining, pr.ID)
			}
		}
	})
}
