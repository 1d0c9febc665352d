// Package rls serves Envoy's rate limit service,
// envoy.service.ratelimit.v3.RateLimitService, over gRPC from the daemon's
// policies (descriptor policies, see quota.Match) and engine, and loads
// envoyproxy/ratelimit configuration files into such policies
// (LoadEnvoyConfigs).
//
// A request's descriptors are matched one by one, as envoyproxy/ratelimit
// matches them. By default a request's descriptors are decided together
// in one all-or-nothing engine call of the domain's subject: either every
// limited descriptor spends its hits or none does, unless its policies
// count hits over the limit (overlimit.go), as envoyproxy/ratelimit does;
// each descriptor's states still live in a place of their own (placeOf), so
// a domain spreads over the memory store's shards and Redis hash tags.
// With Config.SpreadDescriptors, for a store whose one call reaches one
// subject (a Redis Cluster), each descriptor's states have a subject of
// their own (the domain and the descriptor's entries) and a request whose
// descriptors have different subjects is decided descriptor by descriptor,
// as envoyproxy/ratelimit decides it (see decideSpread).
//
// Serve answers a proxy's connections (those whose first call is
// ShouldRateLimit) with a small HTTP/2 transport of its own
// (rls/internal/h2serve, its calls answered in h2calls.go), and every
// other connection with grpc-go, which also serves health checking and
// server reflection.
package rls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-rl/sluice/decide"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/rls/internal/h2serve"
)

// Bounds on a request, beyond those of quota on descriptors.
const (
	// MaxDescriptors is the most descriptors one request may carry: each
	// limited one is at least one engine check, and one engine call
	// decides at most engine.MaxChecks.
	MaxDescriptors = engine.MaxChecks
	// MaxHitsAddend bounds hits_addend, of the request or of a descriptor.
	MaxHitsAddend = 1_000_000_000
)

// ServiceName is the gRPC service this package serves; health checking
// answers for it and for "".
const ServiceName = "envoy.service.ratelimit.v3.RateLimitService"

// Decider decides matched policies in one all-or-nothing call;
// *decide.Decider is one.
type Decider interface {
	DecideStates(ctx context.Context, subject string, applied []quota.Applied) (decide.StatesVerdict, error)
}

// Matcher finds the descriptor policies that apply; *quota.Registry is one.
type Matcher interface {
	HasDomain(domain string) bool
	AppendMatchDescriptor(dst []quota.DescriptorMatch, domain string, entries []quota.DescriptorEntry) []quota.DescriptorMatch
}

// Clock tells the time; nil is real time. Only policies that deny all are
// answered from it (their reset is the end of the window); every other
// figure comes from the engine.
type Clock interface{ Now() time.Time }

