package quota_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"net/netip"

	"github.com/sluice-rl/sluice/quota"
)

func ExampleRegistry_Match() {
	ctx := context.Background()
	reg := quota.NewRegistry(quota.RegistryConfig{}) // add a Store and an Audit log in production
	p, err := quota.ParsePolicy([]byte(`{"id": "pro-default", "match": {"tier": "pro", "routes": ["/v1/*"]},
		"algorithm": "token_bucket", "rate_per_sec": 100, "burst": 200,
		"cost": {"POST /v1/exports": 10}, "mode": "enforce"}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := reg.Put(ctx, "alice", p, nil); err != nil {
		fmt.Println(err)
		return
	}
	for _, a := range reg.Match(quota.Query{Tier: "pro", Subject: "key:abc", Method: "POST", Route: "/v1/exports"}) {
		fmt.Printf("%s v%d %s cost=%d burst=%v\n", a.Policy.ID, a.Policy.Version, a.Policy.Mode, a.Cost, a.Limit.Burst)
	}
	// Output: pro-default v1 enforce cost=10 burst=200
}

func ExampleRegistry_MatchExempt() {
	ctx := context.Background()
	reg := quota.NewRegistry(quota.RegistryConfig{})
	for _, p := range []quota.Policy{
		{ID: "burst", Algorithm: "token_bucket", RatePerSec: 10, Burst: 20, Mode: quota.ModeEnforce},
		{ID: "daily", Algorithm: "fixed_window", Count: 1000, Window: 86400, Mode: quota.ModeEnforce},
	} {
		if _, err := reg.Put(ctx, "alice", p, nil); err != nil {
			fmt.Println(err)
			return
		}
	}
	o, err := quota.ParseOverride([]byte(`{"id": "billing-svc", "subject": "user:billing", "policy": "daily",
		"unlimited": true, "expires_at": "2999-01-01T00:00:00Z"}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := reg.PutOverride(ctx, "alice", o); err != nil {
		fmt.Println(err)
		return
	}
	for _, subject := range []string{"user:billing", "user:42"} {
		applied, exempt := reg.MatchExempt(quota.Query{Subject: subject, Method: "GET", Route: "/v1/orders"})
		for _, a := range applied {
			fmt.Printf("%s: %s applies\n", subject, a.Policy.ID)
		}
		for _, e := range exempt {
			fmt.Printf("%s: %s exempt by %s\n", subject, e.Policy.ID, e.Override)
		}
	}
	// Output:
	// user:billing: burst applies
	// user:billing: daily exempt by billing-svc
	// user:42: burst applies
	// user:42: daily applies
}

func ExampleRegistry_Put_conflict() {
	ctx := context.Background()
	reg := quota.NewRegistry(quota.RegistryConfig{})
	p := quota.Policy{ID: "free", Algorithm: "token_bucket", RatePerSec: 10, Burst: 20}
	v1, _ := reg.Put(ctx, "alice", p, nil)
	fmt.Println(v1.Version, v1.Mode) // a new version starts in shadow

	p.Mode = quota.ModeEnforce
	v := v1.Version
	_, err := reg.Put(ctx, "bob", p, &v) // If-Match: 1
	fmt.Println(err)
	_, err = reg.Put(ctx, "carol", p, &v) // stale
	fmt.Println(err)
	p.Burst = 0
	_, err = reg.Put(ctx, "dave", p, nil)
	fmt.Println(err)
	// Output:
	// 1 shadow
	// <nil>
	// policy free: If-Match version 1, but the version in force is 2
	// invalid policy: burst: must be at least 1, got 0
}

func ExampleIdentify() {
	cfg := quota.IdentityConfig{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}

	// Through a trusted proxy, the client address comes from X-Forwarded-For.
	r := httptest.NewRequest("GET", "/v1/orders", nil)
	r.RemoteAddr = "10.0.0.2:41000"
	r.Header.Set("X-Forwarded-For", "2001:db8:1:2::77, 10.0.0.9")
	id, _ := quota.Identify(r, cfg)
	fmt.Println(id.Subject())

	// From anyone else, the header is ignored.
	r.RemoteAddr = "198.51.100.3:5000"
	id, _ = quota.Identify(r, cfg)
	fmt.Println(id.Subject())

	// The check API body names the same subject.
	id, _ = quota.SubjectFields{IP: "2001:db8:1:2::1"}.Identity()
	fmt.Println(id.Subject())
	// Output:
	// ip6:2001:db8:1:2::/64
	// ip:198.51.100.3
	// ip6:2001:db8:1:2::/64
}

func ExampleNormalizeRoute() {
	for _, p := range []string{"/%6Cogin", "//login", "/login/", "/./login", "/x/../login", "/../login?next=/", "/a%2Fb", "/caf%c3%a9"} {
		fmt.Printf("%-18s %s\n", p, quota.NormalizeRoute(p))
	}
	// Output:
	// /%6Cogin           /login
	// //login            /login
	// /login/            /login
	// /./login           /login
	// /x/../login        /login
	// /../login?next=/   /login
	// /a%2Fb             /a/b
	// /caf%c3%a9         /caf%C3%A9
}
