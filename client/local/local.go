// Package local decides checks in-process, with an engine.Limiter and a
// quota.Registry, instead of asking a daemon: the same policies, overrides,
// exemptions, shadow mode and the same RateLimit, RateLimit-Policy and
// Retry-After fields as `sluice serve` answers for a single region.
// Global-scope policies are enforced whole (there are no other regions to
// share them with).
//
// A *Limiter has the method set of *client.Client's Check, so that the
// middleware of package httplimit takes either. It writes the header fields
// with package region's own functions, and so imports the daemon's
// dependencies (Prometheus, memberlist); httplimit and client do not.
package local

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/client"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/region"
)

// Limiter decides checks against reg's policies with lim's store.
type Limiter struct {
	lim *engine.Limiter
	reg *quota.Registry
}

// New returns a Limiter; lim nil is an in-process memory store.
func New(lim *engine.Limiter, reg *quota.Registry) *Limiter {
	if lim == nil {
		lim = engine.NewLimiter(engine.LimiterConfig{})
	}
	return &Limiter{lim: lim, reg: reg}
}

// Check decides req as a daemon's POST /v1/check does. Bad input is a
// *client.Problem (status 400) naming the field; a limited request is a
// Decision with Allowed false and Status 429, or 503 when a fail-closed
// policy's store could not decide.
func (l *Limiter) Check(ctx context.Context, req client.CheckRequest) (*client.Decision, error) {
	id, err := req.SubjectFields.Identity()
	if err != nil {
		var ve *quota.ValidationError
		if errors.As(err, &ve) && len(ve.Problems) > 0 {
			return nil, invalid(ve.Problems[0].Field, ve.Problems[0].Reason)
		}
		return nil, invalid("", err.Error())
	}
	if req.Tier != "" {
		id.Tier = req.Tier
	}
	method := strings.ToUpper(req.Method)
	if method == "" {
		method = http.MethodGet
	}
	if req.Route == "" || req.Route[0] != '/' {
		return nil, invalid("route", fmt.Sprintf("must be a path starting with /, got %q", req.Route))
	}
	if req.Cost != nil && *req.Cost < 0 {
		return nil, invalid("cost", fmt.Sprintf("must not be negative, got %d", *req.Cost))
	}
	who := l.reg.Resolve(id)
	applied, exempt := l.reg.MatchExempt(quota.Query{Tier: who.Tier, Subject: who.Subject, Method: method, Route: quota.NormalizeRoute(req.Route)})

	d := &client.Decision{Allowed: true, Subject: who.Subject, Tier: who.Tier, Source: "none", Status: http.StatusOK,
		Header: http.Header{}, Policies: make([]client.PolicyResult, len(applied))}
	for _, e := range exempt {
		p := e.Policy
		d.Exempt = append(d.Exempt, client.ExemptResult{ID: p.ID, Version: p.Version, Mode: p.Mode, Class: p.Class,
			Scope: p.Scope, Override: e.Override, ExpiresAt: e.ExpiresAt.UTC()})
	}
	var enforced, shadow []engine.Check
	var enfIdx, shIdx []int
	for i, a := range applied {
		p := a.Policy
		cost := a.Cost
		if req.Cost != nil {
			cost = *req.Cost
			if err := a.Limit.ValidateCost(cost); err != nil {
				return nil, invalid("cost", fmt.Sprintf("policy %s cannot admit it: %v", p.ID, err))
			}
		}
		c := engine.Check{Policy: p.ID, Limit: a.Limit, Cost: cost, Scale: 1, Version: uint64(p.Version), OnFailure: failureOf(p.OnStoreFailure)}
		d.Policies[i] = client.PolicyResult{ID: p.ID, Version: p.Version, Mode: p.Mode, Class: p.Class, Scope: p.Scope,
			Cost: cost, Override: a.Override, Allowed: true}
		if p.Scope == quota.ScopeGlobal {
			d.Policies[i].Scale = 1
		}
		if p.Mode == quota.ModeEnforce {
			enforced, enfIdx = append(enforced, c), append(enfIdx, i)
		} else {
			shadow, shIdx = append(shadow, c), append(shIdx, i)
		}
	}

	decider := -1
	var items []region.RateLimitItem
	var violated, public []string // every rejecting enforced policy; those not class security
	var retryAfter time.Duration
	if len(enforced) > 0 {
		out, err := l.lim.Check(ctx, engine.Request{Subject: who.Subject, Checks: enforced})
		if err != nil {
			return nil, fmt.Errorf("check %s: %w", who.Subject, err)
		}
		d.Source, d.Degraded, d.Allowed = out.Source.String(), out.Degraded, out.Allowed
		for j, r := range out.Results[:len(enforced)] {
			pr := &d.Policies[enfIdx[j]]
			fill(pr, r)
			pr.Degraded = out.Degraded
			a := applied[enfIdx[j]]
			if !r.Allowed && !out.Allowed {
				violated = append(violated, a.Policy.ID)
				if a.Policy.Class != quota.ClassSecurity {
					public = append(public, a.Policy.ID)
				}
			}
			if a.Policy.Class == quota.ClassSecurity {
				continue
			}
			t := ceilSeconds(r.ResetAfter)
			if !r.Allowed {
				t = max(ceilSeconds(r.RetryAfter), 1)
			}
			items = append(items, region.RateLimitItem{Name: a.Policy.ID, Quota: r.Limit,
				Window:    region.WindowSeconds(a.Limit.Algorithm.Windowed(), a.Limit.Window, a.Limit.Rate, a.Limit.Burst),
				Available: r.Remaining, T: t})
		}
		if out.Decider >= 0 {
			decider = enfIdx[out.Decider]
		}
		if !out.Allowed {
			retryAfter = out.RetryAfter()
			d.Status = http.StatusTooManyRequests
			if out.Unavailable {
				d.Status = http.StatusServiceUnavailable
			}
		}
	}
	if len(shadow) > 0 && d.Allowed {
		if out, err := l.lim.Check(ctx, engine.Request{Subject: who.Subject, Checks: shadow}); err == nil {
			for j, r := range out.Results[:len(shadow)] {
				pr := &d.Policies[shIdx[j]]
				fill(pr, r)
				pr.Degraded, pr.Allowed = out.Degraded, true
				if !r.Allowed && !out.Unavailable {
					pr.WouldReject, d.WouldReject = true, true
				}
			}
			if decider < 0 && out.Decider >= 0 {
				decider = shIdx[out.Decider]
			}
		}
	}
	if decider >= 0 {
		pr := d.Policies[decider]
		d.Policy, d.Mode = pr.ID, pr.Mode
		d.Limit, d.Remaining, d.ResetMS, d.RetryAfterMS = pr.Limit, pr.Remaining, pr.ResetMS, pr.RetryAfterMS
		if pr.Mode != quota.ModeEnforce {
			d.RetryAfterMS = 0
		}
	}
	region.SetRateLimitFields(d.Header, items)
	if d.Status != http.StatusOK {
		d.Header["Retry-After"] = []string{strconv.FormatInt(max(ceilSeconds(retryAfter), 1), 10)}
		d.Problem = rejection(d.Status, retryAfter, public, items)
		// As in a daemon's answer to POST /v1/check, which goes to the
		// gateway, not to the client: every violated policy is named.
		d.Problem.ViolatedPolicies = violated
	}
	return d, nil
}

