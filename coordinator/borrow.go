package coordinator

import (
	"maps"
	"math"
	"slices"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/share"
)

// Borrowing between rebalances, driven
// exactly as the simulator drives it, with the same share functions:
//
//   - Every BorrowTick (250 ms) the core takes the engine usage its owner
//     passed to Tick since the last one (kept for the interval's report
//     too) and derives, per global key, the
//     region's offered rate over that tick and an estimate of the region's
//     bucket level; the region's acting node calls Allocator.Borrow with
//     them and sends the request to every other region (through its relay,
//     which sends it on to the region's other nodes; see Relay).
//   - A borrow request is answered at once by the acting node of each other
//     region with Allocator.Lend (its rate: the same estimate), which cuts
//     its own share before the Loan is sent; requests it cannot serve yet
//     are retried every tick by Allocator.ServeLoans.
//   - A Loan is applied by every node of the borrower region with
//     Allocator.Accept (duplicates once, other generations dropped), and
//     mirrored by the lender's other nodes as a cut (below).
//   - Loans expire at the next Rebalance: for the borrower a cut at once, for
//     the lender a raise RaiseDelay later.
//
// The acting node is the region's publisher, its live node with the
// smallest id, so a region asks and lends once. It lends only if it was
// already the acting node at the generation's rebalance: a node that took
// over mid-generation has mirrored its predecessor's loans as cuts its
// allocator does not know, and could lend the same slack twice.
//
// What the simulator reads directly is approximated:
//
//   - Rate: the simulator keeps an exponentially decaying count per key
//     (τ = 250 ms) of the region's arrivals. A node sees only its own
//     arrivals, so the acting node takes its own offered rate over the last
//     tick times the number of live nodes in its region: exact when the
//     region's load balancer spreads a key evenly over its nodes, and an
//     over- or under-estimate by that spread otherwise.
//   - Bucket level: the simulator reads Remaining from the decision. The
//     engine's buckets (memory or Redis) are not readable cheaply off the
//     check path, so the coordinator runs a small token estimate per key
//     from the usage it drains anyway: a bucket of one second of refill
//     (the default burst = rate), refilled at share·L and drained by the
//     region's admitted units; any rejection in the tick means the real
//     bucket is empty, so the estimate is set to zero.
//
// Other nodes of a lender region: Allocator.Lend cuts only the acting
// node's allocator, and share has no call to record a loan another node
// made, so every other node of the lender region (gossip.SendLoan sends
// there first, and to the borrower only after those sends finished)
// subtracts the Loan's amount from its published share for the rest of the
// generation, dedup by (sending node, Seq), and at the next rebalance keeps
// the lower share until the raise, as the allocator does for its own loans.
//
// The published share is clamped to [share.MinShare, 1] (share.Scale): a
// share plus loans can exceed 1 (several lenders answering one request),
// and the engine rejects a Scale above 1.

type mirrorID struct {
	node string
	seq  uint64
}

// borrowState is the core's borrowing state.
type borrowState struct {
	acc       map[engine.UsageKey]engine.Usage // drained since the last report drain
	fast      map[engine.UsageKey]engine.Usage // drained since the last rate update
	fastAt    time.Time
	nextTick  time.Time
	nextCheck time.Time               // next look for a shortage between two ticks
	rates     map[share.Key]float64   // region's offered rate, units/s
	rateSpan  time.Duration           // what rates were counted over
	highs     map[share.Key]float64   // upper confidence bound of rates
	rejected  map[share.Key]time.Time // last tick with a rejection
	onset     map[share.Key]time.Time // first rejection after a quiet spell
	tokens    map[share.Key]float64   // region's bucket level estimate, units

	gen      uint64 // generation: the last rebalanced epoch
	actorGen bool   // this node was the acting node at that rebalance

	cut       map[share.Key]float64 // mirrored loans of this generation
	mirrored  map[mirrorID]bool
	caps      map[share.Key]float64
	capsUntil time.Time
}

func (b *borrowState) init(now time.Time) {
	b.acc = map[engine.UsageKey]engine.Usage{}
	b.fast = map[engine.UsageKey]engine.Usage{}
	b.fastAt = now
	b.rates = map[share.Key]float64{}
	b.tokens = map[share.Key]float64{}
	b.rejected = map[share.Key]time.Time{}
	b.onset = map[share.Key]time.Time{}
	b.cut = map[share.Key]float64{}
	b.mirrored = map[mirrorID]bool{}
}

