package local_test

import (
	"context"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/client"
	"github.com/sluice-rl/sluice/client/internal/daemontest"
	"github.com/sluice-rl/sluice/client/local"
	"github.com/sluice-rl/sluice/quota"
)

// TestSameAsDaemon sends one sequence of checks to a daemon and to a
// Limiter over the same policies and override, and compares the
// decisions, statuses, problems and header fields.
func TestSameAsDaemon(t *testing.T) {
	policies := []quota.Policy{
		daemontest.Policy("burst", 0.01, 3),
		{ID: "hourly", Algorithm: "fixed_window", Count: 2, Window: 3600, Mode: quota.ModeShadow},
		{ID: "login", Algorithm: "token_bucket", RatePerSec: 0.01, Burst: 1, Mode: quota.ModeEnforce, Class: quota.ClassSecurity,
			Match: quota.Match{Routes: []string{"/login"}}},
		{ID: "guarded", Algorithm: "token_bucket", RatePerSec: 0.01, Burst: 1, Mode: quota.ModeEnforce, OnStoreFailure: quota.FailClosed,
			Match: quota.Match{Routes: []string{"/admin/*"}}},
	}
	override := quota.Override{ID: "vip", Subject: "user:vip", Policy: "burst", Unlimited: true, ExpiresAt: time.Now().Add(time.Hour)}
	url, stop := daemontest.Start(policies)
	defer stop()
	ctx := context.Background()
	d, err := client.New(client.Config{Server: url, Token: daemontest.Token})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.PutOverride(ctx, override); err != nil {
		t.Fatal(err)
	}
	reg := quota.NewRegistry(quota.RegistryConfig{})
	if err := reg.Seed(ctx, "test", policies); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.PutOverride(ctx, "test", override); err != nil {
		t.Fatal(err)
	}
	l := local.New(nil, reg)

	user := func(u, method, route string) client.CheckRequest {
		return client.CheckRequest{SubjectFields: quota.SubjectFields{User: u}, Method: method, Route: route}
	}
	cost5 := int64(5)
	reqs := []client.CheckRequest{
		user("1", "GET", "/v1/orders"), user("1", "GET", "/v1/orders"), user("1", "POST", "/v1/orders"),
		user("1", "GET", "/v1/orders"),                         // burst spent
		user("2", "GET", "/login"), user("2", "GET", "/login"), // security: never named
		user("vip", "GET", "/v1/x"), user("vip", "GET", "/v1/x"), user("vip", "GET", "/v1/x"), user("vip", "GET", "/v1/x"),
		user("3", "GET", "/admin/a"), user("3", "GET", "/admin/a"),
		{SubjectFields: quota.SubjectFields{IP: "192.0.2.7"}, Route: "/v1/orders", Tier: "pro"},
	}
	for i, req := range reqs {
		got, gerr := l.Check(ctx, req)
		want, werr := d.Check(ctx, req)
		if (gerr == nil) != (werr == nil) {
			t.Fatalf("check %d: local error %v, daemon error %v", i, gerr, werr)
		}
		if gerr != nil {
			continue
		}
		normalise(got)
		normalise(want)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("check %d %+v:\nlocal  %+v\n  %#v\ndaemon %+v\n  %#v", i, req, *got, got.Problem, *want, want.Problem)
		}
	}
	for _, req := range []client.CheckRequest{
		{Route: "/v1/orders"},
		user("1", "GET", "orders"),
		{SubjectFields: quota.SubjectFields{User: "1"}, Route: "/", Cost: &cost5},
	} {
		_, gerr := l.Check(ctx, req)
		_, werr := d.Check(ctx, req)
		gp, _ := gerr.(*client.Problem)
		wp, _ := werr.(*client.Problem)
		if gp == nil || wp == nil || gp.Status != wp.Status || gp.Errors[0].Field != wp.Errors[0].Field {
			t.Errorf("bad input %+v: local %v, daemon %v", req, gerr, werr)
		}
	}
}

// normalise drops what depends on the microseconds between the two
// checks: the fields in milliseconds. Whole seconds in the headers stay.
func normalise(d *client.Decision) {
	d.ResetMS, d.RetryAfterMS = 0, 0
	for i := range d.Policies {
		d.Policies[i].ResetMS, d.Policies[i].RetryAfterMS = 0, 0
	}
	for i := range d.Exempt {
		d.Exempt[i].ExpiresAt = d.Exempt[i].ExpiresAt.Truncate(time.Second)
	}
	if d.Problem != nil {
		d.Problem.RetryAfterMS = nil
		d.Problem.Instance = ""
	}
	if len(d.Header) == 0 {
		d.Header = http.Header{}
	}
}
