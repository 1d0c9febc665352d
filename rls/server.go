// Package rls serves Envoy's rate limit service,
// envoy.service.ratelimit.v3.RateLimitService, over gRPC from the daemon's
// policies (descriptor policies, see quota.Match) and engine, and loads
// envoyproxy/ratelimit configuration files into such policies
// (LoadEnvoyConfigs).
//
// A request's descriptors are matched one by one, as envoyproxy/ratelimit
// matches them, and then decided together in one all-or-nothing engine
// call: either every limited descriptor spends its hits or none does.
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
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/region"
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
// *region.Daemon is one.
type Decider interface {
	DecideStates(ctx context.Context, subject string, applied []quota.Applied) (region.StatesVerdict, error)
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
	// Registerer receives sluice_rls_requests_total; nil registers
	// nothing.
	Registerer prometheus.Registerer
	Clock      Clock
	// ShutdownTimeout bounds how long in-flight calls may take to finish
	// once Serve's context is cancelled; zero is 30 s.
	ShutdownTimeout time.Duration
}

// Server is the rate limit service. Build it with New, serve with Serve.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	cfg      Config
	log      *slog.Logger
	requests *prometheus.CounterVec
}

// New returns a Server; it registers its metrics on cfg.Registerer.
func New(cfg Config) (*Server, error) {
	if cfg.Decider == nil || cfg.Matcher == nil {
		return nil, errors.New("rls: a Decider and a Matcher are required")
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 30 * time.Second
	}
	s := &Server{cfg: cfg, log: cfg.Logger}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_rls_requests_total",
		Help: "Rate limit service calls by answer: ok, over_limit or invalid (INVALID_ARGUMENT).",
	}, []string{"code"})
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(s.requests); err != nil {
			return nil, fmt.Errorf("rls: metrics: %w", err)
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
// refused and in-flight ones finish (up to ShutdownTimeout).
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	gs := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(gs, s)
	hs := health.NewServer()
	hs.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)
	errc := make(chan error, 1)
	s.log.Info("rate limit service listening", "addr", ln.Addr().String())
	go func() { errc <- gs.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	hs.Shutdown()
	stopped := make(chan struct{})
	go func() { gs.GracefulStop(); close(stopped) }()
	t := time.NewTimer(s.cfg.ShutdownTimeout)
	defer t.Stop()
	select {
	case <-stopped:
	case <-t.C:
		gs.Stop()
		<-stopped
	}
	if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// ShouldRateLimit answers one request; see the package documentation and
// docs/api.md for the mapping.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	resp, err := s.decide(ctx, req)
	switch {
	case err != nil && status.Code(err) == codes.InvalidArgument:
		s.requests.WithLabelValues("invalid").Inc()
	case err != nil:
	case resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT:
		s.requests.WithLabelValues("over_limit").Inc()
	default:
		s.requests.WithLabelValues("ok").Inc()
	}
	return resp, err
}

// descriptor is one validated descriptor of a request.
type descriptor struct {
	entries []quota.DescriptorEntry
	hits    int64
}

func invalidArg(field, format string, args ...any) error {
	return status.Error(codes.InvalidArgument, field+": "+fmt.Sprintf(format, args...))
}