func (c *Core) borrowing() bool { return c.cfg.Share.BorrowEvery > 0 }

// startGen reports whether this region may borrow and lend before its
// first rebalance, in the start generation (share.NewAllocator): only while
// the 1/n it enforces is the allocator's default too (no restored shares,
// no dead region, the allocator's regions exactly those live), so that what
// a lender cuts from is what it enforces. Regions started together (a new
// cluster) then move share inside the first interval instead of waiting
// up to two for their first rebalance; a region that joins a running
// cluster is in another generation than its peers, whose requests and
// loans it ignores, as they ignore its.
func (c *Core) startGen() bool {
	if c.balanced || c.alloc == nil || c.restored != nil || len(c.dead) > 0 {
		return false
	}
	regions := c.alloc.Regions()
	if len(regions) != len(c.live) {
		return false
	}
	for _, r := range regions {
		if _, ok := c.live[r]; !ok {
			return false
		}
	}
	return true
}

// canBorrow reports whether this node asks and lends for its region now:
// it is the acting node, in a rebalanced generation or the start one.
func (c *Core) canBorrow() bool { return (c.balanced || c.startGen()) && c.isActor() }

// expireCuts ends the generation's mirrored loans before a rebalance: like
// the lender's own loans their expiry is a raise, so the shares enforced
// until now cap the new ones until RaiseDelay.
func (c *Core) expireCuts(now time.Time) {
	if len(c.b.cut) > 0 {
		old := c.view
		caps := make(map[share.Key]float64, len(c.b.cut))
		for k := range c.b.cut {
			caps[k] = old.Share(k.Policy, k.Subject)
		}
		c.b.caps, c.b.capsUntil = caps, now.Add(c.cfg.Share.RaiseDelay)
	}
	clear(c.b.cut)
	clear(c.b.mirrored)
}

// borrowTick measures the keys' rates and bucket levels, asks for loans and
// serves pending requests; at most once per BorrowTick.
func (c *Core) borrowTick(now time.Time) {
	if !c.borrowing() {
		return
	}
	if c.b.caps != nil && !now.Before(c.b.capsUntil) {
		c.publish(now)
	}
	if c.alloc != nil {
		if t := c.alloc.BurstsUntil(); !t.IsZero() && !now.Before(t) {
			c.publish(now) // tokens received with a loan are spent
		}
	}
	if now.Before(c.b.nextTick) {
		if !now.Before(c.b.nextCheck) {
			c.b.nextCheck = now.Add(c.checkEvery())
			c.shortage(now)
		}
		return
	}
	c.b.nextTick = now.Add(c.cfg.BorrowTick)
	c.b.nextCheck = now.Add(c.checkEvery())
	c.measure(now)
	if !c.canBorrow() {
		return
	}
	for _, k := range slices.SortedFunc(maps.Keys(c.b.rates), compareKeys) {
		c.borrow(now, k, c.b.rates[k], c.b.tokens[k])
	}
	if c.b.actorGen && c.alloc.Pending() > 0 {
		c.serve(now, c.lendUse)
	}
}

// checkEvery is how often the core looks for a key that has started
// rejecting between two borrow ticks: a shortage is asked for at the
// first look that sees it, not at the next tick.
func (c *Core) checkEvery() time.Duration { return min(c.cfg.BorrowTick, 100*time.Millisecond) }

