package rls

import (
	"context"
	"net"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// BenchmarkServeLoopback is ShouldRateLimit through Serve's own transport
// on loopback, from a grpc-go client of one connection, calls in parallel
// (b.RunParallel's goroutines): the transport's framing, flow control and
// workers as well as the decision, on the memory store.
func BenchmarkServeLoopback(b *testing.B) {
	s := inProcess(b, testPolicies)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		conn.Close()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				b.Errorf("Serve: %v", err)
			}
		case <-time.After(10 * time.Second):
			b.Error("Serve did not return")
		}
	})
	c := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{desc("k", "v")}}
	if _, err := c.ShouldRateLimit(context.Background(), req); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if r, err := c.ShouldRateLimit(context.Background(), req); err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
				b.Errorf("ShouldRateLimit = %v, %v", r, err)
				return
			}
		}
	})
}
