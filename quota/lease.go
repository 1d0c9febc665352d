package quota

import (
	"math"

	"github.com/sluice-rl/sluice/engine"
)

// Lease, on a token_bucket policy, lets each daemon serve the policy from
// local leases: slices of the bucket it takes from the store in one call
// and admits from in process (engine/limiter, docs/algorithms.md). A
// policy without it, the default, sends every check to the store.
type Lease struct {
	// MaxSlice is the most tokens one daemon's lease of one subject holds;
	// zero means the burst. A larger slice costs the store fewer calls and
	// may over-admit more: the bound is the daemons times MaxSlice.
	MaxSlice int64 `json:"max_slice,omitempty"`
}

// MinLeaseBurstSeconds is the least burst, in seconds of the rate, of a
// policy that leases (engine/limiter.MinLeaseBurstSeconds).
const MinLeaseBurstSeconds = 0.02

// LeaseSize is the engine's Check.Lease for p: zero without a lease, else
// MaxSlice or the burst.
func (p *Policy) LeaseSize() int64 {
	if p.Lease == nil {
		return 0
	}
	if p.Lease.MaxSlice > 0 {
		return p.Lease.MaxSlice
	}
	return max(int64(p.Burst), 1)
}

// validateLease refuses a lease where it cannot be exact or safe: on any
// algorithm but the token bucket (a window's count cannot be handed back
// once its window moved on, and the leaky bucket takes no deposit), on a
// security policy (a lease admits what it holds while the store is down,
// and a security policy fails closed), and on a bucket too small to hold
// the refill of the time a spent lease waits for its next slice.
func (p *Policy) validateLease(ve *ValidationError) {
	if p.Lease == nil {
		return
	}
	if p.Algorithm != engine.TokenBucket.String() {
		ve.add("lease", "only a token_bucket policy can be leased exactly, not %q: a window's count cannot be handed back once its window has moved on, and a leaky bucket takes no deposit", clip(p.Algorithm))
		return
	}
	if p.Class == ClassSecurity {
		ve.add("lease", "a security policy cannot be leased: a lease admits what it holds while the store is down, and a security policy fails closed")
	}
	if p.RatePerSec > 0 && p.Burst < math.Ceil(p.RatePerSec*MinLeaseBurstSeconds) {
		ve.add("lease", "needs a burst of at least %v (rate_per_sec × %v s), got %v: the tokens that refill while a spent lease waits for its next slice must fit in the bucket", math.Ceil(p.RatePerSec*MinLeaseBurstSeconds), MinLeaseBurstSeconds, p.Burst)
	}
	if s := p.Lease.MaxSlice; s < 0 || (p.Burst >= 1 && float64(s) > p.Burst) {
		ve.add("lease.max_slice", "must be from 1 to the burst (%v), or absent for the burst, got %d", p.Burst, s)
	}
}
