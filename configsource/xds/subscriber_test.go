package xds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testlog"

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

// requests are the requests the server has received: subscriptions,
// ACKs (the version accepted) and NACKs (the version before, an error).
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

// subscribed is a Subscriber running against a control plane, writing
// into a registry that also holds a policy of the admin API.
type subscribed struct {
	reg  *quota.Registry
	logs *testlog.Buffer
	stop func() error
}

func subscribe(t *testing.T, cp *controlPlane) *subscribed {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	reg := quota.NewRegistry(quota.RegistryConfig{})
	admin := quota.Policy{ID: "admin-c", Match: quota.Match{Domain: "svc", Descriptors: []quota.DescriptorEntry{{Key: "k", Value: "c"}}},
		Algorithm: "fixed_window", Count: 7, Window: 60, Mode: quota.ModeEnforce}
	if _, err := reg.Put(ctx, "admin", admin, nil); err != nil {
		t.Fatal(err)
	}
	logs := &testlog.Buffer{}
	log := slog.New(slog.NewJSONHandler(logs, nil))
	cfg := DefaultConfig(cp.addr)
	cfg.MinBackoff, cfg.MaxBackoff = 50*time.Millisecond, 200*time.Millisecond
	s, err := New(cfg, configsource.NewApplier(reg), configsource.NewReporter(log, nil), log)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(cancel)
	return &subscribed{reg: reg, logs: logs, stop: func() error { cancel(); return <-done }}
}

// limits lists the policies in force as id=limit.
func (s *subscribed) limits() string {
	var out []string
	for _, p := range s.reg.List("") {
		out = append(out, fmt.Sprintf("%s=%v", p.ID, p.Count))
	}
	return strings.Join(out, " ")
}

func (s *subscribed) waitFor(t *testing.T, what, want string) {
	t.Helper()
	testwait.For(t, inForce, what+": policies "+want, func() bool { return s.limits() == want })
}

// checkNACK waits for the NACK of an invalid resource and checks it, and
// the log line, name the resource and field.
func checkNACK(t *testing.T, cp *controlPlane, s *subscribed, lastGood string) {
	t.Helper()
	var nack *discovery.DiscoveryRequest
	testwait.For(t, 10*time.Second, "a NACK", func() bool {
		for _, r := range cp.requests() {
			if r.ErrorDetail != nil && r.ResponseNonce != "" {
				nack = r
				return true
			}
		}
		return false
	})
	if nack.VersionInfo != lastGood || !strings.Contains(nack.ErrorDetail.Message, "svc-a: descriptors[0].rate_limit.unit: required") {
		t.Errorf("NACK = version %q, %q; want version %s and the resource and field named", nack.VersionInfo, nack.ErrorDetail.Message, lastGood)
	}
	var line map[string]any
	for _, l := range strings.Split(s.logs.String(), "\n") {
		if strings.Contains(l, "configuration refused") {
			if err := json.Unmarshal([]byte(l), &line); err != nil {
				t.Fatal(err)
			}
		}
	}
	if line["file"] != "svc-a" || line["field"] != "descriptors[0].rate_limit.unit" || line["source"] != "xds" {
		t.Errorf("refusal logged as %v, want file svc-a, field descriptors[0].rate_limit.unit, source xds", line)
	}
}

// TestSubscriber runs a Subscriber against go-control-plane's server: a
// pushed configuration is in force within 2 s, a removal removes, a
// resource that does not validate is NACKed with the field named while
// the last good configuration stays, a policy of the admin API is left
// alone, and the server going away keeps the last configuration until it
// is back.
func TestSubscriber(t *testing.T) {
	cp := startControlPlane(t, "127.0.0.1:0")
	s := subscribe(t, cp)

	cp.push("1", svc("svc-a", "a", rlconf.RateLimitUnit_MINUTE, 10, "b", rlconf.RateLimitUnit_SECOND, 5))
	s.waitFor(t, "the pushed configuration in force", "admin-c=7 svc.k_a=10 svc.k_b=5")

	cp.push("2", svc("svc-a", "a", rlconf.RateLimitUnit_MINUTE, 20))
	s.waitFor(t, "a descriptor removed", "admin-c=7 svc.k_a=20")

	cp.push("3", svc("svc-a", "a", rlconf.RateLimitUnit_UNKNOWN, 30))
	checkNACK(t, cp, s, "2")
	if got := s.limits(); got != "admin-c=7 svc.k_a=20" {
		t.Errorf("after an invalid resource, policies %s, want the last good", got)
	}

	cp.push("4", svc("svc-a", "a", rlconf.RateLimitUnit_MINUTE, 40), &rlconf.RateLimitConfig{Name: "edge", Domain: "edge",
		Descriptors: []*rlconf.RateLimitDescriptor{{Key: "ip", RateLimit: &rlconf.RateLimitPolicy{Unit: rlconf.RateLimitUnit_HOUR, RequestsPerUnit: 3}}}})
	s.waitFor(t, "a second resource", "admin-c=7 edge.ip=3 svc.k_a=40")

	addr := cp.addr
	cp.srv.Stop()
	testwait.For(t, 10*time.Second, "the stream's end logged", func() bool { return strings.Contains(s.logs.String(), "xds stream ended") })
	if got := s.limits(); got != "admin-c=7 edge.ip=3 svc.k_a=40" {
		t.Errorf("with the server gone, policies %s, want the last configuration", got)
	}
	cp.push("5", svc("svc-a", "a", rlconf.RateLimitUnit_MINUTE, 50))
	cp.serve(addr)
	s.waitFor(t, "the configuration of the server back", "admin-c=7 svc.k_a=50")

	cp.push("6")
	s.waitFor(t, "every resource removed", "admin-c=7")
	if err := s.stop(); err != nil {
		t.Errorf("Run = %v", err)
	}
}

// flakyTarget is a registry whose first Seeds fail as a store would.
type flakyTarget struct {
	*quota.Registry
	mu    sync.Mutex
	fails int
}

func (f *flakyTarget) Seed(ctx context.Context, who string, ps []quota.Policy) error {
	f.mu.Lock()
	fail := f.fails > 0
	f.fails--
	f.mu.Unlock()
	if fail {
		return errors.New("policy store down")
	}
	return f.Registry.Seed(ctx, who, ps)
}

// TestSubscriberRetriesTheStore: a configuration the policy store fails
// to take is acknowledged (it is valid) and put in force when the store
// takes it, without the server sending it again.
func TestSubscriberRetriesTheStore(t *testing.T) {
	cp := startControlPlane(t, "127.0.0.1:0")
	ft := &flakyTarget{Registry: quota.NewRegistry(quota.RegistryConfig{}), fails: 3}
	cfg := DefaultConfig(cp.addr)
	cfg.Retry = 50 * time.Millisecond
	s, err := New(cfg, configsource.NewApplier(ft), configsource.NewReporter(nil, nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	cp.push("1", svc("svc-a", "a", rlconf.RateLimitUnit_MINUTE, 10))
	testwait.For(t, 10*time.Second, "the configuration in force once the store takes it", func() bool {
		_, ok := ft.Get("svc.k_a")
		return ok
	})
	for _, r := range cp.requests() {
		if r.ErrorDetail != nil {
			t.Errorf("a configuration the store failed to take was NACKed: %v", r.ErrorDetail)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v", err)
	}
}
