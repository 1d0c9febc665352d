package rls

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/region"
)

// startRLS runs a daemon on the memory store with policies, and the rate
// limit service in front of it, on loopback; it returns a connection to
// the service. Both stop when the test ends.
func startRLS(t *testing.T, policies []quota.Policy) *grpc.ClientConn {
	t.Helper()
	return startRLSOn(t, "memory", policies)
}

// startRLSOn is startRLS on the given decision store.
func startRLSOn(t *testing.T, store string, policies []quota.Policy) *grpc.ClientConn {
	t.Helper()
	return startRLSWith(t, store, policies, func(*Config) {})
}

// startRLSWith is startRLSOn with the server's Config changed by opt.
func startRLSWith(t *testing.T, store string, policies []quota.Policy, opt func(*Config)) *grpc.ClientConn {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cfg := region.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.Store = store
	cfg.StoreTimeout = time.Second
	cfg.Policies = policies
	d, err := region.New(ctx, cfg, nil, nil, nil)
	if err != nil {
		t.Fatalf("region.New: %v", err)
	}
	hln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	scfg := Config{Decider: d, Matcher: d.Registry(), ShutdownTimeout: 5 * time.Second, SpreadDescriptors: strings.HasPrefix(store, "redis-cluster://")}
	opt(&scfg)
	s, err := New(scfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 2)
	go func() { done <- d.Serve(ctx, hln, nil) }()
	go func() { done <- s.Serve(ctx, gln) }()
	conn, err := grpc.NewClient(gln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				t.Errorf("serve: %v", err)
			}
		}
	})
	return conn
}

// inProcess is a Server on a daemon on the memory store with policies,
// neither listening: for calls in process.
func inProcess(tb testing.TB, policies []quota.Policy) *Server {
	tb.Helper()
	cfg := region.DefaultConfig()
	cfg.Policies = policies
	d, err := region.New(context.Background(), cfg, nil, nil, nil)
	if err != nil {
		tb.Fatal(err)
	}
	s, err := New(Config{Decider: d, Matcher: d.Registry()})
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

func desc(kv ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// freshWindow waits, if less than need is left of the current window of
// unit, for the next one to begin, so that a test's calls all fall in one
// of the fixed windows (aligned to the unit) that envoyproxy/ratelimit
// and Sluice count in. A minute guards every longer unit too: each of
// their windows begins on a minute. It waits for a time, not for a
// condition: the windows are the wall clock's.
func freshWindow(t *testing.T, unit, need time.Duration) {
	t.Helper()
	left := unit - time.Duration(time.Now().UnixNano())%unit
	if left < need {
		<-time.After(left + 5*time.Millisecond)
	}
}

type call struct {
	domain string
	ds     []*rlv3.RateLimitDescriptor
	hits   uint32
}

func ask(t *testing.T, c rlsv3.RateLimitServiceClient, in call) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: in.domain, Descriptors: in.ds, HitsAddend: in.hits})
	if err != nil {
		t.Fatalf("ShouldRateLimit(%s) = %v", in.domain, err)
	}
	return resp
}

func codesOf(r *rlsv3.RateLimitResponse) string {
	var b strings.Builder
	b.WriteString(r.OverallCode.String())
	for _, s := range r.Statuses {
		b.WriteString(" " + s.Code.String())
	}
	return b.String()
}

func header(r *rlsv3.RateLimitResponse, name string) string {
	for _, h := range r.ResponseHeadersToAdd {
		if strings.EqualFold(h.Key, name) {
			return h.Value
		}
	}
	return ""
}

