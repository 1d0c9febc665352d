package decide

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/share"
)

// The stages of a decision, in order: resolve, match, scale, enforce,
// shadow, answer. Each is a function of its own so that a reader can skip
// to the one they need.

// resolve is the first stage: the subject and tier that id counts as,
// through the key registry.
func (dc *Decider) resolve(id quota.Identity) quota.Principal {
	return dc.reg.Resolve(id)
}

// match is the second stage: the policies that apply to who's request t,
// appended to applied, and those who is exempt from, appended to exempt.
func (dc *Decider) match(applied []quota.Applied, exempt []quota.Exemption, who quota.Principal, t Target) ([]quota.Applied, []quota.Exemption) {
	return dc.reg.AppendMatchExempt(applied, exempt, quota.Query{Tier: who.Tier, Subject: who.Subject, Method: t.Method, Route: t.Route})
}

// newVerdict is the verdict before any policy is decided: allowed, from
// source none, with one result per applied policy.
func newVerdict(who quota.Principal, applied []quota.Applied, exempt []quota.Exemption) Verdict {
	v := Verdict{Status: http.StatusOK}
	v.Allowed = true
	v.Subject, v.Tier = who.Subject, who.Tier
	v.Source = "none"
	v.Policies = make([]PolicyResult, len(applied))
	v.Exempt = ExemptResults(exempt)
	return v
}

// plan is the limiter checks of a decision, enforced and shadow apart,
// with the index in applied of each.
type plan struct {
	enforced, shadow []engine.Check
	enfIdx, shIdx    [engine.MaxChecks]int
	quotaAt          [engine.MaxChecks]bool // enforced global quotas
	ne, ns           int
}

// scale is the third stage: it turns each applied policy into a limiter
// check, global ones scaled by the region's share (or, for a global
// quota, by the other regions' counts), with cost, when not nil, in place
// of every policy's own. A cost a policy cannot admit is a 400 problem on
// field's cost.
func (dc *Decider) scale(pl *plan, v *Verdict, who quota.Principal, applied []quota.Applied, cost *int64, field string) *Problem {
	// The limiter keeps its request's checks beyond the stack (they go
	// through the store interface), so both sets share one allocation of
	// exactly their size: the enforced checks first, then the shadow ones.
	nEnforced := 0
	for i := range applied {
		if applied[i].Policy.Mode == quota.ModeEnforce {
			nEnforced++
		}
	}
	var checks []engine.Check
	if len(applied) > 0 {
		checks = make([]engine.Check, len(applied))
	}
	pl.enforced, pl.shadow = checks[:nEnforced:nEnforced], checks[nEnforced:]
	for i, a := range applied {
		p := a.Policy
		c := a.Cost
		if cost != nil {
			c = *cost
			if p := costProblem(a, c, field); p != nil {
				return p
			}
		}
		scale, isQuota := dc.scaleOf(a, who.Subject)
		ch := engine.Check{Policy: a.StateName(), Subject: a.Subject, Limit: a.Limit, Cost: c, Scale: scale, Version: uint64(p.Version), OnFailure: failureOf(p.OnStoreFailure), Lease: p.LeaseSize()}
		v.Policies[i] = PolicyResult{ID: p.ID, Version: p.Version, Mode: p.Mode, Class: p.Class, Scope: p.Scope, Cost: c, Override: a.Override, Allowed: true}
		if p.Scope == quota.ScopeGlobal {
			v.Policies[i].Scale = scale
			// Shadow policies are tracked too: a global one previews
			// what enforcement would do, which depends on what every
			// region admits (its share, or its quota's count), so the
			// others must hear of it.
			ch.Track = dc.track
		}
		if p.Mode == quota.ModeEnforce {
			pl.quotaAt[pl.ne] = isQuota
			pl.enforced[pl.ne], pl.enfIdx[pl.ne] = ch, i
			pl.ne++
		} else {
			pl.shadow[pl.ns], pl.shIdx[pl.ns] = ch, i
			pl.ns++
		}
	}
	return nil
}

// costProblem is the 400 problem of a cost a's limit cannot admit, nil if
// it can.
func costProblem(a quota.Applied, cost int64, field string) *Problem {
	err := a.Limit.ValidateCost(cost)
	if err == nil {
		return nil
	}
	reason := err.Error()
	var le *engine.LimitError
	if errors.As(err, &le) {
		reason = le.Reason
	}
	f := "cost"
	if field != "" {
		f = field + ".cost"
	}
	return Invalid(f, "policy %s cannot admit it: %s", a.Policy.ID, reason)
}

// scaleOf is the scale of a's limit for subject: 1 for a policy of region
// scope; for a global quota, the G-counter rule over the other regions'
// counts (isQuota true); for any other global policy, the region's share.
// Both are looked up by a's state name, the name its usage is tracked
// under, so that a descriptor policy has a share per descriptor value.
func (dc *Decider) scaleOf(a quota.Applied, subject string) (scale float64, isQuota bool) {
	if a.Policy.Scope != quota.ScopeGlobal {
		return 1, false
	}
	name := a.StateName()
	if dc.quotas != nil && a.Limit.Algorithm == engine.FixedWindow {
		others := dc.quotas.QuotaOthers(name, subject, share.WindowIndex(dc.now(), a.Limit.Window))
		return share.QuotaScale(a.Limit.Count, others), true
	}
	return share.Scale(dc.shares.Share(name, subject)), false
}

// failureOf is the engine's spelling of an on_store_failure mode.
func failureOf(s string) engine.Failure {
	switch s {
	case quota.FailClosed:
		return engine.FailClosed
	case quota.FailLocal:
		return engine.FailLocal
	}
	return engine.FailOpen
}

