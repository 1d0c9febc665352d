package coordinator

import (
	"maps"
	"slices"
	"time"

	"github.com/sluice-rl/sluice/coordinator/msg"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/share"
)

// Epochs and reports. Every epoch boundary the core drains this node's
// usage (twice, when the recent rate is measured apart), sends it to the
// region's other nodes, sums the region's node usage into the regional
// report, which the region's publisher broadcasts, files the reports of
// the other regions, rebalances with them at boundary + Settle and
// publishes the raises RaiseDelay later (see the package documentation).

type phase uint8

const (
	phSplit    phase = iota // boundary − Recent: first drain
	phBoundary              // boundary: last drain, node usage sent
	phCollect               // boundary + Collect: regional report
	phSettle                // boundary + Settle: rebalance, cuts
	phRaise                 // rebalance + RaiseDelay: raises, save
)

// Next returns when the epoch's next step is due. An owner ticks the core
// then, and in between at most PollEvery apart (timed from its last
// Tick), which is when membership changes, borrow ticks and scheduled
// raises are noticed.
func (c *Core) Next() time.Time { return c.deadline() }

// WantsUsage reports whether a Tick at now would consume engine usage (a
// borrow tick or a drain of the epoch is due). An owner whose usage source
// is costly to drain may pass nil to Tick otherwise; usage passed at any
// Tick is never lost, it only counts from then.
func (c *Core) WantsUsage(now time.Time) bool {
	if !c.started {
		return false
	}
	if c.borrowing() && (!now.Before(c.b.nextTick) || !now.Before(c.b.nextCheck)) {
		return true
	}
	return (c.ph == phSplit || c.ph == phBoundary) && !now.Before(c.deadline())
}

func (c *Core) deadline() time.Time {
	sc := c.cfg.Share
	switch c.ph {
	case phSplit:
		return c.boundary.Add(-sc.Recent)
	case phBoundary:
		return c.boundary
	case phCollect:
		return c.boundary.Add(c.cfg.Collect)
	case phSettle:
		return c.boundary.Add(sc.Settle)
	default:
		return c.raiseAt
	}
}

func (c *Core) startEpoch(now time.Time) {
	sc := c.cfg.Share
	c.boundary = sc.EpochStart(sc.Epoch(now) + 1)
	c.cur = sc.Epoch(c.boundary) - 1 // the interval that ends at boundary
	c.first, c.firstDur = nil, 0
	c.ph = phBoundary
	if c.split && now.Before(c.boundary.Add(-sc.Recent)) {
		c.ph = phSplit
	}
}

// step runs the epoch's step that is due.
func (c *Core) step(now time.Time) {
	switch c.ph {
	case phSplit:
		c.first = c.drain()
		c.firstDur, c.lastDrain = now.Sub(c.lastDrain), now
		c.ph = phBoundary
	case phBoundary:
		last := c.drain()
		lastDur := now.Sub(c.lastDrain)
		c.lastDrain = now
		c.ownUse = c.nodeUsage(c.cur, c.first, c.firstDur, last, lastDur)
		if len(c.live[c.self]) > 1 {
			u := c.filter(c.ownUse, len(c.live[c.self]))
			u.Quotas = c.nodeQuotas(c.cur)
			c.rd.NodeUsage = append(c.rd.NodeUsage, u)
		}
		c.ph = phCollect
	case phCollect:
		c.report(now, c.cur, c.ownUse)
		c.ph = phSettle
	case phSettle:
		c.rebalance(now, c.cur)
		// Raises take effect RaiseDelay after the rebalance itself (which
		// runs a little after boundary+Settle when the owner is late).
		c.raiseAt = now.Add(c.cfg.Share.RaiseDelay)
		c.ph = phRaise
	case phRaise:
		c.publish(now)
		c.raised = c.cur
		c.rd.Save = c.saved(c.cur)
		c.startEpoch(now)
	}
}

// drain is the report's drain: everything Tick was given since the last one.
func (c *Core) drain() map[engine.UsageKey]engine.Usage {
	out := c.b.acc
	c.b.acc = map[engine.UsageKey]engine.Usage{}
	return out
}

func addUsage(dst map[engine.UsageKey]engine.Usage, src map[engine.UsageKey]engine.Usage) {
	for k, u := range src {
		d := dst[k]
		d.Demand += u.Demand
		d.Admitted += u.Admitted
		if !u.At.Before(d.At) {
			d.Remaining, d.At = u.Remaining, u.At
		}
		dst[k] = d
	}
}

// fileReport files another region's report of size bytes for the
// rebalance of its epoch; its quota counters are merged whatever its age.
func (c *Core) fileReport(now time.Time, r share.Report, size int) {
	if r.Region == c.self {
		return
	}
	c.mergeReportQuotas(r) // G-counters: late reports are still good
	if !c.fresh(now, r.Epoch) {
		return
	}
	if c.reports[r.Epoch] == nil {
		c.reports[r.Epoch] = map[string]share.Report{}
	}
	c.reports[r.Epoch][r.Region] = r
	c.lastSeen[r.Region] = reportInfo{At: now, Epoch: r.Epoch, Bytes: size, Keys: len(r.Keys)}
}

