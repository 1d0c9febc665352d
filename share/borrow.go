package share

import (
	"math"
	"time"
)

// Borrowing moves unused share to a region
// whose bucket is about to empty, between two rebalances, without waiting
// for the next epoch. It is safe by construction: the lender cuts its own
// share before it sends the Loan, so a loan in flight (or lost) only
// under-serves, and loans expire at the next Rebalance of either side (the
// borrower's expiry is a cut, applied at once; the lender's is a raise,
// applied Config.RaiseDelay later like every raise). Hence Σ enforced
// shares ≤ L_global holds with loans exactly as without them.
//
// Messages (both plain structs the gossip layer msgpacks as they are):
//
//	borrower ──BorrowRequest──▶ every peer      (at most one per key per Config.BorrowEvery)
//	lender   ──Loan──────────▶ borrower         (after the lender has cut)
//
// A lender that has no slack when the request arrives keeps it pending for
// Config.BorrowEvery and lends as soon as it has (see ServeLoans), because a
// region whose traffic just moved away still looks busy for a moment.

// BorrowVersion is the newest version of the BorrowRequest and Loan
// layouts this build knows (2 added BorrowRequest.Burst and Loan.Tokens;
// 3 is the same layout carrying tokens only, see TokenVersion). A receiver
// drops a version above its own, so a build that knows only 2 never sees
// a token message.
const BorrowVersion = TokenVersion

// RateVersion is the version of requests and loans of share (rate, with
// tokens at the onset of a shortage): what Borrow and Lend send.
const RateVersion = 2

// TokenVersion marks a request or loan of tokens only (tokens.go): a
// BorrowRequest of this version asks for Want seconds of L_global of
// tokens, and a Loan of it hands over Tokens (= Amount) seconds of
// L_global that the lender has already taken out of its bucket; it moves
// no share.
const TokenVersion = 3

// BorrowRequest asks every peer for part of its unused share of one key.
type BorrowRequest struct {
	Version uint8  `msgpack:"v" json:"version"`
	Region  string `msgpack:"r" json:"region"` // borrower
	// Epoch is the generation of the borrower's shares: the epoch of its
	// last Rebalance. A lender in another generation ignores the request.
	Epoch uint64 `msgpack:"e" json:"epoch"`
	Key
	// Want is the borrower's deficit, a fraction of L_global in (0, 1]: its
	// offered rate minus its current share, at most what would lift the
	// share to the whole limit.
	Want float64 `msgpack:"w" json:"want"`
	// Burst says the borrower has only just started rejecting the key,
	// after a quiet spell: a central bucket would still have held tokens
	// for it, so lenders hand over the tokens their cut takes away
	// (Loan.Tokens). A borrower that has been rejecting for a while asks
	// for rate only: a central bucket would have spent those tokens on
	// its traffic long before.
	Burst bool `msgpack:"b,omitempty" json:"burst,omitempty"`
}

// Loan is a lender's answer: Amount (a fraction of L_global) of the key's
// share moves from Lender to Borrower until the next Rebalance. The lender
// has already cut its own share by Amount when it sends the Loan.
type Loan struct {
	Version  uint8  `msgpack:"v" json:"version"`
	Lender   string `msgpack:"r" json:"lender"`
	Borrower string `msgpack:"b" json:"borrower"`
	Epoch    uint64 `msgpack:"e" json:"epoch"` // generation, as in the request
	Key
	Amount float64 `msgpack:"a" json:"amount"`
	// Tokens is burst handed over with the loan, in seconds of L_global
	// (units / L_global): the tokens the lender's bucket lost when its cut
	// lowered its capacity. The borrower spends them as an extra share of
	// Tokens/Config.BurstSpread for Config.BurstSpread after it accepts.
	Tokens float64 `msgpack:"x,omitempty" json:"tokens,omitempty"`
	// Seq numbers the lender's loans, so a duplicated message is applied
	// once.
	Seq uint64 `msgpack:"n" json:"seq"`
}

type loanID struct {
	lender string
	seq    uint64
}

// EncodedSizeEstimate is an upper estimate of the msgpack size in bytes.
func (r BorrowRequest) EncodedSizeEstimate() int {
	return 1 + 6*2 + 2 + 5 + 1 + len(r.Region) + 9 + len(r.Policy) + len(r.Subject) + 2*5 + 9
}

// EncodedSizeEstimate is an upper estimate of the msgpack size in bytes.
func (l Loan) EncodedSizeEstimate() int {
	return 1 + 8*2 + 2 + 9 + 2*5 + 9 + len(l.Lender) + len(l.Borrower) + 9 + len(l.Policy) + len(l.Subject) + 2*5 + 9
}