// Config configures a Server.
type Config struct {
	Decider Decider
	Matcher Matcher
	Logger  *slog.Logger
	// Registerer receives sluice_rls_requests_total and the own
	// transport's series (h2serve); nil registers nothing.
	Registerer prometheus.Registerer
	Clock      Clock
	// ShutdownTimeout bounds how long in-flight calls may take to finish
	// once Serve's context is cancelled; zero is 30 s.
	ShutdownTimeout time.Duration
	// StreamWorkers is how many goroutines are kept to run calls; zero is
	// DefaultStreamWorkers. A call on a new goroutine starts on a small
	// stack that the decision path outgrows, and growing it copies the
	// stack on every call; a kept goroutine has grown it once. Calls
	// beyond the workers each get a new goroutine, as without them.
	StreamWorkers int
	// ConnectionTimeout bounds how long a new connection may take to send
	// the client preface and its first SETTINGS frame, and how long a
	// header block may take from its HEADERS frame to its last
	// CONTINUATION; zero is 120 s, grpc-go's default. grpc-go applies
	// it to the preface (grpc.ConnectionTimeout).
	ConnectionTimeout time.Duration
	// KeepaliveTime is how long a connection may send nothing before the
	// server pings it, and KeepaliveTimeout how long the ping may then
	// go unanswered (nothing read) before the connection is closed; it
	// is also how long one write of answers may block on a peer that
	// reads nothing. Zero is grpc-go's default, 2 h and 20 s; both
	// servers apply them (grpc.KeepaliveParams).
	KeepaliveTime    time.Duration
	KeepaliveTimeout time.Duration
	// MaxConnections bounds the connections served at once on
	// TransportH2 (those handed to grpc-go included); a connection past
	// it is closed as soon as it is accepted, counted in
	// sluice_rls_connections_refused_total. Zero is
	// DefaultMaxConnections, 10 000.
	MaxConnections int
	// MaxConnectionsPerAddress bounds the connections served at once
	// from one peer IP address on TransportH2 (those handed to grpc-go
	// included); a connection past it is closed as soon as it is
	// accepted, counted in
	// sluice_rls_connections_refused_total{reason="max_connections_per_address"}.
	// Zero is DefaultMaxConnectionsPerAddress, 1 000; negative is no
	// bound per address.
	MaxConnectionsPerAddress int
	// MaxConnectionAge, when positive, is how long a connection is served
	// before it is sent a GOAWAY, jittered by ±10%: its calls in flight
	// are answered, new calls go to a new connection, so that clients
	// rebalance onto servers added since they connected. Zero is no age.
	// MaxConnectionAgeGrace, when positive, is how long after that a
	// connection is closed with calls still in flight; zero waits for
	// them. Both transports apply them, as grpc-go's
	// keepalive.ServerParameters (envoyproxy/ratelimit's
	// GRPC_MAX_CONNECTION_AGE and GRPC_MAX_CONNECTION_AGE_GRACE).
	MaxConnectionAge      time.Duration
	MaxConnectionAgeGrace time.Duration
	// WriteTimeout bounds one write of answers on TransportH2: a peer
	// that takes in nothing for this long (or KeepaliveTimeout, if
	// shorter) is closed, counted in
	// sluice_rls_connections_closed_total{reason="write_timeout"}, and
	// the worker that wrote is free. Zero is DefaultWriteTimeout, 10 s.
	WriteTimeout time.Duration
	// Transport is how connections are served; zero is TransportH2.
	Transport Transport
	// SpreadDescriptors gives each descriptor's states a subject of its
	// own (so a hash tag of its own on Redis) instead of one subject per
	// domain: for a store, such as a Redis Cluster, on which one engine
	// call cannot span subjects and one subject is one slot. A request
	// whose descriptors have several subjects is decided one subject at a
	// time: each descriptor spends its hits when its own policies admit,
	// whatever the others answer.
	SpreadDescriptors bool
	// Headers picks the response headers: HeadersDraft (zero, draft-11's
	// RateLimit-Policy and RateLimit), HeadersEnvoy (envoyproxy/ratelimit's
	// RateLimit-Limit, -Remaining and -Reset, its default names with
	// LIMIT_RESPONSE_HEADERS_ENABLED) or HeadersBoth. Retry-After is sent
	// when over the limit in every case.
	Headers HeaderStyle
	// CountOverLimit counts every request's hits even when it is over the
	// limit, as envoyproxy/ratelimit does, for every descriptor policy
	// (see overlimit.go); without it only the policies with
	// count_over_limit do. It needs a Decider that is a StatesCharger.
	CountOverLimit bool
}

// HeaderStyle is which rate limit headers a response carries.
type HeaderStyle uint8

// The header styles of Config.Headers.
const (
	HeadersDraft HeaderStyle = iota
	HeadersEnvoy
	HeadersBoth
)

// ParseHeaderStyle reads draft, envoy or both.
func ParseHeaderStyle(s string) (HeaderStyle, error) {
	switch s {
	case "draft":
		return HeadersDraft, nil
	case "envoy":
		return HeadersEnvoy, nil
	case "both":
		return HeadersBoth, nil
	}
	return 0, fmt.Errorf("%q is none of draft, envoy or both", s)
}

// DefaultStreamWorkers is Config.StreamWorkers when zero: more than the
// calls in flight from a proxy's usual connection pools.
const DefaultStreamWorkers = 128

// Config.MaxConnections, Config.MaxConnectionsPerAddress and
// Config.WriteTimeout when zero.
const (
	DefaultMaxConnections           = h2serve.DefaultMaxConnections
	DefaultMaxConnectionsPerAddress = h2serve.DefaultMaxConnectionsPerAddress
	DefaultWriteTimeout             = h2serve.DefaultWriteTimeout
)

// Server is the rate limit service. Build it with New, serve with Serve.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	cfg      Config
	log      *slog.Logger
	requests *prometheus.CounterVec
	// The series of requests, resolved once.
	ok, overLimitCalls, invalid prometheus.Counter
	// charger charges hits over the limit; nil when the Decider does not.
	charger   StatesCharger
	overLimit overLimitMetrics

	// Of Serve: the own transport (nil on TransportGRPC), whether
	// shutdown has begun, and where its connections go to grpc-go.
	h2       *h2serve.Server
	stopping atomic.Bool
	handed   *h2serve.ConnQueue
	// The room of TransportGRPC's calls (grpcCall).
	grpcCalls sync.Pool
}

