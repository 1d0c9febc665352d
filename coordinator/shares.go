package coordinator

import (
	"maps"
	"time"

	"github.com/sluice-rl/sluice/share"
)

// The shares this region enforces: what the check path reads (Share,
// View), and how a rebalance or a loan publishes them.

// View is what Share reads: the allocator's table (its own loans included),
// the cuts another node of this region lent this generation, and the caps
// that keep those cuts in force after a rebalance until the raise.
// Immutable once published; an owner may hand it to other goroutines.
type View struct {
	t    *share.Table
	cut  map[share.Key]float64 // fraction of L_global lent by another node of this region
	caps map[share.Key]float64 // upper bounds until the raise after a rebalance
}

// Share is the engine's scale for a key: in [share.MinShare, 1] whatever
// the table, cuts and caps hold.
func (v *View) Share(policy, subject string) float64 {
	if v.cut == nil && v.caps == nil {
		return v.t.Share(policy, subject)
	}
	// Subtract another node's loans from the sum before clamping: a
	// share plus loans above 1 less a mirrored cut is the region's share.
	s := v.t.Unclamped(policy, subject)
	k := share.Key{Policy: policy, Subject: subject}
	if d, ok := v.cut[k]; ok {
		s -= d
	}
	if c, ok := v.caps[k]; ok {
		s = min(s, c)
	}
	return share.Scale(s)
}

// Table returns the allocator's table the view was built from (immutable).
func (v *View) Table() *share.Table { return v.t }

// Share returns the fraction of L_global this region enforces now for a
// global policy and subject, loans included, in [share.MinShare, 1].
func (c *Core) Share(policy, subject string) float64 { return c.view.Share(policy, subject) }

// Table returns the allocator's current table (immutable).
func (c *Core) Table() *share.Table { return c.view.t }

// RegionShares returns every region's share of a coordinated key as this
// region computed them at the last rebalance, or nil if the key is not
// coordinated.
func (c *Core) RegionShares(policy, subject string) map[string]float64 {
	rs, ok := c.shares[share.Key{Policy: policy, Subject: subject}]
	if !ok {
		return nil
	}
	out := make(map[string]float64, len(rs.regions))
	for i, r := range rs.regions {
		out[r] = rs.shares[i]
	}
	return out
}

// ShareVector returns every known region's share of a coordinated key (in
// the order of the regions RegionShares names) as computed at the last
// rebalance, or nil; without copying, for checks run at every step of a
// simulation. The caller must not modify it.
func (c *Core) ShareVector(policy, subject string) []float64 {
	return c.shares[share.Key{Policy: policy, Subject: subject}].shares
}

// publish makes the current shares the ones Share returns.
func (c *Core) publish(now time.Time) {
	if !c.balanced {
		c.publishStart(now)
		return
	}
	v := &View{t: c.alloc.Table(now)}
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
	c.view = v
}

// publishStart is publish before the first rebalance: every key at 1/n of
// the live regions (or its restored share), with the loans of the start
// generation and another node's mirrored cuts on top.
func (c *Core) publishStart(now time.Time) {
	v := &View{t: share.NewTable(c.defaultShare(), c.restored)}
	if c.alloc != nil {
		ov := c.alloc.Overlay(now)
		if len(ov) > 0 || len(c.b.cut) > 0 {
			v.cut = maps.Clone(c.b.cut)
			if v.cut == nil {
				v.cut = map[share.Key]float64{}
			}
			for k, d := range ov {
				v.cut[k] -= d // a cut is subtracted; a loan adds
			}
		}
	}
	c.view = v
}
