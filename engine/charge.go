package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/sluice-rl/sluice/engine/internal/quant"
)

// A charge spends a cost that is known only after a request was served
// (the tokens a completion used, the bytes a download sent, a failed
// login) with no admission decision: it always applies, and the state may
// go past its limit. A token bucket goes into debt (negative tokens) and
// refills from there at its rate; a leaky bucket's level rises above its
// burst and drains from there; a fixed window or a sliding window counter
// counts past its count. Until the state is back within its limit, every
// check of a positive cost is refused, with a RetryAfter that says when
// the debt is paid: at the bucket's rate, or as the window passes.
//
// The sliding window log cannot hold a debt: it keeps one timestamp per
// admitted unit, at most its count of them, so that its memory and its
// work per check stay bounded by the limit. A charge to it is refused
// (ErrChargeUnsupported); use the sliding window counter for a window
// that charges after the fact.
//
// A reservation is a check of an estimated cost whose policies and costs
// the store remembers under an id until it expires (Reserver.Reserve).
// Settling it (ChargeRequest.Reservation) charges each policy the real
// cost less its estimate, or refunds the difference when the estimate
// was higher: a bucket gets the units back (a token bucket up to its
// burst), a window only while the window the estimate was spent in is
// still counted (a fixed window's current one; the current or previous
// one of a sliding window counter). A reservation settles once.

// Errors of charges, for errors.Is.
var (
	ErrChargeUnsupported  = errors.New("the sliding window log cannot be charged after the fact")
	ErrUnknownReservation = errors.New("unknown or expired reservation")
)

// MaxChargeCost bounds the cost of one charge to one policy, as Validate
// bounds a limit: the counts and debts it builds stay exact.
const MaxChargeCost = 1e12

// MaxReservationID bounds a reservation id's length in bytes.
const MaxReservationID = 128

// ChargeRequest charges Subject, after the fact, under every one of
// Checks: each Check's Cost is what the request turned out to cost
// (Deposit must be false, Cost from zero to MaxChargeCost). With a
// Reservation it settles that reservation instead: each policy is charged
// its Cost less the reservation's estimate for it, or refunded the
// difference; a policy the reservation does not hold is charged its whole
// Cost, and one the settlement does not name keeps its estimate spent.
type ChargeRequest struct {
	Subject     string
	Checks      []Check
	Reservation string
	// Held, when as long as Checks, receives from a store that settles
	// Reservation each policy's estimate the reservation held (zero for a
	// policy it did not hold), so that the caller knows what the
	// settlement charged: Cost less Held. A store writes nothing there
	// on an error or without a Reservation.
	Held []int64
}

// Charger is a store that charges after the fact. Charge applies every
// policy of the request or, when it returns an error, none. The Decision
// has one Result per check, read after the charge: Allowed when the state
// is within its limit, otherwise RetryAfter is the time until the debt is
// paid; Decision.Allowed when every policy is within its limit.
type Charger interface {
	Charge(ctx context.Context, req ChargeRequest) (Decision, error)
}

// Reserver is a store that keeps reservations. Reserve records that
// subject spent each check's Cost under its policy at the store's now, as
// an estimate to settle by id within ttl. An id already held by the
// subject is replaced.
type Reserver interface {
	Reserve(ctx context.Context, subject, id string, checks []Check, ttl time.Duration) error
}

// Validate rejects what no store can charge. The error names the check's
// field: a *LimitError with Field "cost" or "algorithm" where that is what
// is wrong.
func (r *ChargeRequest) Validate() error {
	req := Request{Subject: r.Subject, Checks: r.Checks}
	if err := req.Validate(); err != nil {
		return err
	}
	if len(r.Reservation) > MaxReservationID {
		return fmt.Errorf("%w: reservation id of %d bytes, at most %d", ErrBadRequest, len(r.Reservation), MaxReservationID)
	}
	if r.Reservation != "" && req.Spans() {
		return fmt.Errorf("%w: a reservation is of one subject; its checks name others", ErrBadRequest)
	}
	for i := range r.Checks {
		c := &r.Checks[i]
		if c.Deposit {
			return fmt.Errorf("%w: policy %q: a charge is not a deposit", ErrBadRequest, c.Policy)
		}
		if float64(c.Cost) > MaxChargeCost {
			return fmt.Errorf("%w: policy %q: %w", ErrBadRequest, c.Policy,
				&LimitError{Field: "cost", Reason: fmt.Sprintf("must be at most %g, got %d", MaxChargeCost, c.Cost), err: ErrInvalidLimit})
		}
		if c.Limit.Algorithm == SlidingWindowLog {
			return fmt.Errorf("%w: policy %q: %w", ErrBadRequest, c.Policy,
				&LimitError{Field: "algorithm", Reason: ErrChargeUnsupported.Error() + ": it keeps one timestamp per unit, at most its count (use sliding_window_counter)", err: ErrChargeUnsupported})
		}
	}
	return nil
}