// New returns a Server; it registers its metrics on cfg.Registerer.
func New(cfg Config) (*Server, error) {
	if cfg.Decider == nil || cfg.Matcher == nil {
		return nil, errors.New("rls: a Decider and a Matcher are required")
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 30 * time.Second
	}
	if cfg.StreamWorkers <= 0 {
		cfg.StreamWorkers = DefaultStreamWorkers
	}
	if cfg.ConnectionTimeout <= 0 {
		cfg.ConnectionTimeout = 120 * time.Second
	}
	if cfg.KeepaliveTime <= 0 {
		cfg.KeepaliveTime = 2 * time.Hour
	}
	if cfg.KeepaliveTimeout <= 0 {
		cfg.KeepaliveTimeout = 20 * time.Second
	}
	s := &Server{cfg: cfg, log: cfg.Logger}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_rls_requests_total",
		Help: "Rate limit service calls by answer: ok, over_limit or invalid (INVALID_ARGUMENT).",
	}, []string{"code"})
	s.ok = s.requests.WithLabelValues("ok")
	s.overLimitCalls = s.requests.WithLabelValues("over_limit")
	s.invalid = s.requests.WithLabelValues("invalid")
	s.charger, _ = cfg.Decider.(StatesCharger)
	if cfg.CountOverLimit && s.charger == nil {
		return nil, errors.New("rls: counting hits over the limit needs a Decider that charges (a StatesCharger)")
	}
	s.overLimit = newOverLimitMetrics()
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{s.requests, s.overLimit.vec} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("rls: metrics: %w", err)
			}
		}
	}
	if cfg.Transport == TransportH2 {
		var err error
		s.h2, err = h2serve.New(h2serve.Config{Paths: h2Paths,
			HandOver:          func(nc net.Conn) error { return s.handed.Put(nc) },
			Workers:           cfg.StreamWorkers,
			ConnectionTimeout: cfg.ConnectionTimeout,
			KeepaliveTime:     cfg.KeepaliveTime, KeepaliveTimeout: cfg.KeepaliveTimeout,
			WriteTimeout: cfg.WriteTimeout, MaxConnections: cfg.MaxConnections,
			MaxConnectionsPerAddress: cfg.MaxConnectionsPerAddress,
			MaxConnectionAge:         cfg.MaxConnectionAge, MaxConnectionAgeGrace: cfg.MaxConnectionAgeGrace,
			Registerer: cfg.Registerer}, h2Calls{s})
		if err != nil {
			return nil, fmt.Errorf("rls: %w", err)
		}
	}
	return s, nil
}

func (s *Server) now() time.Time {
	if s.cfg.Clock != nil {
		return s.cfg.Clock.Now()
	}
	return time.Now()
}

// Serve answers on ln, with gRPC health checking and server reflection,
// until ctx is cancelled; then health turns NOT_SERVING, new calls are
// refused and in-flight ones finish (up to ShutdownTimeout). See
// rls/internal/h2serve for which connections its own transport serves and
// which grpc-go does. Call it once.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	opts := []grpc.ServerOption{grpc.NumStreamWorkers(uint32(s.cfg.StreamWorkers)),
		grpc.ConnectionTimeout(s.cfg.ConnectionTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: s.cfg.KeepaliveTime, Timeout: s.cfg.KeepaliveTimeout,
			MaxConnectionAge: s.cfg.MaxConnectionAge, MaxConnectionAgeGrace: s.cfg.MaxConnectionAgeGrace})}
	if s.cfg.Transport == TransportGRPC {
		opts = append(opts, tunedOptions()...)
	}
	gs := grpc.NewServer(opts...)
	if s.cfg.Transport == TransportGRPC {
		gs.RegisterService(rlsServiceDesc(), s)
	} else {
		rlsv3.RegisterRateLimitServiceServer(gs, s)
	}
	hs := health.NewServer()
	hs.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)
	if s.cfg.Transport == TransportGRPC {
		return s.serveGRPC(ctx, gs, hs, ln)
	}
	s.handed = h2serve.NewConnQueue(ln.Addr())
	handed := s.handed
	errc := make(chan error, 2)
	s.log.Info("rate limit service listening", "addr", ln.Addr().String())
	go func() { errc <- gs.Serve(handed) }()
	connCtx, cancelConns := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelConns()
	go func() { errc <- s.h2.Serve(connCtx, ln) }()
	var err error
	select {
	case err = <-errc:
	case <-ctx.Done():
	}
	s.stopping.Store(true)
	ln.Close()
	hs.Shutdown()
	drain(s.cfg.ShutdownTimeout, func() {
		s.h2.GoAway()
		gs.GracefulStop()
		s.h2.Wait()
	}, func() {
		gs.Stop()
		cancelConns()
	})
	handed.Close()
	return serveError(err)
}

