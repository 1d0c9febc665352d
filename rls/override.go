package rls

import (
	"strconv"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/quota"
)

// overrideUnits are the seconds of envoy.type.v3.RateLimitUnit's values,
// a month 30 days and a year 365 as in configuration files; 0 (UNKNOWN)
// is no unit.
var overrideUnits = [...]float64{1: 1, 2: 60, 3: 3600, 4: 86400, 5: 30 * 86400, 6: 365 * 86400, 7: 7 * 86400}

// Bounds on a request's limit override.
const (
	// MaxOverrideRequests bounds its requests_per_unit.
	MaxOverrideRequests = 1_000_000_000
	// maxOverrideWindow bounds its unit times unit_multiplier: ten years.
	maxOverrideWindow = 10 * 365 * 86400
)

// fieldError is a problem with a field of a limit override: field starts
// with "." and is relative to the override.
type fieldError struct{ field, reason string }

// overridePolicy is the policy of a descriptor's limit override: a fixed
// window of requests_per_unit per unit_multiplier units, aligned to them
// as envoyproxy/ratelimit counts. Its state is named by its window alone,
// so it is counted apart from the configured policies, and two requests
// with the same unit share a count whatever their limits (as
// envoyproxy/ratelimit's cache key holds the unit, not the limit).
func overridePolicy(d *reqDescriptor) (*quota.Policy, *fieldError) {
	switch {
	case d.limitRPU == 0:
		return nil, &fieldError{".requests_per_unit", "must be at least 1"}
	case d.limitRPU > MaxOverrideRequests:
		return nil, &fieldError{".requests_per_unit", "at most " + strconv.Itoa(MaxOverrideRequests) + ", got " + strconv.FormatUint(d.limitRPU, 10)}
	case d.limitUnit == 0 || d.limitUnit >= uint64(len(overrideUnits)):
		return nil, &fieldError{".unit", "unknown unit " + strconv.FormatUint(d.limitUnit, 10) + " (want SECOND, MINUTE, HOUR, DAY, MONTH, YEAR or WEEK)"}
	}
	mult := uint64(1)
	if d.hasMult {
		mult = d.limitMult
	}
	w := overrideUnits[d.limitUnit]
	switch {
	case mult == 0:
		return nil, &fieldError{".unit_multiplier", "must be at least 1"}
	case float64(mult)*w > maxOverrideWindow:
		return nil, &fieldError{".unit_multiplier", "the window (unit times unit_multiplier) must be at most ten years"}
	}
	w *= float64(mult)
	p := &quota.Policy{
		ID:    "limit-override-" + strconv.FormatFloat(w, 'f', -1, 64) + "s",
		Mode:  quota.ModeEnforce,
		Class: quota.ClassQuota,
		Scope: quota.ScopeRegion,
		// The deny cache keys on the version: a changed limit is decided
		// afresh.
		Version:   int(d.limitRPU),
		Algorithm: engine.FixedWindow.String(),
		Count:     float64(d.limitRPU),
		Window:    w,
	}
	return p, nil
}
