package decide_test

import (
	"context"
	"fmt"

	"github.com/sluice-rl/sluice/decide"
	"github.com/sluice-rl/sluice/engine/limiter"
	"github.com/sluice-rl/sluice/quota"
)

func ExampleDecider() {
	ctx := context.Background()
	reg := quota.NewRegistry(quota.RegistryConfig{})
	err := reg.Seed(ctx, "example", []quota.Policy{{ID: "per-user", Algorithm: "token_bucket",
		RatePerSec: 0.01, Burst: 2, Mode: quota.ModeEnforce}})
	if err != nil {
		fmt.Println(err)
		return
	}
	dc := decide.New(decide.Config{Limiter: limiter.New(limiter.Config{}), Registry: reg})
	for range 3 {
		ans, p := dc.Check(ctx, decide.CheckRequest{SubjectFields: quota.SubjectFields{User: "42"}, Route: "/v1/orders"})
		if p != nil {
			fmt.Println(p)
			return
		}
		fmt.Println(ans.Status, ans.Decision.Policy, ans.Decision.Remaining, ans.Header.Get("RateLimit"))
		if ans.Problem != nil {
			fmt.Println(ans.Problem.Detail)
		}
	}
	// Output:
	// 200 per-user 1 "per-user";r=1;t=100
	// 200 per-user 0 "per-user";r=0;t=200
	// 429 per-user 0 "per-user";r=0;t=100
	// Policy "per-user" allows 2 requests per 200 s for this client; retry in 100 s.
}
