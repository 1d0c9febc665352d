package limiter

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/engine/internal/quant"
)

// A lease serves a token bucket policy of a high rate from process memory.
// A check whose only policy has Check.Lease > 0 is decided from a slice of
// the policy's bucket that this Limiter took from the store in one
// ordinary check of the slice's size: the tokens are spent in the store
// the moment they are taken, in the same state every other check and every
// other daemon's lease spends from, so a lease never admits a token the
// bucket did not hand out. What a lease did not spend by its expiry, or
// when the policy changes, goes back in one deposit (Check.Deposit), which
// fills the bucket at most to its burst as refill does.
//
// The slice is sized on the key's demand seen here, to last LeasePeriod,
// and at most the policy's Lease, its burst, and what the bucket refills in
// LeasePeriod; it is no larger than the bucket is thought to hold (the
// Remaining of the last take, plus its refill since). A key takes at most
// LeaseTakeBurst slices at once and one more per LeaseInterval, and
// returns at most one per LeaseLifetime, so the store sees on average at
// most 1/LeaseInterval + 1/LeaseLifetime calls per second for the key
// from each Limiter, whatever its rate. A key seen
// fewer than LeaseWarm units within a LeaseInterval is checked directly, as
// is a check of cost zero or one whose cost exceeds the slice the policy
// allows.
//
// docs/algorithms.md derives what this costs in accuracy: at most the
// tokens held in leases when a window starts, D × S, beyond the bucket's
// own bound.

// Lease timings and bounds.
const (
	// LeaseInterval is the time one take of one key's lease by one
	// Limiter costs: a key takes at most LeaseTakeBurst slices at once and
	// one more per LeaseInterval, and a check finding the lease spent and
	// no take left is rejected in process, as the deny cache rejects.
	LeaseInterval = 10 * time.Millisecond
	// LeaseTakeBurst is how many takes a key may make in quick succession
	// (while its demand is first measured) before it is held to one per
	// LeaseInterval.
	LeaseTakeBurst = 3
	// LeasePeriod is how long a slice should last at the key's demand.
	LeasePeriod = 20 * time.Millisecond
	// LeaseLifetime is how long after its take a lease admits; what it
	// holds then is returned.
	LeaseLifetime = time.Second
	// LeaseWarm is the demand, in units within one window of
	// LeaseInterval, from which a key is leased rather than checked
	// directly.
	LeaseWarm = 2
	// MaxLeases bounds the keys one Limiter leases; checks of further
	// keys go to the store directly.
	MaxLeases = 10_000
)

// MinLeaseBurstSeconds is the least burst, in seconds of the rate, of a
// policy that may lease: a slice is sized to last LeasePeriod, and the
// tokens that refill while a spent lease waits out LeaseInterval must fit
// in the bucket, or they would be lost to its cap.
const MinLeaseBurstSeconds = 0.02

type leaseKey struct{ subject, policy string }

// lease is one key's lease and what it knows of the key. Every field is
// guarded by mu, which a check holds across its store calls, so that one
// key takes one slice at a time.
type lease struct {
	mu   sync.Mutex
	dead bool // removed from the table: look the key up again

	// What the lease was taken under: a check of another version, limit
	// or lease size is a changed policy.
	started bool
	version uint64
	limit   engine.Limit // effective
	size    int64        // Check.Lease
	ret     engine.Check // the check a return deposits through

	held     int64     // tokens taken and not yet spent
	expires  time.Time // the held tokens admit only before it
	lastTake time.Time // zero for none
	takes    float64   // takes left at lastTake, at most LeaseTakeBurst

	left   int64     // the bucket's Remaining the store reported last
	leftAt time.Time // when; zero if unknown

	winStart time.Time // the demand window
	winUnits int64
	rate     float64 // units/s over the last complete window
	lastSeen time.Time
}

// leaseTable holds the leases of one Limiter.
type leaseTable struct {
	mu sync.Mutex
	m  map[leaseKey]*lease
}

// get returns k's lease, created if need be; nil when the table is full.
func (t *leaseTable) get(k leaseKey) *lease {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[k]
	if e == nil {
		if len(t.m) >= MaxLeases {
			return nil
		}
		e = &lease{}
		t.m[k] = e
	}
	return e
}

func (t *leaseTable) snapshot() map[leaseKey]*lease {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[leaseKey]*lease, len(t.m))
	for k, e := range t.m {
		out[k] = e
	}
	return out
}

