package coordinator

import (
	"cmp"
	"maps"
	"slices"
	"time"

	"github.com/sluice-rl/sluice/coordinator/msg"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/share"
)

// Global quotas (scope: global fixed windows, e.g. a daily quota) are not
// divided into shares. Each region counts what it spent in the window as one
// component of a share.QuotaCounter (a G-counter) and admits while its own
// count plus the last known counts of the others stay within the limit:
//
//   - every drain, the node adds the units the engine admitted to its own
//     component of a per-node counter of its region;
//   - at the epoch boundary it sends that (cumulative) component to the
//     region's other nodes in msg.NodeUsage.Quotas;
//   - at boundary + Collect the region's component is the sum of its nodes'
//     components, and the publisher's report carries the region's counters
//     (share.Report.Quotas) of the keys whose count grew in the last
//     quotaResend epochs;
//   - a received report is merged (the larger value per component, a newer
//     window replaces an older one), and QuotaOthers gives the check path
//     what the others spent.

// quotaResend is how many epochs a key's counter stays in the reports after
// its region's count last grew, so that a report lost now and then does not
// hide a key's final count from the others. Receivers keep counters until
// the window ends.
const quotaResend = 3

// quotaState is this node's knowledge of the global quotas.
type quotaState struct {
	lastDrain time.Time

	nodes       map[share.Key]*share.QuotaCounter // own region, one component per node
	global      map[share.Key]*share.QuotaCounter // one component per region
	grew        map[share.Key]uint64              // epoch the region's component last grew
	nodeChanged map[share.Key]uint64              // epoch this node's component last grew
}

type quotaSeen struct {
	window int64
	others uint64
}

func (q *quotaState) init() {
	q.nodes = map[share.Key]*share.QuotaCounter{}
	q.global = map[share.Key]*share.QuotaCounter{}
	q.grew = map[share.Key]uint64{}
	q.nodeChanged = map[share.Key]uint64{}
}

// QuotaOthers returns the units of a global quota spent in window w (a
// share.WindowIndex) that this daemon's engine state does not hold: the
// other regions' last known counts and, with Config.NodeLocalStore, the
// last known counts of the region's other daemons. The check path admits
// while its engine count plus this plus the cost stay within the limit.
func (c *Core) QuotaOthers(policy, subject string, w int64) uint64 {
	return c.seen.Units(policy, subject, w)
}

// Others is what QuotaOthers reads: per global quota, the units the
// others spent in its current window. Immutable once published; an owner
// may hand it to other goroutines (Core.Published).
type Others map[share.Key]quotaSeen

// Units is Core.QuotaOthers on o.
func (o *Others) Units(policy, subject string, w int64) uint64 {
	s, ok := (*o)[share.Key{Policy: policy, Subject: subject}]
	if !ok || s.window != w {
		return 0
	}
	return s.others
}

// QuotaCounter returns this node's view of a global quota's G-counter (a
// copy), and false if it knows nothing of the key.
func (c *Core) QuotaCounter(policy, subject string) (share.QuotaCounter, bool) {
	g, ok := c.q.global[share.Key{Policy: policy, Subject: subject}]
	if !ok {
		return share.QuotaCounter{}, false
	}
	return g.Clone(), true
}

func (c *Core) quotaWindow(policy string) (time.Duration, bool) {
	if c.cfg.Quota == nil {
		return 0, false
	}
	w, ok := c.cfg.Quota(policy)
	return w, ok && w > 0
}

// countQuotas adds the admitted units of global quotas in u to this node's
// component. Units drained over (lastDrain, now] go to the window holding
// the middle of that span.
func (c *Core) countQuotas(now time.Time, u map[engine.UsageKey]engine.Usage) {
	if c.cfg.Quota == nil || len(u) == 0 {
		return
	}
	prev := c.q.lastDrain
	if prev.IsZero() || prev.After(now) {
		prev = now
	}
	c.q.lastDrain = now
	mid := prev.Add(now.Sub(prev) / 2)
	epoch := c.cfg.Share.Epoch(now)
	changed := false
	for k, v := range u {
		win, ok := c.quotaWindow(k.Policy)
		if !ok || v.Admitted <= 0 {
			continue
		}
		key := share.Key{Policy: k.Policy, Subject: k.Subject}
		q := c.q.nodes[key]
		if q == nil {
			q = &share.QuotaCounter{Key: key}
			c.q.nodes[key] = q
		}
		q.Add(share.WindowIndex(mid, win), c.node, uint64(v.Admitted))
		c.q.nodeChanged[key] = epoch
		changed = true
	}
	if changed && c.cfg.NodeLocalStore {
		c.publishQuotas()
	}
}

