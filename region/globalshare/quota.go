package globalshare

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/gossip"
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
//     region's other nodes in gossip.NodeUsage.Quotas;
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
	lastDrain time.Time // Run's goroutine only

	mu          sync.Mutex
	nodes       map[share.Key]*share.QuotaCounter // own region, one component per node
	global      map[share.Key]*share.QuotaCounter // one component per region
	grew        map[share.Key]uint64              // epoch the region's component last grew
	nodeChanged map[share.Key]uint64              // epoch this node's component last grew

	seen atomic.Pointer[map[share.Key]quotaSeen] // for the check path
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
	q.seen.Store(&map[share.Key]quotaSeen{})
}

// QuotaOthers returns the units of a global quota spent in window w (a
// share.WindowIndex) that this daemon's engine state does not hold: the
// other regions' last known counts and, with Config.NodeLocalStore, the
// last known counts of the region's other daemons. The check path admits
// while its engine count plus this plus the cost stay within the limit.
// Lock-free.
func (c *Coordinator) QuotaOthers(policy, subject string, w int64) uint64 {
	s, ok := (*c.q.seen.Load())[share.Key{Policy: policy, Subject: subject}]
	if !ok || s.window != w {
		return 0
	}
	return s.others
}

// QuotaCounter returns this node's view of a global quota's G-counter (a
// copy), and false if it knows nothing of the key.
func (c *Coordinator) QuotaCounter(policy, subject string) (share.QuotaCounter, bool) {
	c.q.mu.Lock()
	defer c.q.mu.Unlock()
	g, ok := c.q.global[share.Key{Policy: policy, Subject: subject}]
	if !ok {
		return share.QuotaCounter{}, false
	}
	return g.Clone(), true
}

func (c *Coordinator) quotaWindow(policy string) (time.Duration, bool) {
	if c.cfg.Quota == nil {
		return 0, false
	}
	w, ok := c.cfg.Quota(policy)
	return w, ok && w > 0
}

// countQuotas adds the admitted units of global quotas in u to this node's
// component. Units drained over (lastDrain, now] go to the window holding
// the middle of that span.
func (c *Coordinator) countQuotas(u map[engine.UsageKey]engine.Usage) {
	if c.cfg.Quota == nil {
		return
	}
	now := c.clock.Now()
	prev := c.q.lastDrain
	if prev.IsZero() || prev.After(now) {
		prev = now
	}
	c.q.lastDrain = now
	mid := prev.Add(now.Sub(prev) / 2)
	epoch := c.cfg.Share.Epoch(now)
	c.q.mu.Lock()
	defer c.q.mu.Unlock()
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
		c.publishQuotasLocked()
	}
}

// nodeQuotas are this node's components of the keys it spent on in the
// last quotaResend epochs, for NodeUsage.
func (c *Coordinator) nodeQuotas(epoch uint64) []share.QuotaCounter {
	c.q.mu.Lock()
	defer c.q.mu.Unlock()
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
// Called with c.mu held.
func (c *Coordinator) mergeNodeQuotas(u gossip.NodeUsage) {
	if len(u.Quotas) == 0 || u.Node == c.node {
		return
	}
	c.q.mu.Lock()
	defer c.q.mu.Unlock()
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
		c.publishQuotasLocked()
	}
}

// mergeReportQuotas merges another region's counters. Called with c.mu
// held.
func (c *Coordinator) mergeReportQuotas(r share.Report) {
	if len(r.Quotas) == 0 {
		return
	}
	c.q.mu.Lock()
	defer c.q.mu.Unlock()
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
	c.publishQuotasLocked()
}

func byRegion(a, b share.RegionCount) int { return cmp.Compare(a.Region, b.Region) }

// regionQuotas sets the region's component of every counter to the sum of
// its nodes', drops counters of past windows and returns the counters for
// epoch's report.
func (c *Coordinator) regionQuotas(epoch uint64) []share.QuotaCounter {
	if c.cfg.Quota == nil {
		return nil
	}
	now := c.clock.Now()
	c.q.mu.Lock()
	defer c.q.mu.Unlock()
	past := func(k share.Key, q *share.QuotaCounter) bool {
		win, ok := c.quotaWindow(k.Policy)
		return !ok || q.Window < share.WindowIndex(now, win)
	}
	for k, q := range c.q.nodes {
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
	c.publishQuotasLocked()
	return out
}

func sortQuotas(qs []share.QuotaCounter) {
	slices.SortFunc(qs, func(a, b share.QuotaCounter) int {
		return cmp.Or(cmp.Compare(a.Policy, b.Policy), cmp.Compare(a.Subject, b.Subject))
	})
}

// publishQuotasLocked rebuilds the check path's view. Called with q.mu held.
func (c *Coordinator) publishQuotasLocked() {
	seen := make(map[share.Key]quotaSeen, len(c.q.global)+len(c.q.nodes))
	for k, g := range c.q.global {
		var others uint64
		for _, rc := range g.Counts {
			if rc.Region != c.self {
				others += rc.Count
			}
		}
		seen[k] = quotaSeen{window: g.Window, others: others}
	}
	if c.cfg.NodeLocalStore {
		// The engine state holds this node's spend only: the region's
		// other nodes count as others too.
		for k, q := range c.q.nodes {
			region := q.Total()
			s, ok := seen[k]
			switch {
			case !ok || s.window < q.Window:
				s = quotaSeen{window: q.Window}
			case s.window > q.Window:
				continue
			default:
				region = max(region, c.q.global[k].Get(c.self))
			}
			s.others += region - min(region, q.Get(c.node))
			seen[k] = s
		}
	}
	c.q.seen.Store(&seen)
}
