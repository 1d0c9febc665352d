package quota_test

import (
	"context"
	"fmt"

	"github.com/sluice-rl/sluice/quota"
)

// A descriptor policy limits what Envoy's rate limit service asks about:
// here each address of domain edge, one address blocked outright.
func ExampleRegistry_AppendMatchDescriptor() {
	r := quota.NewRegistry(quota.RegistryConfig{})
	err := r.Seed(context.Background(), "example", []quota.Policy{
		{ID: "per-ip", Mode: quota.ModeEnforce, Algorithm: "fixed_window", Count: 10, Window: 1,
			Match: quota.Match{Domain: "edge", Descriptors: []quota.DescriptorEntry{{Key: "remote_address"}}}},
		{ID: "blocked", Mode: quota.ModeEnforce, Algorithm: "fixed_window", Count: 0, Window: 1,
			Match: quota.Match{Domain: "edge", Descriptors: []quota.DescriptorEntry{{Key: "remote_address", Value: "50.0.0.5"}}}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, ip := range []string{"50.0.0.1", "50.0.0.5"} {
		for _, m := range r.AppendMatchDescriptor(nil, "edge", []quota.DescriptorEntry{{Key: "remote_address", Value: ip}}) {
			fmt.Printf("%s: %s, denies all: %v\n", ip, m.Policy.ID, m.Policy.DeniesAll())
		}
	}
	// Output:
	// 50.0.0.1: per-ip, denies all: false
	// 50.0.0.5: blocked, denies all: true
}