// ShouldRateLimit answers one request; see the package documentation and
// docs/api.md for the mapping.
func (s *Server) ShouldRateLimit(ctx context.Context, m *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	var req request
	req.fromMessage(m)
	r := &reply{}
	err := s.decide(ctx, &req, r, &scratch{})
	s.count(r, err)
	if err != nil {
		return nil, err
	}
	return &r.resp, nil
}

// count counts an answer in sluice_rls_requests_total.
func (s *Server) count(r *reply, err error) {
	switch {
	case err != nil && status.Code(err) == codes.InvalidArgument:
		s.invalid.Inc()
	case err != nil:
	case r.resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT:
		s.overLimitCalls.Inc()
	default:
		s.ok.Inc()
	}
}

// descriptor is one validated descriptor of a request.
type descriptor struct {
	entries []quota.DescriptorEntry
	hits    int64
	// override is the request's own limit for this descriptor, in place
	// of the policies; nil when none was sent.
	override *quota.Policy
}

func invalidArg(field, format string, args ...any) error {
	return status.Error(codes.InvalidArgument, field+": "+fmt.Sprintf(format, args...))
}

// validate checks a request and returns its descriptors, in buf when it
// is long enough; every error is INVALID_ARGUMENT naming the field. The
// descriptors' entries are req's.
func validate(req *request, buf []descriptor) ([]descriptor, error) {
	if req.domain == "" {
		return nil, invalidArg("domain", "required")
	}
	if err := quota.ValidDescriptorText(req.domain, quota.MaxDomainBytes); err != nil {
		return nil, invalidArg("domain", "%v", err)
	}
	ds := req.descs
	switch n := req.descriptors(); {
	case n == 0:
		return nil, invalidArg("descriptors", "at least one descriptor is required")
	case n > MaxDescriptors:
		return nil, invalidArg("descriptors", "at most %d descriptors, got %d", MaxDescriptors, n)
	}
	if req.hitsAddend > MaxHitsAddend {
		return nil, invalidArg("hits_addend", "at most %d, got %d", MaxHitsAddend, req.hitsAddend)
	}
	hits := max(int64(req.hitsAddend), 1)
	out := buf[:0]
	if len(ds) > cap(buf) {
		out = make([]descriptor, 0, len(ds))
	}
	out = out[:len(ds)]
	for i := range ds {
		d := &ds[i]
		// Field names are built only for an error: this runs on every call.
		f := func(rest string) string { return "descriptors[" + strconv.Itoa(i) + "]" + rest }
		if d.null {
			return nil, invalidArg(f(""), "must not be null")
		}
		es := d.entries
		switch n := d.entryCount(); {
		case n == 0:
			return nil, invalidArg(f(".entries"), "at least one entry is required")
		case n > quota.MaxDescriptorEntries:
			return nil, invalidArg(f(".entries"), "at most %d entries, got %d", quota.MaxDescriptorEntries, n)
		}
		out[i].override = nil
		if d.hasLimit {
			p, err := overridePolicy(d)
			if err != nil {
				return nil, invalidArg(f(".limit"+err.field), "%s", err.reason)
			}
			out[i].override = p
		}
		if d.negative {
			return nil, invalidArg(f(".is_negative_hits"), "returning hits is not supported")
		}
		out[i].hits = hits
		if d.hasHits {
			if d.hits > MaxHitsAddend {
				return nil, invalidArg(f(".hits_addend"), "at most %d, got %d", MaxHitsAddend, d.hits)
			}
			out[i].hits = int64(d.hits)
		}
		for j, e := range es {
			ef := func(rest string) string { return f(".entries[" + strconv.Itoa(j) + "]" + rest) }
			if e.Key == "" {
				return nil, invalidArg(ef(".key"), "required")
			}
			if err := quota.ValidDescriptorText(e.Key, quota.MaxDescriptorKeyBytes); err != nil {
				return nil, invalidArg(ef(".key"), "%v", err)
			}
			if err := quota.ValidDescriptorText(e.Value, quota.MaxDescriptorValueBytes); err != nil {
				return nil, invalidArg(ef(".value"), "%v", err)
			}
		}
		out[i].entries = es
	}
	return out, nil
}