func (t *leaseTable) remove(k leaseKey, e *lease) {
	t.mu.Lock()
	if t.m[k] == e {
		delete(t.m, k)
	}
	t.mu.Unlock()
}

// leaseCounters are the lease counters of Stats.
type leaseCounters struct {
	takes, tokensTaken, takesRejected, admitted, rejected atomic.Uint64
	returns, tokensReturned, returnErrors                 atomic.Uint64
	policyChanged, expired, tableFull                     atomic.Uint64
}

// LeaseStats count what leases did since the Limiter started.
type LeaseStats struct {
	// Takes counts slices taken, TokensTaken their tokens; TakesRejected
	// takes the store refused (the bucket held less than the slice).
	Takes, TokensTaken, TakesRejected uint64
	// Admitted counts checks admitted from a lease without a store call;
	// Rejected checks rejected in process because the lease was spent
	// and the key took a slice less than LeaseInterval before.
	Admitted, Rejected uint64
	// Returns counts deposits of unspent tokens, TokensReturned their
	// tokens; ReturnErrors returns the store could not apply (their
	// tokens are lost: the bucket admits less, never more).
	Returns, TokensReturned, ReturnErrors uint64
	// PolicyChanged counts leases dropped because a check came with
	// another policy version, limit or lease size: the check and the
	// key's next ones were checked directly. Expired counts leases that
	// outlived LeaseLifetime with tokens left. TableFull counts checks
	// sent directly because MaxLeases keys were leased.
	PolicyChanged, Expired, TableFull uint64
}

func (c *leaseCounters) stats() LeaseStats {
	return LeaseStats{
		Takes: c.takes.Load(), TokensTaken: c.tokensTaken.Load(), TakesRejected: c.takesRejected.Load(),
		Admitted: c.admitted.Load(), Rejected: c.rejected.Load(),
		Returns: c.returns.Load(), TokensReturned: c.tokensReturned.Load(), ReturnErrors: c.returnErrors.Load(),
		PolicyChanged: c.policyChanged.Load(), Expired: c.expired.Load(), TableFull: c.tableFull.Load(),
	}
}

// checkLeased decides a request of one leased check (see lease).
func (l *Limiter) checkLeased(ctx context.Context, req engine.Request, now time.Time) (Outcome, error) {
	k := leaseKey{req.Subject, req.Checks[0].Policy}
	for {
		e := l.leases.get(k)
		if e == nil {
			l.lc.tableFull.Add(1)
			return l.direct(ctx, req, now)
		}
		e.mu.Lock()
		if e.dead {
			e.mu.Unlock()
			continue
		}
		out, err := l.decideLeased(ctx, e, req, now)
		e.mu.Unlock()
		return out, err
	}
}

// decideLeased decides req from e, which the caller holds.
func (l *Limiter) decideLeased(ctx context.Context, e *lease, req engine.Request, now time.Time) (Outcome, error) {
	c := &req.Checks[0]
	lim := c.Effective()
	e.observe(now, c.Cost)
	if e.changed(c, lim) {
		if e.held > 0 || !e.lastTake.IsZero() {
			l.lc.policyChanged.Add(1)
		}
		n := e.restart(c, lim)
		l.giveBack(ctx, req.Subject, *c, n)
		return l.direct(ctx, req, now)
	}
	if c.Cost == 0 {
		return l.direct(ctx, req, now)
	}
	if e.held >= c.Cost && now.Before(e.expires) {
		e.held -= c.Cost
		l.lc.admitted.Add(1)
		d := e.decision(lim, now, true, 0)
		l.track(req, d)
		return Outcome{Decision: d, Source: FromStore}, nil
	}
	if e.held > 0 && !now.Before(e.expires) {
		n := e.held
		e.held = 0
		l.lc.expired.Add(1)
		l.giveBack(ctx, req.Subject, e.ret, n)
	}
	if !e.hot() {
		return l.direct(ctx, req, now)
	}
	if e.takesLeft(now) < 1 {
		l.lc.rejected.Add(1)
		d := e.decision(lim, now, false, e.retry(lim, c.Cost, now))
		l.track(req, d)
		return Outcome{Decision: d, Source: FromDenyCache}, nil
	}
	return l.take(ctx, e, req, lim, now)
}