// TestReadmeExamplesEnforced sends the requests envoyproxy/ratelimit's
// README describes for its examples and expects the decisions it
// documents there.
func TestReadmeExamplesEnforced(t *testing.T) {
	ps, err := LoadEnvoyConfigs([]string{"testdata/envoy/readme"}, false)
	if err != nil {
		t.Fatal(err)
	}
	c := rlsv3.NewRateLimitServiceClient(startRLS(t, ps))

	t.Run("example1 database users 500 per second, other databases unlimited", func(t *testing.T) {
		freshWindow(t, time.Second, 500*time.Millisecond)
		r := ask(t, c, call{domain: "mongo_cps", ds: []*rlv3.RateLimitDescriptor{desc("database", "users")}, hits: 500})
		if codesOf(r) != "OK OK" || r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 500 || r.Statuses[0].CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND || r.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("500 hits = %s %v, want OK with 500/SECOND and 0 remaining", codesOf(r), r.Statuses[0])
		}
		r = ask(t, c, call{domain: "mongo_cps", ds: []*rlv3.RateLimitDescriptor{desc("database", "users")}})
		if codesOf(r) != "OVER_LIMIT OVER_LIMIT" {
			t.Fatalf("501st = %s, want OVER_LIMIT", codesOf(r))
		}
		if d := r.Statuses[0].DurationUntilReset.AsDuration(); d <= 0 || d > time.Second {
			t.Errorf("duration_until_reset = %v, want the rest of the second", d)
		}
		if ra := header(r, "Retry-After"); ra != "1" {
			t.Errorf("Retry-After = %q, want 1", ra)
		}
		r = ask(t, c, call{domain: "mongo_cps", ds: []*rlv3.RateLimitDescriptor{desc("database", "orders")}})
		if codesOf(r) != "OK OK" || r.Statuses[0].CurrentLimit != nil {
			t.Errorf("database orders = %s %v, want OK without a limit", codesOf(r), r.Statuses[0])
		}
	})

	t.Run("example2 nested descriptors", func(t *testing.T) {
		freshWindow(t, time.Minute, 5*time.Second) // the windows are days
		both := []*rlv3.RateLimitDescriptor{desc("message_type", "marketing", "to_number", "2061111111"), desc("to_number", "2061111111")}
		for i := range 5 {
			if r := ask(t, c, call{domain: "messaging", ds: both}); codesOf(r) != "OK OK OK" {
				t.Fatalf("marketing message %d = %s, want OK", i+1, codesOf(r))
			}
		}
		r := ask(t, c, call{domain: "messaging", ds: both})
		if codesOf(r) != "OVER_LIMIT OVER_LIMIT OK" {
			t.Fatalf("6th marketing message = %s, want OVER_LIMIT by the marketing descriptor only", codesOf(r))
		}
		if got := r.Statuses[1].LimitRemaining; got != 95 {
			t.Errorf("to_number remaining = %d, want 95 (the rejected call spent nothing)", got)
		}
		if u := r.Statuses[0].CurrentLimit.GetUnit(); u != rlsv3.RateLimitResponse_RateLimit_DAY {
			t.Errorf("unit = %v, want DAY", u)
		}
		other := []*rlv3.RateLimitDescriptor{desc("message_type", "marketing", "to_number", "2062222222")}
		if r := ask(t, c, call{domain: "messaging", ds: other}); codesOf(r) != "OK OK" || r.Statuses[0].LimitRemaining != 4 {
			t.Errorf("another number = %s remaining %d, want OK with 4 left", codesOf(r), r.Statuses[0].LimitRemaining)
		}
		if r := ask(t, c, call{domain: "messaging", ds: []*rlv3.RateLimitDescriptor{desc("to_number", "2061111111")}}); r.Statuses[0].LimitRemaining != 94 {
			t.Errorf("to_number alone remaining = %d, want 94", r.Statuses[0].LimitRemaining)
		}
	})

	t.Run("example3 per address, one address blocked", func(t *testing.T) {
		freshWindow(t, time.Second, 500*time.Millisecond)
		for i := range 10 {
			if r := ask(t, c, call{domain: "edge_proxy_per_ip", ds: []*rlv3.RateLimitDescriptor{desc("remote_address", "50.0.0.1")}}); codesOf(r) != "OK OK" {
				t.Fatalf("call %d = %s, want OK", i+1, codesOf(r))
			}
		}
		if r := ask(t, c, call{domain: "edge_proxy_per_ip", ds: []*rlv3.RateLimitDescriptor{desc("remote_address", "50.0.0.1")}}); codesOf(r) != "OVER_LIMIT OVER_LIMIT" {
			t.Errorf("11th call = %s, want OVER_LIMIT", codesOf(r))
		}
		r := ask(t, c, call{domain: "edge_proxy_per_ip", ds: []*rlv3.RateLimitDescriptor{desc("remote_address", "50.0.0.5")}})
		if codesOf(r) != "OVER_LIMIT OVER_LIMIT" || r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 0 || header(r, "Retry-After") == "" {
			t.Errorf("blocked address = %s %v, want OVER_LIMIT with limit 0 and Retry-After", codesOf(r), r.Statuses[0])
		}
	})

	t.Run("example4 the request's depth must equal the configuration's", func(t *testing.T) {
		r := ask(t, c, call{domain: "example4", ds: []*rlv3.RateLimitDescriptor{desc("key", "value", "subkey", "subvalue")}})
		if r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 300 {
			t.Errorf("two entries = %v, want the 300/s limit", r.Statuses[0])
		}
		r = ask(t, c, call{domain: "example4", ds: []*rlv3.RateLimitDescriptor{desc("key", "value")}})
		if r.Statuses[0].CurrentLimit != nil {
			t.Errorf("one entry = %v, want no limit", r.Statuses[0])
		}
	})

	t.Run("example5 unlimited", func(t *testing.T) {
		r := ask(t, c, call{domain: "internal", ds: []*rlv3.RateLimitDescriptor{desc("ldap", "x")}, hits: 1000})
		if codesOf(r) != "OK OK" || r.Statuses[0].LimitRemaining != math.MaxUint32 {
			t.Errorf("ldap = %s %v, want OK with remaining MaxUint32", codesOf(r), r.Statuses[0])
		}
		r = ask(t, c, call{domain: "internal", ds: []*rlv3.RateLimitDescriptor{desc("azure", "x")}})
		if l := r.Statuses[0].CurrentLimit; l.GetRequestsPerUnit() != 100 || l.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
			t.Errorf("azure limit = %v, want 100/MINUTE", l)
		}
	})

	t.Run("example6 shadow mode never limits", func(t *testing.T) {
		freshWindow(t, time.Second, 500*time.Millisecond)
		userA := []*rlv3.RateLimitDescriptor{desc("service", "auth-service", "user", "user-a")}
		for i := range 15 {
			if r := ask(t, c, call{domain: "example6", ds: userA}); codesOf(r) != "OK OK" {
				t.Fatalf("user-a call %d = %s, want OK (shadow)", i+1, codesOf(r))
			}
		}
		userB := []*rlv3.RateLimitDescriptor{desc("service", "auth-service", "user", "user-b")}
		if r := ask(t, c, call{domain: "example6", ds: userB, hits: 20}); codesOf(r) != "OK OK" {
			t.Fatalf("user-b 20 hits = %s, want OK", codesOf(r))
		}
		if r := ask(t, c, call{domain: "example6", ds: userB}); codesOf(r) != "OVER_LIMIT OVER_LIMIT" {
			t.Errorf("user-b 21st = %s, want OVER_LIMIT", codesOf(r))
		}
	})

	t.Run("example7 replaces", func(t *testing.T) {
		freshWindow(t, time.Second, 500*time.Millisecond)
		both := []*rlv3.RateLimitDescriptor{desc("key_1", "value_1", "user", "bkthomps"), desc("key_2", "value_2", "user", "bkthomps")}
		for i := range 10 {
			if r := ask(t, c, call{domain: "example7", ds: both}); codesOf(r) != "OK OK OK" {
				t.Fatalf("call %d with both = %s, want OK (10/s, the 5/s limit replaced)", i+1, codesOf(r))
			}
		}
		if r := ask(t, c, call{domain: "example7", ds: both}); codesOf(r) != "OVER_LIMIT OK OVER_LIMIT" {
			t.Errorf("11th with both = %s, want OVER_LIMIT by the replacing limit", codesOf(r))
		}
		r := ask(t, c, call{domain: "example7", ds: []*rlv3.RateLimitDescriptor{desc("key_1", "value_1", "user", "bkthomps")}})
		if codesOf(r) != "OK OK" || r.Statuses[0].LimitRemaining != 4 {
			t.Errorf("key_1 alone = %s remaining %d, want OK with 4 of 5 left (the replaced limit was not touched)", codesOf(r), r.Statuses[0].LimitRemaining)
		}
	})

	t.Run("example8 and example9 values and wildcards", func(t *testing.T) {
		for _, tt := range []struct {
			domain string
			d      *rlv3.RateLimitDescriptor
			want   uint32
		}{
			{"example8", desc("key1", "unspecified_value"), 10},
			{"example8", desc("key1", "value1"), 20},
			{"example9", desc("key1", "valueXYZ"), 20},
			{"example9", desc("path", "/api/123/action"), 20},
			{"example9", desc("path", "/api/123/other"), 0},
			{"example9", desc("route", "/api/v1/resource/123/action"), 20},
		} {
			r := ask(t, c, call{domain: tt.domain, ds: []*rlv3.RateLimitDescriptor{tt.d}})
			if got := r.Statuses[0].CurrentLimit.GetRequestsPerUnit(); got != tt.want {
				t.Errorf("%s %v limit = %d, want %d", tt.domain, tt.d.Entries, got, tt.want)
			}
		}
	})

	t.Run("unknown domain is allowed", func(t *testing.T) {
		r := ask(t, c, call{domain: "nobody-configured-this", ds: []*rlv3.RateLimitDescriptor{desc("a", "b")}, hits: 1 << 20})
		if codesOf(r) != "OK OK" {
			t.Errorf("unknown domain = %s, want OK", codesOf(r))
		}
	})
}

