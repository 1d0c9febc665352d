package decide

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/quota"
)

// Charger is a Limiter that also charges after the fact and keeps
// reservations; a *limiter.Limiter (engine/limiter) is one.
type Charger interface {
	Charge(ctx context.Context, req engine.ChargeRequest) (engine.Outcome, error)
	Reserve(ctx context.Context, subject, id string, checks []engine.Check, ttl time.Duration) error
}

// ChargeRequest is the body of POST /v1/charge: the requester and the
// request, as in a CheckRequest, and what it turned out to cost.
type ChargeRequest struct {
	quota.SubjectFields
	Tier   string `json:"tier,omitempty"`
	Method string `json:"method,omitempty"`
	Route  string `json:"route"`
	// Cost is what the request cost, charged to every policy that applies
	// to it; required, from 0 to engine.MaxChargeCost.
	Cost *int64 `json:"cost"`
	// Reservation, when given, settles the reservation a check of an
	// estimate made: each policy is charged Cost less the estimate, or
	// refunded the difference.
	Reservation string `json:"reservation,omitempty"`
}

// ChargeAnswer is the body of a charge's 200 answer.
type ChargeAnswer struct {
	Subject string `json:"subject"`
	Tier    string `json:"tier"`
	// OverLimit is true when an enforced policy is past its limit after
	// the charge: checks are refused until RetryAfterMS has passed.
	OverLimit    bool  `json:"over_limit"`
	RetryAfterMS int64 `json:"retry_after_ms"`
	// Degraded is true when the store could not be reached and the
	// charge was dropped, as its policies fail open.
	Degraded bool `json:"degraded"`
	// Policies holds each charged policy's figures after the charge;
	// Allowed is false for one past its limit.
	Policies []PolicyResult `json:"policies"`
}

// DefaultReservationTTL is how long a check's reservation is held when
// the check names no reservation_ttl_ms.
const DefaultReservationTTL = 5 * time.Minute

// Charge charges in's cost, after the fact, to every policy that applies
// to its requester and route (enforced and shadow, not those the
// requester is exempt from), past their limits if need be. Bad input is
// a 400 problem naming the field and charges nothing: a missing or
// negative cost, a policy the charge cannot apply to (a sliding window
// log), a request no policy applies to, an unknown or expired
// reservation. A store that cannot be reached is a 503 problem unless
// every policy fails open, when the charge is dropped (Degraded).
func (dc *Decider) Charge(ctx context.Context, in ChargeRequest) (ChargeAnswer, *Problem) {
	ch, ok := dc.lim.(Charger)
	if !ok {
		return ChargeAnswer{}, NewProblem(http.StatusNotImplemented, ProblemInternal, "this limiter does not charge after the fact")
	}
	if in.Cost == nil {
		return ChargeAnswer{}, Invalid("cost", "required: what the request cost, in the policies' units")
	}
	if c := *in.Cost; c < 0 || float64(c) > engine.MaxChargeCost {
		return ChargeAnswer{}, Invalid("cost", "must be from 0 to %g, got %d", engine.MaxChargeCost, c)
	}
	if len(in.Reservation) > engine.MaxReservationID {
		return ChargeAnswer{}, Invalid("reservation", "must be at most %d bytes", engine.MaxReservationID)
	}
	ci := CheckRequest{SubjectFields: in.SubjectFields, Tier: in.Tier, Method: in.Method, Route: in.Route}
	t, p := ci.Target("")
	if p != nil {
		return ChargeAnswer{}, p
	}
	who := dc.resolve(t.ID)
	var buf [2 * engine.MaxChecks]quota.Applied
	var exBuf [engine.MaxChecks]quota.Exemption
	applied, _ := dc.match(buf[:0], exBuf[:0], who, t)
	if len(applied) == 0 {
		return ChargeAnswer{}, Invalid("route", "no policy applies to %s %s for this requester: nothing charged", t.Method, Clip(t.Route))
	}
	cost := *in.Cost
	return dc.chargeApplied(ctx, ch, who, applied, in.Reservation, func(quota.Applied) int64 { return cost })
}

// chargeApplied charges each of applied the cost costOf gives it, settling
// reservation when not empty; see Charge for the problems.
func (dc *Decider) chargeApplied(ctx context.Context, ch Charger, who quota.Principal, applied []quota.Applied, reservation string, costOf func(quota.Applied) int64) (ChargeAnswer, *Problem) {
	req := engine.ChargeRequest{Subject: who.Subject, Checks: make([]engine.Check, len(applied)), Reservation: reservation}
	for i, a := range applied {
		if a.Limit.Algorithm == engine.SlidingWindowLog {
			return ChargeAnswer{}, Invalid("route", "policy %s is a sliding_window_log, which cannot be charged after the fact (it keeps one timestamp per unit, at most its count): nothing charged", a.Policy.ID)
		}
		req.Checks[i] = dc.chargeCheck(a, who.Subject, costOf(a))
	}
	out, err := ch.Charge(ctx, req)
	if err != nil {
		return ChargeAnswer{}, chargeProblem(ctx, err)
	}
	return chargeAnswer(who, applied, req.Checks, out), nil
}

