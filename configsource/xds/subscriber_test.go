package xds

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/sluice-rl/sluice/configsource"
	"github.com/sluice-rl/sluice/internal/testwait"
	"github.com/sluice-rl/sluice/quota"
)

// inForce is the bound within which a pushed configuration must be in
// force.
const inForce = 2 * time.Second

// controlPlane is an xDS server made of go-control-plane's own server and
// snapshot cache, recording the requests it receives.
type controlPlane struct {
	t     *testing.T
	cache cachev3.SnapshotCache
	addr  string
	srv   *grpc.Server

	mu   sync.Mutex
	reqs []*discovery.DiscoveryRequest
}

func startControlPlane(t *testing.T, addr string) *controlPlane {
	t.Helper()
	cp := &controlPlane{t: t, cache: cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)}
	cp.serve(addr)
	return cp
}

// serve (re)starts the server on addr ("127.0.0.1:0": any port).
func (cp *controlPlane) serve(addr string) {
	cp.t.Helper()
	var ln net.Listener
	var err error
	testwait.For(cp.t, 10*time.Second, "listening on "+addr, func() bool {
		ln, err = net.Listen("tcp", addr)
		return err == nil
	})
	cp.addr = ln.Addr().String()
	cb := serverv3.CallbackFuncs{StreamRequestFunc: func(_ int64, r *discovery.DiscoveryRequest) error {
		cp.mu.Lock()
		cp.reqs = append(cp.reqs, r)
		cp.mu.Unlock()
		return nil
	}}
	xs := serverv3.NewServer(cp.t.Context(), cp.cache, cb)
	cp.srv = grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(cp.srv, xs)
	go cp.srv.Serve(ln)
	cp.t.Cleanup(cp.srv.Stop)
}

// push sets the snapshot of node "default" to configs at version.
func (cp *controlPlane) push(version string, configs ...*rlconf.RateLimitConfig) {
	cp.t.Helper()
	res := make([]types.Resource, len(configs))
	for i, c := range configs {
		res[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: res})
	if err != nil {
		cp.t.Fatal(err)
	}
	if err := cp.cache.SetSnapshot(cp.t.Context(), "default", snap); err != nil {
		cp.t.Fatal(err)
	}
}

// answered returns the last request answering the response of version
// (an ACK carries it; a NACK carries the version before and an error).
func (cp *controlPlane) requests() []*discovery.DiscoveryRequest {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return append([]*discovery.DiscoveryRequest(nil), cp.reqs...)
}

func svc(name string, limits ...any) *rlconf.RateLimitConfig {
	c := &rlconf.RateLimitConfig{Name: name, Domain: "svc"}
	for i := 0; i+2 < len(limits); i += 3 {
		c.Descriptors = append(c.Descriptors, &rlconf.RateLimitDescriptor{Key: "k", Value: limits[i].(string),
			RateLimit: &rlconf.RateLimitPolicy{Unit: limits[i+1].(rlconf.RateLimitUnit), RequestsPerUnit: uint32(limits[i+2].(int))}})
	}
	return c
}

// syncBuffer is a log destination safe for the subscriber's goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestSubscriber runs a Subscriber against go-control-plane's server: a
// pushed configuration is in force within 2 s, a removal removes, a
// resource that does not validate is NACKed with the field named while
// the last good configuration stays, a policy of the admin API is left
// alone, and the server going away keeps the last configuration until it
// is back.
func TestSubscriber(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	cp := startControlPlane(t, "127.0.0.1:0")
	reg := quota.NewRegistry(quota.RegistryConfig{})
	admin := quota.Policy{ID: "admin-c", Match: quota.Match{Domain: "svc", Descriptors: []quota.DescriptorEntry{{Key: "k", Value: "c"}}},
		Algorithm: "fixed_window", Count: 7, Window: 60, Mode: quota.ModeEnforce}
	if _, err := reg.Put(ctx, "admin", admin, nil); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	cfg := DefaultConfig(cp.addr)
	cfg.MinBackoff, cfg.MaxBackoff = 50*time.Millisecond, 200*time.Millisecond
	s, err := New(cfg, configsource.NewApplier(reg), configsource.NewReporter(log, nil), log)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()

	limits := func() string {
		var out []string
		for _, p := range reg.List("") {
			out = append(out, fmt.Sprintf("%s=%v", p.ID, p.Count))
		}
		return strings.Join(out, " ")
	}
	waitFor := func(what, want string) {
		t.Helper()
		testwait.For(t, inForce, what+": policies "+want, func() bool { return limits() == want })
	}

	cp.push("1", svc("svc-a", "a", rlconf.RateLimitUnit_MINUTE, 10, "b", rlconf.RateLimitUnit_SECOND, 5))
	waitFor("the pushed configuration in force", "admin-c=7 svc.k_a=10 svc.k_b=5")

	cp.push("2", svc("svc-a", "a", rlconf.RateLimitUnit_MINUTE, 20))
	waitFor("a descriptor removed", "admin-c=7 svc.k_a=20")

	cp.push("3", svc("svc-a", "a", rlconf.RateLimitUnit_UNKNOWN, 30))
	var nack *discovery.DiscoveryRequest
	testwait.For(t, 10*time.Second, "the NACK of version 3", func() bool {
		for _, r := range cp.requests() {
			if r.ErrorDetail != nil && r.ResponseNonce != "" {
				nack = r
				return true
			}
		}
		return false
	})
	if nack.VersionInfo != "2" || !strings.Contains(nack.ErrorDetail.Message, "svc-a: descriptors[0].rate_limit.unit: required") {
		t.Errorf("NACK = version %q, %q; want version 2 and the resource and field named", nack.VersionInfo, nack.ErrorDetail.Message)
	}
	if got := limits(); got != "admin-c=7 svc.k_a=20" {
		t.Errorf("after an invalid resource, policies %s, want the last good", got)
	}
	var line map[string]any
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "configuration refused") {
			if err := json.Unmarshal([]byte(l), &line); err != nil {
				t.Fatal(err)
			}
		}
	}
	if line["file"] != "svc-a" || line["field"] != "descriptors[0].rate_limit.unit" || line["source"] != "xds" {
		t.Errorf("refusal logged as %v, want file svc-a, field descriptors[0].rate_limit.unit, source xds", line)
	}

	cp.push("4", svc("svc-a", "a", rlconf.RateLimitUnit_MINUTE, 40), &rlconf.RateLimitConfig{Name: "edge", Domain: "edge",
		Descriptors: []*rlconf.RateLimitDescriptor{{Key: "ip", RateLimit: &rlconf.RateLimitPolicy{Unit: rlconf.RateLimitUnit_HOUR, RequestsPerUnit: 3}}}})
	waitFor("a second resource", "admin-c=7 edge.ip=3 svc.k_a=40")

	addr := cp.addr
	cp.srv.Stop()
	testwait.For(t, 10*time.Second, "the stream's end logged", func() bool { return strings.Contains(logs.String(), "xds stream ended") })
	if got := limits(); got != "admin-c=7 edge.ip=3 svc.k_a=40" {
		t.Errorf("with the server gone, policies %s, want the last configuration", got)
	}
	cp.push("5", svc("svc-a", "a", rlconf.RateLimitUnit_MINUTE, 50))
	cp.serve(addr)
	waitFor("the configuration of the server back", "admin-c=7 svc.k_a=50")

	cp.push("6")
	waitFor("every resource removed", "admin-c=7")
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v", err)
	}
}