func TestDescriptorsAllOrNothingAndHeaders(t *testing.T) {
	ps := []quota.Policy{
		{ID: "per-user", Mode: quota.ModeEnforce, Algorithm: "token_bucket", RatePerSec: 0.001, Burst: 5, Match: quota.Match{Domain: "api", Descriptors: []quota.DescriptorEntry{{Key: "user"}}}},
		{ID: "per-route", Mode: quota.ModeEnforce, Algorithm: "token_bucket", RatePerSec: 0.001, Burst: 3, Match: quota.Match{Domain: "api", Descriptors: []quota.DescriptorEntry{{Key: "route", Value: "/export"}}}},
	}
	c := rlsv3.NewRateLimitServiceClient(startRLS(t, ps))
	both := []*rlv3.RateLimitDescriptor{desc("user", "ann"), desc("route", "/export")}
	r := ask(t, c, call{domain: "api", ds: both, hits: 2})
	if codesOf(r) != "OK OK OK" || r.Statuses[0].LimitRemaining != 3 || r.Statuses[1].LimitRemaining != 1 {
		t.Fatalf("2 hits = %s %v, want OK with 3 and 1 left", codesOf(r), r.Statuses)
	}
	if got := header(r, "RateLimit-Policy"); got != `"per-user";q=5;w=5000, "per-route";q=3;w=3000` {
		t.Errorf("RateLimit-Policy = %q", got)
	}
	if got := header(r, "RateLimit"); !strings.HasPrefix(got, `"per-user";r=3;t=`) || !strings.Contains(got, `, "per-route";r=1;t=`) {
		t.Errorf("RateLimit = %q", got)
	}
	// The route has 1 left: 2 more hits are over, and the user spends
	// nothing either.
	r = ask(t, c, call{domain: "api", ds: both, hits: 2})
	if codesOf(r) != "OVER_LIMIT OK OVER_LIMIT" || header(r, "Retry-After") == "" {
		t.Fatalf("2 more hits = %s, want OVER_LIMIT by the route, with Retry-After", codesOf(r))
	}
	// A per-descriptor hits_addend of zero reads without spending.
	zero := &rlv3.RateLimitDescriptor{Entries: both[0].Entries, HitsAddend: wrapperspb.UInt64(0)}
	r = ask(t, c, call{domain: "api", ds: []*rlv3.RateLimitDescriptor{zero}})
	if codesOf(r) != "OK OK" || r.Statuses[0].LimitRemaining != 3 {
		t.Errorf("user after the rejection = %s remaining %d, want 3: nothing spent", codesOf(r), r.Statuses[0].LimitRemaining)
	}
	// Per-descriptor hits_addend overrides the request's.
	one := &rlv3.RateLimitDescriptor{Entries: both[1].Entries, HitsAddend: wrapperspb.UInt64(1)}
	r = ask(t, c, call{domain: "api", ds: []*rlv3.RateLimitDescriptor{both[0], one}, hits: 3})
	if codesOf(r) != "OK OK OK" || r.Statuses[0].LimitRemaining != 0 || r.Statuses[1].LimitRemaining != 0 {
		t.Errorf("3 user hits and 1 route hit = %s %v, want OK with 0 and 0 left", codesOf(r), r.Statuses)
	}
	// Another user has a bucket of its own.
	if r := ask(t, c, call{domain: "api", ds: []*rlv3.RateLimitDescriptor{desc("user", "bob")}}); r.Statuses[0].LimitRemaining != 4 {
		t.Errorf("bob remaining = %d, want 4", r.Statuses[0].LimitRemaining)
	}
}

