// Package local decides checks in-process, with a limiter.Limiter and a
// quota.Registry, instead of asking a daemon. It runs the daemon's own
// decision code (decide.Decider): the same validation, policies,
// overrides, exemptions, shadow mode, failure modes, problems and the same
// RateLimit, RateLimit-Policy and Retry-After fields as `sluice serve`
// answers for a single region. Global-scope policies are enforced whole
// (there are no other regions to share them with).
//
// A *Limiter has the method set of *client.Client's Check, so that the
// middleware of package httplimit takes either. It links the decision and
// the engine, but none of the daemon's transports or metrics.
package local

import (
	"context"

	"github.com/sluice-rl/sluice/client"
	"github.com/sluice-rl/sluice/decide"
	"github.com/sluice-rl/sluice/engine/limiter"
	"github.com/sluice-rl/sluice/quota"
)

// Limiter decides checks against reg's policies with lim's store.
type Limiter struct {
	dec *decide.Decider
}

// New returns a Limiter; lim nil is an in-process memory store.
func New(lim *limiter.Limiter, reg *quota.Registry) *Limiter {
	if lim == nil {
		lim = limiter.New(limiter.Config{})
	}
	return &Limiter{dec: decide.New(decide.Config{Limiter: lim, Registry: reg})}
}

// Check decides req as a daemon's POST /v1/check does. Bad input is a
// *client.Problem (status 400) naming the field; a limited request is a
// Decision with Allowed false and Status 429, or 503 when a fail-closed
// policy's store could not decide. A cancelled context is a
// *client.Problem with status 503.
func (l *Limiter) Check(ctx context.Context, req client.CheckRequest) (*client.Decision, error) {
	ans, p := l.dec.Check(ctx, decide.CheckRequest(req))
	if p != nil {
		return nil, problem(p)
	}
	d := &client.Decision{Decision: ans.Decision, Status: ans.Status, Header: ans.Header}
	if ans.Problem != nil {
		d.Problem = problem(ans.Problem)
	}
	return d, nil
}

// problem is p as package client spells it.
func problem(p *decide.Problem) *client.Problem { return (*client.Problem)(p) }

// Charge charges req's cost after the fact as a daemon's POST /v1/charge
// does. Bad input is a *client.Problem (status 400) naming the field, and
// charges nothing.
func (l *Limiter) Charge(ctx context.Context, req client.ChargeRequest) (*client.ChargeAnswer, error) {
	ans, p := l.dec.Charge(ctx, req)
	if p != nil {
		return nil, problem(p)
	}
	return &ans, nil
}
