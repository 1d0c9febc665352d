package coordinator

import (
	"math"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/coordinator/msg"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/share"
)

const (
	policy = "global-api"
	limit  = 100.0 // L_global, units/s
)

// coreNet is a scripted cluster of cores: every node is ticked every step
// of virtual time and messages are delivered after delay, in send order.
// No memberlist, no goroutines, no sleeps.
type coreNet struct {
	t       *testing.T
	sc      share.Config
	now     time.Time
	delay   time.Duration
	nodes   []*coreNode
	inFlite []flight
	// rate is each node's offered rate of the test key, units/s.
	rate map[string]float64
	// cut, if set, drops every message between the two regions.
	cut func(from, to string) bool
	// contactEvery, if set, feeds every member of another region a
	// Contact and an Unanswered as the gossip layer's pings would (every
	// contactEvery, answered at once or given up a period later): the
	// last multiple of it at which the viewer could reach the member,
	// neither down nor cut off, and the last ping given up since. Zero
	// feeds none, as an owner that only passes membership's verdicts.
	contactEvery time.Duration
	contact      map[[2]string]time.Time
	unanswered   map[[2]string]time.Time
	// relay, if set, routes as the gossip package does with relays: what
	// crosses regions goes to the first node of RelayOrder that is not
	// down, which sends it on to its region's other nodes, and only the
	// nodes PingTargets picks are pinged (their Contact and Unanswered
	// move; the others' stay as they were).
	relay bool
	// paused, if set, says whose pings are not running (their process too
	// busy): their contacts age, with no ping given up either.
	paused func(viewer string) bool
	// verdict, if set, is membership's verdict instead of cut: whether
	// viewer's membership shows region dead.
	verdict func(viewer, region string) bool
	log     []Ready // every non-empty Ready, in order (determinism checks)
	sent    int
	// traffic is what each node sent and was sent, by node name.
	traffic map[string]*nodeTraffic
	round   map[string]time.Time // node → the ping round last counted in traffic
}

// nodeTraffic is one node's share traffic: message bytes (the size
// estimates the simulator uses) to and from other regions and inside its
// own, and contact pings sent and answered.
type nodeTraffic struct {
	crossOut, crossIn, lanOut, lanIn int
	pingsOut, pingsIn                int
}

// fly puts f in flight and counts it.
func (n *coreNet) fly(f flight) {
	n.sent++
	n.inFlite = append(n.inFlite, f)
	size := msgSize(f.msg)
	from, to := n.counter(f.from.name), n.counter(f.to.name)
	if f.from.region != f.to.region {
		from.crossOut += size
		to.crossIn += size
	} else {
		from.lanOut += size
		to.lanIn += size
	}
}

// countPings counts, once per ping round, the pings nd sends: those of
// pinged with relays, else one to every member of another region.
func (n *coreNet) countPings(nd *coreNode, ms []msg.Member, pinged []string) {
	own := n.counter(nd.name)
	r := n.now.Truncate(max(n.contactEvery, 1))
	if n.contactEvery == 0 || r.Equal(n.round[nd.name]) {
		return
	}
	n.round[nd.name] = r
	if !n.relay {
		for _, m := range ms {
			if m.Region != nd.region {
				pinged = append(pinged, m.Node)
			}
		}
	}
	own.pingsOut += len(pinged)
	for _, x := range pinged {
		n.counter(x).pingsIn++
	}
}

func (n *coreNet) counter(node string) *nodeTraffic {
	if n.traffic == nil {
		n.traffic, n.round = map[string]*nodeTraffic{}, map[string]time.Time{}
	}
	if n.traffic[node] == nil {
		n.traffic[node] = &nodeTraffic{}
	}
	return n.traffic[node]
}

// msgSize is the encoded size estimate of m's payload, as the simulator
// counts it, plus a 40-byte envelope.
func msgSize(m msg.Message) int {
	const env = 40
	switch m.Kind {
	case msg.KindReport:
		return env + m.Report.EncodedSizeEstimate()
	case msg.KindBorrow:
		return env + m.Borrow.EncodedSizeEstimate()
	case msg.KindLoan:
		return env + m.Loan.EncodedSizeEstimate()
	case msg.KindNodeUsage:
		size := env + 1 + 4*2 + len(m.Usage.Node) + len(m.Usage.Region) + 2*5 + 9 + 5
		for _, k := range m.Usage.Keys {
			size += 1 + 6*2 + 4*9 + len(k.Policy) + len(k.Subject) + 2*5
		}
		return size
	}
	return env
}

type coreNode struct {
	name, region string
	core         *Core
	state        msg.State
	down         bool    // crashed: neither ticked nor sent to, whatever membership says
	carry        float64 // fractional demand not yet drained
	admitted     float64
}