// On the Redis store every descriptor state of a domain is one hash tag,
// so one script decides a request; the same descriptor sent twice in one
// request spends twice.
func TestDescriptorsOnRedis(t *testing.T) {
	srv := redistest.Start(t)
	c := rlsv3.NewRateLimitServiceClient(startRLSOn(t, "redis://"+srv.Addr(), []quota.Policy{
		{ID: "per-user", Mode: quota.ModeEnforce, Algorithm: "token_bucket", RatePerSec: 0.001, Burst: 5, Match: quota.Match{Domain: "api", Descriptors: []quota.DescriptorEntry{{Key: "user"}}}},
		{ID: "per-route", Mode: quota.ModeEnforce, Algorithm: "token_bucket", RatePerSec: 0.001, Burst: 3, Match: quota.Match{Domain: "api", Descriptors: []quota.DescriptorEntry{{Key: "route"}}}},
	}))
	twice := []*rlv3.RateLimitDescriptor{desc("user", "ann"), desc("user", "ann"), desc("route", "/x")}
	r := ask(t, c, call{domain: "api", ds: twice})
	if codesOf(r) != "OK OK OK OK" || r.Statuses[0].LimitRemaining != 3 || r.Statuses[1].LimitRemaining != 3 || r.Statuses[2].LimitRemaining != 2 {
		t.Fatalf("ann twice and a route = %s %v, want OK with 3, 3 and 2 left", codesOf(r), r.Statuses)
	}
	r = ask(t, c, call{domain: "api", ds: twice, hits: 2})
	if codesOf(r) != "OVER_LIMIT OVER_LIMIT OVER_LIMIT OK" {
		t.Fatalf("2 hits each = %s, want OVER_LIMIT by ann's 4 of 3", codesOf(r))
	}
	r = ask(t, c, call{domain: "api", ds: []*rlv3.RateLimitDescriptor{desc("route", "/x")}, hits: 2})
	if codesOf(r) != "OK OK" || r.Statuses[0].LimitRemaining != 0 {
		t.Errorf("the route after the rejection = %s remaining %d, want OK with 0 left (2 were still there)", codesOf(r), r.Statuses[0].LimitRemaining)
	}
}

