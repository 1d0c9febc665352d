package policyset_test

import (
	"fmt"
	"time"

	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/region/policyset"
)

// A region changes a policy and adds an override; another region checks
// the set it receives and works out what to write into its registry.
func Example() {
	now := time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)
	orders := quota.Policy{ID: "orders", Algorithm: "token_bucket", RatePerSec: 10, Burst: 20, Mode: quota.ModeEnforce}.Normalize()
	search := quota.Policy{ID: "search", Algorithm: "fixed_window", Count: 100, Window: 60, Mode: quota.ModeEnforce}.Normalize()

	// What the receiving region holds: revision r of both policies.
	held := policyset.New("", []quota.Policy{orders, search}, nil, nil)
	r := policyset.NextRevision(now, 0, "eu-1")

	// The sender raises orders, drops search and grants tenant-7 a burst.
	faster := orders
	faster.RatePerSec = 50
	vip := quota.Override{ID: "vip", Subject: "tenant-7", Policy: "orders", Burst: 100, ExpiresAt: now.Add(24 * time.Hour)}
	sent := policyset.New("us-2", []quota.Policy{faster}, []quota.Override{vip}, nil)
	rev := policyset.NextRevision(now.Add(time.Second), r, "us-2")
	data, _ := sent.Encode()

	// The receiver: newer, valid, then the writes.
	got, _ := policyset.Decode(data)
	set, err := got.Validate(now)
	if err != nil {
		fmt.Println("refused:", err)
		return
	}
	c := policyset.Diff(held, set)
	fmt.Println("newer:", rev > r)
	fmt.Println("hashes differ:", held.Hash() != set.Hash())
	fmt.Println("put policies:", len(c.PutPolicies), c.PutPolicies[0].ID)
	fmt.Println("delete policies:", c.DeletePolicies)
	fmt.Println("put overrides:", len(c.PutOverrides), c.PutOverrides[0].ID)

	// A set naming a policy it does not carry is refused whole.
	stray := quota.Override{ID: "stray", Subject: "tenant-8", Policy: "search", Burst: 5, ExpiresAt: now.Add(time.Hour)}
	_, err = policyset.New("us-2", []quota.Policy{faster}, []quota.Override{stray}, nil).Validate(now)
	fmt.Println(err)
	// Output:
	// newer: true
	// hashes differ: true
	// put policies: 1 orders
	// delete policies: [search]
	// put overrides: 1 vip
	// override "stray": invalid policy: policy: no policy "search" is in force
}
