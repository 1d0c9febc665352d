package globalshare

import (
	"context"
	"maps"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/gossip"
	"github.com/sluice-rl/sluice/share"
)

// Borrowing between rebalances (share-algorithms.md §3 step 6), driven
// exactly as the simulator drives it, with the same share functions:
//
//   - Every BorrowTick (250 ms) the coordinator drains the engine's usage
//     (kept for the interval's report too) and derives, per global key, the
//     region's offered rate over that tick and an estimate of the region's
//     bucket level; the region's acting node calls Allocator.Borrow with
//     them and sends the request to every node of the other regions.
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
// The published share is capped at 1: a share plus loans can exceed it
// (several lenders answering one request), and the engine rejects a Scale
// above 1.

// outboxSize bounds the borrow messages waiting to be sent; a full outbox
// drops (a dropped loan under-serves until the next rebalance).
const outboxSize = 256

// maxMail bounds the borrow messages waiting for Run's goroutine.
const maxMail = 4096

// view is what Share reads: the allocator's table (its own loans included),
// the cuts another node of this region lent this generation, and the caps
// that keep those cuts in force after a rebalance until the raise.
// Immutable once published.
type view struct {
	t    *share.Table
	cut  map[share.Key]float64 // fraction of L_global lent by another node of this region
	caps map[share.Key]float64 // upper bounds until the raise after a rebalance
}

func (v *view) share(policy, subject string) float64 {
	s := v.t.Share(policy, subject)
	if v.cut != nil || v.caps != nil {
		k := share.Key{Policy: policy, Subject: subject}
		if d, ok := v.cut[k]; ok {
			s = max(s-d, share.MinShare)
		}
		if c, ok := v.caps[k]; ok {
			s = min(s, c)
		}
	}
	return min(s, 1)
}

type inLoan struct {
	from string // sending node
	loan share.Loan
}

type outMsg struct {
	req    share.BorrowRequest
	loan   share.Loan
	isLoan bool
}

type mirrorID struct {
	node string
	seq  uint64
}

// borrowState is the borrowing state of Run's goroutine.
type borrowState struct {
	acc      map[engine.UsageKey]engine.Usage // drained since the last report drain
	fast     map[engine.UsageKey]engine.Usage // drained since the last rate update
	fastAt   time.Time
	nextTick time.Time
	rates    map[share.Key]float64 // region's offered rate, units/s
	tokens   map[share.Key]float64 // region's bucket level estimate, units

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
	b.cut = map[share.Key]float64{}
	b.mirrored = map[mirrorID]bool{}
}

func addUsage(dst map[engine.UsageKey]engine.Usage, src map[engine.UsageKey]engine.Usage) {
	for k, u := range src {
		d := dst[k]
		d.Demand += u.Demand
		d.Admitted += u.Admitted
		dst[k] = d
	}
}

func (c *Coordinator) borrowing() bool { return c.cfg.Share.BorrowEvery > 0 }

// drainTick drains the engine between report drains, keeping the units for
// the report (acc) and for the rate (fast).
func (c *Coordinator) drainTick() {
	u := c.cfg.Usage()
	c.countQuotas(u)
	addUsage(c.b.acc, u)
	addUsage(c.b.fast, u)
}

// drain is the report's drain: everything since the last one.
func (c *Coordinator) drain() map[engine.UsageKey]engine.Usage {
	c.drainTick()
	out := c.b.acc
	c.b.acc = map[engine.UsageKey]engine.Usage{}
	return out
}

// isActor reports whether this node acts for its region: its publisher.
func (c *Coordinator) isActor() bool {
	live := c.cfg.Gossip.Regions()[c.self]
	return len(live) == 0 || live[0] == c.node
}

// publish stores the view Share reads.
func (c *Coordinator) publish(now time.Time) {
	v := &view{t: c.alloc.Table(now)}
	if len(c.b.cut) > 0 {
		v.cut = maps.Clone(c.b.cut)
	}
	if c.b.caps != nil {
		if now.Before(c.b.capsUntil) {
			v.caps = c.b.caps
		} else {
			c.b.caps = nil
		}
	}
	c.view.Store(v)
}

// expireCuts ends the generation's mirrored loans before a rebalance: like
// the lender's own loans their expiry is a raise, so the shares enforced
// until now cap the new ones until RaiseDelay.
func (c *Coordinator) expireCuts(now time.Time) {
	if len(c.b.cut) > 0 {
		old := c.view.Load()
		caps := make(map[share.Key]float64, len(c.b.cut))
		for k := range c.b.cut {
			caps[k] = old.share(k.Policy, k.Subject)
		}
		c.b.caps, c.b.capsUntil = caps, now.Add(c.cfg.Share.RaiseDelay)
	}
	clear(c.b.cut)
	clear(c.b.mirrored)
}