// NeedLoan is the borrower's pure decision. share is the region's current
// fraction of L_global (loans included), limit L_global in units/s, rate the
// key's offered rate here (units/s, rejected included) and tokens what the
// bucket holds now (units). The bucket empties within horizon when the
// offered rate exceeds the refill and tokens/(rate − refill) < horizon; the
// result is the deficit (rate/limit − share), or 0 when no loan is needed.
func NeedLoan(share, limit, rate, tokens float64, horizon time.Duration) float64 {
	if !(limit > 0) {
		return 0
	}
	refill := share * limit
	if !(rate > refill) {
		return 0
	}
	if tokens/(rate-refill) >= horizon.Seconds() {
		return 0
	}
	return rate/limit - share
}

// LendAmount is the lender's pure decision: the lender keeps
// Config.CapFactor times its own offered rate (the headroom the allocation
// gives a region) and lends Config.LendFraction of the rest, at most want.
// share is the lender's current fraction (loans included), rate its offered
// rate for the key (units/s).
func LendAmount(cfg Config, share, limit, rate, want float64) float64 {
	if !(limit > 0) || !(want > 0) {
		return 0
	}
	return lendFrom(cfg, share, cfg.CapFactor*rate/limit, want)
}

// lendFrom is what a lender of share that keeps keep (both fractions of
// L_global) lends against want: Config.LendFraction of the rest, at most
// want.
func lendFrom(cfg Config, share, keep, want float64) float64 {
	if !(want > 0) {
		return 0
	}
	// A lender keeps at least MinShare, which the engine enforces for a
	// share of zero anyway: lending it too would let the borrower's share
	// and the lender's floor add up to more than the whole limit.
	slack := share - max(keep, MinShare)
	if !(slack > 0) {
		return 0
	}
	return min(want, cfg.LendFraction*slack)
}

type pendKey struct {
	Key
	borrower string
}

type pending struct {
	req     BorrowRequest
	expires time.Time
	done    bool
}

// Borrow decides whether this region asks its peers for a loan on key at
// now (NeedLoan), at most once per Config.BorrowEvery per key. limit, rate
// and tokens are as for NeedLoan. The caller sends the request to every
// peer it can reach.
func (a *Allocator) Borrow(now time.Time, key Key, limit, rate, tokens float64) (BorrowRequest, bool) {
	if a.isolated || len(a.regions) < 2 || a.cfg.BorrowEvery <= 0 || limit < a.cfg.BorrowMinRate {
		return BorrowRequest{}, false
	}
	if last, ok := a.asked[key]; ok && now.Sub(last) < a.cfg.BorrowEvery {
		return BorrowRequest{}, false
	}
	s := a.share(now, key)
	// No more than the whole limit, less the MinShare every other region
	// enforces however much it lends.
	want := min(NeedLoan(s, limit, rate, tokens, a.cfg.BorrowHorizon), 1-s-float64(len(a.regions)-1)*MinShare)
	if !(want > 0) {
		return BorrowRequest{}, false
	}
	a.asked[key] = now
	return BorrowRequest{Version: RateVersion, Region: a.self, Epoch: a.gen, Key: key, Want: want}, true
}

// Use is what a region measured of one key over its last borrow tick.
type Use struct {
	// Rate is the key's offered rate in the region (units/s, rejected
	// included).
	Rate float64
	// Tokens is an estimate of what the region's bucket holds now (units);
	// a lender hands over the part its cut takes away (Loan.Tokens). Zero
	// when the estimate cannot be trusted (the region rejected lately).
	Tokens float64
	// Span is the time Rate was counted over. With it, a lender whose Rate
	// is within Config.NoiseZ Poisson standard deviations of its smoothed
	// demand keeps headroom over that demand instead (lendKeep). Zero: Rate
	// is taken as it is.
	Span time.Duration
}

// lendKeepZ is how many Poisson standard deviations of its interval count
// a lender keeps above its smoothed demand (lendKeep): 2, about 6% at 100
// units/s.
const lendKeepZ = 2

