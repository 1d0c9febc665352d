package rls

import (
	"context"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// FuzzShouldRateLimit decodes a request as gRPC would and answers it on
// the README examples' policies: never a panic, and every error is
// INVALID_ARGUMENT; an answer has one status per descriptor.
func FuzzShouldRateLimit(f *testing.F) {
	ps, err := LoadEnvoyConfigs([]string{"testdata/envoy/readme"}, false)
	if err != nil {
		f.Fatal(err)
	}
	s := inProcess(f, ps)
	for _, r := range []*rlsv3.RateLimitRequest{
		{Domain: "messaging", Descriptors: []*rlv3.RateLimitDescriptor{desc("message_type", "marketing", "to_number", "1"), desc("to_number", "1")}},
		{Domain: "example7", HitsAddend: 3, Descriptors: []*rlv3.RateLimitDescriptor{desc("key_1", "value_1", "user", "bkthomps"), desc("key_2", "value_2", "user", "bkthomps")}},
		{Domain: "edge_proxy_per_ip", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: desc("remote_address", "50.0.0.5").Entries, HitsAddend: wrapperspb.UInt64(0)}}},
		{Domain: "internal", Descriptors: []*rlv3.RateLimitDescriptor{desc("ldap", "x"), desc("ldap", "x")}},
	} {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var req rlsv3.RateLimitRequest
		if proto.Unmarshal(data, &req) != nil {
			return
		}
		resp, err := s.ShouldRateLimit(context.Background(), &req)
		if err != nil {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("ShouldRateLimit = %v, want INVALID_ARGUMENT or an answer", err)
			}
			return
		}
		if len(resp.Statuses) != len(req.Descriptors) {
			t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(req.Descriptors))
		}
	})
}
