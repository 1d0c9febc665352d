package main

import (
	"net"
	"strings"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-rl/sluice/internal/testwait"
)

// TestServeXDS runs the binary with --envoy-xds-server against an xDS
// server made of go-control-plane's server and snapshot cache: what it
// pushes for the node of --envoy-xds-node-id limits ShouldRateLimit
// within 2 s, and a descriptor it removes is no longer limited.
func TestServeXDS(t *testing.T) {
	bin := buildSluice(t)
	cache := cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(srv, serverv3.NewServer(t.Context(), cache, nil))
	go srv.Serve(ln)
	defer srv.Stop()
	push := func(version string, descs ...*rlconf.RateLimitDescriptor) {
		t.Helper()
		snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{
			resource.RateLimitConfigType: {&rlconf.RateLimitConfig{Name: "gw", Domain: "gateway", Descriptors: descs}},
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := cache.SetSnapshot(t.Context(), "sluice-test", snap); err != nil {
			t.Fatal(err)
		}
	}
	limit := func(value string, rpu uint32) *rlconf.RateLimitDescriptor {
		return &rlconf.RateLimitDescriptor{Key: "path", Value: value, RateLimit: &rlconf.RateLimitPolicy{Unit: rlconf.RateLimitUnit_MINUTE, RequestsPerUnit: rpu}}
	}
	push("1", limit("/a", 11), limit("/b", 12))

	d := startDaemon(t, bin, "--rls-listen", "127.0.0.1:0", "--envoy-xds-server", ln.Addr().String(), "--envoy-xds-node-id", "sluice-test")
	conn, err := grpc.NewClient(rlsAddr(t, d), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := rlsCaller{t: t, c: rlsv3.NewRateLimitServiceClient(conn)}
	testwait.For(t, inForce+5*time.Second, "the first configuration from xDS in force", func() bool { return r.limit("gateway", "path", "/b") == 12 })
	push("2", limit("/a", 21))
	testwait.For(t, inForce, "a pushed change in force", func() bool { return r.limit("gateway", "path", "/a") == 21 })
	if got := r.limit("gateway", "path", "/b"); got != 0 {
		t.Errorf("/b, removed by the xDS server, limited to %d, want no limit", got)
	}
	if m := d.do("GET", "/metrics", "").body; !strings.Contains(m, `sluice_config_policies{source="xds"} 1`) {
		t.Errorf("metrics lack sluice_config_policies{source=\"xds\"} 1:\n%s", grepLines(m, "sluice_config_"))
	}
}