// take takes a slice for req's key and decides req from it.
func (l *Limiter) take(ctx context.Context, e *lease, req engine.Request, lim engine.Limit, now time.Time) (Outcome, error) {
	c := &req.Checks[0]
	k := e.want(c, lim, now)
	if k < c.Cost {
		return l.direct(ctx, req, now)
	}
	t := *c
	t.Cost, t.Lease, t.Track = k, 0, false
	e.takes, e.lastTake = e.takesLeft(now)-1, now
	d, err := l.callStore(ctx, engine.Request{Subject: req.Subject, Checks: []engine.Check{t}})
	if err != nil {
		return l.storeFailed(ctx, req, err)
	}
	r := &d.Results[0]
	e.left, e.leftAt = r.Remaining, now
	if !r.Allowed {
		l.lc.takesRejected.Add(1)
		out := e.decision(lim, now, false, e.retry(lim, c.Cost, now))
		l.track(req, out)
		return Outcome{Decision: out, Source: FromStore}, nil
	}
	l.lc.takes.Add(1)
	l.lc.tokensTaken.Add(uint64(k))
	e.held += k - c.Cost
	e.expires = now.Add(LeaseLifetime)
	e.ret = t
	out := e.decision(lim, now, true, 0)
	l.track(req, out)
	return Outcome{Decision: out, Source: FromStore}, nil
}

// giveBack deposits n unspent tokens under c's policy; a failed deposit
// loses them. It runs even if the caller gave up: the tokens are not the
// caller's.
func (l *Limiter) giveBack(ctx context.Context, subject string, c engine.Check, n int64) {
	if n <= 0 {
		return
	}
	c.Cost, c.Deposit, c.Lease, c.Track = n, true, 0, false
	_, err := l.callStore(context.WithoutCancel(ctx), engine.Request{Subject: subject, Checks: []engine.Check{c}})
	if err != nil {
		l.lc.returnErrors.Add(1)
		return
	}
	l.lc.returns.Add(1)
	l.lc.tokensReturned.Add(uint64(n))
}

// observe counts cost units of demand at now. Demand is counted in
// windows of LeaseInterval; rate is that of the last one closed.
func (e *lease) observe(now time.Time, cost int64) {
	if e.winStart.IsZero() || now.Sub(e.winStart) >= LeaseInterval {
		if !e.winStart.IsZero() {
			e.rate = float64(e.winUnits) / now.Sub(e.winStart).Seconds()
		}
		e.winStart, e.winUnits = now, 0
	}
	e.winUnits += cost
	e.lastSeen = now
}

// demand is the key's demand in units per second: the last window's, or
// the current one's so far if higher (over at least a millisecond, so
// that a key's first checks size its first slices).
func (e *lease) demand() float64 {
	return max(e.rate, float64(e.winUnits)/max(e.lastSeen.Sub(e.winStart), time.Millisecond).Seconds())
}

// takesLeft is how many takes the key may make at now.
func (e *lease) takesLeft(now time.Time) float64 {
	if e.lastTake.IsZero() {
		return LeaseTakeBurst
	}
	return min(e.takes+float64(now.Sub(e.lastTake))/float64(LeaseInterval), LeaseTakeBurst)
}

// hot reports whether the key saw LeaseWarm units within the current
// demand window, or over the last one.
func (e *lease) hot() bool {
	return e.winUnits >= LeaseWarm || e.rate*LeaseInterval.Seconds() >= LeaseWarm
}

// changed reports whether c differs from what e was taken under; the
// first check of a key sets it.
func (e *lease) changed(c *engine.Check, lim engine.Limit) bool {
	if !e.started {
		e.started, e.version, e.limit, e.size = true, c.Version, lim, c.Lease
		return false
	}
	return e.version != c.Version || e.limit.Rate != lim.Rate || e.limit.Burst != lim.Burst || e.size != c.Lease
}

// restart forgets the lease for c's policy and returns the tokens it held.
// Demand is counted afresh, so the key is checked directly until it is
// seen hot again.
func (e *lease) restart(c *engine.Check, lim engine.Limit) int64 {
	n := e.held
	e.version, e.limit, e.size, e.ret = c.Version, lim, c.Lease, engine.Check{}
	e.held, e.expires, e.lastTake, e.left, e.leftAt = 0, time.Time{}, time.Time{}, 0, time.Time{}
	e.winStart, e.winUnits, e.rate = time.Time{}, 0, 0
	return n
}

// want is the size of the next slice (see lease).
func (e *lease) want(c *engine.Check, lim engine.Limit, now time.Time) int64 {
	slice := min(c.Lease, quant.Units(lim.Burst), max(c.Cost, quant.UnitsUp(lim.Rate*LeasePeriod.Seconds())))
	k := min(max(quant.UnitsUp(e.demand()*LeasePeriod.Seconds()), c.Cost), slice-e.held)
	if est, ok := e.bucket(lim, now, time.Millisecond); ok && est-1 < k {
		k = max(est-1, c.Cost)
	}
	return min(k, slice)
}

