package engine

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// MaxChecks is the most policies one check may name. A Decision holds its
// results in a fixed array so that a check allocates nothing.
const MaxChecks = 8

// Clock tells the time. A nil Clock means the real one; the simulator passes
// virtual time.
type Clock interface {
	Now() time.Time
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// ClockOrReal returns c, or the real clock when c is nil.
func ClockOrReal(c Clock) Clock {
	if c == nil {
		return realClock{}
	}
	return c
}

// Check is one policy to apply to the request's subject.
type Check struct {
	// Policy names the state: a subject has one state per policy, so it
	// must stay the same across policy versions that should share counts.
	Policy string
	Limit  Limit
	// Cost is the units this request spends under this policy; zero reads
	// the state and spends nothing.
	Cost int64
	// Scale is the fraction of Limit this region enforces (a share of a
	// global limit). Zero or one means the whole limit. A changed Scale
	// takes effect on the next check without resetting state.
	Scale float64
	// Version is the policy version the limit comes from. Stores ignore
	// it; the Limiter's deny cache keys on it so that a raised limit takes
	// effect on the very next check.
	Version uint64
	// OnFailure is what the Limiter does with this policy when the store
	// cannot decide. Stores ignore it.
	OnFailure Failure
	// Track asks the Limiter to count this policy's demand and admissions
	// for global shares (DrainUsage).
	Track bool
	// Deposit puts Cost units back into a token bucket instead of spending
	// them, up to its capacity (units beyond it are lost, as refill of a
	// full bucket is): the tokens another region took out of its own
	// bucket and handed over. A deposit is always allowed, must be the
	// request's only check, of a token bucket, with a positive cost, and
	// is never tracked or answered from the deny cache.
	Deposit bool
	// Subject, when set, is the subject whose state this check spends in
	// place of the request's. One request may then span subjects, still
	// decided all or nothing, on a store that can decide them in one call:
	// the memory store (its shards locked in a fixed order), a single
	// Redis server or Sentinel (one script over keys of several hash
	// tags). A Redis Cluster refuses it: one call reaches one slot. What
	// the Limiter keeps per subject (the deny cache, demand and admissions
	// for shares, leases) stays under the request's subject and the policy.
	Subject string
	// Lease, when positive, lets the Limiter serve this policy from a
	// local lease of at most Lease tokens taken from the store's bucket in
	// one call (see engine/limiter's lease.go) when the request has no
	// other check. Zero sends every check to the store. Only a token
	// bucket leases. Stores ignore it.
	Lease int64
}

// Request asks whether Subject may spend under every one of Checks.
type Request struct {
	Subject string
	Checks  []Check
}

// Decision is the verdict on a Request: allowed only if every policy
// allows, in which case every policy's state was spent; otherwise none was.
type Decision struct {
	Allowed bool
	// Decider indexes the result that decided: the rejecting policy with
	// the longest RetryAfter or, when allowed, the one with least
	// Remaining. It is -1 for a request without checks.
	Decider int
	// N is how many entries of Results are in use, one per Check, in order.
	N       int
	Results [MaxChecks]Result
}

// Policies returns the per-policy results, in the order of the checks.
func (d *Decision) Policies() []Result { return d.Results[:d.N] }

// RetryAfter is the deciding policy's retry-after: zero when allowed.
func (d *Decision) RetryAfter() time.Duration {
	if d.Allowed || d.Decider < 0 {
		return 0
	}
	return d.Results[d.Decider].RetryAfter
}

// ErrBadRequest marks a request the engine refuses to decide.
var ErrBadRequest = errors.New("bad check request")

// Validate rejects what no store can decide. Limits are cheap to check, so
// each check re-validates rather than trusting its caller.
func (r *Request) Validate() error {
	if r.Subject == "" {
		return fmt.Errorf("%w: empty subject", ErrBadRequest)
	}
	if len(r.Checks) > MaxChecks {
		return fmt.Errorf("%w: %d policies, at most %d", ErrBadRequest, len(r.Checks), MaxChecks)
	}
	for i := range r.Checks {
		c := &r.Checks[i]
		if c.Policy == "" {
			return fmt.Errorf("%w: check %d has no policy", ErrBadRequest, i)
		}
		if err := c.Limit.Validate(); err != nil {
			return fmt.Errorf("%w: policy %q: %w", ErrBadRequest, c.Policy, err)
		}
		if c.Cost < 0 {
			return fmt.Errorf("%w: policy %q: negative cost %d", ErrBadRequest, c.Policy, c.Cost)
		}
		if c.Deposit && (len(r.Checks) != 1 || c.Limit.Algorithm != TokenBucket || c.Cost == 0 || c.Track) {
			return fmt.Errorf("%w: policy %q: a deposit is the only check of its request, of a token bucket, untracked, with a positive cost", ErrBadRequest, c.Policy)
		}
		if c.Lease != 0 && (c.Lease < 0 || c.Limit.Algorithm != TokenBucket || c.Deposit) {
			return fmt.Errorf("%w: policy %q: a lease is of a token bucket, positive, and not a deposit", ErrBadRequest, c.Policy)
		}
		for j := 0; j < i; j++ {
			if r.Checks[j].Policy == c.Policy && r.Checks[j].SubjectOf(r.Subject) == c.SubjectOf(r.Subject) {
				return fmt.Errorf("%w: policy %q named twice", ErrBadRequest, c.Policy)
			}
		}
		if !(c.Scale >= 0 && c.Scale <= 1) {
			return fmt.Errorf("%w: policy %q: scale %v outside [0, 1]", ErrBadRequest, c.Policy, c.Scale)
		}
	}
	return nil
}

// SubjectOf is the subject whose state c spends in a request of subject:
// c.Subject if set, else subject.
func (c *Check) SubjectOf(subject string) string {
	if c.Subject != "" {
		return c.Subject
	}
	return subject
}

// Spans reports whether r has a check of a subject other than its own.
func (r *Request) Spans() bool {
	for i := range r.Checks {
		if s := r.Checks[i].Subject; s != "" && s != r.Subject {
			return true
		}
	}
	return false
}

// Units is the cost the algorithms apply: Cost, or its negative for a
// deposit (the token bucket then gains the units, up to its burst).
func (c *Check) Units() int64 {
	if c.Deposit {
		return -c.Cost
	}
	return c.Cost
}

// ScaleFactor is the factor Effective applies: Scale, or 1 for "all".
func (c *Check) ScaleFactor() float64 {
	if c.Scale > 0 && c.Scale < 1 {
		return c.Scale
	}
	return 1
}

// Effective is the limit a check enforces after regional scaling.
func (c *Check) Effective() Limit { return c.Limit.Scale(c.Scale) }

// Finish sets Allowed and Decider from the per-policy results. When the
// request is rejected nothing was spent, so a policy that would have
// allowed reports what it still has, not what it would have had. Nil
// checks hold nothing back: a charge, spent whatever the results say.
func (d *Decision) Finish(checks []Check) {
	d.Allowed = true
	d.Decider = -1
	for i := 0; i < d.N; i++ {
		if !d.Results[i].Allowed {
			d.Allowed = false
		}
	}
	if !d.Allowed && checks != nil {
		for i := 0; i < d.N; i++ {
			if r := &d.Results[i]; r.Allowed {
				r.Remaining = min(r.Remaining+checks[i].Cost, r.Limit)
			}
		}
	}
	for i := 0; i < d.N; i++ {
		r := &d.Results[i]
		if d.Decider < 0 {
			if d.Allowed || !r.Allowed {
				d.Decider = i
			}
			continue
		}
		best := &d.Results[d.Decider]
		if d.Allowed {
			if r.Remaining < best.Remaining {
				d.Decider = i
			}
		} else if !r.Allowed && r.RetryAfter > best.RetryAfter {
			d.Decider = i
		}
	}
}

// ErrStoreBusy is a check that waited in the store's own queue longer than
// the queue's bound without being sent: the daemon is overloaded, the store
// did not fail. The Limiter decides such a check by its policy's failure
// mode but does not count it against the store's circuit breaker.
var ErrStoreBusy = errors.New("store busy: check waited too long in the queue")

// ErrDeadline is a store call that outlived its deadline.
var ErrDeadline = fmt.Errorf("store call: %w", context.DeadlineExceeded)