func TestBadRequests(t *testing.T) {
	c := rlsv3.NewRateLimitServiceClient(startRLS(t, []quota.Policy{
		{ID: "p", Mode: quota.ModeEnforce, Algorithm: "fixed_window", Count: 10, Window: 60, Match: quota.Match{Domain: "d", Descriptors: []quota.DescriptorEntry{{Key: "k"}}}},
	}))
	many := make([]*rlv3.RateLimitDescriptor, MaxDescriptors+1)
	for i := range many {
		many[i] = desc("k", "v")
	}
	deep := desc("1", "", "2", "", "3", "", "4", "", "5", "", "6", "", "7", "", "8", "", "9", "")
	tests := []struct {
		name  string
		req   *rlsv3.RateLimitRequest
		field string
	}{
		{"empty domain", &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc("k", "v")}}, "domain: required"},
		{"no descriptors", &rlsv3.RateLimitRequest{Domain: "d"}, "descriptors: at least one"},
		{"too many descriptors", &rlsv3.RateLimitRequest{Domain: "d", Descriptors: many}, "descriptors: at most 8"},
		{"no entries", &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{{}}}, "descriptors[0].entries: at least one"},
		{"too many entries", &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{deep}}, "descriptors[0].entries: at most 8"},
		{"empty key", &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{desc("", "v")}}, "descriptors[0].entries[0].key: required"},
		{"oversized value", &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{desc("k", strings.Repeat("v", 2000))}}, "descriptors[0].entries[0].value: longer than 1024 bytes"},
		{"control character", &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{desc("k\x1f", "v")}}, "descriptors[0].entries[0].key: must not contain control characters"},
		{"huge hits_addend", &rlsv3.RateLimitRequest{Domain: "d", HitsAddend: math.MaxUint32, Descriptors: []*rlv3.RateLimitDescriptor{desc("k", "v")}}, "hits_addend: at most"},
		{"huge descriptor hits_addend", &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: desc("k", "v").Entries, HitsAddend: wrapperspb.UInt64(math.MaxUint64)}}}, "descriptors[0].hits_addend: at most"},
		{"negative hits", &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: desc("k", "v").Entries, IsNegativeHits: true}}}, "descriptors[0].is_negative_hits"},
		{"limit override", &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: desc("k", "v").Entries, Limit: &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1}}}}, "descriptors[0].limit"},
		{"limit override without unit", override(1, 0, nil), "descriptors[0].limit.unit: unknown unit 0"},
		{"limit override of an unknown unit", override(1, 99, nil), "descriptors[0].limit.unit: unknown unit 99"},
		{"limit override of zero", override(0, typev3.RateLimitUnit_SECOND, nil), "descriptors[0].limit.requests_per_unit: must be at least 1"},
		{"absurd limit override", override(math.MaxUint32, typev3.RateLimitUnit_SECOND, nil), "descriptors[0].limit.requests_per_unit: at most"},
		{"unit_multiplier 0", override(5, typev3.RateLimitUnit_SECOND, wrapperspb.UInt32(0)), "descriptors[0].limit.unit_multiplier: must be at least 1"},
		{"absurd unit_multiplier", override(5, typev3.RateLimitUnit_YEAR, wrapperspb.UInt32(100)), "descriptors[0].limit.unit_multiplier: the window"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.ShouldRateLimit(context.Background(), tt.req)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tt.field) {
				t.Errorf("ShouldRateLimit = %v, want INVALID_ARGUMENT naming %q", err, tt.field)
			}
		})
	}
	// A hits_addend above a limit is over it, not an error.
	r := ask(t, c, call{domain: "d", ds: []*rlv3.RateLimitDescriptor{desc("k", "v")}, hits: 11})
	if codesOf(r) != "OVER_LIMIT OVER_LIMIT" {
		t.Errorf("11 hits on a limit of 10 = %s, want OVER_LIMIT", codesOf(r))
	}
}