// lendKeep is the share (a fraction of L_global) a lender keeps for its
// own traffic of key k: CapFactor × u.Rate, as LendAmount, or less when
// u.Rate is within Config.NoiseZ Poisson standard deviations of the
// lender's smoothed demand D: the rate is then counting noise around D,
// and the lender keeps an upper bound of its mean rate over the interval,
// D + lendKeepZ·√(D·T)/T (T = Interval). A rate counted over a quarter
// second from a few dozen arrivals is ±20%, and 1.2 times it made a lender
// keep up to 1.4·D: the share kept beyond its use was refill wasted, and
// its bucket (one second of that share) tokens stranded, while the borrower
// rejected. The lender's bucket absorbs its own short-term noise. Never
// more than CapFactor × u.Rate: a region whose traffic is leaving, still
// within the noise of a demand that lags it, lends as much as before.
func (a *Allocator) lendKeep(k Key, u Use, limit float64) float64 {
	keep := a.cfg.CapFactor * u.Rate / limit
	d, ok := a.demand[k]
	span := u.Span.Seconds()
	if !ok || !(d > 0) || !(span > 0) || !(a.cfg.NoiseZ > 0) || !(u.Rate >= 0) {
		return keep
	}
	if math.Abs(u.Rate-d) > a.cfg.NoiseZ*math.Sqrt(d*span)/span {
		return keep // a real change of the lender's own traffic
	}
	t := a.cfg.Interval.Seconds()
	return min(keep, (d+lendKeepZ*math.Sqrt(d*t)/t)/limit)
}

// Lend answers a peer's request at now; u is this region's use of the key
// and limit L_global. If it lends, it cuts its own share first and returns
// the Loan to send. What it cannot lend yet (all of the request, or the
// rest of it) stays pending for Config.BorrowEvery (ServeLoans). Requests
// from another generation, from unknown regions or while isolated are
// dropped.
func (a *Allocator) Lend(now time.Time, req BorrowRequest, limit float64, u Use) (Loan, bool) {
	if req.Epoch != a.gen || req.Region == a.self || a.isolated || !(req.Want > 0) || limit < a.cfg.BorrowMinRate ||
		req.Version >= TokenVersion {
		return Loan{}, false
	}
	if _, ok := a.index[req.Region]; !ok {
		return Loan{}, false
	}
	pk := pendKey{Key: req.Key, borrower: req.Region}
	if i, ok := a.pending[pk]; ok {
		a.pendList[i].done = true // superseded
		delete(a.pending, pk)
	}
	l, ok := a.tryLend(now, req, limit, u, false)
	if rest := req.Want - l.Amount; rest >= minLoan {
		// The rest waits for slack: a region whose traffic has just moved
		// away still looks busy for a tick.
		req.Want = rest
		req.Burst = false // the tokens went with the first loan
		a.pending[pk] = len(a.pendList)
		a.pendList = append(a.pendList, pending{req: req, expires: now.Add(a.cfg.BorrowEvery)})
	}
	return l, ok
}

// tryLend lends if the amount is worth a message: the whole want, at least
// half of this region's share, or anything at all once the request is
// about to expire (last).
func (a *Allocator) tryLend(now time.Time, req BorrowRequest, limit float64, u Use, last bool) (Loan, bool) {
	s := a.share(now, req.Key)
	amt := lendFrom(a.cfg, s, a.lendKeep(req.Key, u, limit), req.Want)
	if !(amt > 0) || (amt < req.Want && amt < s/2 && !last) || amt < minLoan {
		return Loan{}, false
	}
	a.loans[req.Key] -= amt
	a.refresh()
	a.lendSeq++
	return Loan{Version: RateVersion, Lender: a.self, Borrower: req.Region, Epoch: a.gen, Key: req.Key,
		Amount: amt, Tokens: a.lendTokens(req, s, amt, limit, u), Seq: a.lendSeq}, true
}

// lendTokens is the burst a loan of amt hands over (seconds of L_global)
// for a request marked Burst: what the cut from s to s − amt takes out of
// this region's bucket, whose
// capacity is taken to be one second of its refill (the default burst).
// Only a region that sees the key's traffic (u.Rate > 0) hands tokens
// over: its next check clamps the bucket to the lowered capacity, so the
// tokens are gone here before the borrower spends them. A bucket the
// engine never checks again would keep them, and a later raise would
// refill it from there.
func (a *Allocator) lendTokens(req BorrowRequest, s, amt, limit float64, u Use) float64 {
	if !req.Burst || a.cfg.BurstSpread <= 0 || !(u.Rate > 0) || !(limit > 0) || !(u.Tokens > 0) {
		return 0
	}
	held := min(u.Tokens/limit, s) // a bucket holds at most its capacity
	return min(max(held-(s-amt), 0), amt)
}

// minLoan is the smallest loan worth a message (a fraction of L_global).
const minLoan = 1e-3