// nodeQuotas are this node's components of the keys it spent on in the
// last quotaResend epochs, for NodeUsage.
func (c *Core) nodeQuotas(epoch uint64) []share.QuotaCounter {
	var out []share.QuotaCounter
	for k, at := range c.q.nodeChanged {
		q := c.q.nodes[k]
		if q == nil || at+quotaResend <= epoch {
			continue
		}
		if n := q.Get(c.node); n > 0 {
			out = append(out, share.QuotaCounter{Key: k, Window: q.Window, Counts: []share.RegionCount{{Region: c.node, Count: n}}})
		}
	}
	sortQuotas(out)
	return out
}

// mergeNodeQuotas files another node's components (from its NodeUsage).
func (c *Core) mergeNodeQuotas(u msg.NodeUsage) {
	if len(u.Quotas) == 0 || u.Node == c.node {
		return
	}
	for _, in := range u.Quotas {
		if _, ok := c.quotaWindow(in.Policy); !ok || in.Subject == "" {
			continue
		}
		q := c.q.nodes[in.Key]
		if q == nil {
			q = &share.QuotaCounter{Key: in.Key}
			c.q.nodes[in.Key] = q
		}
		q.Merge(share.QuotaCounter{Key: in.Key, Window: in.Window, Counts: []share.RegionCount{{Region: u.Node, Count: in.Get(u.Node)}}})
	}
	if c.cfg.NodeLocalStore {
		c.publishQuotas()
	}
}

// mergeReportQuotas merges another region's counters.
func (c *Core) mergeReportQuotas(r share.Report) {
	if len(r.Quotas) == 0 {
		return
	}
	for _, in := range r.Quotas {
		if _, ok := c.quotaWindow(in.Policy); !ok || in.Subject == "" || !slices.IsSortedFunc(in.Counts, byRegion) {
			continue
		}
		g := c.q.global[in.Key]
		if g == nil {
			g = &share.QuotaCounter{Key: in.Key}
			c.q.global[in.Key] = g
		}
		g.Merge(in)
	}
	c.publishQuotas()
}

func byRegion(a, b share.RegionCount) int { return cmp.Compare(a.Region, b.Region) }

// regionQuotas sets the region's component of every counter to the sum of
// its nodes', drops counters of past windows and returns the counters for
// epoch's report.
func (c *Core) regionQuotas(now time.Time, epoch uint64) []share.QuotaCounter {
	if c.cfg.Quota == nil {
		return nil
	}
	past := func(k share.Key, q *share.QuotaCounter) bool {
		win, ok := c.quotaWindow(k.Policy)
		return !ok || q.Window < share.WindowIndex(now, win)
	}
	for _, k := range slices.SortedFunc(maps.Keys(c.q.nodes), compareKeys) {
		q := c.q.nodes[k]
		if past(k, q) {
			delete(c.q.nodes, k)
			delete(c.q.nodeChanged, k)
			continue
		}
		g := c.q.global[k]
		if g == nil {
			g = &share.QuotaCounter{Key: k}
			c.q.global[k] = g
		}
		before := g.Get(c.self)
		if g.Window != q.Window {
			before = 0
		}
		g.Merge(share.QuotaCounter{Key: k, Window: q.Window, Counts: []share.RegionCount{{Region: c.self, Count: q.Total()}}})
		if g.Window == q.Window && g.Get(c.self) > before {
			c.q.grew[k] = epoch
		}
	}
	var out []share.QuotaCounter
	for k, g := range c.q.global {
		if past(k, g) {
			delete(c.q.global, k)
			delete(c.q.grew, k)
			continue
		}
		if at, ok := c.q.grew[k]; ok && at+quotaResend > epoch {
			out = append(out, g.Clone())
		}
	}
	sortQuotas(out)
	c.publishQuotas()
	return out
}

func sortQuotas(qs []share.QuotaCounter) {
	slices.SortFunc(qs, func(a, b share.QuotaCounter) int {
		return cmp.Or(cmp.Compare(a.Policy, b.Policy), cmp.Compare(a.Subject, b.Subject))
	})
}

