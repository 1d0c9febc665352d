package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/client"
	"github.com/sluice-rl/sluice/client/internal/daemontest"
	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/region"
)

func newClient(t *testing.T, url string, mode client.FailureMode) *client.Client {
	t.Helper()
	c, err := client.New(client.Config{Server: url, Token: daemontest.Token, OnFailure: mode})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// downURL is the address of a loopback port nothing listens on.
func downURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}

func TestCheckAgainstDaemon(t *testing.T) {
	url, stop := daemontest.Start([]quota.Policy{daemontest.Policy("burst", 0.01, 2)})
	defer stop()
	c := newClient(t, url, client.FailError)
	ctx := context.Background()
	req := client.CheckRequest{SubjectFields: quota.SubjectFields{User: "42"}, Route: "/v1/orders"}
	for i, want := range []struct {
		allowed   bool
		status    int
		remaining int64
		rateLimit string
	}{
		{true, 200, 1, `"burst";r=1;t=100`},
		{true, 200, 0, `"burst";r=0;t=200`},
		{false, 429, 0, `"burst";r=0;t=100`},
	} {
		d, err := c.Check(ctx, req)
		if err != nil {
			t.Fatalf("check %d: %v", i, err)
		}
		if d.Allowed != want.allowed || d.Status != want.status || d.Remaining != want.remaining {
			t.Errorf("check %d = allowed %v status %d remaining %d, want %v %d %d", i, d.Allowed, d.Status, d.Remaining, want.allowed, want.status, want.remaining)
		}
		if got := d.Header.Get("RateLimit"); got != want.rateLimit {
			t.Errorf("check %d RateLimit = %q, want %q", i, got, want.rateLimit)
		}
		if got := d.Header.Get("RateLimit-Policy"); got != `"burst";q=2;w=200` {
			t.Errorf("check %d RateLimit-Policy = %q", i, got)
		}
		if d.Subject != "user:42" || d.Policy != "burst" || d.Fallback {
			t.Errorf("check %d: subject %q policy %q fallback %v", i, d.Subject, d.Policy, d.Fallback)
		}
		if !want.allowed {
			if ra := d.RetryAfter(); d.Header.Get("Retry-After") != "100" || ra <= 99*time.Second || ra > 100*time.Second {
				t.Errorf("rejected: Retry-After %q, RetryAfter() %v, want 100 and (99s, 100s]", d.Header.Get("Retry-After"), ra)
			}
			if d.Problem == nil || d.Problem.Type != region.ProblemQuotaExceeded || !slices.Equal(d.Problem.ViolatedPolicies, []string{"burst"}) {
				t.Errorf("rejected: problem %+v", d.Problem)
			}
		} else if d.Problem != nil || d.Header.Get("Retry-After") != "" {
			t.Errorf("allowed: problem %+v, Retry-After %q", d.Problem, d.Header.Get("Retry-After"))
		}
	}

	items, err := c.CheckBatch(ctx, []client.CheckRequest{req, {Route: "/x"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(items) != 2 || items[0].Status != 429 || items[0].Decision == nil || items[0].Decision.Allowed ||
		items[1].Status != 400 || items[1].Problem == nil {
		t.Errorf("batch = %+v", items)
	}
}

func TestCheckBadInputIsAProblemInEveryMode(t *testing.T) {
	url, stop := daemontest.Start(nil)
	defer stop()
	for _, mode := range []client.FailureMode{client.FailError, client.FailOpen, client.FailClosed} {
		t.Run(mode.String(), func(t *testing.T) {
			_, err := newClient(t, url, mode).Check(context.Background(), client.CheckRequest{SubjectFields: quota.SubjectFields{User: "1"}, Route: "no-slash"})
			var p *client.Problem
			if !errors.As(err, &p) || p.Status != 400 || len(p.Errors) != 1 || p.Errors[0].Field != "route" {
				t.Fatalf("Check(route without /) error = %v, want a 400 problem naming route", err)
			}
		})
	}
}

func TestCheckFailureModes(t *testing.T) {
	// A gateway in front of a dead daemon answers 502 without a decision.
	badGateway := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "upstream down", http.StatusBadGateway)
	}))
	defer badGateway.Close()
	// A daemon that never answers within the deadline.
	release := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer hang.Close()
	defer close(release)

	req := client.CheckRequest{SubjectFields: quota.SubjectFields{User: "1"}, Route: "/"}
	for _, server := range []struct{ name, url string }{{"refused", downURL(t)}, {"502", badGateway.URL}, {"timeout", hang.URL}} {
		for _, tc := range []struct {
			mode    client.FailureMode
			allowed bool
			status  int
			retry   string
		}{
			{client.FailOpen, true, 200, ""},
			{client.FailClosed, false, 503, "1"},
		} {
			t.Run(server.name+"/"+tc.mode.String(), func(t *testing.T) {
				c, err := client.New(client.Config{Server: server.url, OnFailure: tc.mode, Timeout: 200 * time.Millisecond})
				if err != nil {
					t.Fatal(err)
				}
				d, err := c.Check(context.Background(), req)
				if err != nil {
					t.Fatalf("Check = %v, want a fallback decision", err)
				}
				if !d.Fallback || d.Allowed != tc.allowed || d.Status != tc.status || d.Header.Get("Retry-After") != tc.retry || !errors.Is(d.Err, client.ErrUnavailable) {
					t.Errorf("Check = fallback %v allowed %v status %d Retry-After %q err %v, want true %v %d %q ErrUnavailable",
						d.Fallback, d.Allowed, d.Status, d.Header.Get("Retry-After"), d.Err, tc.allowed, tc.status, tc.retry)
				}
			})
		}
		t.Run(server.name+"/error", func(t *testing.T) {
			c, err := client.New(client.Config{Server: server.url, Timeout: 200 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			d, err := c.Check(context.Background(), req)
			if !errors.Is(err, client.ErrUnavailable) || d != nil {
				t.Errorf("Check = %v, %v; want nil and an ErrUnavailable", d, err)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  client.Config
		want string
	}{
		{client.Config{}, "server: required"},
		{client.Config{Server: "ftp://x"}, "server: want a URL"},
		{client.Config{Server: "127.0.0.1:8080", Timeout: -1}, "timeout"},
		{client.Config{Server: "127.0.0.1:8080", OnFailure: 7}, "on failure"},
		{client.Config{Server: "127.0.0.1:8080", Token: "a\nb"}, "token"},
		{client.Config{Server: "127.0.0.1:8080"}, ""},
	} {
		err := tc.cfg.Validate()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("Validate(%+v) = %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

func TestAdminCalls(t *testing.T) {
	url, stop := daemontest.Start([]quota.Policy{daemontest.Policy("burst", 1, 10)})
	defer stop()
	c := newClient(t, url, client.FailError)
	ctx := context.Background()

	ps, err := c.Policies(ctx, "")
	if err != nil || len(ps) != 1 || ps[0].ID != "burst" {
		t.Fatalf("Policies = %+v, %v", ps, err)
	}
	v1 := ps[0].Version
	p, err := c.PutPolicy(ctx, "burst", json.RawMessage(`{"algorithm":"token_bucket","rate_per_sec":1,"burst":20,"mode":"enforce"}`), &v1)
	if err != nil || p.Version != v1+1 || p.Burst != 20 {
		t.Fatalf("PutPolicy = %+v, %v", p, err)
	}
	_, err = c.PutPolicy(ctx, "burst", json.RawMessage(`{"algorithm":"token_bucket","rate_per_sec":1,"burst":0}`), nil)
	var prob *client.Problem
	if !errors.As(err, &prob) || prob.Status != 400 || prob.Errors[0].Field != "burst" {
		t.Fatalf("PutPolicy(burst 0) = %v, want a 400 naming burst", err)
	}
	p, err = c.RollbackPolicyTo(ctx, "burst", v1)
	if err != nil || p.Burst != 10 || p.Version != v1+2 {
		t.Fatalf("RollbackPolicyTo(%d) = %+v, %v", v1, p, err)
	}
	vs, err := c.PolicyVersions(ctx, "burst")
	if cur, ok := vs.Current(); err != nil || !ok || cur.Burst != 10 || len(vs.Versions) != 3 {
		t.Fatalf("PolicyVersions = %+v, %v", vs, err)
	}

	o, err := c.PutOverride(ctx, quota.Override{ID: "vip", Subject: "user:7", Policy: "burst", Burst: 50, ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil || o.ID != "vip" {
		t.Fatalf("PutOverride = %+v, %v", o, err)
	}
	if os, err := c.Overrides(ctx); err != nil || len(os) != 1 || os[0].Burst != 50 {
		t.Fatalf("Overrides = %+v, %v", os, err)
	}
	if err := c.DeleteOverride(ctx, "vip"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteOverride(ctx, "vip"); !errors.As(err, &prob) || prob.Status != 404 {
		t.Fatalf("DeleteOverride(deleted) = %v, want 404", err)
	}

	k, err := c.PutKey(ctx, "sk_live_abc", "pro")
	if err != nil || k.Tier != "pro" || !strings.HasPrefix(k.Subject, "key:") {
		t.Fatalf("PutKey = %+v, %v", k, err)
	}
	u, err := c.Usage(ctx, k.Subject, client.UsageQuery{})
	if err != nil || u.Tier != "pro" || len(u.Policies) != 1 || u.Policies[0].Remaining != 10 {
		t.Fatalf("Usage = %+v, %v", u, err)
	}
	if err := c.DeleteKey(ctx, "sk_live_abc"); err != nil {
		t.Fatal(err)
	}
	r, err := c.Regions(ctx)
	if err != nil || r.MultiRegion {
		t.Fatalf("Regions = %+v, %v", r, err)
	}

	wrong, err := client.New(client.Config{Server: url, Token: "wrong"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wrong.Policies(ctx, ""); !errors.As(err, &prob) || prob.Status != 403 {
		t.Fatalf("Policies with a wrong token = %v, want 403", err)
	}
	if _, err := newClient(t, downURL(t), client.FailOpen).Policies(ctx, ""); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("Policies on a closed port = %v, want ErrUnavailable", err)
	}
}

// TestWireTypesMatchDaemon keeps the client's own wire types, which add
// client-side fields to the daemon's (the admin bodies are adminapi's and
// the check types decide's, shared rather than mirrored), equal in JSON
// fields to the daemon's.
func TestWireTypesMatchDaemon(t *testing.T) {
	for _, tc := range []struct{ client, daemon any }{
		{client.Decision{}, region.Decision{}},
		{client.BatchItem{}, region.BatchItem{}},
	} {
		got, want := jsonFields(reflect.TypeOf(tc.client)), jsonFields(reflect.TypeOf(tc.daemon))
		if !slices.Equal(got, want) {
			t.Errorf("%T has JSON fields %v, %T has %v", tc.client, got, tc.daemon, want)
		}
	}
}

func jsonFields(t reflect.Type) []string {
	var out []string
	for f := range t.Fields() {
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case tag == "-" || !f.IsExported() && !f.Anonymous:
		case f.Anonymous && tag == "":
			out = append(out, jsonFields(f.Type)...)
		case tag == "":
			out = append(out, f.Name)
		default:
			out = append(out, tag)
		}
	}
	sort.Strings(out)
	return out
}