// rejection is the problem of a 429 or 503 decision, worded as the
// daemon's; violated leaves out class security policies.
func rejection(status int, retryAfter time.Duration, violated []string, items []region.RateLimitItem) *client.Problem {
	retry := max(ceilSeconds(retryAfter), 1)
	ms := ceilMS(retryAfter)
	p := &client.Problem{Status: status, RetryAfterMS: &ms, ViolatedPolicies: violated, Title: "Too Many Requests"}
	switch {
	case status == http.StatusServiceUnavailable:
		p.Type = region.ProblemReducedCapacity
		p.Title = "Service Unavailable"
		p.Detail = fmt.Sprintf("The rate limit could not be decided and this route fails closed; retry in %d s.", retry)
	case len(violated) == 0:
		p.Type = region.ProblemAbnormalUsage
		p.Detail = fmt.Sprintf("Too many attempts; retry in %d s.", retry)
	default:
		p.Type = region.ProblemQuotaExceeded
		var q, w int64
		for _, it := range items {
			if it.Name == violated[0] {
				q, w = it.Quota, it.Window
			}
		}
		p.Detail = fmt.Sprintf("Policy %q allows %d requests per %d s for this client; retry in %d s.", violated[0], q, w, retry)
	}
	return p
}

func invalid(field, reason string) *client.Problem {
	detail := reason
	if field != "" {
		detail = field + ": " + reason
	}
	return &client.Problem{Type: region.ProblemInvalid, Title: "Bad Request", Status: http.StatusBadRequest,
		Detail: detail, Errors: []quota.FieldError{{Field: field, Reason: reason}}}
}

func failureOf(s string) engine.Failure {
	switch s {
	case quota.FailClosed:
		return engine.FailClosed
	case quota.FailLocal:
		return engine.FailLocal
	}
	return engine.FailOpen
}

func fill(pr *client.PolicyResult, r engine.Result) {
	pr.Evaluated, pr.Allowed = true, r.Allowed
	pr.Limit, pr.Remaining = r.Limit, r.Remaining
	pr.ResetMS, pr.RetryAfterMS = ceilMS(r.ResetAfter), ceilMS(r.RetryAfter)
}

func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

func ceilMS(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}
