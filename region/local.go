package region

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/engine/limiter"
	"github.com/sluice-rl/sluice/quota"
)

// Decider decides checks in-process with the daemon's own decision code:
// the same validation, policy matching, exemptions, overrides, enforced
// then shadow evaluation, failure modes, rejection problems and RateLimit
// fields as POST /v1/check of a single-region daemon, without a listener,
// a policy store watcher or gossip. Global-scope policies are enforced
// whole: there is no other region to share them with. A Decider is safe
// for concurrent use.
type Decider struct {
	d *Daemon
}

// NewDecider returns a Decider over reg's policies with lim's store. The
// daemon's check metrics (sluice_checks_total and the others newMetrics
// names) are registered on metrics; nil keeps them on a private registry
// that nothing gathers.
func NewDecider(lim *limiter.Limiter, reg *quota.Registry, metrics prometheus.Registerer) *Decider {
	if metrics == nil {
		metrics = prometheus.NewRegistry()
	}
	d := &Daemon{log: slog.New(slog.DiscardHandler), lim: lim, reg: reg, shares: WholeShare{}}
	d.m = newMetrics(metrics, lim, nil, "local")
	return &Decider{d: d}
}

// CheckAnswer is what POST /v1/check answers for a decided check: the
// status, the decision, the header fields and, when limited, the problem
// members of the body.
type CheckAnswer struct {
	// Status is 200 (allowed), 429 (limited) or 503 (the store could not
	// decide and a policy fails closed).
	Status int
	// Decision is the body's decision.
	Decision Decision
	// Header holds RateLimit-Policy and RateLimit (when an enforced policy
	// that is not class security applied) and, when Status is not 200,
	// Retry-After in whole seconds, under their canonical keys.
	Header http.Header
	// Problem is nil when allowed; else the 429 or 503 body's problem
	// members. As in the daemon's answer, which goes to the gateway and
	// not to the client, ViolatedPolicies names every violated policy,
	// class security ones too, and RetryAfterMS is the decision's.
	// Instance is empty: there is no request path.
	Problem *Problem
}

// Check decides in exactly as a daemon's POST /v1/check decides its body.
// Bad input is a 400 problem naming the field; a cancelled context is a
// 503 problem. A limited request is an answer, not a problem.
func (dc *Decider) Check(ctx context.Context, in CheckRequest) (CheckAnswer, *Problem) {
	t, p := in.target("")
	if p != nil {
		return CheckAnswer{}, p
	}
	v, p := dc.d.decide(ctx, t)
	if p != nil {
		return CheckAnswer{}, p
	}
	out := CheckAnswer{Status: v.status, Decision: v.Decision, Header: http.Header{}}
	setRateLimitHeaders(out.Header, &v)
	if v.status != http.StatusOK {
		prob := rejection(&v)
		ms := v.RetryAfterMS
		out.Problem = &Problem{Type: prob.Type, Title: prob.Title, Status: prob.Status, Detail: prob.Detail,
			ViolatedPolicies: v.violated, RetryAfterMS: &ms}
	}
	return out, nil
}