// ChargeStates charges applied, policies already matched by the caller (a
// rate limit service matches descriptors, not routes), for subject, each
// its own Cost, after the fact and past their limits if need be: what
// Envoy's second call on stream done (apply_on_stream_done) asks for,
// whose hits count even over the limit and whose answer Envoy ignores.
// At most quota.MaxPoliciesPerRequest policies with distinct state names;
// an error is a charge refused (a sliding window log, a cost out of
// range, a store that cannot be reached by a policy that does not fail
// open), and charges nothing.
func (dc *Decider) ChargeStates(ctx context.Context, subject string, applied []quota.Applied) (ChargeAnswer, error) {
	ch, ok := dc.lim.(Charger)
	if !ok {
		return ChargeAnswer{}, errors.New("this limiter does not charge after the fact")
	}
	if len(applied) > quota.MaxPoliciesPerRequest {
		return ChargeAnswer{}, errors.New("too many policies for one charge")
	}
	ans, p := dc.chargeApplied(ctx, ch, quota.Principal{Subject: subject}, applied, "", func(a quota.Applied) int64 { return a.Cost })
	if p != nil {
		return ChargeAnswer{}, p
	}
	return ans, nil
}

// chargeCheck is the limiter check that charges cost to a for subject,
// scaled as a check of it is.
func (dc *Decider) chargeCheck(a quota.Applied, subject string, cost int64) engine.Check {
	p := a.Policy
	scale, _ := dc.scaleOf(a, subject)
	c := engine.Check{Policy: a.StateName(), Subject: a.Subject, Limit: a.Limit, Cost: cost, Scale: scale, Version: uint64(p.Version), OnFailure: failureOf(p.OnStoreFailure)}
	if p.Scope == quota.ScopeGlobal {
		c.Track = dc.track
	}
	return c
}

// chargeProblem is the problem of a charge the limiter refused.
func chargeProblem(ctx context.Context, err error) *Problem {
	switch {
	case ctx.Err() != nil:
		return NewProblem(http.StatusServiceUnavailable, ProblemUnavailable, "the request was cancelled before it was charged")
	case errors.Is(err, engine.ErrUnknownReservation):
		return Invalid("reservation", "unknown, expired or already settled: nothing charged")
	case errors.Is(err, engine.ErrBadRequest):
		return Invalid("", "%v", err)
	}
	return NewProblem(http.StatusServiceUnavailable, ProblemStateStore, fmt.Sprintf("the charge could not reach the state store and a policy does not fail open: %v", err))
}

// chargeAnswer shapes the limiter's outcome of a charge.
func chargeAnswer(who quota.Principal, applied []quota.Applied, checks []engine.Check, out engine.Outcome) ChargeAnswer {
	ans := ChargeAnswer{Subject: who.Subject, Tier: who.Tier, Degraded: out.Degraded, Policies: make([]PolicyResult, len(applied))}
	for i, a := range applied {
		p := a.Policy
		pr := &ans.Policies[i]
		*pr = PolicyResult{ID: p.ID, Version: p.Version, Mode: p.Mode, Class: p.Class, Scope: p.Scope, Cost: checks[i].Cost, Override: a.Override, Allowed: true}
		if p.Scope == quota.ScopeGlobal {
			pr.Scale = checks[i].Scale
		}
		if out.Degraded {
			continue
		}
		pr.Fill(out.Results[i])
		if !pr.Allowed && p.Mode == quota.ModeEnforce {
			ans.OverLimit = true
			ans.RetryAfterMS = max(ans.RetryAfterMS, pr.RetryAfterMS)
		}
	}
	return ans
}

// reserve holds the estimate that v's allowed check t spent under its
// enforced policies, as reservation t.Reservation, for Charge to settle.
// It returns a 503 problem when the reservation could not be recorded:
// the estimate stays spent, and the caller charges the difference without
// a reservation.
func (dc *Decider) reserve(ctx context.Context, t Target, who quota.Principal, checks []engine.Check) *Problem {
	ch, ok := dc.lim.(Charger)
	if !ok {
		return NewProblem(http.StatusNotImplemented, ProblemInternal, "this limiter keeps no reservations")
	}
	ttl := t.ReservationTTL
	if ttl == 0 {
		ttl = DefaultReservationTTL
	}
	if err := ch.Reserve(ctx, who.Subject, t.Reservation, checks, ttl); err != nil {
		return NewProblem(http.StatusServiceUnavailable, ProblemStateStore,
			fmt.Sprintf("the estimate was spent but reservation %q could not be recorded (charge the difference without it): %v", Clip(t.Reservation), err))
	}
	return nil
}