// validate checks a request and returns its descriptors; every error is
// INVALID_ARGUMENT naming the field.
func validate(req *rlsv3.RateLimitRequest) ([]descriptor, error) {
	if req.GetDomain() == "" {
		return nil, invalidArg("domain", "required")
	}
	if err := quota.ValidDescriptorText(req.GetDomain(), quota.MaxDomainBytes); err != nil {
		return nil, invalidArg("domain", "%v", err)
	}
	ds := req.GetDescriptors()
	switch {
	case len(ds) == 0:
		return nil, invalidArg("descriptors", "at least one descriptor is required")
	case len(ds) > MaxDescriptors:
		return nil, invalidArg("descriptors", "at most %d descriptors, got %d", MaxDescriptors, len(ds))
	}
	if req.GetHitsAddend() > MaxHitsAddend {
		return nil, invalidArg("hits_addend", "at most %d, got %d", MaxHitsAddend, req.GetHitsAddend())
	}
	hits := max(int64(req.GetHitsAddend()), 1)
	out := make([]descriptor, len(ds))
	for i, d := range ds {
		// Field names are built only for an error: this runs on every call.
		f := func(rest string) string { return "descriptors[" + strconv.Itoa(i) + "]" + rest }
		if d == nil {
			return nil, invalidArg(f(""), "must not be null")
		}
		es := d.GetEntries()
		switch {
		case len(es) == 0:
			return nil, invalidArg(f(".entries"), "at least one entry is required")
		case len(es) > quota.MaxDescriptorEntries:
			return nil, invalidArg(f(".entries"), "at most %d entries, got %d", quota.MaxDescriptorEntries, len(es))
		}
		if d.GetLimit() != nil {
			return nil, invalidArg(f(".limit"), "a limit override in the request is not supported: the limit comes from the policies")
		}
		if d.GetIsNegativeHits() {
			return nil, invalidArg(f(".is_negative_hits"), "returning hits is not supported")
		}
		out[i].hits = hits
		if h := d.GetHitsAddend(); h != nil {
			if h.GetValue() > MaxHitsAddend {
				return nil, invalidArg(f(".hits_addend"), "at most %d, got %d", MaxHitsAddend, h.GetValue())
			}
			out[i].hits = int64(h.GetValue())
		}
		out[i].entries = make([]quota.DescriptorEntry, len(es))
		for j, e := range es {
			ef := func(rest string) string { return f(".entries[" + strconv.Itoa(j) + "]" + rest) }
			if e.GetKey() == "" {
				return nil, invalidArg(ef(".key"), "required")
			}
			if err := quota.ValidDescriptorText(e.GetKey(), quota.MaxDescriptorKeyBytes); err != nil {
				return nil, invalidArg(ef(".key"), "%v", err)
			}
			if err := quota.ValidDescriptorText(e.GetValue(), quota.MaxDescriptorValueBytes); err != nil {
				return nil, invalidArg(ef(".value"), "%v", err)
			}
			out[i].entries[j] = quota.DescriptorEntry{Key: e.GetKey(), Value: e.GetValue()}
		}
	}
	return out, nil
}

// stateName names the engine state a descriptor policy counts in: the
// policy id and the descriptor's entries, joined by control characters
// that no id, key or value contains.
func stateName(policy string, entries []quota.DescriptorEntry) string {
	var b strings.Builder
	b.WriteString(policy)
	for _, e := range entries {
		b.WriteByte(0x1f)
		b.WriteString(e.Key)
		b.WriteByte(0x1e)
		b.WriteString(e.Value)
	}
	return b.String()
}

// subjectOf is the engine subject of every descriptor state of a domain:
// one subject, so that one engine call decides a request's descriptors
// together.
func subjectOf(domain string) string { return "rls:" + domain }

// use is one policy applied to one descriptor.
type use struct {
	desc    int
	policy  *quota.Policy
	limit   engine.Limit
	applied int // index into the engine checks; -1 when none
}

// matched is what a request's descriptors matched: the policies each one
// uses, the engine checks of all of them, which descriptors are
// unlimited, and whether a policy of limit 0 denies the request.
type matched struct {
	uses      []use
	applied   []quota.Applied
	unlimited []bool
	denied    bool
}

func (s *Server) decide(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	ds, err := validate(req)
	if err != nil {
		return nil, err
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(ds))}
	for i := range resp.Statuses {
		resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	}
	domain := req.GetDomain()
	if !s.cfg.Matcher.HasDomain(domain) {
		return resp, nil // an unknown domain limits nothing
	}
	m, err := s.match(domain, ds)
	if err != nil {
		return nil, err
	}
	v := region.StatesVerdict{Allowed: true}
	if len(m.applied) > 0 {
		if v, err = s.cfg.Decider.DecideStates(ctx, subjectOf(domain), m.applied); err != nil {
			if ctx.Err() != nil {
				return nil, status.FromContextError(ctx.Err()).Err()
			}
			return nil, invalidArg("descriptors", "%v", err)
		}
	}
	allowed := v.Allowed && !m.denied
	now := s.now()
	for i := range ds {
		answer(resp.Statuses[i], i, ds[i], m, v, allowed, now)
	}
	if !allowed {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	resp.ResponseHeadersToAdd = headers(v, allowed, m.uses, now)
	return resp, nil
}

