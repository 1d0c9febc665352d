package xds

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-rl/sluice/configsource"
	"github.com/sluice-rl/sluice/quota"
)

// Config configures a Subscriber.
type Config struct {
	// Server is the xDS server's address, host:port.
	Server string
	// NodeID is the node the server keys its snapshots by; "default" as
	// envoyproxy/ratelimit's CONFIG_GRPC_XDS_NODE_ID.
	NodeID string
	// Source names the source in ownership, logs and metrics; "xds".
	Source string
	// Merge lets two resources configure one domain (MERGE_DOMAIN_CONFIG).
	Merge bool
	// MinBackoff and MaxBackoff bound the wait before reconnecting; the
	// wait doubles from MinBackoff after each failed attempt.
	MinBackoff, MaxBackoff time.Duration
	// Retry is how often a configuration the policy store failed to take
	// is applied again.
	Retry time.Duration
	// DialOptions are added to the connection's (plaintext by default).
	DialOptions []grpc.DialOption
}

// DefaultConfig subscribes as envoyproxy/ratelimit's defaults do, to
// server.
func DefaultConfig(server string) Config {
	return Config{Server: server, NodeID: "default", Source: "xds", MinBackoff: 500 * time.Millisecond, MaxBackoff: 30 * time.Second, Retry: time.Second}
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	switch {
	case c.Server == "":
		return errors.New("xds: no server address")
	case c.NodeID == "" || c.Source == "":
		return errors.New("xds: NodeID and Source are required")
	case c.MinBackoff <= 0 || c.MaxBackoff < c.MinBackoff || c.Retry <= 0:
		return errors.New("xds: MinBackoff, MaxBackoff and Retry must be positive, MaxBackoff at least MinBackoff")
	}
	return nil
}

// Subscriber keeps the rate limit configuration an xDS server serves in
// force.
type Subscriber struct {
	cfg    Config
	apply  *configsource.Applier
	report *configsource.Reporter
	log    *slog.Logger
	conn   *grpc.ClientConn
	// version is the version last accepted, sent back with a NACK.
	version string
	// pending is a configuration accepted but not yet in force, the
	// policy store having failed; nil when none.
	pending []quota.Policy
	hasPend bool
}

// New returns a Subscriber of cfg putting what the server sends in force
// through a. It does not connect; Run does.
func New(cfg Config, a *configsource.Applier, r *configsource.Reporter, log *slog.Logger) (*Subscriber, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, cfg.DialOptions...)
	conn, err := grpc.NewClient(cfg.Server, opts...)
	if err != nil {
		return nil, fmt.Errorf("xds server %s: %w", cfg.Server, err)
	}
	r.Start(cfg.Source, a.Owned(cfg.Source))
	return &Subscriber{cfg: cfg, apply: a, report: r, log: log, conn: conn}, nil
}

// Run subscribes until ctx is done, reconnecting with backoff when the
// stream ends; the configuration in force stays meanwhile.
func (s *Subscriber) Run(ctx context.Context) error {
	defer s.conn.Close()
	wait := s.cfg.MinBackoff
	for {
		got, err := s.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if got {
			wait = s.cfg.MinBackoff
		}
		s.log.Warn("xds stream ended: the last configuration stays in force; reconnecting", "server", s.cfg.Server, "err", err, "in", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		wait = min(2*wait, s.cfg.MaxBackoff)
	}
}

// session runs one stream: it subscribes, then handles each response
// until the stream fails. got reports whether a response arrived.
func (s *Subscriber) session(ctx context.Context) (got bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(s.conn).StreamAggregatedResources(sctx)
	if err != nil {
		return false, err
	}
	node := &corev3.Node{Id: s.cfg.NodeID}
	if err := stream.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: TypeURL, VersionInfo: s.version}); err != nil {
		return false, err
	}
	resps := make(chan *discovery.DiscoveryResponse)
	errc := make(chan error, 1)
	go func() {
		for {
			r, err := stream.Recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case resps <- r:
			case <-sctx.Done():
				return
			}
		}
	}()
	retry := time.NewTicker(s.cfg.Retry)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return got, ctx.Err()
		case err := <-errc:
			return got, err
		case r := <-resps:
			got = true
			if err := stream.Send(s.handle(ctx, r)); err != nil {
				return got, err
			}
		case <-retry.C:
			if s.hasPend {
				s.put(ctx, s.pending)
			}
		}
	}
}

// handle puts a response in force and returns its ACK, or its NACK when
// it does not validate (the last good configuration stays).
func (s *Subscriber) handle(ctx context.Context, r *discovery.DiscoveryResponse) *discovery.DiscoveryRequest {
	ack := &discovery.DiscoveryRequest{Node: &corev3.Node{Id: s.cfg.NodeID}, TypeUrl: TypeURL, ResponseNonce: r.GetNonce()}
	if r.GetTypeUrl() != TypeURL {
		ack.VersionInfo = s.version
		ack.ErrorDetail = &statuspb.Status{Code: int32(codes.InvalidArgument), Message: fmt.Sprintf("type_url %q, want %s", r.GetTypeUrl(), TypeURL)}
		s.report.Refused(s.cfg.Source, &configsource.Error{File: "version " + r.GetVersionInfo(), Field: "type_url", Reason: ack.ErrorDetail.Message})
		return ack
	}
	ps, err := Convert(r.GetResources(), s.cfg.Merge)
	if err != nil {
		s.report.Refused(s.cfg.Source, err)
	} else {
		err = s.put(ctx, ps)
	}
	if err != nil {
		ack.VersionInfo = s.version
		ack.ErrorDetail = &statuspb.Status{Code: int32(codes.InvalidArgument), Message: err.Error()}
		return ack
	}
	s.version = r.GetVersionInfo()
	ack.VersionInfo = s.version
	return ack
}

// put applies ps. It returns an error only for a configuration refused
// for what it says (the response is then NACKed); one the policy store
// failed to take is accepted and retried.
func (s *Subscriber) put(ctx context.Context, ps []quota.Policy) error {
	p, err := s.apply.Apply(ctx, s.cfg.Source, ps)
	var oe *configsource.OwnerError
	var re *configsource.RefusedError
	switch {
	case err == nil:
		s.pending, s.hasPend = nil, false
		s.report.Applied(s.cfg.Source, p, s.apply.Owned(s.cfg.Source))
		return nil
	case errors.As(err, &oe) || errors.As(err, &re):
		s.report.Refused(s.cfg.Source, err)
		return err
	default:
		s.pending, s.hasPend = ps, true
		s.report.Failed(s.cfg.Source, err)
		return nil
	}
}
