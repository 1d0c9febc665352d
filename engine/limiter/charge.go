package limiter

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluice-rl/sluice/engine"
)

// ErrChargeNotSupported is a charge or reservation for a store that cannot
// keep them.
var ErrChargeNotSupported = errors.New("the store does not charge after the fact")

// Charge charges req after the fact (engine.Charger): through the store,
// under the store's breaker, once. A store that cannot be reached is
// counted (Stats.ChargeErrors), and the charge is never retried: if every
// policy fails open it is dropped (Stats.ChargesDropped) and the Outcome
// is degraded, with no error; otherwise the error is returned. A request
// the store refuses (a bad request, an unknown or expired reservation) is
// an error and charges nothing. A charge ends the subject's remembered
// rejections, as a settlement may refund. Tracked policies count a
// charge's cost as demand and as admitted usage, and a settlement what it
// charged beyond the estimate (whose check counted the estimate); a
// refund is not taken back, as a global quota's counter only grows.
func (l *Limiter) Charge(ctx context.Context, req engine.ChargeRequest) (Outcome, error) {
	if err := req.Validate(); err != nil {
		return Outcome{Decision: engine.Decision{Decider: -1}}, err
	}
	c, ok := l.store.(engine.Charger)
	if !ok {
		return Outcome{Decision: engine.Decision{Decider: -1}}, ErrChargeNotSupported
	}
	if req.Reservation != "" && tracked(req.Checks) {
		req.Held = make([]int64, len(req.Checks))
	}
	call := func() (engine.Decision, error) { return c.Charge(ctx, req) }
	var d engine.Decision
	var err error
	if _, inProcess := l.store.(*engine.MemoryStore); inProcess {
		d, err = call()
	} else {
		d, err = l.breaker(ctx, req.Subject).Execute(call)
	}
	if err != nil {
		if errors.Is(err, engine.ErrBadRequest) || errors.Is(err, engine.ErrUnknownReservation) || ctx.Err() != nil {
			return Outcome{Decision: engine.Decision{Decider: -1}}, err
		}
		l.chargeErrors.Add(1)
		l.logSometimes("charge failed", err)
		for i := range req.Checks {
			if req.Checks[i].OnFailure != engine.FailOpen {
				return Outcome{Decision: engine.Decision{Decider: -1}}, fmt.Errorf("charge not applied: %w", err)
			}
		}
		l.chargesDropped.Add(1)
		return Outcome{Decision: engine.Decision{Decider: -1, N: len(req.Checks)}, Degraded: true, Err: err}, nil
	}
	if l.deny != nil {
		l.deny.forget(req.Subject)
	}
	l.trackCharge(req, d)
	return Outcome{Decision: d, Source: engine.FromStore}, nil
}

// Reserve records an estimate to settle by id within ttl
// (engine.Reserver), with the caller's deadline.
func (l *Limiter) Reserve(ctx context.Context, subject, id string, checks []engine.Check, ttl time.Duration) error {
	r, ok := l.store.(engine.Reserver)
	if !ok {
		return ErrChargeNotSupported
	}
	return r.Reserve(ctx, subject, id, checks, ttl)
}

func tracked(checks []engine.Check) bool {
	for i := range checks {
		if checks[i].Track {
			return true
		}
	}
	return false
}

// trackCharge counts what an applied charge spent under its tracked
// policies: the whole cost, or for a settlement the cost beyond the
// estimate its reservation held (the store reports it in req.Held).
func (l *Limiter) trackCharge(req engine.ChargeRequest, d engine.Decision) {
	var now time.Time
	for i := range req.Checks {
		ch := &req.Checks[i]
		if !ch.Track {
			continue
		}
		units := ch.Cost
		if req.Reservation != "" {
			if len(req.Held) != len(req.Checks) {
				continue
			}
			units -= req.Held[i]
		}
		if now.IsZero() {
			now = l.clock.Now()
		}
		l.usage.add(req.Subject, ch.Policy, max(units, 0), true, d.Results[i].Remaining, now)
	}
}
