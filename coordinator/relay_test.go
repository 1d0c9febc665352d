package coordinator

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/coordinator/msg"
	"github.com/sluice-rl/sluice/share"
)

// grid returns the members of regions r0…r(regions−1) with nodes
// rX-n0…rX-n(nodes−1), all alive.
func grid(regions, nodes int) []msg.Member {
	var out []msg.Member
	for r := range regions {
		for i := range nodes {
			out = append(out, msg.Member{Node: fmt.Sprintf("r%d-n%d", r, i), Region: fmt.Sprintf("r%d", r), State: msg.StateAlive})
		}
	}
	return out
}

func withState(ms []msg.Member, st msg.State, nodes ...string) []msg.Member {
	ms = slices.Clone(ms)
	for i := range ms {
		if slices.Contains(nodes, ms[i].Node) {
			ms[i].State = st
		}
	}
	return ms
}

func TestRelayOrder(t *testing.T) {
	ms := grid(2, 3)
	tests := []struct {
		name    string
		members []msg.Member
		want    []string
	}{
		{"all alive", ms, []string{"r1-n0", "r1-n1", "r1-n2"}},
		{"relay suspected: tried last", withState(ms, msg.StateSuspect, "r1-n0"), []string{"r1-n1", "r1-n2", "r1-n0"}},
		{"relay dead: the next one", withState(ms, msg.StateDead, "r1-n0"), []string{"r1-n1", "r1-n2"}},
		{"relay left", withState(ms, msg.StateLeft, "r1-n0", "r1-n1"), []string{"r1-n2"}},
		{"region gone", withState(ms, msg.StateDead, "r1-n0", "r1-n1", "r1-n2"), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := RelayOrder(tt.members, "r1"); !slices.Equal(got, tt.want) {
				t.Errorf("RelayOrder = %v, want %v", got, tt.want)
			}
			want := ""
			if len(tt.want) > 0 {
				want = tt.want[0]
			}
			if got := Relay(tt.members, "r1"); got != want {
				t.Errorf("Relay = %q, want %q", got, want)
			}
		})
	}
}

// TestPingTargetsSpread: every node sends PingsPerRegion pings to each
// other region and, with regions of equal size, is sent as many from each,
// whatever the number of nodes.
func TestPingTargetsSpread(t *testing.T) {
	for _, nodes := range []int{1, 2, 4, 8} {
		t.Run(fmt.Sprint(nodes), func(t *testing.T) {
			ms := grid(3, nodes)
			got := map[string]int{}
			for _, m := range ms {
				targets := PingTargets(ms, m.Node, m.Region, nil)
				if want := 2 * min(nodes, PingsPerRegion); len(targets) != want {
					t.Fatalf("%s pings %v, want %d nodes", m.Node, targets, want)
				}
				for _, x := range targets {
					if x[:2] == m.Region {
						t.Fatalf("%s pings %s of its own region", m.Node, x)
					}
					got[x]++
				}
			}
			for _, m := range ms {
				if want := 2 * min(nodes, PingsPerRegion); got[m.Node] != want {
					t.Errorf("%s is pinged %d times a round, want %d", m.Node, got[m.Node], want)
				}
			}
		})
	}
}

func TestPingTargets(t *testing.T) {
	ms := grid(2, 4)
	tests := []struct {
		name    string
		self    string
		members []msg.Member
		busy    []string
		want    []string
	}{
		{"from its position", "r0-n1", ms, nil, []string{"r1-n1", "r1-n2"}},
		{"wraps around", "r0-n3", ms, nil, []string{"r1-n3", "r1-n0"}},
		{"skips a ping in flight", "r0-n1", ms, []string{"r1-n1"}, []string{"r1-n2", "r1-n3"}},
		{"skips dead nodes of a live region", "r0-n0", withState(ms, msg.StateDead, "r1-n0"), nil, []string{"r1-n1", "r1-n2"}},
		{"a region behind a partition is still asked", "r0-n0",
			withState(ms, msg.StateDead, "r1-n0", "r1-n1", "r1-n2", "r1-n3"), nil, []string{"r1-n0", "r1-n1"}},
		{"never a node that left", "r0-n0",
			withState(withState(ms, msg.StateDead, "r1-n0", "r1-n1", "r1-n2"), msg.StateLeft, "r1-n3"), []string{"r1-n0"}, []string{"r1-n1", "r1-n2"}},
		{"every ping in flight", "r0-n0", grid(2, 1), []string{"r1-n0"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			busy := func(node string) bool { return slices.Contains(tt.busy, node) }
			got := PingTargets(tt.members, tt.self, tt.self[:2], busy)
			if !slices.Equal(got, tt.want) {
				t.Errorf("PingTargets(%s) = %v, want %v", tt.self, got, tt.want)
			}
		})
	}
}

