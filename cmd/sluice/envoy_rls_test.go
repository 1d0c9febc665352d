package main

import (
	"context"
	"encoding/json"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sluice-rl/sluice/internal/testwait"
	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/rls"
)

// TestEnvoyRateLimitConfigStructure checks deploy/envoy/envoy-ratelimit.yaml
// without an Envoy binary: the ratelimit filter before the router asks the
// gRPC cluster at the prescribed --rls-listen address over HTTP/2, fails
// open, names the domain of deploy/envoy/ratelimit.yaml, and every
// descriptor the route's actions build is limited by that file as Sluice
// loads it. Envoy's own schema (protobuf) is not checked.
func TestEnvoyRateLimitConfigStructure(t *testing.T) {
	const name = "../../deploy/envoy/envoy-ratelimit.yaml"
	raw, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	var root map[string]any
	if err := yaml.Unmarshal(raw, &root); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	hcm := yamlAt(t, root, "static_resources", "listeners", 0, "filter_chains", 0, "filters", 0, "typed_config")
	if got := yamlAt(t, hcm, "use_remote_address"); got != true {
		t.Errorf("use_remote_address = %v, want true (remote_address is then the socket peer)", got)
	}
	filters, _ := yamlAt(t, hcm, "http_filters").([]any)
	rl, router := -1, -1
	for i, f := range filters {
		switch yamlAt(t, f, "name") {
		case "envoy.filters.http.ratelimit":
			rl = i
		case "envoy.filters.http.router":
			router = i
		}
	}
	if rl < 0 || router < 0 || rl > router {
		t.Fatalf("http_filters: ratelimit at %d, router at %d; want ratelimit before router", rl, router)
	}
	tc := yamlAt(t, filters[rl], "typed_config")
	if got := yamlAt(t, tc, "@type"); got != "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit" {
		t.Errorf("ratelimit @type = %v", got)
	}
	if got := yamlAt(t, tc, "failure_mode_deny"); got != false {
		t.Errorf("failure_mode_deny = %v, want false (Sluice down must not take the API down)", got)
	}
	if got := yamlAt(t, tc, "rate_limit_service", "transport_api_version"); got != "V3" {
		t.Errorf("transport_api_version = %v, want V3", got)
	}
	cluster := yamlAt(t, tc, "rate_limit_service", "grpc_service", "envoy_grpc", "cluster_name")
	found := false
	for _, c := range yamlAt(t, root, "static_resources", "clusters").([]any) {
		if yamlAt(t, c, "name") != cluster {
			continue
		}
		found = true
		sa := yamlAt(t, c, "load_assignment", "endpoints", 0, "lb_endpoints", 0, "endpoint", "address", "socket_address")
		if yamlAt(t, sa, "address") != "127.0.0.1" || yamlAt(t, sa, "port_value") != 8081 {
			t.Errorf("cluster %v is at %v, want 127.0.0.1:8081", cluster, sa)
		}
		opts := yamlAt(t, c, "typed_extension_protocol_options", "envoy.extensions.upstreams.http.v3.HttpProtocolOptions", "explicit_http_config")
		if _, ok := yamlAt(t, opts, "http2_protocol_options").(map[string]any); !ok {
			t.Errorf("cluster %v does not speak HTTP/2 (gRPC needs it)", cluster)
		}
	}
	if !found {
		t.Errorf("envoy_grpc.cluster_name %v is not among the clusters", cluster)
	}
	flags := prescribedFlags(t, name, string(raw), "127.0.0.1:8080")
	if got := flagValue(flags, "--rls-listen"); got != "127.0.0.1:8081" {
		t.Errorf("prescribed --rls-listen = %q, want the cluster's 127.0.0.1:8081", got)
	}
	if got := flagValue(flags, "--envoy-config"); got != "deploy/envoy/ratelimit.yaml" {
		t.Errorf("prescribed --envoy-config = %q, want deploy/envoy/ratelimit.yaml", got)
	}

	policies, err := rls.LoadEnvoyConfigs([]string{"../../deploy/envoy/ratelimit.yaml"}, false)
	if err != nil {
		t.Fatal(err)
	}
	domain := yamlAt(t, tc, "domain")
	reg := quota.NewRegistry(quota.RegistryConfig{})
	if err := reg.Seed(t.Context(), "test", policies); err != nil {
		t.Fatal(err)
	}
	if !reg.HasDomain(domain.(string)) {
		t.Fatalf("filter domain %v is not the domain of ratelimit.yaml", domain)
	}
	// The descriptors the route's actions build, with example values.
	route := yamlAt(t, hcm, "route_config", "virtual_hosts", 0, "routes", 0, "route")
	for i, rlim := range yamlAt(t, route, "rate_limits").([]any) {
		var entries []quota.DescriptorEntry
		for _, a := range yamlAt(t, rlim, "actions").([]any) {
			m := a.(map[string]any)
			switch {
			case m["remote_address"] != nil:
				entries = append(entries, quota.DescriptorEntry{Key: "remote_address", Value: "192.0.2.7"})
			case m["generic_key"] != nil:
				entries = append(entries, quota.DescriptorEntry{Key: "generic_key", Value: yamlAt(t, m, "generic_key", "descriptor_value").(string)})
			case m["request_headers"] != nil:
				entries = append(entries, quota.DescriptorEntry{Key: yamlAt(t, m, "request_headers", "descriptor_key").(string), Value: "/v1/orders"})
			default:
				t.Fatalf("rate_limits[%d]: action %v not understood by this test", i, slices.Collect(maps.Keys(m)))
			}
		}
		if got := reg.AppendMatchDescriptor(nil, domain.(string), entries); len(got) == 0 {
			t.Errorf("rate_limits[%d] builds %v, which no policy of ratelimit.yaml limits", i, entries)
		}
	}
}