// shortage asks at once for the keys the engine has rejected since the
// last borrow tick, with their offered rate over that time (at least one
// checkEvery) and an empty bucket; the per-key limit of one request per
// BorrowEvery still holds.
func (c *Core) shortage(now time.Time) {
	if !c.canBorrow() {
		return
	}
	dt := now.Sub(c.b.fastAt).Seconds()
	nodes := float64(max(1, len(c.live[c.self])))
	var short, surge []share.Key
	for k, u := range c.b.fast {
		key := share.Key{Policy: k.Policy, Subject: k.Subject}
		switch {
		case u.Demand > u.Admitted:
			short = append(short, key)
		case c.surging(key, u, dt, nodes):
			surge = append(surge, key)
		}
	}
	c.askTokens(now, dt, nodes)
	slices.SortFunc(short, compareKeys)
	for _, k := range short {
		u := c.b.fast[engine.UsageKey{Policy: k.Policy, Subject: k.Subject}]
		c.rejectedAt(now, k)
		c.borrow(now, k, float64(u.Demand)/dt*nodes, 0)
	}
	slices.SortFunc(surge, compareKeys)
	for _, k := range surge {
		// Not rejecting yet, but offered far more than the share refills:
		// ask now, with the bucket estimate drained by what was admitted,
		// rather than at the first rejection a look later.
		u := c.b.fast[engine.UsageKey{Policy: k.Policy, Subject: k.Subject}]
		limit, _ := c.cfg.Limit(k.Policy)
		tok := max(c.b.tokens[k]+c.Share(k.Policy, k.Subject)*limit*dt-float64(u.Admitted)*nodes, 0)
		c.borrow(now, k, float64(u.Demand)/dt*nodes, tok)
	}
	if c.b.actorGen && c.alloc.Pending() > 0 {
		// A request waiting for slack is served as soon as the key's
		// traffic here has clearly fallen (it moved to the borrower), not
		// at the next tick.
		c.serve(now, func(k share.Key) (float64, share.Use) {
			limit, u := c.lendUse(k)
			n := float64(c.b.fast[engine.UsageKey{Policy: k.Policy, Subject: k.Subject}].Demand)
			if expect := u.Rate / nodes * dt; expect-n > max(c.cfg.Share.NoiseZ, 1)*math.Sqrt(expect)+1 {
				u.Rate, u.Span = n/dt*nodes, now.Sub(c.b.fastAt)
			}
			return limit, u
		})
	}
}

// surging reports whether key k, not rejected since the last borrow tick,
// was offered u.Demand units by this node over dt seconds, clearly more
// (beyond NoiseZ Poisson standard deviations) than its share refills.
func (c *Core) surging(k share.Key, u engine.Usage, dt float64, nodes float64) bool {
	if _, ok := c.b.tokens[k]; !ok || !(dt > 0) {
		return false // no bucket estimate: the key was idle
	}
	limit, ok := c.cfg.Limit(k.Policy)
	if !ok || !(limit > 0) {
		return false
	}
	expect := c.Share(k.Policy, k.Subject) * limit * dt / nodes
	return float64(u.Demand)-expect > max(c.cfg.Share.NoiseZ, 1)*math.Sqrt(expect)+1
}

// serve lends what it can to the pending requests.
func (c *Core) serve(now time.Time, use func(share.Key) (float64, share.Use)) {
	loans := c.alloc.ServeLoans(now, use)
	if len(loans) > 0 {
		c.publish(now) // cut before the loans leave
	}
	for _, l := range loans {
		c.lent(l)
	}
}

// borrow asks for a loan of key k if Allocator.Borrow says so; rate and
// tokens are the region's offered rate and bucket level.
func (c *Core) borrow(now time.Time, k share.Key, rate, tokens float64) {
	limit, ok := c.cfg.Limit(k.Policy)
	if !ok {
		return
	}
	if req, ok := c.alloc.Borrow(now, k, limit, rate, tokens); ok {
		// At the onset of a shortage, or before any rejection at all (a
		// surge seen coming), a central bucket would still hold tokens.
		on, ok := c.b.onset[k]
		last, rejected := c.b.rejected[k]
		onset := ok && now.Sub(on) <= c.cfg.Share.BorrowEvery || !rejected || now.Sub(last) > c.quiet()
		req.Burst = onset && c.bucket(k.Policy)
		c.m.Borrow.WithLabelValues("requested").Inc()
		c.rd.Borrows = append(c.rd.Borrows, req)
	}
}

// rejectedAt records that the engine rejected key k by now, and the onset
// of a shortage if it is the first rejection after a quiet spell.
func (c *Core) rejectedAt(now time.Time, k share.Key) {
	if last, ok := c.b.rejected[k]; !ok || now.Sub(last) > c.quiet() {
		c.b.onset[k] = now
	}
	c.b.rejected[k] = now
}