func TestHealthAndReflection(t *testing.T) {
	conn := startRLS(t, nil)
	h, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: ServiceName})
	if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health(%s) = %v, %v, want SERVING", ServiceName, h, err)
	}
	stream, err := reflectpb.NewServerReflectionClient(conn).ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectpb.ServerReflectionRequest{MessageRequest: &reflectpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	if !strings.Contains(strings.Join(names, " "), ServiceName) {
		t.Errorf("reflection lists %v, want %s among them", names, ServiceName)
	}
	stream.CloseSend()
	if _, err := stream.Recv(); err != nil && !errors.Is(err, context.Canceled) && status.Code(err) != codes.OK && err.Error() != "EOF" {
		t.Logf("reflection stream end: %v", err)
	}
}

// override is a request of one descriptor (k, v) of domain d with a limit
// override.
func override(rpu uint32, unit typev3.RateLimitUnit, mult *wrapperspb.UInt32Value) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: desc("k", "v").Entries,
		Limit: &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit, UnitMultiplier: mult}}}}
}

// A descriptor's limit override replaces the configured limit, counted
// apart from it; an unknown domain still limits nothing.
func TestLimitOverride(t *testing.T) {
	c := rlsv3.NewRateLimitServiceClient(startRLS(t, []quota.Policy{
		{ID: "p", Mode: quota.ModeEnforce, Algorithm: "fixed_window", Count: 10, Window: 3600, Match: quota.Match{Domain: "d", Descriptors: []quota.DescriptorEntry{{Key: "k"}}}},
	}))
	ctx := context.Background()
	for i, want := range []string{"OK OK 1", "OK OK 0", "OVER_LIMIT OVER_LIMIT 0"} {
		r, err := c.ShouldRateLimit(ctx, override(2, typev3.RateLimitUnit_DAY, nil))
		if err != nil {
			t.Fatal(err)
		}
		got := fmt.Sprintf("%s %d", codesOf(r), r.Statuses[0].LimitRemaining)
		if got != want {
			t.Errorf("override call %d = %s, want %s", i, got, want)
		}
		if l := r.Statuses[0].CurrentLimit; l.GetRequestsPerUnit() != 2 || l.GetUnit() != rlsv3.RateLimitResponse_RateLimit_DAY {
			t.Errorf("override call %d current_limit = %v, want 2 per DAY", i, l)
		}
	}
	// The configured limit counted none of them.
	if r := ask(t, c, call{domain: "d", ds: []*rlv3.RateLimitDescriptor{desc("k", "v")}}); r.Statuses[0].LimitRemaining != 9 {
		t.Errorf("configured limit after the overrides: remaining %d, want 9", r.Statuses[0].LimitRemaining)
	}
	// unit_multiplier 2 of MINUTE: a window of two minutes.
	r, err := c.ShouldRateLimit(ctx, override(7, typev3.RateLimitUnit_MINUTE, wrapperspb.UInt32(2)))
	if err != nil || codesOf(r) != "OK OK" || r.Statuses[0].LimitRemaining != 6 {
		t.Errorf("override with unit_multiplier = %v %v, want OK with 6 left", r, err)
	}
	unknown := override(1, typev3.RateLimitUnit_SECOND, nil)
	unknown.Domain = "nobody"
	for range 3 {
		if r, err := c.ShouldRateLimit(ctx, unknown); err != nil || codesOf(r) != "OK OK" {
			t.Fatalf("override on an unknown domain = %v %v, want OK", r, err)
		}
	}
}

