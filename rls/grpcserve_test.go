package rls

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	reflectpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	gproto "google.golang.org/protobuf/proto"

	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/region"
)

// TestTransportGRPC serves with grpc-go tuned (TransportGRPC): rate limit
// calls, health and reflection on one connection.
func TestTransportGRPC(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	rcfg := region.DefaultConfig()
	rcfg.Policies = []quota.Policy{
		{ID: "p", Mode: quota.ModeEnforce, Algorithm: "fixed_window", Count: 2, Window: 60, Match: quota.Match{Domain: "d", Descriptors: []quota.DescriptorEntry{{Key: "k"}}}},
	}
	d, err := region.New(ctx, rcfg, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Decider: d, Matcher: d.Registry(), ShutdownTimeout: 5 * time.Second, Transport: TransportGRPC})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	c := rlsv3.NewRateLimitServiceClient(conn)
	for i, want := range []string{"OK OK", "OK OK", "OVER_LIMIT OVER_LIMIT"} {
		if r := ask(t, c, call{domain: "d", ds: []*rlv3.RateLimitDescriptor{desc("k", "v")}}); codesOf(r) != want {
			t.Errorf("call %d = %s, want %s", i+1, codesOf(r), want)
		}
	}
	if h, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: ServiceName}); err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health = %v, %v, want SERVING", h, err)
	}
	stream, err := reflectpb.NewServerReflectionClient(conn).ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectpb.ServerReflectionRequest{MessageRequest: &reflectpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	if r, err := stream.Recv(); err != nil || len(r.GetListServicesResponse().GetService()) == 0 {
		t.Errorf("reflection = %v, %v, want the services", r, err)
	}
}

// rlsCodec writes a response as proto.Marshal does, and reads a request
// as decodeRequest does.
func TestRLSCodec(t *testing.T) {
	codec := rlsCodec{fallback: encoding.GetCodecV2(proto.Name)}
	s := inProcess(t, testPolicies)
	resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{desc("k", "v")}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := codec.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	want, err := gproto.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Materialize(), want) {
		t.Errorf("Marshal = %x, want %x", got.Materialize(), want)
	}
	msg := rlsMessage(t)[5:]
	var r request
	if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(msg)}, &r); err != nil || r.domain != "d" || len(r.descs) != 1 {
		t.Errorf("Unmarshal = %+v, %v, want domain d and one descriptor", r, err)
	}
}