// publishQuotas rebuilds the check path's view.
func (c *Core) publishQuotas() {
	seen := make(map[share.Key]quotaSeen, len(c.q.global)+len(c.q.nodes))
	for k := range c.q.global {
		seen[k], _ = c.others(k, nil)
	}
	if c.cfg.NodeLocalStore {
		for k := range c.q.nodes {
			if _, done := seen[k]; !done {
				seen[k], _ = c.others(k, nil)
			}
		}
	}
	others := Others(seen)
	c.seen = &others
}

// others is what the check path sees of key k: the newest window
// known and the units spent in it that this daemon's engine state does not
// hold. Unless regions is nil it also files those units per region there:
// each other region's last known component and, with NodeLocalStore, this
// region's count less this node's (what its other daemons spent). ok is
// false when nothing is known of k.
func (c *Core) others(k share.Key, regions map[string]uint64) (s quotaSeen, ok bool) {
	g, hasGlobal := c.q.global[k]
	if hasGlobal {
		s.window = g.Window
		for _, rc := range g.Counts {
			if rc.Region != c.self {
				s.others = share.SatAdd(s.others, rc.Count)
				if regions != nil {
					regions[rc.Region] = rc.Count
				}
			}
		}
	}
	q, hasNode := c.q.nodes[k]
	if !c.cfg.NodeLocalStore || !hasNode {
		return s, hasGlobal
	}
	// The engine state holds this node's spend only: the region's other
	// nodes count as others too.
	region := q.Total()
	switch {
	case !hasGlobal || s.window < q.Window:
		s = quotaSeen{window: q.Window}
		clear(regions)
	case s.window > q.Window:
		return s, true
	default:
		region = max(region, g.Get(c.self))
	}
	siblings := region - min(region, q.Get(c.node))
	s.others = share.SatAdd(s.others, siblings)
	if regions != nil && siblings > 0 {
		regions[c.self] = siblings
	}
	return s, true
}

// QuotaView is this daemon's knowledge of one global quota key in one
// window, apart from its own engine state: what the check path adds to
// the engine's count.
type QuotaView struct {
	// Others is what QuotaOthers returns for the same window.
	Others uint64
	// Regions splits Others by region: each other region's count as last
	// reported (at most one report interval old, plus delivery) and, for
	// this region with a per-daemon store, its other daemons' counts as
	// last sent. Regions with nothing known are absent.
	Regions map[string]uint64
}

// QuotaView returns what this daemon knows of a global quota's spend in
// window w (a share.WindowIndex) beyond its own engine state, consistent
// with QuotaOthers: Others is the sum of Regions.
func (c *Core) QuotaView(policy, subject string, w int64) QuotaView {
	v := QuotaView{Regions: map[string]uint64{}}
	s, ok := c.others(share.Key{Policy: policy, Subject: subject}, v.Regions)
	if !ok || s.window != w {
		clear(v.Regions)
		return v
	}
	v.Others = s.others
	return v
}

// quotaEntryOverhead is ApproxBytes's allowance for a counter's map entry,
// pointer, key strings' headers and slice header.
const quotaEntryOverhead = 96

// QuotaStats returns the size of the global quotas' G-counter state, one
// entry per policy that has any, sorted by policy. It walks every counter:
// for the admin API.
func (c *Core) QuotaStats() []QuotaStat {
	by := map[string]*QuotaStat{}
	add := func(k share.Key, q *share.QuotaCounter, node bool) {
		st := by[k.Policy]
		if st == nil {
			st = &QuotaStat{Policy: k.Policy}
			by[k.Policy] = st
		}
		if node {
			st.NodeCounters++
		} else {
			st.Counters++
		}
		st.Entries += len(q.Counts)
		n := int64(quotaEntryOverhead + len(k.Policy) + len(k.Subject) + 8)
		for _, rc := range q.Counts {
			n += int64(len(rc.Region)) + 16 + 8 // name, its header, count
		}
		st.ApproxBytes += n
	}
	for k, q := range c.q.global {
		add(k, q, false)
	}
	for k, q := range c.q.nodes {
		add(k, q, true)
	}
	out := make([]QuotaStat, 0, len(by))
	for _, st := range by {
		out = append(out, *st)
	}
	slices.SortFunc(out, func(a, b QuotaStat) int { return cmp.Compare(a.Policy, b.Policy) })
	return out
}