// stateName names the engine state a descriptor policy counts in: the
// policy id and the descriptor's entries, joined by control characters
// that no id, key or value contains.
func stateName(policy string, entries []quota.DescriptorEntry) string {
	n := len(policy)
	for _, e := range entries {
		n += 2 + len(e.Key) + len(e.Value)
	}
	var b strings.Builder
	b.Grow(n)
	b.WriteString(policy)
	for _, e := range entries {
		b.WriteByte(0x1f)
		b.WriteString(e.Key)
		b.WriteByte(0x1e)
		b.WriteString(e.Value)
	}
	return b.String()
}

// subjectOf is the engine subject of a domain's requests when their
// descriptors are decided together: what the limiter keeps per subject
// (the deny cache, usage for shares, leases) is kept under it and each
// state's name, while the states themselves live at placeOf.
func subjectOf(domain string) string { return "rls:" + domain }

// descriptorSubject is the engine subject of one descriptor's states when
// they are spread (Config.SpreadDescriptors): the domain and the entries,
// joined as stateName joins them.
func descriptorSubject(domain string, entries []quota.DescriptorEntry) string {
	return stateName("rls:"+domain, entries)
}

// placeOf is where a descriptor's states live when a request's
// descriptors are decided together (engine.Check.Subject): the domain and
// a 64-bit FNV-1a hash of the entries, so that a domain's descriptors
// spread over the memory store's shards and over Redis hash tags while one
// engine call still decides them all. Two descriptors whose hashes collide
// share a place, never a state: the state's name (stateName) holds the
// entries themselves.
func placeOf(domain string, entries []quota.DescriptorEntry) string {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	mix := func(s string) {
		for i := 0; i < len(s); i++ {
			h ^= uint64(s[i])
			h *= prime
		}
	}
	for _, e := range entries {
		mix(e.Key)
		h ^= 0x1e
		h *= prime
		mix(e.Value)
		h ^= 0x1f
		h *= prime
	}
	var b [16]byte
	return subjectOf(domain) + ":" + string(strconv.AppendUint(b[:0], h, 16))
}

// use is one policy applied to one descriptor.
type use struct {
	desc    int
	policy  *quota.Policy
	limit   engine.Limit
	applied int // index into the engine checks; -1 when none
}

// matched is what a request's descriptors matched: the policies each one
// uses, which descriptors are unlimited, and whether a policy of limit 0
// denies the request. The engine checks of all of them are apart (see
// match), since they leave for the engine and these need not.
type matched struct {
	uses      []use
	unlimited []bool
	denied    bool
}

// reply is a response with the messages its statuses and headers point
// to, allocated together: a request of one descriptor is answered in one
// allocation.
type reply struct {
	resp    rlsv3.RateLimitResponse
	sts     []descStatus
	one     [1]descStatus
	onePtr  [1]*rlsv3.RateLimitResponse_DescriptorStatus
	headers [6]*corev3.HeaderValue
	hvs     [6]corev3.HeaderValue
	// degraded is request_headers_to_add's X-Sluice-Degraded.
	degraded    [1]*corev3.HeaderValue
	degradedHdr corev3.HeaderValue
}

// descStatus is one descriptor's status and the messages it points to.
type descStatus struct {
	st    rlsv3.RateLimitResponse_DescriptorStatus
	limit rlsv3.RateLimitResponse_RateLimit
	reset durationpb.Duration
}

// init makes r an OK response with n OK statuses, reusing r's room.
func (r *reply) init(n int) {
	sts, ptrs := r.sts, r.resp.Statuses
	r.resp = rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	switch {
	case n == 1:
		sts, ptrs = r.one[:], r.onePtr[:]
	case cap(sts) < n || len(sts) > 0 && &sts[0] == &r.one[0]:
		sts, ptrs = make([]descStatus, n), make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)
	}
	r.sts, r.resp.Statuses = sts[:n], ptrs[:n]
	for i := range r.sts {
		r.sts[i] = descStatus{}
		r.sts[i].st.Code = rlsv3.RateLimitResponse_OK
		r.resp.Statuses[i] = &r.sts[i].st
	}
}

