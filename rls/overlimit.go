package rls

import (
	"context"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/decide"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/quota"
)

// Counting hits over the limit.
//
// By default a request over the limit spends nothing: a rejected engine
// call leaves every state as it was. envoyproxy/ratelimit instead counts
// every descriptor's hits whatever the answer (it increments, then
// compares), and Envoy's second call on stream done (apply_on_stream_done)
// relies on it: that call carries what the request turned out to cost,
// and Envoy ignores its answer, so a call that spent nothing when over
// would lose exactly the usage that put the client over its budget.
//
// A policy counts over the limit when Config.CountOverLimit is set (the
// whole daemon) or the policy has count_over_limit (quota.Policy.
// CountOverLimit; a domain's files set it with the Sluice field
// count_over_limit). When the engine call rejects, the hits of those
// policies are then charged after the fact (decide.Decider.ChargeStates):
// a token bucket goes into debt, a window past its count, and the next
// calls are refused until the state is back within its limit. A request
// is admitted as before, when its hits fit; its answer, when rejected,
// carries each charged policy's figures after the charge, so a
// descriptor is OVER_LIMIT when its state is past its limit, as in
// envoyproxy/ratelimit. A sliding window log cannot go past its count and
// spends nothing when over in either mode.

// StatesCharger charges matched policies after the fact;
// *decide.Decider is one.
type StatesCharger interface {
	ChargeStates(ctx context.Context, subject string, applied []quota.Applied) (decide.ChargeAnswer, error)
}

// overLimitMetrics counts the charges of hits over the limit.
type overLimitMetrics struct {
	vec                      *prometheus.CounterVec
	charged, dropped, failed prometheus.Counter
}

func newOverLimitMetrics() overLimitMetrics {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_rls_over_limit_charges_total",
		Help: "Requests over the limit whose hits were charged to policies that count over the limit, by outcome: charged; dropped (the store could not be reached and the policies fail open); failed (the store could not be reached and a policy fails closed: the hits are lost, the answer stays OVER_LIMIT).",
	}, []string{"outcome"})
	return overLimitMetrics{vec: vec, charged: vec.WithLabelValues("charged"),
		dropped: vec.WithLabelValues("dropped"), failed: vec.WithLabelValues("failed")}
}

// countsOver reports whether a's hits are charged when its request is
// over the limit.
func (s *Server) countsOver(a quota.Applied) bool {
	return a.Cost > 0 && (s.cfg.CountOverLimit || a.Policy.CountOverLimit) &&
		a.Limit.Algorithm != engine.SlidingWindowLog && s.charger != nil
}

// decideStates decides applied for subject in one engine call and, when
// it rejects, charges the hits of the policies that count over the limit.
func (s *Server) decideStates(ctx context.Context, subject string, applied []quota.Applied) (decide.StatesVerdict, error) {
	v, err := s.cfg.Decider.DecideStates(ctx, subject, applied)
	if err != nil || v.Allowed || v.Unavailable || v.Degraded {
		return v, err
	}
	var idx []int
	var charge []quota.Applied
	for i, a := range applied {
		if s.countsOver(a) {
			idx = append(idx, i)
			charge = append(charge, a)
		}
	}
	if len(charge) == 0 {
		return v, nil
	}
	ans, err := s.charger.ChargeStates(ctx, subject, charge)
	switch {
	case err != nil && ctx.Err() != nil:
		return decide.StatesVerdict{}, ctx.Err()
	case err != nil:
		// Charged once, never again: the answer stays the rejection.
		s.overLimit.failed.Inc()
		s.log.Warn("hits over the limit could not be charged", "subject", subject, "err", err)
		return v, nil
	case ans.Degraded:
		s.overLimit.dropped.Inc()
		return v, nil
	}
	s.overLimit.charged.Inc()
	for k, i := range idx {
		v.Results[i] = ans.Policies[k]
	}
	rejectAfterCharge(&v)
	return v, nil
}

// rejectAfterCharge sets v's verdict from its results after a charge: over
// the limit while an enforced policy is, with the longest Retry-After of
// those.
func rejectAfterCharge(v *decide.StatesVerdict) {
	v.Allowed, v.RetryAfterHeader = true, ""
	var retry int64 // ms
	for _, r := range v.Results {
		if r.Evaluated && !r.Allowed && r.Mode == quota.ModeEnforce {
			v.Allowed = false
			retry = max(retry, r.RetryAfterMS)
		}
	}
	if !v.Allowed {
		v.RetryAfterHeader = strconv.FormatInt(max((retry+999)/1000, 1), 10)
	}
}