// Charge spends units under l at now whatever st holds, as a store
// charges one policy: the state may go past the limit (see ChargeRequest).
// A negative units is a refund of a reservation made at time at (Unix µs);
// at is ignored otherwise. The Result is the state's after the charge, as
// ChargeResult reads it. It is pure; l must be valid and not a sliding
// window log.
func Charge(now time.Time, st State, l Limit, units int64, at int64) (State, Result) {
	us := now.UnixMicro()
	next := counters{a: st.A, b: st.B, t: st.T}
	chargeCounters(us, &next, &l, float64(units), at)
	out := State{A: next.a, B: next.b, T: next.t}
	return out, ChargeResult(now, out, l)
}

// ChargeResult reads a state after a charge: what a check of no cost
// reports, so Allowed is false while the state is past its limit and
// RetryAfter is then the time until it is back within it.
func ChargeResult(now time.Time, st State, l Limit) Result {
	next := counters{a: st.A, b: st.B, t: st.T}
	var r Result
	decide(now.UnixMicro(), &next, &l, 0, &r)
	return r
}

// chargeCounters brings st to now as a check would (refill, drain, a new
// window) and adds units, past the limit if need be. Every floating-point
// operation is mirrored, in the same order, by the Redis store's
// charge.lua: change both.
func chargeCounters(now int64, st *counters, l *Limit, units float64, at int64) {
	switch l.Algorithm {
	case TokenBucket:
		tokens, t := l.Burst, now
		if st.t != 0 {
			tokens, t = st.a, st.t
			if now > t {
				tokens = tokens + (float64(now-t)*l.Rate)/usPerSec
				t = now
			}
			if tokens > l.Burst {
				tokens = l.Burst
			}
		}
		tokens = tokens - units
		if tokens > l.Burst {
			tokens = l.Burst // a refund fills up to the burst
		}
		st.a, st.b, st.t = quant.Down(tokens), 0, t
	case LeakyBucket:
		level, t := 0.0, now
		if st.t != 0 {
			level, t = st.a, st.t
			if now > t {
				level = math.Max(0, level-(float64(now-t)*l.Rate)/usPerSec)
				t = now
			}
		}
		level = math.Max(0, level+units)
		st.a, st.b, st.t = quant.Up(level), 0, t
	case FixedWindow:
		w := windowUs(l)
		start := now - now%w
		if st.t == 0 || start > st.t {
			st.a, st.t = 0, start
		}
		if units >= 0 || at-at%w == st.t {
			st.a = quant.StoredCount(st.a + units)
		}
		st.b = 0
	case SlidingWindowCounter:
		w := windowUs(l)
		start := now - now%w
		switch {
		case st.t == 0:
			st.a, st.b, st.t = 0, 0, start
		case start == st.t+w:
			st.a, st.b, st.t = 0, st.a, start
		case start > st.t:
			st.a, st.b, st.t = 0, 0, start
		}
		switch wa := at - at%w; {
		case units >= 0 || wa == st.t:
			st.a = quant.StoredCount(st.a + units)
		case wa+w == st.t:
			st.b = quant.StoredCount(st.b + units)
		}
	}
}

// ChargeTTL is how long a store keeps a state after a charge at now: as
// after a check (until the bucket is full or empty again, or the window
// no longer matters), scale f as Check.ScaleFactor gives it.
func ChargeTTL(now int64, st State, l Limit, f float64) time.Duration {
	c := counters{a: st.A, b: st.B, t: st.T}
	return usToDuration(ttl(now, &c, nil, &l, f))
}

// MaxReservationTTL bounds how long a reservation may be held.
const MaxReservationTTL = 24 * time.Hour

// ValidateReservation rejects a reservation no store can keep: an empty
// subject or id, an id longer than MaxReservationID, a ttl outside
// (0, MaxReservationTTL], more than MaxChecks policies or a negative cost.
func ValidateReservation(subject, id string, checks []Check, ttl time.Duration) error {
	switch {
	case subject == "":
		return fmt.Errorf("%w: empty subject", ErrBadRequest)
	case id == "" || len(id) > MaxReservationID:
		return fmt.Errorf("%w: reservation id of %d bytes, want 1 to %d", ErrBadRequest, len(id), MaxReservationID)
	case ttl <= 0 || ttl > MaxReservationTTL:
		return fmt.Errorf("%w: reservation ttl %v outside (0, %v]", ErrBadRequest, ttl, MaxReservationTTL)
	case len(checks) > MaxChecks:
		return fmt.Errorf("%w: %d policies, at most %d", ErrBadRequest, len(checks), MaxChecks)
	}
	for i := range checks {
		if checks[i].Cost < 0 || checks[i].Policy == "" {
			return fmt.Errorf("%w: check %d: a reservation holds a named policy and a cost of zero or more", ErrBadRequest, i)
		}
		if s := checks[i].Subject; s != "" && s != subject {
			return fmt.Errorf("%w: check %d: a reservation is of one subject; the check names another", ErrBadRequest, i)
		}
	}
	return nil
}
