package decide

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/sluice-rl/sluice/quota"
)

// StatesVerdict is the decision on a set of matched policies (DecideStates):
// the whole set's verdict, each policy's figures and the RateLimit fields
// a gateway would send.
type StatesVerdict struct {
	// Allowed is true when every enforced policy admitted; their states
	// were then all spent, else none was.
	Allowed bool
	// Unavailable is true when the store could not decide and a policy
	// failing closed rejected.
	Unavailable bool
	// Degraded is true when the policies' on_store_failure decided.
	Degraded bool
	// Source is store, deny_cache, fallback or none.
	Source string
	// RetryAfter is the deciding enforced policy's; zero when allowed.
	RetryAfter time.Duration
	// Results holds one entry per applied policy, in order. A shadow
	// policy is evaluated only when the enforced ones admitted.
	Results []PolicyResult
	// RateLimitPolicy and RateLimit are the draft-11 fields over the
	// enforced policies that are not class security, one item per policy
	// id (the least remaining when a policy applied more than once);
	// empty when there is none. RetryAfterHeader is Retry-After in whole
	// seconds when rejected, else empty.
	RateLimitPolicy, RateLimit, RetryAfterHeader string
}

// DecideStates decides applied, policies already matched by the caller
// (a rate limit service matches descriptors, not routes), for subject
// exactly as POST /v1/check decides a request's policies: every enforced
// policy in one all-or-nothing engine call, then the shadow ones only if
// that admitted. Each Applied's Cost is spent (zero reads the state) in
// its StateName. At most quota.MaxPoliciesPerRequest policies, with
// distinct state names, may be given. An error is a request the engine
// refuses or a cancelled context, never a rejection.
func (dc *Decider) DecideStates(ctx context.Context, subject string, applied []quota.Applied) (StatesVerdict, error) {
	if len(applied) > quota.MaxPoliciesPerRequest {
		return StatesVerdict{}, errors.New("too many policies for one decision")
	}
	who := quota.Principal{Subject: subject}
	v, p := dc.decideApplied(ctx, who, applied, nil, Target{})
	if p != nil {
		return StatesVerdict{}, errors.New(p.Detail)
	}
	out := StatesVerdict{
		Allowed: v.Allowed, Unavailable: v.Status == 503, Degraded: v.Degraded,
		Source: v.Source, RetryAfter: v.RetryAfter, Results: v.Policies,
	}
	if items := leastRemainingPerName(v.Headers); len(items) > 0 {
		out.RateLimitPolicy = FormatPolicyHeader(items)
		out.RateLimit = FormatRateLimitHeader(items)
	}
	if !v.Allowed {
		out.RetryAfterHeader = strconv.FormatInt(max(ceilSeconds(v.RetryAfter), 1), 10)
	}
	return out, nil
}

// leastRemainingPerName keeps, of the items sharing a name, the one with
// least available, in the order names first appear: a structured field
// list should name each policy once. It filters items in place.
func leastRemainingPerName(items []HeaderItem) []HeaderItem {
	out := items[:0]
	for _, it := range items {
		dup := false
		for j := range out {
			if out[j].Name == it.Name {
				dup = true
				if it.Available < out[j].Available {
					out[j] = it
				}
				break
			}
		}
		if !dup {
			out = append(out, it)
		}
	}
	return out
}