// scratch is room a call works in that would otherwise be allocated on
// every call: the slices that leave for the Matcher and the Decider (an
// interface call's arguments live on the heap), and the engine subject of
// the last domain seen. The transport keeps one per pooled stream.
type scratch struct {
	ms      []quota.DescriptorMatch
	applied []quota.Applied
	// subjects holds each applied check's subject when descriptors are
	// spread; nil otherwise.
	subjects []string
	domain   string
	subject  string
}

// subjectOf is subjectOf(domain), remembered for the next call.
func (sc *scratch) subjectOf(domain string) string {
	if sc.subject == "" || sc.domain != domain {
		sc.domain, sc.subject = domain, subjectOf(domain)
	}
	return sc.subject
}

// Most requests carry this many descriptors or fewer: their matching
// works in buffers on the stack.
const fewDescriptors = 4

// decide answers req in r, or returns a gRPC status error.
func (s *Server) decide(ctx context.Context, req *request, r *reply, sc *scratch) error {
	var dsBuf [fewDescriptors]descriptor
	ds, err := validate(req, dsBuf[:])
	if err != nil {
		return err
	}
	r.init(len(ds))
	domain := req.domain
	if !s.cfg.Matcher.HasDomain(domain) {
		return nil // an unknown domain limits nothing
	}
	var usesBuf [fewDescriptors]use
	var unlimitedBuf [fewDescriptors]bool
	m, applied, err := s.match(domain, ds, matched{uses: usesBuf[:0], unlimited: unlimitedBuf[:0]}, sc)
	if err != nil {
		return err
	}
	v := decide.StatesVerdict{Allowed: true}
	if len(applied) > 0 {
		if s.cfg.SpreadDescriptors {
			v, err = s.decideSpread(ctx, applied, sc.subjects)
		} else {
			v, err = s.decideStates(ctx, sc.subjectOf(domain), applied)
		}
		if err != nil {
			if ctx.Err() != nil {
				return status.FromContextError(ctx.Err()).Err()
			}
			return invalidArg("descriptors", "%v", err)
		}
	}
	allowed := v.Allowed && !m.denied
	now := s.now()
	for i := range ds {
		answer(&r.sts[i], i, ds[i], &m, v, allowed, now)
	}
	if !allowed {
		r.resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	r.resp.ResponseHeadersToAdd = r.addHeaders(v, allowed, m.uses, now, s.cfg.Headers)
	if v.Degraded {
		// As the HTTP answers' X-Sluice-Degraded, for the gateway's logs
		// and the API: on the request Envoy sends upstream, never on the
		// client's answer, as it speaks of the limiter's health.
		r.degradedHdr = corev3.HeaderValue{Key: "X-Sluice-Degraded", Value: "true"}
		r.degraded[0] = &r.degradedHdr
		r.resp.RequestHeadersToAdd = r.degraded[:]
	}
	return nil
}

// match finds each descriptor's policies, leaves out those that a policy
// applying to any descriptor replaces, and gathers the engine checks: one
// per policy and distinct entries (a descriptor sent twice spends twice
// in one state). When a policy of limit 0 denies the request, the checks
// spend nothing but those of policies that count over the limit: the
// engine only reads the other states, for their figures.
// It returns what matched, in the buffers of into.uses and into.unlimited
// when they are large enough, and the checks.
func (s *Server) match(domain string, ds []descriptor, into matched, sc *scratch) (matched, []quota.Applied, error) {
	m := into
	ms := sc.ms
	uses := m.uses[:0]
	var replaced []string
	for i, d := range ds {
		if d.override != nil {
			// As envoyproxy/ratelimit: the request's limit replaces the
			// configured ones for this descriptor.
			uses = append(uses, use{desc: i, policy: d.override, limit: d.override.Limit(), applied: -1})
			continue
		}
		ms = s.cfg.Matcher.AppendMatchDescriptor(ms[:0], domain, d.entries)
		for _, m := range ms {
			replaced = append(replaced, m.Policy.Replaces...)
			uses = append(uses, use{desc: i, policy: m.Policy, limit: m.Limit, applied: -1})
		}
	}
	clear(ms) // keeps no policy alive in the pool
	sc.ms = ms[:0]
	if cap(m.unlimited) < len(ds) {
		m.unlimited = make([]bool, len(ds))
	}
	m.unlimited = m.unlimited[:len(ds)]
	clear(m.unlimited)
	// Every check comes from one use: room for all of them at once.
	applied := sc.applied[:0]
	if cap(applied) < len(uses) {
		applied = make([]quota.Applied, 0, len(uses))
	}
	sc.applied = applied
	spread := s.cfg.SpreadDescriptors
	subjects := sc.subjects[:0]
	// The uses kept are written over those read, never ahead of them.
	m.uses = uses[:0]
	for _, u := range uses {
		if contains(replaced, u.policy.ID) {
			continue
		}
		d := ds[u.desc]
		switch {
		case u.policy.Unlimited:
			// A shadow unlimited policy (a descriptor with neither
			// rate_limit nor children) changes nothing: answered as
			// matching no limit, 0 remaining, as envoyproxy/ratelimit.
			if u.policy.Mode == quota.ModeEnforce {
				m.unlimited[u.desc] = true
			}
			continue
		case u.policy.DeniesAll():
			if d.hits > 0 && u.policy.Mode == quota.ModeEnforce {
				m.denied = true
			}
		default:
			var name, subject string
			if spread {
				name, subject = u.policy.ID, descriptorSubject(domain, d.entries)
			} else {
				name = stateName(u.policy.ID, d.entries)
			}
			for j := range applied {
				if applied[j].State == name && (!spread || subjects[j] == subject) {
					applied[j].Cost += d.hits
					u.applied = j
				}
			}
			if u.applied < 0 {
				if len(applied) == quota.MaxPoliciesPerRequest {
					return matched{}, nil, invalidArg("descriptors", "the descriptors match more than %d limits; send fewer descriptors", quota.MaxPoliciesPerRequest)
				}
				u.applied = len(applied)
				a := quota.Applied{Policy: u.policy, Cost: d.hits, Limit: u.limit, State: name}
				if spread {
					subjects = append(subjects, subject)
				} else {
					a.Subject = placeOf(domain, d.entries)
				}
				applied = append(applied, a)
			}
		}
		m.uses = append(m.uses, u)
	}
	if m.denied {
		for j := range applied {
			if !s.countsOver(applied[j]) {
				applied[j].Cost = 0
			}
		}
	}
	sc.subjects = subjects
	return m, applied, nil
}

// answer fills descriptor i's status from its most constraining policy.
func answer(ds *descStatus, i int, d descriptor, m *matched, v decide.StatesVerdict, allowed bool, now time.Time) {
	st := &ds.st
	best := -1 // index into m.uses
	var bestRes decide.PolicyResult
	for k, u := range m.uses {
		if u.desc != i {
			continue
		}
		var r decide.PolicyResult
		if u.applied >= 0 {
			r = v.Results[u.applied]
		} else { // denies all
			w := windowOf(u.policy)
			reset := w - time.Duration(now.UnixNano())%w
			r = decide.PolicyResult{Mode: u.policy.Mode, Evaluated: true, Allowed: d.hits == 0, ResetMS: reset.Milliseconds(), RetryAfterMS: reset.Milliseconds()}
		}
		if best < 0 || worse(r, bestRes) {
			best, bestRes = k, r
		}
	}
	if best < 0 {
		if m.unlimited[i] {
			st.LimitRemaining = math.MaxUint32
		}
		return
	}
	u := m.uses[best]
	setLimit(&ds.limit, u.policy, u.limit)
	st.CurrentLimit = &ds.limit
	st.LimitRemaining = uint32(min(max(bestRes.Remaining, 0), math.MaxUint32))
	reset := bestRes.ResetMS
	if bestRes.Evaluated && !bestRes.Allowed && u.policy.Mode == quota.ModeEnforce && !allowed {
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		st.LimitRemaining = 0
		reset = max(reset, bestRes.RetryAfterMS)
	}
	ds.reset.Seconds, ds.reset.Nanos = reset/1000, int32(reset%1000)*int32(time.Millisecond)
	st.DurationUntilReset = &ds.reset
}

// worse reports whether a constrains a descriptor more than b: an
// enforced rejection first, then the least remaining.
func worse(a, b decide.PolicyResult) bool {
	ar := a.Evaluated && !a.Allowed && a.Mode == quota.ModeEnforce
	br := b.Evaluated && !b.Allowed && b.Mode == quota.ModeEnforce
	if ar != br {
		return ar
	}
	if ar {
		return a.RetryAfterMS > b.RetryAfterMS
	}
	if a.Evaluated != b.Evaluated {
		return a.Evaluated
	}
	return a.Remaining < b.Remaining
}

func contains(ids []string, id string) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// addHeaders returns the draft-11 fields of the verdict and, when over the
// limit, Retry-After, in r's room for them.
func (r *reply) addHeaders(v decide.StatesVerdict, allowed bool, uses []use, now time.Time, style HeaderStyle) []*corev3.HeaderValue {
	out := r.headers[:0]
	add := func(key, value string) {
		h := &r.hvs[len(out)]
		h.Key, h.Value = key, value
		out = append(out, h)
	}
	if v.RateLimitPolicy != "" && style != HeadersEnvoy {
		add("RateLimit-Policy", v.RateLimitPolicy)
		add("RateLimit", v.RateLimit)
	}
	if style != HeadersDraft {
		if st := r.leastRemaining(); st != nil {
			reset := st.GetDurationUntilReset().AsDuration()
			add("RateLimit-Limit", strconv.FormatUint(uint64(st.CurrentLimit.RequestsPerUnit), 10))
			add("RateLimit-Remaining", strconv.FormatUint(uint64(st.LimitRemaining), 10))
			add("RateLimit-Reset", strconv.FormatInt(int64((reset+time.Second-1)/time.Second), 10))
		}
	}
	if allowed {
		return out
	}
	retry := v.RetryAfterHeader
	if v.Allowed { // denied by a policy of limit 0: retry when its window ends
		var longest time.Duration
		for _, u := range uses {
			if u.applied < 0 && u.policy.Mode == quota.ModeEnforce {
				w := windowOf(u.policy)
				longest = max(longest, w-time.Duration(now.UnixNano())%w)
			}
		}
		retry = fmt.Sprint(max(int64((longest+time.Second-1)/time.Second), 1))
	}
	add("Retry-After", retry)
	return out
}

// leastRemaining is the status its RateLimit-Limit, -Remaining and
// -Reset headers describe, picked as envoyproxy/ratelimit picks it: the
// last status over the limit, else the one with a current limit and the
// least remaining, the first of them in a tie; nil when none has a limit.
func (r *reply) leastRemaining() *rlsv3.RateLimitResponse_DescriptorStatus {
	var best *rlsv3.RateLimitResponse_DescriptorStatus
	over := false
	for _, st := range r.resp.Statuses {
		switch {
		case st.Code == rlsv3.RateLimitResponse_OVER_LIMIT && st.CurrentLimit != nil:
			best, over = st, true
		case !over && st.CurrentLimit != nil && (best == nil || st.LimitRemaining < best.LimitRemaining):
			best = st
		}
	}
	return best
}

func windowOf(p *quota.Policy) time.Duration {
	w := time.Duration(p.Window * float64(time.Second))
	return max(w, time.Millisecond)
}

// units are the rate limit units of the API, shortest first, in seconds.
var units = []struct {
	unit rlsv3.RateLimitResponse_RateLimit_Unit
	sec  float64
}{
	{rlsv3.RateLimitResponse_RateLimit_SECOND, 1},
	{rlsv3.RateLimitResponse_RateLimit_MINUTE, 60},
	{rlsv3.RateLimitResponse_RateLimit_HOUR, 3600},
	{rlsv3.RateLimitResponse_RateLimit_DAY, 86400},
	{rlsv3.RateLimitResponse_RateLimit_WEEK, 7 * 86400},
	{rlsv3.RateLimitResponse_RateLimit_MONTH, 30 * 86400},
	{rlsv3.RateLimitResponse_RateLimit_YEAR, 365 * 86400},
}

// setLimit sets out to a policy's limit as the API's requests per unit:
// a window of exactly one unit as it is; any other limit as its long-run
// rate in the shortest unit in which that is a whole number, else rounded
// down in the shortest unit in which it is at least one.
func setLimit(out *rlsv3.RateLimitResponse_RateLimit, p *quota.Policy, l engine.Limit) {
	out.Name = p.ID
	perSec := l.Rate
	if p.DeniesAll() || l.Algorithm.Windowed() {
		w := p.Window
		for _, u := range units {
			if w == u.sec {
				out.Unit, out.RequestsPerUnit = u.unit, uint32(min(l.Count, math.MaxUint32))
				return
			}
		}
		perSec = l.Count / w
	}
	for _, u := range units {
		n := perSec * u.sec
		if n >= 1 && math.Abs(n-math.Round(n)) < 1e-9 {
			out.Unit, out.RequestsPerUnit = u.unit, uint32(min(math.Round(n), math.MaxUint32))
			return
		}
	}
	for _, u := range units {
		if n := perSec * u.sec; n >= 1 {
			out.Unit, out.RequestsPerUnit = u.unit, uint32(min(math.Floor(n), math.MaxUint32))
			return
		}
	}
	out.Unit = rlsv3.RateLimitResponse_RateLimit_YEAR
}