// Headers: both sends draft-11's fields and envoyproxy/ratelimit's of the
// descriptor with the least remaining; a bad name is refused.
func TestHeaderStyles(t *testing.T) {
	c := rlsv3.NewRateLimitServiceClient(startRLSWith(t, "memory", []quota.Policy{
		{ID: "wide", Mode: quota.ModeEnforce, Algorithm: "fixed_window", Count: 10, Window: 3600, Match: quota.Match{Domain: "d", Descriptors: []quota.DescriptorEntry{{Key: "a"}}}},
		{ID: "tight", Mode: quota.ModeEnforce, Algorithm: "fixed_window", Count: 3, Window: 3600, Match: quota.Match{Domain: "d", Descriptors: []quota.DescriptorEntry{{Key: "b"}}}},
	}, func(c *Config) { c.Headers = HeadersBoth }))
	r := ask(t, c, call{domain: "d", ds: []*rlv3.RateLimitDescriptor{desc("a", "1"), desc("b", "1")}})
	if header(r, "RateLimit-Policy") == "" || header(r, "RateLimit-Limit") != "3" || header(r, "RateLimit-Remaining") != "2" || header(r, "RateLimit-Reset") == "" {
		t.Errorf("headers = %v, want draft-11's and RateLimit-Limit 3, -Remaining 2, -Reset", r.ResponseHeadersToAdd)
	}
	if _, err := ParseHeaderStyle("x-ratelimit"); err == nil {
		t.Error("ParseHeaderStyle(x-ratelimit) = nil error")
	}
}

// TestDegradedAnswerSaysSo asks with Redis down and with it up: an answer
// the store did not decide carries X-Sluice-Degraded: true in
// request_headers_to_add, as the HTTP answers carry it, and never in the
// headers meant for the client; one the store decided carries neither.
func TestDegradedAnswerSaysSo(t *testing.T) {
	policies := []quota.Policy{{ID: "per-user", Mode: quota.ModeEnforce, Algorithm: "fixed_window", Count: 100, Window: 60,
		OnStoreFailure: "open", Match: quota.Match{Domain: "api", Descriptors: []quota.DescriptorEntry{{Key: "user"}}}}}
	has := func(hs []*corev3.HeaderValue) bool {
		for _, h := range hs {
			if h.Key == "X-Sluice-Degraded" && h.Value == "true" {
				return true
			}
		}
		return false
	}
	up := redistest.Start(t)
	down := redistest.Start(t)
	down.Kill() // the port is ours, with nothing listening on it
	for _, tc := range []struct {
		name     string
		store    string
		degraded bool
	}{
		{"store up", "redis://" + up.Addr(), false},
		{"store down", "redis://" + down.Addr(), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := rlsv3.NewRateLimitServiceClient(startRLSOn(t, tc.store, policies))
			r := ask(t, c, call{domain: "api", ds: []*rlv3.RateLimitDescriptor{desc("user", "u1")}})
			if r.OverallCode != rlsv3.RateLimitResponse_OK {
				t.Fatalf("answer = %v, want OK (a fail-open policy)", r.OverallCode)
			}
			if got := has(r.RequestHeadersToAdd); got != tc.degraded {
				t.Errorf("request_headers_to_add %v: degraded %v, want %v", r.RequestHeadersToAdd, got, tc.degraded)
			}
			if has(r.ResponseHeadersToAdd) {
				t.Errorf("response_headers_to_add %v says degraded to the client", r.ResponseHeadersToAdd)
			}
		})
	}
}

