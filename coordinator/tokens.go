package coordinator

import (
	"context"
	"fmt"
	"math"

	"github.com/sluice-rl/sluice/share"
)

// Spend is a token loan waiting for its tokens: the owner takes them out
// of this region's bucket for Key and then sends the loan. It reads the
// bucket (an engine check of cost 0 at the scale it enforces for the key),
// takes n = Take(remaining) units with a check of cost n at that scale,
// and, if n > 0 and that check is allowed, sends Of(n) as it sends Loans.
// If it takes nothing it sends nothing: the request goes unanswered, which
// only leaves the borrower short.
type Spend struct {
	Key share.Key
	// Max is the most to take (units): what the borrower asked for, at
	// most one second of L_global (the most a loan can carry).
	Max float64
	// Keep is what the bucket keeps for this region's own traffic (units):
	// the level at which it would be as full as the borrower's.
	Keep float64
	// Part is the part of what the bucket holds above Keep to hand over,
	// in (0, 1]: the borrower's capacity over both capacities, which
	// leaves both buckets equally full.
	Part float64
	// Limit is L_global of the key (units/s).
	Limit float64
	// Loan is the loan to fill (Of).
	Loan share.Loan
}

// Take is how many whole units to take from a bucket holding remaining
// units: Part of what it holds above Keep, at most Max; 0 if that is less
// than one.
func (s Spend) Take(remaining float64) int64 {
	n := math.Floor(min(s.Max, (remaining-s.Keep)*s.Part))
	if !(n >= 1) {
		return 0
	}
	return int64(n)
}

// Of is the loan handing over units taken out of the bucket.
func (s Spend) Of(units int64) share.Loan { return share.TokenLoanOf(s.Loan, float64(units), s.Limit) }

// Deposit is tokens another region took out of its bucket for Key and
// handed over: the owner puts Units back into this region's bucket of the
// key (an engine deposit at the scale it enforces, up to the bucket's
// capacity; what does not fit is lost, as the refill of a full bucket is).
// A deposit the owner cannot make is lost too: it only leaves this region
// short.
type Deposit struct {
	Key   share.Key
	Units int64
}

// TokenBucket is this region's token bucket of a key as the owner of a
// core reaches it: the daemon through its limiter, the simulator through
// its engine. Every call is a check of the key's bucket as the check path
// makes it, at the scale this region enforces for the key.
type TokenBucket interface {
	// Level reads the bucket with a check of cost 0 and returns the units
	// it holds. ok is false when there is nothing to take: the key is no
	// longer a global token bucket here, or the store could not decide
	// (a degraded answer, one from a deny cache).
	Level(ctx context.Context, key share.Key) (units int64, ok bool, err error)
	// Take takes units out of the bucket with a check of that cost, and
	// reports whether the store itself allowed it.
	Take(ctx context.Context, key share.Key, units int64) (bool, error)
	// Put puts units into the bucket, up to its capacity (an engine
	// deposit). It puts nothing into a key that is no longer a global
	// token bucket here, and returns an error when the store could not
	// decide.
	Put(ctx context.Context, key share.Key, units int64) error
}

// Do carries out the spend on b: it reads the bucket, takes Take(level)
// units out of it, and returns them only if that check was allowed by the
// store itself: a store that cannot decide must not hand over tokens,
// whatever the policy's failure mode, so a degraded answer takes nothing.
// The owner sends Of(n) only for n > 0 without error.
func (s Spend) Do(ctx context.Context, b TokenBucket) (int64, error) {
	level, ok, err := b.Level(ctx, s.Key)
	if err != nil {
		return 0, fmt.Errorf("read bucket of %s: %w", s.Key.Policy, err)
	}
	if !ok {
		return 0, nil
	}
	n := s.Take(float64(level))
	if n <= 0 {
		return 0, nil
	}
	took, err := b.Take(ctx, s.Key, n)
	if err != nil {
		return 0, fmt.Errorf("take %d tokens of %s: %w", n, s.Key.Policy, err)
	}
	if !took {
		return 0, nil
	}
	return n, nil
}

// Do carries out the deposit on b: Units go into the bucket, up to its
// capacity. One that fails is lost: it leaves this region short, never
// over.
func (d Deposit) Do(ctx context.Context, b TokenBucket) error {
	if d.Units <= 0 {
		return nil
	}
	if err := b.Put(ctx, d.Key, d.Units); err != nil {
		return fmt.Errorf("deposit %d tokens of %s: %w", d.Units, d.Key.Policy, err)
	}
	return nil
}