type flight struct {
	at    time.Time
	to    *coreNode
	msg   msg.Message
	from  *coreNode
	relay bool // the receiver sends it on inside its region (coreNet.relay)
}

func newCoreNet(t *testing.T, sc share.Config, nodes ...string) *coreNet {
	t.Helper()
	return newCoreNetCollect(t, sc, 150*time.Millisecond, nodes...)
}

// newCoreNetCollect is newCoreNet with the cores' CoreConfig.Collect (zero:
// the default, Settle/3).
func newCoreNetCollect(t *testing.T, sc share.Config, collect time.Duration, nodes ...string) *coreNet {
	t.Helper()
	n := &coreNet{t: t, sc: sc, now: sc.EpochStart(1_000_000).Add(100 * time.Millisecond),
		delay: 20 * time.Millisecond, rate: map[string]float64{},
		contactEvery: sc.Interval / 40, contact: map[[2]string]time.Time{}, unanswered: map[[2]string]time.Time{}}
	for _, name := range nodes {
		n.nodes = append(n.nodes, &coreNode{name: name, region: regionOf(name), state: msg.StateAlive})
	}
	for _, nd := range n.nodes {
		c, err := NewCore(CoreConfig{Share: sc, Region: nd.region, Node: nd.name, Collect: collect,
			Limit: func(p string) (float64, bool) { return limit, p == policy }}, n.members())
		if err != nil {
			t.Fatal(err)
		}
		nd.core = c
		if err := c.Start(n.now, n.members(), nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

func (n *coreNet) members() []msg.Member {
	out := make([]msg.Member, 0, len(n.nodes))
	for _, nd := range n.nodes {
		out = append(out, msg.Member{Node: nd.name, Region: nd.region, State: nd.state})
	}
	return out
}

func (n *coreNet) node(name string) *coreNode {
	for _, nd := range n.nodes {
		if nd.name == name {
			return nd
		}
	}
	n.t.Fatalf("no node %s", name)
	return nil
}

// usage is what node nd's engine would have drained over dt: its offered
// rate, admitted up to its share of the limit split by rate in its region.
func (n *coreNet) usage(nd *coreNode, dt time.Duration) map[engine.UsageKey]engine.Usage {
	rate := n.rate[nd.name]
	if rate == 0 {
		return nil
	}
	regional := 0.0
	for name, r := range n.rate {
		if regionOf(name) == nd.region {
			regional += r
		}
	}
	nd.carry += rate * dt.Seconds()
	nd.admitted += min(rate, nd.core.Share(policy, "hot")*limit*rate/regional) * dt.Seconds()
	d, a := math.Floor(nd.carry), math.Floor(min(nd.admitted, nd.carry))
	nd.carry -= d
	nd.admitted -= a
	return map[engine.UsageKey]engine.Usage{{Subject: "hot", Policy: policy}: {Demand: int64(d), Admitted: int64(a)}}
}

// send routes rd's messages from nd the way the gossip package does.
func (n *coreNet) send(from *coreNode, rd Ready) {
	if !reflect.DeepEqual(rd, Ready{}) {
		n.log = append(n.log, rd)
	}
	to := func(m msg.Message, ok func(*coreNode) bool) {
		m.From, m.Region = from.name, from.region
		var relayed []string
		for _, nd := range n.nodes {
			if nd == from || nd.down || nd.state != msg.StateAlive || !ok(nd) || (n.cut != nil && n.cut(from.region, nd.region)) {
				continue
			}
			if n.relay && nd.region != from.region {
				if !slices.Contains(relayed, nd.region) {
					relayed = append(relayed, nd.region)
				}
				continue
			}
			n.fly(flight{at: n.now.Add(n.delay), to: nd, msg: m, from: from})
		}
		for _, r := range relayed {
			n.relayTo(from, m, r)
		}
	}
	for _, r := range rd.Reports {
		to(msg.Message{Kind: msg.KindReport, Report: r}, func(nd *coreNode) bool { return nd.region != from.region })
	}
	for _, u := range rd.NodeUsage {
		to(msg.Message{Kind: msg.KindNodeUsage, Usage: u}, func(nd *coreNode) bool { return nd.region == from.region })
	}
	for _, b := range rd.Borrows {
		to(msg.Message{Kind: msg.KindBorrow, Borrow: b}, func(nd *coreNode) bool { return nd.region != from.region })
	}
	for _, l := range rd.Loans {
		to(msg.Message{Kind: msg.KindLoan, Loan: l}, func(nd *coreNode) bool {
			return nd.region == l.Borrower || nd.region == l.Lender
		})
	}
}

// relayTo sends m to region r's relay: the first node of RelayOrder (as
// from's membership shows it) not down, as a send to a crashed node fails
// and the next one is tried.
func (n *coreNet) relayTo(from *coreNode, m msg.Message, r string) {
	for _, name := range RelayOrder(n.verdicts(from, n.members()), r) {
		if nd := n.node(name); !nd.down {
			n.fly(flight{at: n.now.Add(n.delay), to: nd, msg: m, from: from, relay: true})
			return
		}
	}
}

// run advances virtual time to until in steps, ticking every live node and
// delivering messages due; each (if set) is called after every step.
// firstBorrow is the first borrow request region sent in the Readies
// logged from index since on.
func (n *coreNet) firstBorrow(since int, region string) (share.BorrowRequest, bool) {
	for _, rd := range n.log[since:] {
		for _, b := range rd.Borrows {
			if b.Region == region {
				return b, true
			}
		}
	}
	return share.BorrowRequest{}, false
}

func (n *coreNet) run(until time.Time, step time.Duration, each func()) {
	for n.now.Before(until) {
		n.now = n.now.Add(step)
		due := n.inFlite[:0:0]
		keep := n.inFlite[:0]
		for _, f := range n.inFlite {
			if !f.at.After(n.now) {
				due = append(due, f)
			} else {
				keep = append(keep, f)
			}
		}
		n.inFlite = keep
		for _, f := range due {
			if f.to.state == msg.StateAlive && !f.to.down {
				n.send(f.to, f.to.core.Step(n.now, f.msg))
				if f.relay {
					n.forward(f)
				}
			}
		}
		for _, nd := range n.nodes {
			if nd.state == msg.StateAlive && !nd.down {
				n.send(nd, nd.core.Tick(n.now, n.usage(nd, step), n.view(nd)))
			}
		}
		if each != nil {
			each()
		}
	}
}

// forward sends a relayed message on to the relay's region's other nodes.
func (n *coreNet) forward(f flight) {
	for _, nd := range n.nodes {
		if nd != f.to && nd.region == f.to.region && !nd.down && nd.state == msg.StateAlive {
			n.fly(flight{at: n.now.Add(n.delay), to: nd, msg: f.msg, from: f.to})
		}
	}
}

// view is membership as nd sees it: a cut-off region looks dead, and
// every member of another region has the Contact of its last answered
// ping (contactEvery).
func (n *coreNet) view(nd *coreNode) []msg.Member {
	ms := n.members()
	var pinged []string
	if n.relay {
		pinged = PingTargets(n.verdicts(nd, ms), nd.name, nd.region, nil)
	}
	n.countPings(nd, ms, pinged)
	for i := range ms {
		cut := n.cut != nil && n.cut(nd.region, ms[i].Region)
		switch {
		case n.verdict != nil:
			if n.verdict(nd.region, ms[i].Region) {
				ms[i].State = msg.StateDead
			}
		case cut:
			ms[i].State = msg.StateDead
		}
		if n.contactEvery > 0 && ms[i].Region != nd.region {
			// Pings are answered at once or given up a period later.
			k := [2]string{nd.name, ms[i].Node}
			switch {
			case n.paused != nil && n.paused(nd.name):
			case n.relay && !slices.Contains(pinged, ms[i].Node):
				// Not pinged this round: what it had stays.
			case !cut && !n.node(ms[i].Node).down:
				n.contact[k] = n.now.Truncate(n.contactEvery)
			default:
				if failed := n.now.Add(-n.contactEvery).Truncate(n.contactEvery); failed.After(n.contact[k]) {
					n.unanswered[k] = failed
				}
			}
			ms[i].Contact = n.contact[k]
			if u := n.unanswered[k]; u.After(ms[i].Contact) {
				ms[i].Unanswered = u
			}
		}
	}
	return ms
}

// verdicts is ms with membership's verdicts as nd sees them (cut-off or
// dead regions dead), without contact.
func (n *coreNet) verdicts(nd *coreNode, ms []msg.Member) []msg.Member {
	ms = slices.Clone(ms)
	for i := range ms {
		switch {
		case n.verdict != nil:
			if n.verdict(nd.region, ms[i].Region) {
				ms[i].State = msg.StateDead
			}
		case n.cut != nil && n.cut(nd.region, ms[i].Region):
			ms[i].State = msg.StateDead
		}
	}
	return ms
}

func (n *coreNet) shares(names ...string) []float64 {
	out := make([]float64, len(names))
	for i, name := range names {
		out[i] = n.node(name).core.Share(policy, "hot")
	}
	return out
}

func sum(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s
}

// regionOf is the region of a test node named region-n.
func regionOf(node string) string { return node[:2] }

// testShareConfig is a share config with a 1 s interval.
func testShareConfig() share.Config {
	sc := share.DefaultConfig()
	sc.Interval = time.Second
	sc.Recent = 200 * time.Millisecond
	sc.Settle = 400 * time.Millisecond
	sc.RaiseDelay = 200 * time.Millisecond
	return sc
}
