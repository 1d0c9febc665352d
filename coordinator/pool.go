package coordinator

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/sluice-rl/sluice/share"
)

// Token pooling (share/tokens.go) for keys whose L_global is below
// BorrowMinRate, on the acting node, when the owner carries out Spends and
// Deposits (CoreConfig.PoolTokens).
//
// One central bucket wastes refill only when the whole pool is full; the
// buckets of n regions waste it whenever any one of them is full, while
// another may be rejecting. Pooling keeps the regions' buckets about
// equally full, as fractions of their capacities: a region whose bucket
// estimate falls below tokenAskBelow of its capacity (or that rejected)
// asks every other region; each answers with what makes its own bucket
// and the borrower's equally full, were it the only lender (Spend.Part),
// which its owner reads from its real bucket; and the borrower deposits
// what it receives into its bucket, up to its capacity.
const (
	// tokenAskBelow is the part of its bucket's capacity (one second of
	// its refill) below which a region asks for tokens: a region that sees
	// a few arrivals per second then has over half a second before it
	// rejects, a few deliveries. Asking higher up sends a request after
	// nearly every arrival of a small bucket (0.8 sent four times the
	// bytes in zipf-keys) for tokens that mostly do not fit.
	tokenAskBelow = 0.65
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

// askTokens asks for tokens for every key of the last dt seconds below
// BorrowMinRate that was rejected here, or whose bucket estimate is below
// tokenAskBelow of its capacity, as often as the allocator lets it
// (Allocator.AskTokens).
func (c *Core) askTokens(now time.Time, dt, nodes float64) {
	if !c.cfg.PoolTokens {
		return
	}
	var keys []share.Key
	want := map[share.Key]float64{}
	for k, u := range c.b.fast {
		limit, ok := c.cfg.Limit(k.Policy)
		if !ok || !(limit > 0) || limit >= c.cfg.Share.BorrowMinRate || !c.bucket(k.Policy) {
			continue
		}
		key := share.Key{Policy: k.Policy, Subject: k.Subject}
		capacity := c.Share(k.Policy, k.Subject) * limit // one second of refill
		level := 0.0
		switch {
		case !u.At.IsZero():
			// What the engine's last check of the key here left (with a
			// regional store, in the region's bucket), refilled since:
			// a fact, where the estimate below drifts by what arrived
			// since its tick.
			level = min(float64(u.Remaining)+capacity*max(now.Sub(u.At).Seconds(), 0), capacity)
			if level >= tokenAskBelow*capacity {
				continue
			}
		case u.Demand <= u.Admitted:
			tok, seen := c.b.tokens[key]
			if !seen {
				tok = capacity
			}
			level = min(max(tok+capacity*dt-float64(u.Admitted)*nodes, 0), capacity)
			if level >= tokenAskBelow*capacity {
				continue
			}
		}
		keys = append(keys, key)
		want[key] = max(capacity-level, 1) / limit
	}
	slices.SortFunc(keys, compareKeys)
	for _, k := range keys {
		limit, _ := c.cfg.Limit(k.Policy)
		if req, ok := c.alloc.AskTokens(now, k, limit, want[k]); ok {
			c.m.Borrow.WithLabelValues("tokens_requested").Inc()
			c.rd.Borrows = append(c.rd.Borrows, req)
		}
	}
}

// tokenRequest answers a peer's token request with a Spend that would
// leave this region's bucket and the borrower's equally full: the
// borrower's level is its capacity less what it asked for (its room), its
// capacity its share as this region computed it at the last rebalance.
// The owner reads the real bucket, so no estimate of this region's level
// gates the answer.
func (c *Core) tokenRequest(now time.Time, r share.BorrowRequest, limit float64) {
	if !c.cfg.PoolTokens || !c.bucket(r.Policy) {
		return
	}
	capacity := c.Share(r.Policy, r.Subject) * limit
	other := c.regionShare(r.Key, r.Region) * limit
	if !(capacity > 0) || !(other > 0) {
		return
	}
	l, ok := c.alloc.TokenLoan(now, r, limit)
	if !ok {
		return
	}
	full := max(0, 1-min(r.Want, 1)*limit/other) // the borrower's level, a fraction of its capacity
	sp := Spend{Key: r.Key, Max: min(r.Want, 1) * limit, Keep: full * capacity, Part: other / (capacity + other), Limit: limit, Loan: l}
	if est, seen := c.b.tokens[r.Key]; seen {
		// What the owner is about to take is gone from the estimate.
		c.b.tokens[r.Key] = est - float64(sp.Take(est))
	}
	c.m.Borrow.WithLabelValues("tokens_offered").Inc()
	c.rd.Spends = append(c.rd.Spends, sp)
}

// regionShare is region's share of key as this region computed it at the
// last rebalance, or the default share if the key is not coordinated.
func (c *Core) regionShare(key share.Key, region string) float64 {
	if v := c.alloc.Shares(key); v != nil {
		if i := slices.Index(c.alloc.Regions(), region); i >= 0 && i < len(v) && v[i] > 0 {
			return v[i]
		}
	}
	return c.defaultShare()
}

// tokenLoan takes a token loan addressed to this region: applied once, in
// its generation (Allocator.Accept), and deposited by the owner of the
// acting node only, which asked for it; the region's other nodes drop it,
// so the tokens land in one bucket once.
func (c *Core) tokenLoan(now time.Time, l share.Loan) {
	if !c.cfg.PoolTokens || !c.isActor() {
		return
	}
	limit, ok := c.cfg.Limit(l.Policy)
	if !ok || !(limit > 0) || !c.alloc.Accept(now, l) {
		return
	}
	units := int64(math.Round(min(l.Tokens, 1) * limit))
	if units < 1 {
		return
	}
	c.m.Borrow.WithLabelValues("tokens_accepted").Inc()
	c.rd.Deposits = append(c.rd.Deposits, Deposit{Key: l.Key, Units: units})
	if est, seen := c.b.tokens[l.Key]; seen {
		// The bucket holds them once the owner has deposited them, up to
		// its capacity: the next look must not ask for them again.
		c.b.tokens[l.Key] = min(est+float64(units), c.Share(l.Policy, l.Subject)*limit)
	}
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