// enforce is the fourth stage: the enforced checks in one all-or-nothing
// limiter call, whose outcome is the verdict. It returns the index in
// applied of the deciding policy, -1 for none. A limiter error is a
// problem: 503 when ctx was cancelled, else 400 on field.
func (dc *Decider) enforce(ctx context.Context, pl *plan, v *Verdict, who quota.Principal, applied []quota.Applied, field string) (int, *Problem) {
	if pl.ne == 0 {
		return -1, nil
	}
	out, err := dc.lim.Check(ctx, engine.Request{Subject: who.Subject, Checks: pl.enforced[:pl.ne]})
	if err != nil {
		if ctx.Err() != nil {
			return -1, NewProblem(http.StatusServiceUnavailable, ProblemUnavailable, "the request was cancelled before it was decided")
		}
		return -1, Invalid(field, "%v", err)
	}
	for j := 0; j < pl.ne; j++ {
		// A global quota never needs more than its window's end: the
		// others' counts start again from zero in the next window.
		if r := &out.Results[j]; pl.quotaAt[j] && !r.Allowed && r.RetryAfter > r.ResetAfter {
			r.RetryAfter = r.ResetAfter
		}
	}
	v.Source = out.Source.String()
	v.Degraded = out.Degraded
	v.Allowed = out.Allowed
	for j := 0; j < pl.ne; j++ {
		r := out.Results[j]
		i := pl.enfIdx[j]
		pr := &v.Policies[i]
		pr.Fill(r)
		pr.Degraded = out.Degraded
		p := applied[i].Policy
		if !r.Allowed && !out.Allowed {
			v.addViolated(p, pl.ne)
		}
		if p.Class != quota.ClassSecurity {
			v.Headers = append(v.Headers, headerItem(p.ID, applied[i].Limit.Scale(pl.enforced[j].Scale), r))
		}
	}
	decider := -1
	if out.Decider >= 0 {
		decider = pl.enfIdx[out.Decider]
	}
	if !out.Allowed {
		v.RetryAfter = out.RetryAfter()
		v.Status = http.StatusTooManyRequests
		if out.Unavailable {
			v.Status = http.StatusServiceUnavailable
		}
		v.SecurityOnly = len(v.ViolatedPublic) == 0
	}
	return decider, nil
}

// addViolated lists p among the policies that rejected v; n bounds how
// many there can be.
func (v *Verdict) addViolated(p *quota.Policy, n int) {
	if v.Violated == nil {
		// One allocation for both lists, each of at most n.
		ids := make([]string, 0, 2*n)
		v.Violated, v.ViolatedPublic = ids[:0:n], ids[n:n]
	}
	v.Violated = append(v.Violated, p.ID)
	if p.Class != quota.ClassSecurity {
		v.ViolatedPublic = append(v.ViolatedPublic, p.ID)
	}
}

// headerItem is the RateLimit item of policy id, with limit l as scaled
// for the check, decided r.
func headerItem(id string, l engine.Limit, r engine.Result) HeaderItem {
	t := ceilSeconds(r.ResetAfter)
	if !r.Allowed {
		// Retry-After must not point before the end of the effective
		// window, so a rejecting policy's window ends when it would
		// admit.
		t = max(ceilSeconds(r.RetryAfter), 1)
	}
	return HeaderItem{Name: id, Quota: r.Limit, Window: windowSeconds(l.Algorithm.Windowed(), l.Window, l.Rate, l.Burst),
		Available: r.Remaining, T: t}
}

// shadow is the fifth stage: the shadow checks in a limiter call of their
// own, only when the enforced ones allowed. Their results never change
// the verdict, but a shadow policy may decide the figures when no
// enforced one did (*decider < 0). It returns the source of the shadow
// decision, "none" when there was none or the limiter failed.
func (dc *Decider) shadow(ctx context.Context, pl *plan, v *Verdict, who quota.Principal, decider *int) string {
	if pl.ns == 0 || !v.Allowed {
		return "none"
	}
	out, err := dc.lim.Check(ctx, engine.Request{Subject: who.Subject, Checks: pl.shadow[:pl.ns]})
	if err != nil {
		return "none"
	}
	for j := 0; j < pl.ns; j++ {
		r := out.Results[j]
		pr := &v.Policies[pl.shIdx[j]]
		pr.Fill(r)
		pr.Degraded = out.Degraded
		pr.Allowed = true
		if !r.Allowed && !out.Unavailable {
			pr.WouldReject = true
			v.WouldReject = true
		}
	}
	if *decider < 0 && out.Decider >= 0 {
		*decider = pl.shIdx[out.Decider]
	}
	return out.Source.String()
}

// answer is the last stage: the decision's headline figures are those of
// the deciding policy, the one at index decider (none when negative). A
// shadow policy never gives a retry.
func (dc *Decider) answer(v *Verdict, decider int) {
	if decider < 0 {
		return
	}
	pr := v.Policies[decider]
	v.Policy, v.Mode = pr.ID, pr.Mode
	v.Limit, v.Remaining, v.ResetMS, v.RetryAfterMS = pr.Limit, pr.Remaining, pr.ResetMS, pr.RetryAfterMS
	if pr.Mode != quota.ModeEnforce {
		v.RetryAfterMS = 0
	}
}

// Fill copies the limiter's result r into pr, which is then evaluated.
func (pr *PolicyResult) Fill(r engine.Result) {
	pr.Evaluated = true
	pr.Allowed = r.Allowed
	pr.Limit, pr.Remaining = r.Limit, r.Remaining
	pr.ResetMS = ceilMS(r.ResetAfter)
	pr.RetryAfterMS = ceilMS(r.RetryAfter)
}

// ceilMS rounds d up to whole milliseconds; zero and negative are 0.
func ceilMS(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}