// measure turns the units drained since the last update into the region's
// offered rate and bucket level per global key (see the top of this file).
func (c *Core) measure(now time.Time) {
	dt := now.Sub(c.b.fastAt).Seconds()
	if dt < c.cfg.BorrowTick.Seconds()/2 {
		return // too short to be a rate: keep counting
	}
	nodes := float64(max(1, len(c.live[c.self])))
	rates := make(map[share.Key]float64, len(c.b.fast))
	tokens := make(map[share.Key]float64, len(c.b.fast))
	for k, u := range c.b.fast {
		limit, ok := c.cfg.Limit(k.Policy)
		if !ok || limit <= 0 {
			continue
		}
		key := share.Key{Policy: k.Policy, Subject: k.Subject}
		rates[key] = float64(u.Demand) / dt * nodes
		refill := c.Share(k.Policy, k.Subject) * limit
		capacity := refill // one second of refill
		tok, seen := c.b.tokens[key]
		if !seen {
			tok = capacity
		}
		if u.Demand > u.Admitted {
			tok = 0 // the engine rejected: its bucket is empty
			c.rejectedAt(now, key)
		} else {
			tok = min(max(tok+refill*dt-float64(u.Admitted)*nodes, 0), capacity)
		}
		tokens[key] = tok
	}
	c.b.rates, c.b.tokens = rates, tokens
	c.b.rateSpan = now.Sub(c.b.fastAt)
	c.b.fast = map[engine.UsageKey]engine.Usage{}
	c.b.fastAt = now
}

// lendUse is ServeLoans' view of a key: L_global and the region's offered
// rate and bucket level.
func (c *Core) lendUse(k share.Key) (float64, share.Use) {
	limit, _ := c.cfg.Limit(k.Policy)
	return limit, c.use(k)
}

func (c *Core) use(k share.Key) share.Use {
	u := share.Use{Rate: c.b.rates[k], Tokens: c.b.tokens[k], Span: c.b.rateSpan}
	if t, ok := c.b.rejected[k]; ok && c.b.fastAt.Sub(t) <= c.quiet() || !c.bucket(k.Policy) {
		u.Tokens = 0 // the estimate is a guess since the bucket ran dry, or no bucket at all
	}
	return u
}

// borrowRequest answers another region's request on the region's acting
// node: a loan (its own share cut first) or a pending request.
func (c *Core) borrowRequest(now time.Time, r share.BorrowRequest) {
	if !c.canBorrow() || !c.b.actorGen {
		return // no generation to lend in, or not this node's to answer
	}
	limit, ok := c.cfg.Limit(r.Policy)
	if !ok {
		return
	}
	if r.Version >= share.TokenVersion {
		c.tokenRequest(now, r, limit)
		return
	}
	if l, ok := c.alloc.Lend(now, r, limit, c.use(r.Key)); ok {
		c.publish(now) // a lender cuts before its loan leaves
		c.lent(l)
	}
}

// loan applies a loan sent by node from: borrowed if this region is the
// borrower, mirrored as a cut if another node of this region lent it.
func (c *Core) loan(now time.Time, from string, l share.Loan) {
	if !c.balanced && !c.startGen() {
		return
	}
	switch {
	case l.Borrower == c.self && l.Version >= share.TokenVersion:
		c.tokenLoan(now, l)
	case l.Borrower == c.self:
		if c.alloc.Accept(now, l) {
			c.m.Borrow.WithLabelValues("accepted").Inc()
			c.publish(now)
		}
	case l.Lender == c.self && l.Version < share.TokenVersion: // a token loan cuts no share
		id := mirrorID{node: from, seq: l.Seq}
		if l.Epoch != c.b.gen || c.b.mirrored[id] {
			return
		}
		c.b.mirrored[id] = true
		c.b.cut[l.Key] += l.Amount
		c.m.Borrow.WithLabelValues("mirrored").Inc()
		c.publish(now)
	}
}

func (c *Core) lent(l share.Loan) {
	c.m.Borrow.WithLabelValues("lent").Inc()
	c.rd.Loans = append(c.rd.Loans, l)
}

// bucket reports whether loans of policy may hand over tokens
// (CoreConfig.Bucket).
func (c *Core) bucket(policy string) bool { return c.cfg.Bucket != nil && c.cfg.Bucket(policy) }

// quiet is how long a key must go without a rejection for the next one to
// mark the onset of a shortage (BorrowRequest.Burst), and for this
// region's bucket estimate to be trusted as a lender's (Use.Tokens).
func (c *Core) quiet() time.Duration { return 2 * c.cfg.Share.BorrowEvery }