// relayNet is three regions of four nodes routed through relays
// (coreNet.relay), with demand on every node of eu and us.
func relayNet(t *testing.T, sc share.Config) *coreNet {
	t.Helper()
	var names []string
	for _, r := range []string{"eu", "us", "ap"} {
		for i := range 4 {
			names = append(names, fmt.Sprintf("%s-%d", r, i))
		}
	}
	n := newCoreNet(t, sc, names...)
	n.relay = true
	for _, name := range names {
		n.rate[name] = 15
	}
	return n
}

// filedEverywhere fails unless every live node filed the report of epoch
// e of every other region of regions.
func filedEverywhere(t *testing.T, n *coreNet, e uint64, regions ...string) {
	t.Helper()
	for _, nd := range n.nodes {
		if nd.down {
			continue
		}
		want := slices.DeleteFunc(slices.Clone(regions), func(r string) bool { return r == nd.region })
		if got, _ := nd.core.Filed(e); !slices.Equal(got, want) {
			t.Errorf("%s filed the reports of %v for epoch %d, want %v", nd.name, got, e, want)
		}
	}
}

// TestCoreRelayPartition: with reports through relays and only the pings
// PingTargets picks, every node files every region's report, and a
// partition of ap is judged as with every node pinged: ap's nodes cut to
// Safe within Silence and a ping round, the majority reclaims its share
// no sooner than Hold, and Σ of the regions' enforced shares stays ≤ 1.
func TestCoreRelayPartition(t *testing.T) {
	sc := testShareConfig()
	sc.BorrowEvery = 0
	n := relayNet(t, sc)
	n.run(n.now.Add(5*sc.Interval), 10*time.Millisecond, nil)
	e := sc.Epoch(n.now) - 2
	filedEverywhere(t, n, e, "ap", "eu", "us")
	start := n.now
	n.cut = func(a, b string) bool { return a != b && (a == "ap" || b == "ap") }
	silence, hold := n.node("ap-0").core.Config().Silence, n.node("eu-0").core.Hold()
	var isolated, reclaimed time.Duration
	n.run(start.Add(4*sc.Interval), 10*time.Millisecond, func() {
		if s := sum(n.shares("eu-0", "us-0", "ap-0")); s > 1+1e-9 {
			t.Fatalf("%v: Σ enforced shares = %v during the partition", n.now.Sub(start), s)
		}
		all := true
		for i := range 4 {
			all = all && n.node(fmt.Sprintf("ap-%d", i)).core.Isolated()
		}
		if isolated == 0 && all {
			isolated = n.now.Sub(start)
		}
		if reclaimed == 0 && slices.Contains(n.node("eu-3").core.Dead(), "ap") {
			reclaimed = n.now.Sub(start)
		}
	})
	if isolated == 0 || isolated > silence+n.contactEvery+20*time.Millisecond {
		t.Errorf("every ap node isolated %v after the cut (0: never), want within Silence %v + a ping round", isolated, silence)
	}
	if reclaimed == 0 || reclaimed < hold-n.contactEvery {
		t.Errorf("eu reclaimed ap's share %v after the cut (0: never), want no sooner than Hold %v less a ping round", reclaimed, hold)
	}
}