// fileNodeUsage files the usage of another node of this region for the
// regional report of its epoch; its quota components are merged whatever
// its age.
func (c *Core) fileNodeUsage(now time.Time, u msg.NodeUsage) {
	if u.Region != c.self {
		return
	}
	c.mergeNodeQuotas(u) // cumulative: late ones are still good
	if !c.fresh(now, u.Epoch) {
		return
	}
	if c.nodeUse[u.Epoch] == nil {
		c.nodeUse[u.Epoch] = map[string]msg.NodeUsage{}
	}
	c.nodeUse[u.Epoch][u.Node] = u
}

// nodeUsage turns drained units into this node's rates for epoch.
func (c *Core) nodeUsage(epoch uint64, first map[engine.UsageKey]engine.Usage, firstDur time.Duration,
	last map[engine.UsageKey]engine.Usage, lastDur time.Duration) msg.NodeUsage {
	total := (firstDur + lastDur).Seconds()
	recent := lastDur.Seconds()
	if total <= 0 || recent <= 0 {
		return msg.NodeUsage{Node: c.node, Region: c.self, Epoch: epoch}
	}
	if first == nil {
		recent = total // no split: the recent rate is the interval rate
	}
	sums := map[engine.UsageKey]*msg.KeyUsage{}
	add := func(m map[engine.UsageKey]engine.Usage, isLast bool) {
		for k, u := range m {
			limit, ok := c.cfg.Limit(k.Policy)
			if !ok || limit <= 0 {
				continue
			}
			s := sums[k]
			if s == nil {
				s = &msg.KeyUsage{Key: share.Key{Policy: k.Policy, Subject: k.Subject}, Limit: limit}
				sums[k] = s
			}
			s.Offered += float64(u.Demand) / total
			s.Admitted += float64(u.Admitted) / total
			if isLast || first == nil {
				s.Recent += float64(u.Demand) / recent
			}
		}
	}
	add(first, false)
	add(last, true)
	out := msg.NodeUsage{Node: c.node, Region: c.self, Epoch: epoch, Keys: make([]msg.KeyUsage, 0, len(sums))}
	for _, s := range sums {
		out.Keys = append(out.Keys, *s)
	}
	slices.SortFunc(out.Keys, func(a, b msg.KeyUsage) int { return compareKeys(a.Key, b.Key) })
	return out
}

// filter keeps the keys worth sending to the region's other nodes: those
// already coordinated, and those where this node alone offers more than
// Pressure·share/(2·nodes) of the limit (if the region's sum is above the
// pressure threshold, some node is above threshold/nodes; halving it catches
// most of the others' contributions too).
func (c *Core) filter(u msg.NodeUsage, nodes int) msg.NodeUsage {
	out := u
	out.Keys = nil
	for _, k := range u.Keys {
		own := c.Share(k.Policy, k.Subject)
		if c.alloc.Shares(k.Key) != nil || max(k.Offered, k.Recent) > c.cfg.Share.Pressure*own*k.Limit/float64(2*nodes) {
			out.Keys = append(out.Keys, k)
		}
	}
	return out
}

// isActor reports whether this node acts for its region: its publisher,
// the region's live node with the smallest id.
func (c *Core) isActor() bool {
	live := c.live[c.self]
	return len(live) == 0 || live[0] == c.node
}

// report sums the region's node usage for epoch, feeds it to the
// allocator and, on the region's publisher, asks for the report to be
// broadcast.
func (c *Core) report(now time.Time, epoch uint64, own msg.NodeUsage) {
	peers := c.nodeUse[epoch]
	sum := map[share.Key]*share.Usage{}
	add := func(keys []msg.KeyUsage) {
		for _, k := range keys {
			s := sum[k.Key]
			if s == nil {
				s = &share.Usage{Key: k.Key}
				sum[k.Key] = s
			}
			s.Limit = max(s.Limit, k.Limit)
			s.Offered += k.Offered
			s.Recent += k.Recent
			s.Admitted += k.Admitted
		}
	}
	add(own.Keys)
	for _, n := range slices.Sorted(maps.Keys(peers)) { // fixed order: equal sums on every node
		if n != c.node {
			add(peers[n].Keys)
		}
	}
	usage := make([]share.Usage, 0, len(sum))
	for _, k := range slices.SortedFunc(maps.Keys(sum), compareKeys) {
		usage = append(usage, *sum[k])
	}
	r := c.alloc.Report(epoch, usage)
	r.Quotas = c.regionQuotas(now, epoch)
	c.m.ReportKeys.Set(float64(len(r.Keys)))
	if c.isActor() {
		c.rd.Reports = append(c.rd.Reports, r)
		if c.lossy(epoch) {
			c.rd.Reports = append(c.rd.Reports, r) // see lossy
		}
	}
	c.lastSeen[c.self] = reportInfo{At: now, Epoch: epoch, Bytes: r.EncodedSizeEstimate(), Keys: len(r.Keys)}
	c.own = r
}

