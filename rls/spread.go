package rls

import (
	"context"
	"strconv"

	"github.com/sluice-rl/sluice/decide"
	"github.com/sluice-rl/sluice/quota"
)

// decideSpread decides applied, whose checks live under subjects (one per
// check), when descriptor states are spread: one all-or-nothing engine
// call per distinct subject, in the order subjects first appear, so the
// policies of one descriptor are still decided together. Across subjects
// the decisions are apart, as envoyproxy/ratelimit decides descriptors:
// a descriptor whose policies admit spends its hits even when another
// descriptor of the request is over its limit (which spends nothing).
// The verdict is allowed when every call allowed; its results are in
// the order of applied, its headers those of every call, and its
// Retry-After the longest of the calls that rejected.
func (s *Server) decideSpread(ctx context.Context, applied []quota.Applied, subjects []string) (decide.StatesVerdict, error) {
	first := subjects[0]
	one := true
	for _, sub := range subjects[1:] {
		if sub != first {
			one = false
			break
		}
	}
	if one {
		return s.decideStates(ctx, first, applied)
	}
	out := decide.StatesVerdict{Allowed: true, Source: "none", Results: make([]decide.PolicyResult, len(applied))}
	done := make([]bool, len(applied))
	var group []quota.Applied
	var idx []int
	var retry int64
	for i := range applied {
		if done[i] {
			continue
		}
		group, idx = group[:0], idx[:0]
		for j := i; j < len(applied); j++ {
			if !done[j] && subjects[j] == subjects[i] {
				done[j] = true
				group = append(group, applied[j])
				idx = append(idx, j)
			}
		}
		v, err := s.decideStates(ctx, subjects[i], group)
		if err != nil {
			return decide.StatesVerdict{}, err
		}
		for k, j := range idx {
			out.Results[j] = v.Results[k]
		}
		mergeVerdict(&out, v, &retry)
	}
	if !out.Allowed {
		out.RetryAfterHeader = strconv.FormatInt(max(retry, 1), 10)
	}
	return out, nil
}

// mergeVerdict folds one subject's verdict v into out; retry keeps the
// longest Retry-After, in seconds, of the verdicts that rejected.
func mergeVerdict(out *decide.StatesVerdict, v decide.StatesVerdict, retry *int64) {
	if v.Source != "none" && (out.Source == "none" || out.Source == "store") {
		out.Source = v.Source
	}
	out.Degraded = out.Degraded || v.Degraded
	out.Unavailable = out.Unavailable || v.Unavailable
	if !v.Allowed {
		out.Allowed = false
		out.RetryAfter = max(out.RetryAfter, v.RetryAfter)
		if n, err := strconv.ParseInt(v.RetryAfterHeader, 10, 64); err == nil {
			*retry = max(*retry, n)
		}
	}
	if v.RateLimitPolicy != "" {
		if out.RateLimitPolicy != "" {
			out.RateLimitPolicy += ", "
			out.RateLimit += ", "
		}
		out.RateLimitPolicy += v.RateLimitPolicy
		out.RateLimit += v.RateLimit
	}
}
