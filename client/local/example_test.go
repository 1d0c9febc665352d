package local_test

import (
	"context"
	"fmt"

	"github.com/sluice-rl/sluice/client"
	"github.com/sluice-rl/sluice/client/local"
	"github.com/sluice-rl/sluice/quota"
)

func ExampleLimiter_Check() {
	ctx := context.Background()
	reg := quota.NewRegistry(quota.RegistryConfig{})
	err := reg.Seed(ctx, "example", []quota.Policy{{ID: "per-user", Algorithm: "token_bucket",
		RatePerSec: 0.01, Burst: 2, Mode: quota.ModeEnforce}})
	if err != nil {
		fmt.Println(err)
		return
	}
	l := local.New(nil, reg) // nil: an in-process memory store
	for range 3 {
		d, err := l.Check(ctx, client.CheckRequest{SubjectFields: quota.SubjectFields{User: "42"}, Route: "/v1/orders"})
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(d.Status, d.Header.Get("RateLimit-Policy"), d.Header.Get("RateLimit"), "retry:"+d.Header.Get("Retry-After"))
	}
	// Output:
	// 200 "per-user";q=2;w=200 "per-user";r=1;t=100 retry:
	// 200 "per-user";q=2;w=200 "per-user";r=0;t=200 retry:
	// 429 "per-user";q=2;w=200 "per-user";r=0;t=100 retry:100
}
