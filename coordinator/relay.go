package coordinator

import (
	"slices"

	"github.com/sluice-rl/sluice/coordinator/msg"
)

// Routing between regions. Every message that crosses regions (reports,
// borrow requests, loans to the borrower) goes to one node of the target
// region, its relay, which sends it on to the region's other nodes; every
// node pings PingsPerRegion nodes of each other region per round rather
// than all of them. Both rules are functions of the membership alone, so
// every node that sees the same membership picks the same nodes without
// exchanging a message, and what one node sends and is sent per second
// depends on the number of regions, not on the number of nodes in them.

// PingsPerRegion is how many nodes of each other region a node pings per
// contact round: two, so that one node of that region dying between two
// rounds leaves the other's answer, and a region's contact (the newest of
// its nodes') stays at most one round plus the ping timeout old, as when
// every node was pinged.
const PingsPerRegion = 2

// Relay returns the relay of region as members shows it: its alive node
// with the smallest name, the node that is also the region's publisher
// and acting node while none is suspected (RelayOrder); "" when none is
// live.
func Relay(members []msg.Member, region string) string {
	if order := RelayOrder(members, region); len(order) > 0 {
		return order[0]
	}
	return ""
}

// RelayOrder returns the live nodes of region in the order a sender tries
// them: the alive ones by name, then the suspected ones by name. The first
// is the relay; a send to it that fails (a relay that has died before
// membership says so) falls back to the next at once, and a relay that
// membership suspects is passed over as soon as it does.
func RelayOrder(members []msg.Member, region string) []string {
	alive, suspect := liveNodes(members, region, msg.StateAlive), liveNodes(members, region, msg.StateSuspect)
	return append(alive, suspect...)
}

// liveNodes returns the nodes of region in state st (every live one when
// st is empty), sorted by name.
func liveNodes(members []msg.Member, region string, st msg.State) []string {
	var out []string
	for _, m := range members {
		if m.Region == region && m.State.Live() && (st == "" || m.State == st) {
			out = append(out, m.Node)
		}
	}
	slices.Sort(out)
	return out
}

// PingTargets returns the nodes of other regions that self (a node of
// region) pings this round: for each other region, PingsPerRegion of its
// live nodes (every node not known to have left when none is live, so a
// region behind a partition is still asked), skipping those busy says
// have a ping in flight. The nodes of a region are taken in name order
// from the position self holds among its own region's live nodes, so the
// pings of a region spread evenly over the nodes of another one of the
// same size: each node sends and answers about PingsPerRegion pings per
// other region per round, however many nodes the regions have.
func PingTargets(members []msg.Member, self, region string, busy func(node string) bool) []string {
	own := liveNodes(members, region, "")
	at := max(slices.Index(own, self), 0)
	byRegion := map[string][]string{}
	anyLive := map[string]bool{}
	for _, m := range members {
		if m.Region == region || m.Region == "" || m.State == msg.StateLeft {
			continue
		}
		byRegion[m.Region] = append(byRegion[m.Region], m.Node)
		anyLive[m.Region] = anyLive[m.Region] || m.State.Live()
	}
	var out []string
	for _, r := range sortedKeys(byRegion) {
		nodes := byRegion[r]
		if anyLive[r] {
			nodes = liveNodes(members, r, "")
		}
		slices.Sort(nodes)
		picked := 0
		for i := range nodes {
			x := nodes[(at+i)%len(nodes)]
			if busy != nil && busy(x) {
				continue
			}
			out = append(out, x)
			if picked++; picked == PingsPerRegion {
				break
			}
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
