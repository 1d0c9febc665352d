package rls

import (
	"context"
	"strconv"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/sluice-rl/sluice/quota"
)

// TestTransport drives a connection whose first call is ShouldRateLimit,
// which the service's own transport then serves: rate limit calls, large
// ones over several frames among them, health checks, and nothing else.
func TestTransport(t *testing.T) {
	conn := startRLS(t, []quota.Policy{
		{ID: "p", Mode: quota.ModeEnforce, Algorithm: "fixed_window", Count: 2, Window: 60, Match: quota.Match{Domain: "d", Descriptors: []quota.DescriptorEntry{{Key: "k"}}}},
	})
	c := rlsv3.NewRateLimitServiceClient(conn)
	for i, want := range []string{"OK OK", "OK OK", "OVER_LIMIT OVER_LIMIT"} {
		if r := ask(t, c, call{domain: "d", ds: []*rlv3.RateLimitDescriptor{desc("k", "v")}}); codesOf(r) != want {
			t.Errorf("call %d = %s, want %s", i+1, codesOf(r), want)
		}
	}
	// 8 descriptors of 8 entries of 1 KiB: a message over the default
	// stream window of 64 KiB, in many DATA frames.
	big := make([]*rlv3.RateLimitDescriptor, MaxDescriptors)
	for i := range big {
		var kv []string
		for j := range quota.MaxDescriptorEntries {
			kv = append(kv, "k"+strconv.Itoa(j), strings.Repeat("v", quota.MaxDescriptorValueBytes))
		}
		big[i] = desc(kv...)
	}
	if r := ask(t, c, call{domain: "d", ds: big}); r.OverallCode != rlsv3.RateLimitResponse_OK || len(r.Statuses) != len(big) {
		t.Errorf("a large request = %s, want OK with %d statuses", codesOf(r), len(big))
	}
	_, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d"})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("no descriptors = %v, want INVALID_ARGUMENT", err)
	}
	hc := healthpb.NewHealthClient(conn)
	for _, svc := range []string{"", ServiceName} {
		if h, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc}); err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health(%q) = %v, %v, want SERVING", svc, h, err)
		}
	}
	if _, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "nope"}); status.Code(err) != codes.NotFound {
		t.Errorf("health(nope) = %v, want NOT_FOUND", err)
	}
	stream, err := reflectpb.NewServerReflectionClient(conn).ServerReflectionInfo(context.Background())
	if err == nil {
		// A Send that fails has io.EOF; Recv then has the status.
		_ = stream.Send(&reflectpb.ServerReflectionRequest{MessageRequest: &reflectpb.ServerReflectionRequest_ListServices{}})
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("reflection after ShouldRateLimit on one connection = %v, want UNIMPLEMENTED", err)
	}
}

func TestParseTimeout(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want string
		ok   bool
	}{{"5S", "5s", true}, {"20m", "20ms", true}, {"99999999H", "2562047h47m16.854775807s", true}, {"1", "0s", false}, {"-1S", "0s", false}, {"1x", "0s", false}} {
		got, ok := parseTimeout(tt.in)
		if got.String() != tt.want || ok != tt.ok {
			t.Errorf("parseTimeout(%q) = %v, %v, want %s, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}