// lossy reports whether the report of epoch is sent twice: for K
// (PartitionIntervals) epochs after the start and after a report of a
// region membership sees live went missing here. Every region computes every share from the
// reports it received, and holds a region whose report it missed at the
// share it computed for it last time (share.Allocate, Held), which is not
// the share that region computed for itself: when reports are lost at
// random, the regions' own shares stop summing to 1 (in lossy-ten, with
// 20% lost, to 1.05 for 30 s, or to 0.95). A second copy, sent and lost
// independently, makes a report missing with p² instead of p (4% instead
// of 20%), at twice the report bytes while the loss lasts; a network that
// loses nothing sends one copy. A receiver files the same report twice.
func (c *Core) lossy(epoch uint64) bool {
	return c.lossSeen && epoch <= c.lossAt+uint64(c.cfg.Share.PartitionIntervals)
}

// noteLoss records whether a report of a live region is missing among
// the reports of epoch (lossy).
func (c *Core) noteLoss(epoch uint64, got map[string]share.Report) {
	for r, nodes := range c.live {
		if r == c.self || len(nodes) == 0 || slices.Contains(c.dead, r) {
			continue
		}
		if _, ok := got[r]; !ok {
			c.lossAt, c.lossSeen = epoch, true
			return
		}
	}
}

// rebalance computes epoch's shares and publishes the cut table.
func (c *Core) rebalance(now time.Time, epoch uint64) {
	alloc := c.alloc
	alloc.SetMembers(epoch, c.knownRegions())
	got := c.reports[epoch]
	c.noteLoss(epoch, got)
	reports := make([]share.Report, 0, len(got))
	for _, r := range slices.Sorted(maps.Keys(got)) {
		reports = append(reports, got[r])
	}
	for e := range c.reports {
		if e+2 < epoch {
			delete(c.reports, e)
		}
	}
	for e := range c.nodeUse {
		if e+2 < epoch {
			delete(c.nodeUse, e)
		}
	}

	c.expireCuts(now)
	alloc.Rebalance(now, epoch, reports)
	c.b.gen = epoch
	c.b.actorGen = c.isActor()
	c.balanced = true
	c.publish(now)

	// Every region's shares of the keys in play, for RegionShares.
	regions := alloc.Regions()
	keys := map[share.Key]regionShares{}
	collect := func(r share.Report) {
		for _, k := range r.Keys {
			if _, done := keys[k.Key]; done {
				continue
			}
			if s := alloc.Shares(k.Key); s != nil {
				keys[k.Key] = regionShares{regions: regions, shares: s}
			}
		}
	}
	for _, r := range reports {
		collect(r)
	}
	if c.own.Epoch == epoch && c.own.Region != "" {
		collect(c.own)
	}
	c.epoch, c.isolated, c.coordKeys, c.known = epoch, alloc.Isolated(), alloc.Keys(), regions
	c.shares = keys

	c.m.Rebalances.Inc()
	c.m.CoordKeys.Set(float64(alloc.Keys()))
	c.m.Regions.Set(float64(len(regions)))
	c.m.ReportsMissing.Add(float64(max(0, len(regions)-1-len(reports))))
	iso := 0.0
	if alloc.Isolated() {
		iso = 1
	}
	c.m.Isolated.Set(iso)
}

// knownRegions are the regions of the cluster for Allocator.SetMembers:
// every region with a node not known to have left, so that a failed region
// stays known (and reserved) until the allocation reclaims it.
func (c *Core) knownRegions() []string {
	set := map[string]bool{c.self: true}
	for _, m := range c.members {
		if m.State != msg.StateLeft && m.Region != "" {
			set[m.Region] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// restore enforces saved shares, if they are this region's and at most
// PartitionIntervals epochs old, until the first rebalance (with the
// default 1/n for every other key). Shares outside (0, 1] are skipped.
func (c *Core) restore(now time.Time, saved Saved) {
	sc := c.cfg.Share
	cur := sc.Epoch(now)
	if len(saved.Shares) == 0 || saved.Region != c.self || saved.Epoch+uint64(sc.PartitionIntervals) < cur {
		return
	}
	m := make(map[share.Key]float64, len(saved.Shares))
	for _, s := range saved.Shares {
		if s.Share > 0 && s.Share <= 1 {
			m[s.Key] = s.Share
		}
	}
	c.restored = m
	c.view = &View{t: share.NewTable(c.defaultShare(), m)}
}

// saved is the shares this region enforces for epoch, to persist.
func (c *Core) saved(epoch uint64) *Saved {
	s := &Saved{Region: c.self, Epoch: epoch, Shares: make([]SavedShare, 0, len(c.shares))}
	for _, k := range slices.SortedFunc(maps.Keys(c.shares), compareKeys) {
		rs := c.shares[k]
		if i := slices.Index(rs.regions, c.self); i >= 0 {
			s.Shares = append(s.Shares, SavedShare{Key: k, Share: rs.shares[i]})
		}
	}
	return s
}