// TestCoreRelayDies: us's relay crashes, membership still showing it
// alive. Messages to us fall back to its next node at once, so every
// other us node still files eu's and ap's reports the next epoch, and the
// region's contact, judged from the two pings per round, never lapses:
// no region counts us as silent or reclaims its share.
func TestCoreRelayDies(t *testing.T) {
	sc := testShareConfig()
	sc.BorrowEvery = 0
	n := relayNet(t, sc)
	n.run(n.now.Add(4*sc.Interval), 10*time.Millisecond, nil)
	n.node("us-0").down = true
	crash := n.now
	n.run(crash.Add(3*sc.Interval), 10*time.Millisecond, func() {
		for _, nd := range n.nodes {
			if !nd.down && (nd.core.Isolated() || len(nd.core.Dead()) > 0) {
				t.Fatalf("%v after us-0 crashed: %s isolated %v, dead %v", n.now.Sub(crash), nd.name, nd.core.Isolated(), nd.core.Dead())
			}
		}
	})
	// us-0 was us's publisher: us's own report is missing until membership
	// says it is gone, but eu's and ap's reach us-1…us-3 through us-1.
	e := sc.Epoch(crash) + 1
	for _, name := range []string{"us-1", "us-2", "us-3"} {
		if got, _ := n.node(name).core.Filed(e); !slices.Contains(got, "eu") || !slices.Contains(got, "ap") {
			t.Errorf("%s filed the reports of %v for epoch %d, want eu's and ap's", name, got, e)
		}
	}
	n.node("us-0").state = msg.StateDead // membership's verdict
	n.run(n.now.Add(3*sc.Interval), 10*time.Millisecond, nil)
	filedEverywhere(t, n, sc.Epoch(n.now)-2, "ap", "eu", "us")
}

// trafficPerNode runs regions eu, us and ap of nodes nodes each on
// virtual time, the same regional demand split evenly over the nodes, and
// returns what the busiest node sent and was sent per second: message
// bytes across regions, inside its region, and contact pings.
func trafficPerNode(t *testing.T, nodes int, relay bool) (cross, lan, pings float64) {
	t.Helper()
	sc := testShareConfig()
	demand := map[string]float64{"eu": 120, "us": 60, "ap": 30}
	var names []string
	for _, r := range []string{"eu", "us", "ap"} {
		for i := range nodes {
			names = append(names, fmt.Sprintf("%s-%d", r, i))
		}
	}
	n := newCoreNet(t, sc, names...)
	n.relay = relay
	for _, name := range names {
		n.rate[name] = demand[regionOf(name)] / float64(nodes)
	}
	n.run(n.now.Add(3*sc.Interval), 10*time.Millisecond, nil)
	clear(n.traffic)
	const measured = 6
	n.run(n.now.Add(measured*sc.Interval), 10*time.Millisecond, nil)
	secs := (measured * sc.Interval).Seconds()
	for _, tr := range n.traffic {
		cross = max(cross, float64(tr.crossOut+tr.crossIn)/secs)
		lan = max(lan, float64(tr.lanOut+tr.lanIn)/secs)
		pings = max(pings, float64(tr.pingsOut+tr.pingsIn)/secs)
	}
	return cross, lan, pings
}

// TestRelayTrafficPerNode: with relays, the busiest node's cross-region
// bytes per second and contact pings per second with 3 regions × 8 nodes
// are within 1.2× of those with 3 × 2; without them (every node pinged,
// every node of another region sent to) they grow with the nodes. The
// traffic inside a region (node usage, relayed copies) grows with the
// region's own nodes either way.
func TestRelayTrafficPerNode(t *testing.T) {
	type figures struct{ cross, lan, pings float64 }
	got := map[[2]int]figures{}
	for _, relay := range []int{0, 1} {
		for _, nodes := range []int{2, 8} {
			c, l, p := trafficPerNode(t, nodes, relay == 1)
			got[[2]int{relay, nodes}] = figures{c, l, p}
			t.Logf("relay=%v 3×%d: busiest node %.0f B/s across regions, %.0f B/s in region, %.0f pings/s",
				relay == 1, nodes, c, l, p)
		}
	}
	small, large := got[[2]int{1, 2}], got[[2]int{1, 8}]
	if large.cross > 1.2*small.cross {
		t.Errorf("with relays, cross-region bytes/s per node: 3×8 %.0f > 1.2 × 3×2 %.0f", large.cross, small.cross)
	}
	if large.pings > 1.2*small.pings {
		t.Errorf("with relays, pings/s per node: 3×8 %.0f > 1.2 × 3×2 %.0f", large.pings, small.pings)
	}
	if old := got[[2]int{0, 8}]; old.pings < 3*got[[2]int{0, 2}].pings {
		t.Errorf("without relays, pings/s per node: 3×8 %.0f, want the growth with nodes this test exists to remove", old.pings)
	}
}
