package coordinator

import (
	"maps"
	"slices"
	"time"

	"github.com/sluice-rl/sluice/coordinator/msg"
)

// Contact: which regions this node can reach. Membership (msg.Member)
// gives every node's state and the times of its last answered and
// unanswered ping; the core turns them into the regions that are silent
// (a region cut off from a majority cuts itself to Safe) and gone (their
// shares are reclaimed), and the live nodes of every region (the
// publisher, 1/n before the first rebalance).

// SetMembers updates the membership the core knows between two Ticks, so
// that Step recognises a region that has just joined. Tick takes the
// membership as well; a nil members is ignored.
func (c *Core) SetMembers(members []msg.Member) {
	if members != nil {
		c.setMembers(members)
	}
}

func (c *Core) setMembers(members []msg.Member) {
	c.members = slices.Clone(members)
	live := map[string][]string{}
	for _, m := range c.members {
		if m.State.Live() {
			live[m.Region] = append(live[m.Region], m.Node)
		}
	}
	for _, nodes := range live {
		slices.Sort(nodes)
	}
	if _, ok := live[c.self]; !ok {
		live[c.self] = []string{c.node} // this node is live, whatever gossip says yet
	}
	c.live = live
}

// defaultShare is 1/n of the live regions.
func (c *Core) defaultShare() float64 { return 1 / float64(max(1, len(c.live))) }

// knownRegion reports whether membership or the allocation knows region r.
func (c *Core) knownRegion(r string) bool {
	if r == c.self {
		return true
	}
	if c.alloc != nil && slices.Contains(c.known, r) {
		return true
	}
	for _, m := range c.members {
		if m.Region == r {
			return true
		}
	}
	return false
}

// Hold is how long this region waits, after it last had contact with
// another region, before it reclaims that region's share: Silence +
// PollEvery (by then a region cut off from the majority has noticed its
// own silence and cut to Safe) + ContactLag (this side's last answered
// ping may be that much older than the other side's) + PollEvery of
// margin. See docs/architecture.md, "Losing a region".
func (c *Core) Hold() time.Duration {
	return c.cfg.Silence + 2*c.PollEvery() + c.cfg.ContactLag
}

// regionStates sorts the other regions by what this node knows of them:
// silent (out of contact for at least Silence), gone (for at least Hold:
// its share may be reclaimed) and alive (a node alive, not even
// suspected, and not silent: its reports may be missing only through
// loss).
//
// Contact is the send time of the last answered ping to any of the
// region's nodes (msg.Member.Contact). Being out of contact also takes
// fresh evidence: a ping sent after that contact and left unanswered
// (Member.Unanswered) within the last 2·ContactLag + PollEvery, the
// longest between two failures while the pings run, and sent after this
// node's last pause (a gap of more than 2·PollEvery between two Ticks). A
// node that was too busy to ping, or to hear the answers, sees its
// contacts age without such evidence and decides nothing until its pings
// run again; a node cut off has it all along. (A pause during a partition
// delays the cut by as much; the node admits nothing while paused.)
//
// A region none of whose nodes has a Contact yet (an owner that pings
// nothing, or a node not pinged yet) counts as out of contact from the
// first Tick at which membership showed every node of it dead: the same
// rule, timed by membership's verdict instead of the pings, which keeps
// its bound only while both sides' verdicts come within Hold − Silence of
// each other.
func (c *Core) regionStates(now time.Time) (silent, gone, alive []string) {
	contact, failed := map[string]time.Time{}, map[string]time.Time{}
	known, live, dead, up := map[string]bool{}, map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, m := range c.members {
		if m.Region == "" || m.Region == c.self || m.State == msg.StateLeft {
			continue
		}
		r := m.Region
		known[r] = true
		if m.Contact.After(contact[r]) {
			contact[r] = m.Contact
		}
		if m.Unanswered.After(failed[r]) {
			failed[r] = m.Unanswered
		}
		switch {
		case m.State == msg.StateAlive:
			up[r], live[r] = true, true
		case m.State.Live():
			live[r] = true
		case m.State == msg.StateDead:
			dead[r] = true
		}
	}
	for r := range c.deadSince {
		if !dead[r] || live[r] {
			delete(c.deadSince, r)
		}
	}
	hold, fresh := c.Hold(), 2*c.cfg.ContactLag+c.PollEvery()
	for _, r := range slices.Sorted(maps.Keys(known)) {
		since, evidence := contact[r], false
		switch {
		case !since.IsZero():
			// A ping sent before this node's last pause may have been
			// given up only because the node could not hear its answer.
			evidence = failed[r].After(since) && now.Sub(failed[r]) <= fresh && !failed[r].Before(c.resumed)
		case dead[r] && !live[r]:
			if _, ok := c.deadSince[r]; !ok {
				c.deadSince[r] = now
			}
			since, evidence = c.deadSince[r], true
		}
		// Once out, a region stays out until its contact is fresh again.
		out := now.Sub(since) >= c.cfg.Silence && (evidence || slices.Contains(c.silent, r))
		if out {
			silent = append(silent, r)
		}
		if now.Sub(since) >= hold && (evidence || slices.Contains(c.dead, r)) {
			gone = append(gone, r)
		}
		if up[r] && !out {
			alive = append(alive, r)
		}
	}
	return silent, gone, alive
}

// checkMembership applies what regionStates finds: a region that has lost
// contact with a majority cuts to Safe at once (Allocator.SetSilent), and
// a region out of contact for Hold has its shares reclaimed at once
// (Allocator.SetDead), by which time, if it is alive behind a partition,
// it has cut. Both publish the new table at once.
func (c *Core) checkMembership(now time.Time) {
	silent, gone, alive := c.regionStates(now)
	c.alloc.SetLive(alive)
	changed := false
	c.countLost(silent, c.silent, "silent")
	c.countLost(gone, c.dead, "reclaimed")
	if !slices.Equal(silent, c.silent) {
		c.silent = silent
		changed = c.alloc.SetSilent(now, silent)
	}
	if !slices.Equal(gone, c.dead) {
		c.dead = gone
		c.alloc.SetDead(now, gone)
		changed = true
	}
	if changed && c.balanced {
		c.publish(now)
	}
}

// countLost counts the regions of now that were not in before.
func (c *Core) countLost(now, before []string, stage string) {
	for _, r := range now {
		if !slices.Contains(before, r) {
			c.m.Lost.WithLabelValues(r, stage).Inc()
		}
	}
}

// Dead returns the regions whose shares this core has reclaimed (the
// caller must not modify it).
func (c *Core) Dead() []string { return c.dead }

// Isolated reports whether this region has lost contact with a majority
// and runs at the safe share.
func (c *Core) Isolated() bool { return c.alloc != nil && c.alloc.Isolated() }