// rlsAddr waits for the address the daemon's rate limit service logs.
func (d *daemon) rlsAddr() string {
	d.t.Helper()
	var addr string
	testwait.For(d.t, 10*time.Second, "the rate limit service's address in the log", func() bool {
		for _, line := range strings.Split(d.log(), "\n") {
			var m struct{ Msg, Addr string }
			if json.Unmarshal([]byte(line), &m) == nil && m.Msg == "rate limit service listening" {
				addr = m.Addr
				return true
			}
		}
		return false
	})
	return addr
}

// TestServeRLS runs the binary with --rls-listen and the shipped
// envoyproxy/ratelimit file, asks it over gRPC, and stops it with SIGTERM.
func TestServeRLS(t *testing.T) {
	bin := buildSluice(t)
	d := startDaemon(t, bin, "--rls-listen", "127.0.0.1:0", "--envoy-config", "../../deploy/envoy/ratelimit.yaml")
	addr := d.rlsAddr()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := t.Context()
	if h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health = %v, %v, want SERVING", h, err)
	}
	c := rlsv3.NewRateLimitServiceClient(conn)
	ip := []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "192.0.2.7"}}}}
	r, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: ip})
	if err != nil {
		t.Fatal(err)
	}
	if l := r.Statuses[0].CurrentLimit; r.OverallCode != rlsv3.RateLimitResponse_OK || l.GetRequestsPerUnit() != 600 || l.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
		t.Errorf("one hit = %v %v, want OK under 600/MINUTE", r.OverallCode, l)
	}
	r, err = c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: ip, HitsAddend: 601})
	if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("601 hits = %v, %v, want OVER_LIMIT", r, err)
	}
	if _, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("no descriptors = %v, want INVALID_ARGUMENT", err)
	}
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-d.done:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("sluice did not exit after SIGTERM")
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Errorf("rate limit service still accepting after exit")
	}
}

// TestServeMergesDomains runs the binary on a directory of two files
// that configure one domain: with --envoy-merge-domains it serves the
// descriptors of both; without, it does not start, and says why in one
// line naming the domain.
func TestServeMergesDomains(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"a.yaml": "domain: shared\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 3}\n",
		"b.yaml": "domain: shared\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 7}\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := buildSluice(t)

	// A daemon that started anyway would serve until killed.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "serve", "--listen", "127.0.0.1:0", "--rls-listen", "127.0.0.1:0", "--envoy-config", dir).CombinedOutput()
	if err == nil || !strings.Contains(string(out), `domain "shared" is also configured by`) {
		t.Errorf("without --envoy-merge-domains: %v, %s; want a failed start naming the domain", err, out)
	}

	d := startDaemon(t, bin, "--rls-listen", "127.0.0.1:0", "--envoy-config", dir, "--envoy-merge-domains")
	conn, err := grpc.NewClient(d.rlsAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := rlsv3.NewRateLimitServiceClient(conn)
	for _, tc := range []struct {
		key  string
		rpu  uint32
		unit rlsv3.RateLimitResponse_RateLimit_Unit
	}{{"user", 3, rlsv3.RateLimitResponse_RateLimit_MINUTE}, {"tenant", 7, rlsv3.RateLimitResponse_RateLimit_HOUR}} {
		r, err := c.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "shared",
			Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: tc.key, Value: "x"}}}}})
		if err != nil {
			t.Fatal(err)
		}
		if l := r.Statuses[0].CurrentLimit; r.OverallCode != rlsv3.RateLimitResponse_OK || l.GetRequestsPerUnit() != tc.rpu || l.GetUnit() != tc.unit {
			t.Errorf("%s = %v under %v, want OK under %d/%v", tc.key, r.OverallCode, l, tc.rpu, tc.unit)
		}
	}
}