// match finds each descriptor's policies, leaves out those that a policy
// applying to any descriptor replaces, and gathers the engine checks: one
// per policy and distinct entries (a descriptor sent twice spends twice
// in one state). When a policy of limit 0 denies the request, the checks
// spend nothing: the engine only reads the other states, for their figures.
func (s *Server) match(domain string, ds []descriptor) (matched, error) {
	var ms []quota.DescriptorMatch
	var uses []use
	var replaced []string
	for i, d := range ds {
		ms = s.cfg.Matcher.AppendMatchDescriptor(ms[:0], domain, d.entries)
		for _, m := range ms {
			replaced = append(replaced, m.Policy.Replaces...)
			uses = append(uses, use{desc: i, policy: m.Policy, limit: m.Limit, applied: -1})
		}
	}
	m := matched{unlimited: make([]bool, len(ds))}
	for _, u := range uses {
		if contains(replaced, u.policy.ID) {
			continue
		}
		d := ds[u.desc]
		switch {
		case u.policy.Unlimited:
			m.unlimited[u.desc] = true
			continue
		case u.policy.DeniesAll():
			if d.hits > 0 && u.policy.Mode == quota.ModeEnforce {
				m.denied = true
			}
		default:
			name := stateName(u.policy.ID, d.entries)
			for j := range m.applied {
				if m.applied[j].State == name {
					m.applied[j].Cost += d.hits
					u.applied = j
				}
			}
			if u.applied < 0 {
				if len(m.applied) == quota.MaxPoliciesPerRequest {
					return matched{}, invalidArg("descriptors", "the descriptors match more than %d limits; send fewer descriptors", quota.MaxPoliciesPerRequest)
				}
				u.applied = len(m.applied)
				m.applied = append(m.applied, quota.Applied{Policy: u.policy, Cost: d.hits, Limit: u.limit, State: name})
			}
		}
		m.uses = append(m.uses, u)
	}
	if m.denied {
		for j := range m.applied {
			m.applied[j].Cost = 0
		}
	}
	return m, nil
}

// answer fills descriptor i's status from its most constraining policy.
func answer(st *rlsv3.RateLimitResponse_DescriptorStatus, i int, d descriptor, m matched, v region.StatesVerdict, allowed bool, now time.Time) {
	best := -1 // index into m.uses
	var bestRes region.PolicyResult
	for k, u := range m.uses {
		if u.desc != i {
			continue
		}
		var r region.PolicyResult
		if u.applied >= 0 {
			r = v.Results[u.applied]
		} else { // denies all
			w := windowOf(u.policy)
			reset := w - time.Duration(now.UnixNano())%w
			r = region.PolicyResult{Mode: u.policy.Mode, Evaluated: true, Allowed: d.hits == 0, ResetMS: reset.Milliseconds(), RetryAfterMS: reset.Milliseconds()}
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
	st.CurrentLimit = currentLimit(u.policy, u.limit)
	st.LimitRemaining = uint32(min(max(bestRes.Remaining, 0), math.MaxUint32))
	reset := bestRes.ResetMS
	if bestRes.Evaluated && !bestRes.Allowed && u.policy.Mode == quota.ModeEnforce && !allowed {
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		st.LimitRemaining = 0
		reset = max(reset, bestRes.RetryAfterMS)
	}
	st.DurationUntilReset = durationpb.New(time.Duration(reset) * time.Millisecond)
}

// worse reports whether a constrains a descriptor more than b: an
// enforced rejection first, then the least remaining.
func worse(a, b region.PolicyResult) bool {
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

// headers are the draft-11 fields of the verdict and, when over the
// limit, Retry-After.
func headers(v region.StatesVerdict, allowed bool, uses []use, now time.Time) []*corev3.HeaderValue {
	var out []*corev3.HeaderValue
	if v.RateLimitPolicy != "" {
		out = append(out,
			&corev3.HeaderValue{Key: "RateLimit-Policy", Value: v.RateLimitPolicy},
			&corev3.HeaderValue{Key: "RateLimit", Value: v.RateLimit})
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
	return append(out, &corev3.HeaderValue{Key: "Retry-After", Value: retry})
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

// currentLimit expresses a policy's limit as the API's requests per unit:
// a window of exactly one unit as it is; any other limit as its long-run
// rate in the shortest unit in which that is a whole number, else rounded
// down in the shortest unit in which it is at least one.
func currentLimit(p *quota.Policy, l engine.Limit) *rlsv3.RateLimitResponse_RateLimit {
	out := &rlsv3.RateLimitResponse_RateLimit{Name: p.ID}
	perSec := l.Rate
	if p.DeniesAll() || l.Algorithm.Windowed() {
		w := p.Window
		for _, u := range units {
			if w == u.sec {
				out.Unit, out.RequestsPerUnit = u.unit, uint32(min(l.Count, math.MaxUint32))
				return out
			}
		}
		perSec = l.Count / w
	}
	for _, u := range units {
		n := perSec * u.sec
		if n >= 1 && math.Abs(n-math.Round(n)) < 1e-9 {
			out.Unit, out.RequestsPerUnit = u.unit, uint32(min(math.Round(n), math.MaxUint32))
			return out
		}
	}
	for _, u := range units {
		if n := perSec * u.sec; n >= 1 {
			out.Unit, out.RequestsPerUnit = u.unit, uint32(min(math.Floor(n), math.MaxUint32))
			return out
		}
	}
	out.Unit = rlsv3.RateLimitResponse_RateLimit_YEAR
	return out
}
