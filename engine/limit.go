// Package engine decides whether a subject may spend a cost now. It holds
// the five algorithms as pure functions of (now, state, limit, cost), the
// value types every caller shares (Limit, Request, Decision) and the
// in-process store. The Redis store (engine/redisstore) and the Limiter
// that keeps a check fast and safe when a store misbehaves
// (engine/limiter) are packages of their own, so that a program links a
// store client only when it uses that store.
//
// The engine knows nothing of HTTP, policy documents or regions: callers
// hand it a subject and the limits that apply, already resolved.
package engine

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/engine/internal/quant"
)

// Algorithm names one of the five decision algorithms.
type Algorithm uint8

// The algorithms. The zero value is invalid so that a forgotten field is
// caught by Validate instead of silently meaning "token bucket".
const (
	TokenBucket Algorithm = iota + 1
	LeakyBucket
	FixedWindow
	SlidingWindowLog
	SlidingWindowCounter
)

var algorithmNames = [...]string{
	TokenBucket:          "token_bucket",
	LeakyBucket:          "leaky_bucket",
	FixedWindow:          "fixed_window",
	SlidingWindowLog:     "sliding_window_log",
	SlidingWindowCounter: "sliding_window_counter",
}

// String returns the name used in policy documents, e.g. "token_bucket".
func (a Algorithm) String() string {
	if a >= TokenBucket && a <= SlidingWindowCounter {
		return algorithmNames[a]
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

// ParseAlgorithm is the inverse of String.
func ParseAlgorithm(s string) (Algorithm, error) {
	for a := TokenBucket; a <= SlidingWindowCounter; a++ {
		if algorithmNames[a] == s {
			return a, nil
		}
	}
	return 0, fmt.Errorf("unknown algorithm %q (want one of %s)", s, strings.Join(algorithmNames[1:], ", "))
}

// Windowed reports whether the algorithm counts units per window (Count and
// Window) rather than refilling a bucket (Rate and Burst).
func (a Algorithm) Windowed() bool {
	return a == FixedWindow || a == SlidingWindowLog || a == SlidingWindowCounter
}

// DefaultMaxLogLimit is the largest Count a sliding window log accepts by
// default: the log keeps one timestamp per admitted unit, so its memory and
// its work per check grow with the limit.
const DefaultMaxLogLimit = 1000

// Limit holds the parameters of one policy as the engine sees them.
//
// Buckets (token, leaky) use Rate and Burst; window algorithms use Count and
// Window. Values are float64 so that a region's share of a global limit
// (Scale) needs no rounding; policy documents carry whole numbers.
type Limit struct {
	Algorithm Algorithm
	// Rate is the refill (token bucket) or drain (leaky bucket) rate in
	// units per second.
	Rate float64
	// Burst is the bucket capacity in units: the largest spend allowed at
	// once.
	Burst float64
	// Count is the number of units allowed per Window.
	Count float64
	// Window is the window length. Fixed windows are aligned to the Unix
	// epoch, so a 24 h window is a UTC day. Whole milliseconds only.
	Window time.Duration
	// MaxLog caps Count for the sliding window log; zero means
	// DefaultMaxLogLimit.
	MaxLog int
}

// Errors returned by Validate and ValidateCost, for errors.Is.
var (
	ErrInvalidLimit = errors.New("invalid limit")
	ErrCostTooLarge = errors.New("cost exceeds what the limit can ever admit")
)

// LimitError names the parameter that is wrong, so a caller can point at
// the field in its own document.
type LimitError struct {
	Field  string // "rate", "burst", "count", "window", "algorithm", "cost"
	Reason string
	err    error
}

func (e *LimitError) Error() string { return e.Field + ": " + e.Reason }
func (e *LimitError) Unwrap() error { return e.err }

func limitErr(field, format string, args ...any) error {
	return &LimitError{Field: field, Reason: fmt.Sprintf(format, args...), err: ErrInvalidLimit}
}

// maxWindow bounds windows so that microsecond arithmetic never overflows
// and Lua's doubles stay exact.
const maxWindow = 366 * 24 * time.Hour

// Validate reports the first parameter that makes the limit unusable.
func (l Limit) Validate() error {
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	switch l.Algorithm {
	case TokenBucket, LeakyBucket:
		if !finite(l.Rate) || l.Rate <= 0 {
			return limitErr("rate", "must be a positive number of units per second, got %v", l.Rate)
		}
		if l.Rate > 1e9 {
			return limitErr("rate", "must be at most 1e9 units per second, got %v", l.Rate)
		}
		if !finite(l.Burst) || l.Burst < 1 {
			return limitErr("burst", "must be at least 1, got %v", l.Burst)
		}
		if l.Burst > 1e12 {
			return limitErr("burst", "must be at most 1e12, got %v", l.Burst)
		}
	case FixedWindow, SlidingWindowLog, SlidingWindowCounter:
		if !finite(l.Count) || l.Count < 1 {
			return limitErr("count", "must be at least 1, got %v", l.Count)
		}
		if l.Count > 1e12 {
			return limitErr("count", "must be at most 1e12, got %v", l.Count)
		}
		if l.Window < time.Millisecond || l.Window > maxWindow {
			return limitErr("window", "must be between 1ms and %v, got %v", maxWindow, l.Window)
		}
		if l.Window%time.Millisecond != 0 {
			return limitErr("window", "must be a whole number of milliseconds, got %v", l.Window)
		}
		if l.Algorithm == SlidingWindowLog && l.Count > float64(l.MaxLogCount()) {
			return limitErr("count", "sliding_window_log keeps one timestamp per unit, so its limit must be at most %d, got %v (use sliding_window_counter for large limits)", l.MaxLogCount(), l.Count)
		}
	default:
		return limitErr("algorithm", "unknown algorithm %d", uint8(l.Algorithm))
	}
	return nil
}

// MaxLogCount is the most entries a sliding log of this limit keeps: MaxLog,
// or DefaultMaxLogLimit when MaxLog is zero.
func (l Limit) MaxLogCount() int {
	if l.MaxLog > 0 {
		return l.MaxLog
	}
	return DefaultMaxLogLimit
}

// Capacity is the most units the limit admits at once: Burst for buckets,
// Count for windows. It is what headers report as the quota.
func (l Limit) Capacity() float64 {
	if l.Algorithm.Windowed() {
		return l.Count
	}
	return l.Burst
}

// ValidateCost rejects a cost that the limit could never admit, which would
// otherwise show up as an endless retry-after.
func (l Limit) ValidateCost(cost int64) error {
	if cost < 0 {
		return &LimitError{Field: "cost", Reason: fmt.Sprintf("must not be negative, got %d", cost), err: ErrInvalidLimit}
	}
	if float64(cost) > l.Capacity() {
		return &LimitError{Field: "cost", Reason: fmt.Sprintf("%d exceeds the limit's capacity %v", cost, l.Capacity()), err: ErrCostTooLarge}
	}
	return nil
}

// Scale returns the limit with its rate and capacity multiplied by f, the
// fraction of a global limit this region enforces. f outside (0, 1] is
// clamped: a region never enforces more than the whole limit, and a share
// of zero would reject everything, so the floor is left to the caller.
func (l Limit) Scale(f float64) Limit {
	if !(f > 0) || f >= 1 {
		return l
	}
	l.Rate *= f
	l.Burst *= f
	l.Count *= f
	return l
}

// CapacityUnits is Capacity in whole units, rounded down, as the
// algorithms report Remaining.
func (l Limit) CapacityUnits() int64 { return quant.Units(l.Capacity()) }