// Without SpreadDescriptors a request's descriptors are still decided in
// one call, but each descriptor's states have a place of their own: on a
// single Redis server 200 users and one route make 201 hash tags, none of
// them the domain's, and a request over one descriptor's limit spends
// nothing in the others' tags (TestDescriptorsOnRedis).
func TestDescriptorStatesPlacedApartOnRedis(t *testing.T) {
	srv := redistest.Start(t)
	c := rlsv3.NewRateLimitServiceClient(startRLSOn(t, "redis://"+srv.Addr(), []quota.Policy{
		{ID: "per-user", Mode: quota.ModeEnforce, Algorithm: "fixed_window", Count: 10, Window: 60, Match: quota.Match{Domain: "api", Descriptors: []quota.DescriptorEntry{{Key: "user"}}}},
		{ID: "per-route", Mode: quota.ModeEnforce, Algorithm: "fixed_window", Count: 1000, Window: 60, Match: quota.Match{Domain: "api", Descriptors: []quota.DescriptorEntry{{Key: "route"}}}},
	}))
	const users = 200
	for i := range users {
		r := ask(t, c, call{domain: "api", ds: []*rlv3.RateLimitDescriptor{desc("user", fmt.Sprintf("u%03d", i)), desc("route", "/x")}})
		if codesOf(r) != "OK OK OK" {
			t.Fatalf("u%03d = %s, want OK", i, codesOf(r))
		}
	}
	keys, err := srv.Client(t).Keys(context.Background(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	tags := map[string]int{}
	for _, k := range keys {
		open, close := strings.IndexByte(k, '{'), strings.IndexByte(k, '}')
		if open < 0 || close < open || !strings.HasPrefix(k[open+1:], "rls:") {
			continue // not a descriptor state (the policy store's)
		}
		tags[k[open+1:close]]++
	}
	if len(tags) != users+1 {
		t.Errorf("%d hash tags over %d keys, want %d: one per descriptor", len(tags), len(keys), users+1)
	}
	if n := tags[subjectOf("api")]; n != 0 {
		t.Errorf("%d states under the domain's own tag, want none", n)
	}
}

// A descriptor's place depends on its entries alone, the same in every
// daemon and release (its states in Redis are found by it after a
// restart), and distinct entries rarely share one.
func TestPlaceOf(t *testing.T) {
	e := func(kv ...string) []quota.DescriptorEntry {
		var out []quota.DescriptorEntry
		for i := 0; i+1 < len(kv); i += 2 {
			out = append(out, quota.DescriptorEntry{Key: kv[i], Value: kv[i+1]})
		}
		return out
	}
	// FNV-1a of "user" 0x1e "ann" 0x1f, computed apart: a change here
	// moves every state an upgraded daemon looks for.
	if got, want := placeOf("api", e("user", "ann")), "rls:api:"+strconv.FormatUint(fnv1a("user\x1eann\x1f"), 16); got != want {
		t.Errorf("placeOf(api, user=ann) = %q, want %q", got, want)
	}
	for _, tt := range []struct{ a, b []quota.DescriptorEntry }{
		{e("user", "ann"), e("user", "bob")},
		{e("user", "ann"), e("use", "rann")},
		{e("a", "b", "c", "d"), e("a", "bc", "d", "")},
		{e("a", "b", "c", "d"), e("c", "d", "a", "b")},
	} {
		if placeOf("api", tt.a) == placeOf("api", tt.b) {
			t.Errorf("%v and %v share a place", tt.a, tt.b)
		}
	}
	if placeOf("api", e("user", "ann")) == placeOf("web", e("user", "ann")) {
		t.Error("two domains share a place")
	}
	seen := map[string]bool{}
	for i := range 100000 {
		seen[placeOf("api", e("user", strconv.Itoa(i)))] = true
	}
	if len(seen) != 100000 {
		t.Errorf("100000 users in %d places", len(seen))
	}
}

// fnv1a is hash/fnv's 64-bit FNV-1a of s.
func fnv1a(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}