// borrowTick measures the keys' rates and bucket levels, asks for loans and
// serves pending requests; at most once per BorrowTick.
func (c *Coordinator) borrowTick() {
	if !c.borrowing() || c.alloc == nil {
		return
	}
	now := c.clock.Now()
	if now.Before(c.b.nextTick) {
		return
	}
	c.b.nextTick = now.Add(c.cfg.BorrowTick)
	c.drainTick()
	c.measure(now)
	if c.b.caps != nil && !now.Before(c.b.capsUntil) {
		c.publish(now)
	}
	if !c.balanced || !c.isActor() {
		return
	}
	for k, rate := range c.b.rates {
		limit, ok := c.cfg.Limit(k.Policy)
		if !ok {
			continue
		}
		if req, ok := c.alloc.Borrow(now, k, limit, rate, c.b.tokens[k]); ok {
			c.m.borrow.WithLabelValues("requested").Inc()
			c.reqSent.Add(1)
			c.enqueue(outMsg{req: req})
		}
	}
	if c.b.actorGen && c.alloc.Pending() > 0 {
		loans := c.alloc.ServeLoans(now, c.lendRate)
		if len(loans) > 0 {
			c.publish(now) // cut before the loans leave
		}
		for _, l := range loans {
			c.lent(l)
		}
	}
}

// measure turns the units drained since the last update into the region's
// offered rate and bucket level per global key (see the top of this file).
func (c *Coordinator) measure(now time.Time) {
	dt := now.Sub(c.b.fastAt).Seconds()
	if dt < c.cfg.BorrowTick.Seconds()/2 {
		return // too short to be a rate: keep counting
	}
	nodes := float64(max(1, len(c.cfg.Gossip.Regions()[c.self])))
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
		} else {
			tok = min(max(tok+refill*dt-float64(u.Admitted)*nodes, 0), capacity)
		}
		tokens[key] = tok
	}
	c.b.rates, c.b.tokens = rates, tokens
	c.b.fast = map[engine.UsageKey]engine.Usage{}
	c.b.fastAt = now
}

// lendRate is ServeLoans' view of a key: L_global and the region's offered
// rate.
func (c *Coordinator) lendRate(k share.Key) (float64, float64) {
	limit, _ := c.cfg.Limit(k.Policy)
	return limit, c.b.rates[k]
}

// borrowMail handles the borrow messages receive filed.
func (c *Coordinator) borrowMail() {
	c.mu.Lock()
	reqs, loans := c.inReq, c.inLoan
	c.inReq, c.inLoan = nil, nil
	c.mu.Unlock()
	defer func() {
		c.reqIn.Add(int64(len(reqs)))
		c.loansIn.Add(int64(len(loans)))
	}()
	if !c.balanced || c.alloc == nil {
		return // no generation yet: requests and loans would be refused anyway
	}
	now := c.clock.Now()
	changed := false
	var out []share.Loan
	if c.isActor() && c.b.actorGen {
		for _, r := range reqs {
			limit, ok := c.cfg.Limit(r.Policy)
			if !ok {
				continue
			}
			if l, ok := c.alloc.Lend(now, r, limit, c.b.rates[r.Key]); ok {
				out = append(out, l)
				changed = true
			}
		}
	}
	for _, in := range loans {
		l := in.loan
		switch {
		case l.Borrower == c.self:
			if c.alloc.Accept(now, l) {
				c.m.borrow.WithLabelValues("accepted").Inc()
				changed = true
			}
		case l.Lender == c.self:
			id := mirrorID{node: in.from, seq: l.Seq}
			if l.Epoch != c.b.gen || c.b.mirrored[id] {
				continue
			}
			c.b.mirrored[id] = true
			c.b.cut[l.Key] += l.Amount
			c.m.borrow.WithLabelValues("mirrored").Inc()
			changed = true
		}
	}
	if changed {
		c.publish(now) // a lender cuts before its loans leave
	}
	for _, l := range out {
		c.lent(l)
	}
}

func (c *Coordinator) lent(l share.Loan) {
	c.m.borrow.WithLabelValues("lent").Inc()
	c.loansSent.Add(1)
	c.enqueue(outMsg{loan: l, isLoan: true})
}

func (c *Coordinator) enqueue(m outMsg) {
	select {
	case c.out <- m:
	default:
		c.m.borrow.WithLabelValues("send_dropped").Inc()
	}
}

// sendLoop sends borrow messages off Run's goroutine, in order, so a slow
// peer delays neither the epochs nor the check path.
func (c *Coordinator) sendLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-c.out:
			var err error
			if m.isLoan {
				err = c.cfg.Gossip.SendLoan(ctx, m.loan)
			} else {
				err = c.cfg.Gossip.SendBorrowRequest(ctx, m.req)
			}
			if err != nil && ctx.Err() == nil {
				c.m.borrow.WithLabelValues("send_failed").Inc()
				c.log.Debug("globalshare: send borrow message", "loan", m.isLoan, "err", err)
			}
		}
	}
}

var _ Gossip = (*gossip.Node)(nil)