// ServeLoans retries the pending requests at now, oldest first, and
// returns the loans to send; use gives this region's L_global and use of a
// key. Call it often (every few hundred ms at most).
func (a *Allocator) ServeLoans(now time.Time, use func(Key) (limit float64, u Use)) []Loan {
	if len(a.pending) == 0 {
		a.pendList = a.pendList[:0]
		return nil
	}
	var out []Loan
	keep := a.pendList[:0]
	for _, p := range a.pendList {
		if p.done {
			continue
		}
		pk := pendKey{Key: p.req.Key, borrower: p.req.Region}
		last := !now.Before(p.expires.Add(-a.cfg.BorrowEvery / 10))
		limit, u := use(p.req.Key)
		if l, ok := a.tryLend(now, p.req, limit, u, last); ok {
			out = append(out, l)
			p.req.Want -= l.Amount
			p.req.Burst = false
		}
		if last || p.req.Want < minLoan {
			delete(a.pending, pk)
			continue
		}
		a.pending[pk] = len(keep)
		keep = append(keep, p)
	}
	clear(a.pendList[len(keep):])
	a.pendList = keep
	return out
}

// Pending returns the number of requests waiting for slack.
func (a *Allocator) Pending() int { return len(a.pending) }

// Accept applies a loan addressed to this region at now. Loans of another
// generation (the borrower or the lender has rebalanced since) are dropped:
// the lender's cut has expired or will at its own Rebalance.
//
// A loan of TokenVersion moves no share and changes no share: the owner
// deposits its tokens into the region's bucket.
func (a *Allocator) Accept(now time.Time, l Loan) bool {
	if l.Borrower != a.self || l.Epoch != a.gen || !(l.Amount > 0) || a.isolated {
		return false
	}
	if _, ok := a.index[l.Lender]; !ok {
		return false
	}
	id := loanID{lender: l.Lender, seq: l.Seq}
	if a.accepted[id] {
		return false // duplicate
	}
	a.accepted[id] = true
	if l.Version >= TokenVersion {
		return true // the owner deposits the tokens into its bucket
	}
	a.loans[l.Key] += l.Amount
	delete(a.asked, l.Key) // still short after this loan: ask again at once
	if t := min(l.Tokens, l.Amount); t > 0 && a.cfg.BurstSpread > 0 {
		a.addBurst(now, l.Key, t)
	}
	a.refresh()
	return true
}

// burst is tokens received with loans, spent as an extra share until
// until.
type burst struct {
	share float64 // fraction of L_global
	until time.Time
}

// addBurst spreads t seconds of L_global, with what is left of an earlier
// burst of the key, over Config.BurstSpread from now, or longer if the
// extra share would lift the key's share above 1 (where the engine would
// clamp it and the tokens would be lost).
func (a *Allocator) addBurst(now time.Time, k Key, t float64) {
	if b, ok := a.bursts[k]; ok && now.Before(b.until) {
		t += b.share * b.until.Sub(now).Seconds()
	}
	delete(a.bursts, k)
	room := 1 - a.share(now, k)
	if room <= 0 {
		return
	}
	x := min(t/a.cfg.BurstSpread.Seconds(), room)
	d := min(time.Duration(t/x*float64(time.Second)), a.cfg.Interval) // a generation ends sooner
	a.bursts[k] = burst{share: x, until: now.Add(d)}
}

// expireBursts drops the bursts spent by now.
func (a *Allocator) expireBursts(now time.Time) {
	for k, b := range a.bursts {
		if !now.Before(b.until) {
			delete(a.bursts, k)
			a.refresh()
		}
	}
}

// BurstsUntil returns when the next burst received with a loan ends (its
// extra share is then no longer in Table), or the zero time if none is
// running. The owner publishes a new Table then.
func (a *Allocator) BurstsUntil() time.Time {
	var t time.Time
	for _, b := range a.bursts {
		if t.IsZero() || b.until.Before(t) {
			t = b.until
		}
	}
	return t
}

// Overlay returns, per key, what this generation's loans and the tokens
// received with them add to this region's share at now (negative for a
// lender): what Table adds to the base shares. An owner that enforces base
// shares of its own before the first Rebalance (1/n of the regions it sees
// live) adds it to them, so that loans of the start generation are
// enforced like any other.
func (a *Allocator) Overlay(now time.Time) map[Key]float64 {
	a.expireBursts(now)
	if len(a.loans) == 0 && len(a.bursts) == 0 {
		return nil
	}
	out := make(map[Key]float64, len(a.loans)+len(a.bursts))
	for k, v := range a.loans {
		out[k] = v
	}
	for k, b := range a.bursts {
		out[k] += b.share
	}
	return out
}

// Generation returns the generation loans and borrow requests of this
// region carry: the epoch of the last Rebalance, or before the first the
// start generation (NewAllocator).
func (a *Allocator) Generation() uint64 { return a.gen }

// Loans returns this region's net loan of key in the current generation
// (+ borrowed, − lent), a fraction of L_global.
func (a *Allocator) Loans(key Key) float64 { return a.loans[key] }
