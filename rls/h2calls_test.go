package rls

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-rl/sluice/internal/testwait"
	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/region"
)

// testPolicies limit domain "d", descriptor key "k".
var testPolicies = []quota.Policy{{ID: "p", Mode: quota.ModeEnforce, Algorithm: "fixed_window", Count: 1e9, Window: 60, Match: quota.Match{Domain: "d", Descriptors: []quota.DescriptorEntry{{Key: "k"}}}}}

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

// heldDecider holds every decision until release is closed.
type heldDecider struct {
	Decider
	started chan struct{}
	release chan struct{}
}

func (h heldDecider) DecideStates(ctx context.Context, subject string, applied []quota.Applied) (region.StatesVerdict, error) {
	h.started <- struct{}{}
	<-h.release
	return h.Decider.DecideStates(ctx, subject, applied)
}

// TestTransportShutdown cancels Serve with a call in flight on a
// connection the transport serves: the call is answered, then Serve
// returns and the connection is gone.
func TestTransportShutdown(t *testing.T) {
	cfg := region.DefaultConfig()
	cfg.Policies = []quota.Policy{{ID: "p", Mode: quota.ModeEnforce, Algorithm: "fixed_window", Count: 10, Window: 60, Match: quota.Match{Domain: "d", Descriptors: []quota.DescriptorEntry{{Key: "k"}}}}}
	d, err := region.New(context.Background(), cfg, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	held := heldDecider{Decider: d, started: make(chan struct{}, 1), release: make(chan struct{})}
	s, err := New(Config{Decider: held, Matcher: d.Registry(), ShutdownTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	answered := make(chan error, 1)
	go func() {
		r, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(),
			&rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{desc("k", "v")}})
		if err == nil && r.OverallCode != rlsv3.RateLimitResponse_OK {
			err = fmt.Errorf("overall_code %v", r.OverallCode)
		}
		answered <- err
	}()
	<-held.started
	cancel()
	select {
	case err := <-served:
		t.Fatalf("Serve returned %v with a call in flight", err)
	case err := <-answered:
		t.Fatalf("the call in flight was answered %v before it was decided", err)
	case <-time.After(100 * time.Millisecond): // neither may happen; waiting a while checks it
	}
	close(held.release)
	if err := <-answered; err != nil {
		t.Errorf("the call in flight at shutdown = %v, want OK", err)
	}
	if err := <-served; err != nil {
		t.Errorf("Serve = %v, want nil", err)
	}
}

// rlsMessage is a gRPC message of a ShouldRateLimit request on the test
// policies, with its length prefix.
func rlsMessage(t testing.TB) []byte {
	b, err := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{desc("k", "v")}})
	if err != nil {
		t.Fatal(err)
	}
	return append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(b))), b...)
}

// TestTransportMaxConnectionAge has a grpc-go client make calls without
// pause, from several goroutines, on a service whose connections age in
// 100 ms: the transport sends each connection a GOAWAY at its age, and
// grpc-go moves to a new connection without a call failing.
func TestTransportMaxConnectionAge(t *testing.T) {
	reg := prometheus.NewRegistry()
	conn := startRLSWith(t, "memory", testPolicies, func(c *Config) {
		c.Registerer = reg
		c.MaxConnectionAge, c.MaxConnectionAgeGrace = 100*time.Millisecond, time.Minute
	})
	c := rlsv3.NewRateLimitServiceClient(conn)
	aged := func() float64 {
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if f.GetName() == "sluice_rls_connections_closed_total" && l.GetValue() == "max_age" {
						return m.GetCounter().GetValue()
					}
				}
			}
		}
		return 0
	}
	ctx, stop := context.WithCancel(context.Background())
	errs := make(chan error, 4)
	for range cap(errs) {
		go func() {
			var err error
			for ctx.Err() == nil && err == nil {
				_, err = c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{desc("k", "v")}})
			}
			errs <- err
		}()
	}
	testwait.For(t, 60*time.Second, "three connections aged out", func() bool { return aged() >= 3 })
	stop()
	for range cap(errs) {
		if err := <-errs; err != nil {
			t.Errorf("a call across the connections' ages: %v", err)
		}
	}
}