// bucket estimates what the store's bucket holds at now: what it reported
// last plus its refill since, less margin of refill (the store's clock is
// not this one), at most its burst. ok is false when nothing was reported.
func (e *lease) bucket(lim engine.Limit, now time.Time, margin time.Duration) (int64, bool) {
	if e.leftAt.IsZero() {
		return 0, false
	}
	el := max(now.Sub(e.leftAt)-margin, 0)
	return min(quant.Units(float64(e.left)+lim.Rate*el.Seconds()), quant.Units(lim.Burst)), true
}

// retry is how long a check of cost rejected from e should wait: until
// the next take, or until the bucket refills cost.
func (e *lease) retry(lim engine.Limit, cost int64, now time.Time) time.Duration {
	wait := time.Duration((1 - e.takesLeft(now)) * float64(LeaseInterval))
	if est, ok := e.bucket(lim, now, 0); ok && est+e.held < cost {
		wait = max(wait, time.Duration(float64(cost-est-e.held)/lim.Rate*float64(time.Second)))
	}
	return max(wait, time.Microsecond)
}

// decision is the answer of a check decided from e: Remaining is the
// lease's tokens and the bucket's estimate, at most the burst.
func (e *lease) decision(lim engine.Limit, now time.Time, allowed bool, retry time.Duration) engine.Decision {
	limit := quant.Units(lim.Burst)
	est, _ := e.bucket(lim, now, 0)
	rem := min(e.held+est, limit)
	d := engine.Decision{N: 1}
	d.Results[0] = engine.Result{Allowed: allowed, Limit: limit, Remaining: rem, RetryAfter: retry,
		ResetAfter: time.Duration(float64(limit-rem) / lim.Rate * float64(time.Second))}
	d.Finish(nil)
	return d
}

// SweepLeases returns what every expired lease holds and forgets the keys
// not seen for LeaseLifetime, so that an idle key's tokens go back to the
// bucket for other daemons.
func (l *Limiter) SweepLeases(ctx context.Context) {
	if l.leases == nil {
		return
	}
	now := l.clock.Now()
	for k, e := range l.leases.snapshot() {
		e.mu.Lock()
		if e.held > 0 && !now.Before(e.expires) {
			n := e.held
			e.held = 0
			l.lc.expired.Add(1)
			l.giveBack(ctx, k.subject, e.ret, n)
		}
		// A key never leased and not hot is only a demand count: drop it
		// soon, so that a leased policy of many quiet subjects does not
		// fill the table.
		idle := now.Sub(e.lastSeen) >= LeaseLifetime || (e.lastTake.IsZero() && !e.hot())
		if e.held == 0 && idle {
			e.dead = true
			l.leases.remove(k, e)
		}
		e.mu.Unlock()
	}
}

// dropLeases forgets subject's leases under policies without returning
// their tokens: the store's state was reset, and tokens taken from the
// old one must not be admitted on top of a fresh bucket.
func (l *Limiter) dropLeases(subject string, policies []string) {
	if l.leases == nil {
		return
	}
	for _, p := range policies {
		k := leaseKey{subject, p}
		l.leases.mu.Lock()
		e := l.leases.m[k]
		l.leases.mu.Unlock()
		if e == nil {
			continue
		}
		e.mu.Lock()
		e.held, e.dead = 0, true
		l.leases.remove(k, e)
		e.mu.Unlock()
	}
}

// ReturnLeases returns what every lease holds, expired or not: what a
// daemon does before it stops.
func (l *Limiter) ReturnLeases(ctx context.Context) {
	if l.leases == nil {
		return
	}
	for k, e := range l.leases.snapshot() {
		e.mu.Lock()
		n := e.held
		e.held = 0
		l.giveBack(ctx, k.subject, e.ret, n)
		e.mu.Unlock()
	}
}

// RunLeases sweeps the leases every quarter of LeaseLifetime until ctx
// ends, then returns what they hold.
func (l *Limiter) RunLeases(ctx context.Context) error {
	t := time.NewTicker(LeaseLifetime / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			l.ReturnLeases(context.WithoutCancel(ctx))
			return nil
		case <-t.C:
			l.SweepLeases(ctx)
		}
	}
}
