package coordinator

import (
	"fmt"
	"math"
	"reflect"
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
	// paused, if set, says whose pings are not running (their process too
	// busy): their contacts age, with no ping given up either.
	paused func(viewer string) bool
	// verdict, if set, is membership's verdict instead of cut: whether
	// viewer's membership shows region dead.
	verdict func(viewer, region string) bool
	log     []Ready // every non-empty Ready, in order (determinism checks)
	sent    int
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
	at   time.Time
	to   *coreNode
	msg  msg.Message
	from *coreNode
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
		contactEvery: sc.Interval / 40, contact: map[[2]string]time.Time{}}
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
		for _, nd := range n.nodes {
			if nd == from || nd.down || nd.state != msg.StateAlive || !ok(nd) || (n.cut != nil && n.cut(from.region, nd.region)) {
				continue
			}
			n.sent++
			n.inFlite = append(n.inFlite, flight{at: n.now.Add(n.delay), to: nd, msg: m, from: from})
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

// view is membership as nd sees it: a cut-off region looks dead, and
// every member of another region has the Contact of its last answered
// ping (contactEvery).
func (n *coreNet) view(nd *coreNode) []msg.Member {
	ms := n.members()
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
			case !cut && !n.node(ms[i].Node).down:
				n.contact[k] = n.now.Truncate(n.contactEvery)
			default:
				if failed := n.now.Add(-n.contactEvery).Truncate(n.contactEvery); failed.After(n.contact[k]) {
					ms[i].Unanswered = failed
				}
			}
			ms[i].Contact = n.contact[k]
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

// TestCoreSharesFollowTraffic drives four nodes in three regions through
// scripted epochs: shares follow the traffic, the two eu nodes enforce the
// same share, only eu's publisher sends its report, and Σ of the enforced
// shares never exceeds 1.
func TestCoreSharesFollowTraffic(t *testing.T) {
	sc := testShareConfig()
	sc.BorrowEvery = 0
	n := newCoreNet(t, sc, "eu-1", "eu-2", "us-1", "ap-1")
	n.rate = map[string]float64{"eu-1": 70, "eu-2": 70, "us-1": 40, "ap-1": 20}
	if got := n.shares("eu-1")[0]; math.Abs(got-1.0/3) > 1e-12 {
		t.Fatalf("Share before any rebalance = %v, want 1/3", got)
	}
	check := func() {
		s := n.shares("eu-1", "eu-2", "us-1", "ap-1")
		if s[0] != s[1] {
			t.Fatalf("%v: eu-1 enforces %v, eu-2 %v", n.now, s[0], s[1])
		}
		if got := s[0] + s[2] + s[3]; got > 1+1e-9 {
			t.Fatalf("%v: Σ enforced shares = %v > 1", n.now, got)
		}
	}
	n.run(n.now.Add(8*sc.Interval), 50*time.Millisecond, check)
	s := n.shares("eu-1", "us-1", "ap-1")
	for i, want := range []float64{0.7, 0.2, 0.1} {
		if math.Abs(s[i]-want) > 0.05 {
			t.Errorf("shares eu/us/ap = %.3f, want 0.7/0.2/0.1 ± 0.05", s)
			break
		}
	}
	reports := map[string]int{}
	for _, rd := range n.log {
		for _, r := range rd.Reports {
			reports[r.Region]++
		}
	}
	if reports["eu"] != reports["us"] || reports["eu"] < 7 {
		t.Errorf("reports sent per region = %v: want one per epoch per region (eu's publisher only)", reports)
	}

	// All traffic moves to us.
	n.rate = map[string]float64{"us-1": 200}
	n.run(n.now.Add(5*sc.Interval), 50*time.Millisecond, check)
	if us := n.shares("us-1")[0]; us < 0.9 {
		t.Errorf("after the shift us holds %.3f, want ≥ 0.9", us)
	}
}

// TestCoreDeadRegion: when ap crashes, eu and us reclaim its share Hold
// after their last answered ping to it, at once (no RaiseDelay: the hold
// already covers the cut of a region cut off rather than crashed); fed
// membership's verdicts only, Hold after the verdict. Never before.
func TestCoreDeadRegion(t *testing.T) {
	for _, tt := range []struct {
		name    string
		contact bool
	}{{"pings", true}, {"verdicts only", false}} {
		t.Run(tt.name, func(t *testing.T) {
			sc := testShareConfig()
			sc.BorrowEvery = 0
			n := newCoreNet(t, sc, "eu-1", "us-1", "ap-1")
			if !tt.contact {
				n.contactEvery = 0
			}
			n.rate = map[string]float64{"eu-1": 60, "us-1": 60, "ap-1": 30}
			n.run(n.now.Add(6*sc.Interval), 50*time.Millisecond, nil)
			// Away from the next rebalance, so that only the rule moves shares.
			n.run(n.now.Truncate(sc.Interval).Add(sc.Interval+sc.Settle+2*sc.RaiseDelay), 10*time.Millisecond, nil)
			before := n.shares("eu-1", "us-1")
			ap := n.node("ap-1")
			ap.down = true
			lost := n.now.Truncate(n.contactEvery + 1) // the last answered ping: now, or the verdict below
			if !tt.contact {
				ap.state = msg.StateDead
				lost = n.now.Add(10 * time.Millisecond) // the first tick that sees it
			}
			hold := n.node("eu-1").core.Hold()
			var took time.Duration
			n.run(lost.Add(hold+100*time.Millisecond), 10*time.Millisecond, func() {
				if s := n.shares("eu-1", "us-1"); took == 0 && sum(s) > sum(before)+0.1 {
					took = n.now.Sub(lost)
					if sum(s) > 1+1e-9 {
						t.Errorf("eu+us = %.3f, want ≤ 1", sum(s))
					}
				}
			})
			if took < hold || took > hold+20*time.Millisecond {
				t.Errorf("eu+us = %.3f before ap died; they reclaimed its share %v after it was lost (0: never), want Hold %v (+ two ticks)",
					sum(before), took, hold)
			}
		})
	}
}

// TestCorePartitionSlowMinorityVerdict: ap is cut off; eu and us's
// membership declares it dead at once, ap's own declares them dead only
// after three intervals (memberlist's Lifeguard on a node without
// confirmers). With contact fed, ap cuts to Safe within Silence and a tick
// and the majority reclaims its share only after Hold, so Σ of the
// enforced shares stays ≤ 1 at every step.
func TestCorePartitionSlowMinorityVerdict(t *testing.T) {
	sc := testShareConfig()
	n := newCoreNet(t, sc, "eu-1", "us-1", "ap-1")
	n.rate = map[string]float64{"eu-1": 60, "us-1": 60, "ap-1": 60}
	n.run(n.now.Add(5*sc.Interval), 10*time.Millisecond, nil)
	start := n.now
	ap := n.node("ap-1")
	isolated, reclaimed := time.Duration(0), time.Duration(0)
	// Messages and pings are cut both ways at once; membership's verdict
	// differs by side.
	n.cut = func(a, b string) bool { return a != b && (a == "ap" || b == "ap") }
	n.verdict = func(viewer, region string) bool {
		if viewer == "ap" && n.now.Sub(start) < 3*sc.Interval {
			return false // ap's view: the others still look alive
		}
		return n.cut(viewer, region)
	}
	n.run(start.Add(6*sc.Interval), 10*time.Millisecond, func() {
		s := n.shares("eu-1", "us-1", "ap-1")
		if sum(s) > 1+1e-9 {
			t.Fatalf("%v into the partition: Σ enforced shares = %.4f (eu, us, ap %.3f)", n.now.Sub(start), sum(s), s)
		}
		if isolated == 0 && s[2] <= sc.Floor/3+1e-12 {
			isolated = n.now.Sub(start)
		}
		if reclaimed == 0 && s[0]+s[1] > 0.95 {
			reclaimed = n.now.Sub(start)
		}
	})
	silence, hold := ap.core.cfg.Silence, n.node("eu-1").core.Hold()
	if isolated == 0 || isolated > silence+n.contactEvery+20*time.Millisecond {
		t.Errorf("ap fell back to Safe %v into the partition (0: never), want within Silence %v + a ping period and two ticks", isolated, silence)
	}
	if reclaimed == 0 || reclaimed > hold+n.contactEvery+sc.Interval {
		t.Errorf("eu+us reclaimed ap's share %v into the partition (0: never), want within Hold %v and the rebalance after it", reclaimed, hold)
	}
}

// TestCorePausedPingsDecideNothing: when a node's pings stop running (its
// process paused) its contacts age without any ping given up; it must not
// take that for a partition: no cut to Safe, no reclaim.
func TestCorePausedPingsDecideNothing(t *testing.T) {
	sc := testShareConfig()
	n := newCoreNet(t, sc, "eu-1", "us-1", "ap-1")
	n.rate = map[string]float64{"eu-1": 60, "us-1": 60, "ap-1": 60}
	n.run(n.now.Add(5*sc.Interval), 10*time.Millisecond, nil)
	n.run(n.now.Truncate(sc.Interval).Add(sc.Interval+sc.Settle+2*sc.RaiseDelay), 10*time.Millisecond, nil)
	before := n.shares("eu-1", "us-1", "ap-1")
	pause := n.now
	hold := n.node("ap-1").core.Hold()
	n.paused = func(viewer string) bool { return viewer == "ap-1" }
	n.run(pause.Add(2*hold), 10*time.Millisecond, func() {
		if s := n.shares("eu-1", "us-1", "ap-1"); s[2] < before[2]-1e-9 || s[0]+s[1] > before[0]+before[1]+1e-9 {
			t.Fatalf("%v into ap's pause: shares eu, us, ap %.3f, were %.3f: want no cut and no reclaim", n.now.Sub(pause), s, before)
		}
	})
}

// TestCorePartitionedRegionCuts: a region cut off from the other two is
// isolated and falls back to the safe share, while the majority reclaims
// its share; Σ of the enforced shares stays ≤ 1 throughout.
func TestCorePartitionedRegionCuts(t *testing.T) {
	sc := testShareConfig()
	n := newCoreNet(t, sc, "eu-1", "us-1", "ap-1")
	n.rate = map[string]float64{"eu-1": 60, "us-1": 60, "ap-1": 60}
	n.run(n.now.Add(5*sc.Interval), 50*time.Millisecond, nil)
	n.cut = func(a, b string) bool { return a != b && (a == "ap" || b == "ap") }
	n.run(n.now.Add(6*sc.Interval), 50*time.Millisecond, func() {
		if s := sum(n.shares("eu-1", "us-1", "ap-1")); s > 1+1e-9 {
			t.Fatalf("%v: Σ enforced shares = %v during the partition", n.now, s)
		}
	})
	if ap := n.shares("ap-1")[0]; ap > sc.Floor/3+1e-12 {
		t.Errorf("isolated ap enforces %v, want the safe share %v", ap, sc.Floor/3)
	}
	if s := sum(n.shares("eu-1", "us-1")); s < 0.95 {
		t.Errorf("majority eu+us = %v, want ≥ 0.95", s)
	}
}

// TestCoreDeterministic: the same script gives the same messages in the
// same order, byte for byte.
func TestCoreDeterministic(t *testing.T) {
	sc := testShareConfig()
	var logs [2][]Ready
	for i := range logs {
		n := newCoreNet(t, sc, "eu-1", "eu-2", "us-1", "ap-1")
		n.rate = map[string]float64{"eu-1": 45, "eu-2": 45, "us-1": 5, "ap-1": 5}
		n.run(n.now.Add(3*sc.Interval), 50*time.Millisecond, nil)
		n.rate = map[string]float64{"us-1": 100}
		n.run(n.now.Add(3*sc.Interval), 50*time.Millisecond, nil)
		logs[i] = n.log
	}
	if !reflect.DeepEqual(logs[0], logs[1]) {
		t.Error("two runs of one script sent different messages")
	}
	loans := 0
	for _, rd := range logs[0] {
		loans += len(rd.Loans)
	}
	if loans == 0 {
		t.Error("no loan after the shift: the script does not exercise borrowing")
	}
}

// TestCoreBorrowsAfterShift: traffic moves from eu to us mid-interval; us
// gets a loan within 1.5 s, eu cuts before us raises.
func TestCoreBorrowsAfterShift(t *testing.T) {
	sc := share.DefaultConfig()
	sc.Interval = 4 * time.Second
	sc.Recent = 400 * time.Millisecond
	sc.Settle = 400 * time.Millisecond
	sc.RaiseDelay = 200 * time.Millisecond
	n := newCoreNet(t, sc, "eu-1", "eu-2", "us-1", "ap-1")
	n.rate = map[string]float64{"eu-1": 45, "eu-2": 45, "us-1": 5, "ap-1": 5}
	n.run(n.now.Add(3*sc.Interval+time.Second), 50*time.Millisecond, nil)
	shift := n.now
	n.rate = map[string]float64{"us-1": 100}
	var got time.Time
	n.run(n.now.Add(1500*time.Millisecond), 50*time.Millisecond, func() {
		s := n.shares("eu-1", "eu-2", "us-1", "ap-1")
		if total := max(s[0], s[1]) + s[2] + s[3]; total > 1+3*share.MinShare+1e-12 {
			t.Fatalf("%v after the shift: Σ enforced shares = %v", n.now.Sub(shift), total)
		}
		if s[2] >= 0.5 && got.IsZero() {
			got = n.now
		}
	})
	if got.IsZero() {
		t.Fatalf("us got no loan within 1.5 s of the shift (us at %.3f)", n.shares("us-1")[0])
	}
}

// TestCoreAsksAtOnce: a region that starts rejecting asks for a loan at
// the core's next look (checkEvery), not at the next borrow tick, and the
// request says the shortage has only just begun (Burst).
func TestCoreAsksAtOnce(t *testing.T) {
	sc := share.DefaultConfig()
	sc.Interval = 4 * time.Second
	sc.Recent = 400 * time.Millisecond
	sc.Settle = 400 * time.Millisecond
	sc.RaiseDelay = 200 * time.Millisecond
	n := newCoreNet(t, sc, "eu-1", "us-1", "ap-1")
	for _, nd := range n.nodes {
		nd.core.cfg.Bucket = func(string) bool { return true }
	}
	n.rate = map[string]float64{"eu-1": 90, "us-1": 5, "ap-1": 5}
	n.run(n.now.Add(3*sc.Interval+time.Second), 10*time.Millisecond, nil)
	us := n.node("us-1").core
	if tick := us.cfg.BorrowTick; tick <= us.checkEvery() {
		t.Fatalf("BorrowTick %v is no longer than checkEvery %v: nothing to show", tick, us.checkEvery())
	}
	shift := n.now
	n.rate = map[string]float64{"eu-1": 90, "us-1": 100, "ap-1": 5}
	seen := len(n.log)
	var asked time.Time
	var req share.BorrowRequest
	n.run(n.now.Add(time.Second), 10*time.Millisecond, func() {
		if b, ok := n.firstBorrow(seen, "us"); ok && asked.IsZero() {
			asked, req = n.now, b
		}
		seen = len(n.log)
	})
	if asked.IsZero() {
		t.Fatal("us never asked for a loan")
	}
	if d := asked.Sub(shift); d > us.checkEvery()+20*time.Millisecond {
		t.Errorf("us asked %v after it started rejecting, want within %v", d, us.checkEvery()+20*time.Millisecond)
	}
	if !req.Burst {
		t.Errorf("the first request after a quiet spell is not marked Burst: %+v", req)
	}
	if !(req.Want > 0 && req.Want <= 1) {
		t.Errorf("Want = %v, want in (0, 1]", req.Want)
	}
}

// TestCoreDropsUnusableMessages: a message naming an unknown region, an
// epoch far from now or a non-finite figure is counted and never applied.
func TestCoreDropsUnusableMessages(t *testing.T) {
	sc := testShareConfig()
	n := newCoreNet(t, sc, "eu-1", "us-1")
	c := n.node("eu-1").core
	cur := sc.Epoch(n.now)
	key := share.Key{Policy: policy, Subject: "hot"}
	report := func(region string, epoch uint64, v float64) msg.Message {
		return msg.Message{Kind: msg.KindReport, From: region + "-1", Region: region, Report: share.Report{
			Version: share.ReportVersion, Region: region, Epoch: epoch,
			Keys: []share.KeyReport{{Key: key, Limit: limit, Offered: v, Recent: v, Demand: v, Admitted: v}}}}
	}
	for _, tt := range []struct {
		name string
		msg  msg.Message
		want string
	}{
		{"good report", report("us", cur, 50), ""},
		{"unknown region", report("mars", cur, 50), DropRegion},
		{"future epoch", report("us", cur+2, 50), DropEpoch},
		{"ancient epoch", report("us", cur-maxAge-1, 50), DropEpoch},
		{"NaN demand", report("us", cur, math.NaN()), DropNumber},
		{"infinite demand", report("us", cur, math.Inf(1)), DropNumber},
		{"negative demand", report("us", cur, -1), DropNumber},
		{"no region", report("", cur, 1), DropMalformed},
		{"NaN node usage", msg.Message{Kind: msg.KindNodeUsage, Usage: msg.NodeUsage{Node: "eu-2", Region: "eu", Epoch: cur,
			Keys: []msg.KeyUsage{{Key: key, Limit: math.NaN()}}}}, DropNumber},
		{"infinite want", msg.Message{Kind: msg.KindBorrow, Borrow: share.BorrowRequest{Region: "us", Epoch: cur, Key: key,
			Want: math.Inf(1)}}, DropNumber},
		{"loan from nowhere", msg.Message{Kind: msg.KindLoan, Loan: share.Loan{Lender: "mars", Borrower: "eu", Epoch: cur,
			Key: key, Amount: 0.1}}, DropRegion},
		{"loan above the limit", msg.Message{Kind: msg.KindLoan, Loan: share.Loan{Lender: "us", Borrower: "eu", Epoch: cur,
			Key: key, Amount: 2}}, DropNumber},
		{"NaN loan", msg.Message{Kind: msg.KindLoan, Loan: share.Loan{Lender: "us", Borrower: "eu", Epoch: cur,
			Key: key, Amount: math.NaN()}}, DropNumber},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := c.Dropped()[tt.want]
			rd := c.Step(n.now, tt.msg)
			if rd.Dropped != tt.want {
				t.Fatalf("Step(%s).Dropped = %q, want %q", tt.name, rd.Dropped, tt.want)
			}
			if tt.want == "" {
				return
			}
			if got := c.Dropped()[tt.want]; got != before+1 {
				t.Errorf("Dropped()[%s] = %d, want %d", tt.want, got, before+1)
			}
			if r := tt.msg.Report; tt.msg.Kind == msg.KindReport {
				if _, filed := c.reports[r.Epoch][r.Region]; filed && r.Region != "us" || filed && r.Epoch != cur {
					t.Errorf("a dropped report was filed")
				}
				if f := c.reports[cur]["us"]; len(f.Keys) == 1 && !(f.Keys[0].Demand == 50) {
					t.Errorf("a dropped report replaced the good one: %+v", f)
				}
			}
		})
	}
}

// TestCoreDropsBadBorrowsAndLoans: borrow requests and loans that are
// malformed, from an unknown region, for nothing or more than the whole
// limit, handing over more tokens than their cut frees, of a generation
// this region has rebalanced past, or of an epoch too old or in the future
// are counted and never applied: the region's share does not move, and
// nothing is sent in answer (no loan for a bad request).
func TestCoreDropsBadBorrowsAndLoans(t *testing.T) {
	sc := testShareConfig()
	n := newCoreNet(t, sc, "eu-1", "us-1")
	n.rate = map[string]float64{"eu-1": 30, "us-1": 30}
	n.run(n.now.Add(3*sc.Interval), 10*time.Millisecond, nil)
	c := n.node("eu-1").core
	gen := c.b.gen
	key := share.Key{Policy: policy, Subject: "hot"}
	// Requests and loans of share and of tokens alike.
	for _, version := range []uint8{share.RateVersion, share.TokenVersion} {
		borrow := func(region string, epoch uint64, want float64) msg.Message {
			return msg.Message{Kind: msg.KindBorrow, From: region + "-1", Region: region, Borrow: share.BorrowRequest{
				Version: version, Region: region, Epoch: epoch, Key: key, Want: want}}
		}
		loan := func(lender string, epoch uint64, amount, tokens float64) msg.Message {
			return msg.Message{Kind: msg.KindLoan, From: lender + "-1", Region: lender, Loan: share.Loan{
				Version: version, Lender: lender, Borrower: "eu", Epoch: epoch, Key: key, Amount: amount, Tokens: tokens, Seq: 1}}
		}
		for _, tt := range []struct {
			name string
			msg  msg.Message
			want string
		}{
			{"borrow without region", borrow("", gen, 0.2), DropMalformed},
			{"borrow from an unknown region", borrow("mars", gen, 0.2), DropRegion},
			{"borrow of nothing", borrow("us", gen, 0), DropNumber},
			{"borrow of more than the limit", borrow("us", gen, 1.5), DropNumber},
			{"borrow NaN", borrow("us", gen, math.NaN()), DropNumber},
			{"borrow of an infinite amount", borrow("us", gen, math.Inf(1)), DropNumber},
			{"borrow of an expired generation", borrow("us", gen-1, 0.2), DropExpired},
			{"borrow from too far back", borrow("us", sc.Epoch(n.now)-maxAge-1, 0.2), DropEpoch},
			{"borrow from the future", borrow("us", sc.Epoch(n.now)+2, 0.2), DropEpoch},
			{"borrow without policy", func() msg.Message { m := borrow("us", gen, 0.2); m.Borrow.Policy = ""; return m }(), DropMalformed},
			{"loan without lender", loan("", gen, 0.2, 0), DropMalformed},
			{"loan without borrower", func() msg.Message { m := loan("us", gen, 0.2, 0); m.Loan.Borrower = ""; return m }(), DropMalformed},
			{"loan without policy", func() msg.Message { m := loan("us", gen, 0.2, 0); m.Loan.Policy = ""; return m }(), DropMalformed},
			{"loan to an unknown region", func() msg.Message { m := loan("us", gen, 0.2, 0); m.Loan.Borrower = "mars"; return m }(), DropRegion},
			{"loan from an unknown region", loan("mars", gen, 0.2, 0), DropRegion},
			{"loan of more than the limit", loan("us", gen, 1.5, 0), DropNumber},
			{"loan of nothing", loan("us", gen, 0, 0), DropNumber},
			{"loan with more tokens than its cut", loan("us", gen, 0.2, 0.3), DropNumber},
			{"loan with negative tokens", loan("us", gen, 0.2, -0.1), DropNumber},
			{"loan of an expired generation", loan("us", gen-1, 0.2, 0.2), DropExpired},
			{"loan from too far back", loan("us", sc.Epoch(n.now)-maxAge-1, 0.2, 0), DropEpoch},
			{"loan from the future", loan("us", sc.Epoch(n.now)+2, 0.2, 0), DropEpoch},
		} {
			t.Run(fmt.Sprintf("v%d/%s", version, tt.name), func(t *testing.T) {
				before, share0 := c.Dropped()[tt.want], c.Share(policy, "hot")
				rd := c.Step(n.now, tt.msg)
				if rd.Dropped != tt.want {
					t.Fatalf("Step(%s).Dropped = %q, want %q", tt.name, rd.Dropped, tt.want)
				}
				if len(rd.Loans) != 0 || len(rd.Borrows) != 0 || len(rd.Spends) != 0 {
					t.Errorf("Step(%s) sent %d loans, %d borrow requests and %d spends, want none", tt.name, len(rd.Loans), len(rd.Borrows), len(rd.Spends))
				}
				if got := c.Dropped()[tt.want]; got != before+1 {
					t.Errorf("Dropped()[%s] = %d, want %d", tt.want, got, before+1)
				}
				if got := c.Share(policy, "hot"); got != share0 {
					t.Errorf("share after a dropped message = %v, want %v", got, share0)
				}
			})
		}
	}
	// The same loan, well formed and of this generation, is applied.
	good := msg.Message{Kind: msg.KindLoan, From: "us-1", Region: "us", Loan: share.Loan{
		Version: share.RateVersion, Lender: "us", Borrower: "eu", Epoch: gen, Key: key, Amount: 0.2, Seq: 1}}
	if rd := c.Step(n.now, good); rd.Dropped != "" {
		t.Fatalf("a good loan was dropped: %q", rd.Dropped)
	}
}

// TestCoreRestoresSavedShares: recent saved shares are enforced until the
// first rebalance; old ones, or another region's, are ignored; the core
// asks to save after each raise.
func TestCoreRestoresSavedShares(t *testing.T) {
	sc := testShareConfig()
	now := sc.EpochStart(1_000_000).Add(100 * time.Millisecond)
	cur := sc.Epoch(now)
	key := share.Key{Policy: policy, Subject: "hot"}
	members := []msg.Member{{Node: "eu-1", Region: "eu", State: msg.StateAlive}, {Node: "us-1", Region: "us", State: msg.StateAlive}}
	for _, tt := range []struct {
		name  string
		saved Saved
		want  float64
	}{
		{"recent", Saved{Region: "eu", Epoch: cur - 1, Shares: []SavedShare{{Key: key, Share: 0.8}}}, 0.8},
		{"too old", Saved{Region: "eu", Epoch: cur - uint64(sc.PartitionIntervals) - 1, Shares: []SavedShare{{Key: key, Share: 0.8}}}, 0.5},
		{"another region's", Saved{Region: "us", Epoch: cur - 1, Shares: []SavedShare{{Key: key, Share: 0.8}}}, 0.5},
		{"out of range", Saved{Region: "eu", Epoch: cur - 1, Shares: []SavedShare{{Key: key, Share: 7}}}, 0.5},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := NewCore(CoreConfig{Share: sc, Region: "eu", Node: "eu-1",
				Limit: func(string) (float64, bool) { return limit, true }}, members)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Start(now, members, &tt.saved, nil); err != nil {
				t.Fatal(err)
			}
			c.Tick(now.Add(50*time.Millisecond), nil, members)
			if got := c.Share(policy, "hot"); got != tt.want {
				t.Errorf("Share = %v, want %v", got, tt.want)
			}
			if got := c.Share(policy, "cold"); got != 0.5 {
				t.Errorf("Share of another key = %v, want 1/2", got)
			}
			var saves []*Saved
			for at := now.Add(100 * time.Millisecond); at.Before(now.Add(3 * sc.Interval)); at = at.Add(50 * time.Millisecond) {
				if rd := c.Tick(at, nil, members); rd.Save != nil {
					saves = append(saves, rd.Save)
				}
			}
			if len(saves) < 2 || saves[0].Region != "eu" || saves[1].Epoch != saves[0].Epoch+1 {
				t.Errorf("saves over three intervals = %d, want one per epoch", len(saves))
			}
		})
	}
}

// TestCoreQuotaCounters: a global quota's spend is counted as a G-counter
// and reaches the other region through the reports.
func TestCoreQuotaCounters(t *testing.T) {
	sc := testShareConfig()
	const window = time.Hour
	members := []msg.Member{{Node: "eu-1", Region: "eu", State: msg.StateAlive}, {Node: "us-1", Region: "us", State: msg.StateAlive}}
	mk := func(region, node string) *Core {
		c, err := NewCore(CoreConfig{Share: sc, Region: region, Node: node,
			Limit: func(string) (float64, bool) { return limit, true },
			Quota: func(p string) (time.Duration, bool) { return window, p == "daily" }}, members)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	eu, us := mk("eu", "eu-1"), mk("us", "us-1")
	now := sc.EpochStart(1_000_000).Add(100 * time.Millisecond)
	for _, c := range []*Core{eu, us} {
		if err := c.Start(now, members, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	spend := map[engine.UsageKey]engine.Usage{{Subject: "acme", Policy: "daily"}: {Demand: 40, Admitted: 30}}
	for at := now; at.Before(now.Add(3 * sc.Interval)); at = at.Add(50 * time.Millisecond) {
		rd := eu.Tick(at, spend, members)
		spend = nil
		for _, r := range rd.Reports {
			if got := us.Step(at, msg.Message{Kind: msg.KindReport, From: "eu-1", Region: "eu", Report: r}); got.Dropped != "" {
				t.Fatalf("us dropped eu's report: %s", got.Dropped)
			}
		}
		us.Tick(at, nil, members)
	}
	w := share.WindowIndex(now, window)
	if got := us.QuotaOthers("daily", "acme", w); got != 30 {
		t.Errorf("us: QuotaOthers = %d, want eu's 30 admitted units", got)
	}
	if got := eu.QuotaOthers("daily", "acme", w); got != 0 {
		t.Errorf("eu: QuotaOthers = %d, want 0 (its own spend is in its engine)", got)
	}
	if q, ok := us.QuotaCounter("daily", "acme"); !ok || q.Get("eu") != 30 {
		t.Errorf("us's counter = %+v, %v", q, ok)
	}
	if stats := us.QuotaStats(); len(stats) != 1 || stats[0].Counters != 1 {
		t.Errorf("QuotaStats = %+v", stats)
	}
	if got := eu.Share("daily", "acme"); got != 0.5 {
		t.Errorf("a quota is never shared: Share = %v", got)
	}
}

// FuzzCoreStep feeds the core reports and loans with arbitrary figures
// and epochs: whatever it applies or drops, the share it enforces stays in
// [MinShare, 1] and its share vector in [0, 1] with a sum of at most
// 1 + 1e-9.
func FuzzCoreStep(f *testing.F) {
	f.Add(50.0, 50.0, 40.0, 0.1, int64(0))
	f.Add(math.NaN(), math.Inf(1), -1.0, 2.0, int64(-30))
	f.Add(1e308, 0.0, 1e-300, 0.5, int64(3))
	f.Fuzz(func(t *testing.T, offered, recent, demand, amount float64, de int64) {
		sc := testShareConfig()
		n := newCoreNet(t, sc, "eu-1", "us-1", "ap-1")
		n.rate = map[string]float64{"eu-1": 80, "us-1": 40}
		c := n.node("eu-1").core
		key := share.Key{Policy: policy, Subject: "hot"}
		check := func() {
			if s := c.Share(policy, "hot"); !(s >= share.MinShare && s <= 1) {
				t.Fatalf("Share = %v outside [MinShare, 1]", s)
			}
			sum := 0.0
			for _, v := range c.ShareVector(policy, "hot") {
				if !(v >= 0 && v <= 1) {
					t.Fatalf("share vector %v has a share outside [0, 1]", c.ShareVector(policy, "hot"))
				}
				sum += v
			}
			if sum > 1+1e-9 {
				t.Fatalf("share vector sums to %v", sum)
			}
		}
		for i := range 4 {
			n.run(n.now.Add(sc.Interval/2), 50*time.Millisecond, check)
			e := int64(sc.Epoch(n.now)) + de + int64(i)
			if e < 0 {
				e = 0
			}
			c.Step(n.now, msg.Message{Kind: msg.KindReport, From: "ap-1", Region: "ap", Report: share.Report{
				Version: share.ReportVersion, Region: "ap", Epoch: uint64(e) - 1,
				Keys: []share.KeyReport{{Key: key, Limit: limit, Offered: offered, Recent: recent, Demand: demand, Admitted: offered}}}})
			c.Step(n.now, msg.Message{Kind: msg.KindLoan, From: "ap-1", Region: "ap", Loan: share.Loan{
				Lender: "ap", Borrower: "eu", Epoch: c.b.gen, Key: key, Amount: amount, Seq: uint64(i)}})
			check()
			n.run(n.now.Add(sc.Interval/2), 50*time.Millisecond, check)
		}
	})
}

// TestCoreTakeoverAfterCrash scripts the end-to-end failover at the
// daemon's 1 s timings: three regions of two nodes, all traffic in r3, then
// r3's nodes crash (no leave; membership keeps them alive until it declares
// them dead) and the traffic moves to r1 and r2. The survivors must hold
// r3's share by the documented bound: K+1 intervals after r3's last report
// plus Settle and RaiseDelay, or RaiseDelay after membership declares r3
// dead if that comes first; Σ of the enforced shares never exceeds 1.
func TestCoreTakeoverAfterCrash(t *testing.T) {
	sc := testShareConfig()
	sc.Settle = 250 * time.Millisecond // region.ShareConfig(1 s)
	sc.RaiseDelay = 100 * time.Millisecond
	// Silence reclaims after K+1 missed reports a region whose nodes are
	// suspected, after 2K+2 one whose nodes still answer every probe.
	reclaim := time.Duration(sc.PartitionIntervals+1)*sc.Interval + sc.Settle + sc.RaiseDelay
	reclaimAlive := time.Duration(2*sc.PartitionIntervals+2)*sc.Interval + sc.Settle + sc.RaiseDelay
	for _, tt := range []struct {
		name    string
		delay   time.Duration // gossip delivery delay
		crash   time.Duration // into the interval: r3's report of the last one is sent at Settle/3
		suspect time.Duration // membership suspects r3's nodes this long after the crash
		detect  time.Duration // membership declares r3 dead this long after the crash
	}{
		{"crash at the boundary, slow detection", 20 * time.Millisecond, 0, 1500 * time.Millisecond, 8 * time.Second},
		{"crash after the report, slow detection", 20 * time.Millisecond, 200 * time.Millisecond, 1500 * time.Millisecond, 8 * time.Second},
		{"crash late in the interval, slow detection", 20 * time.Millisecond, 900 * time.Millisecond, 1500 * time.Millisecond, 8 * time.Second},
		{"slow gossip, slow detection", 140 * time.Millisecond, 500 * time.Millisecond, 1500 * time.Millisecond, 8 * time.Second},
		{"fast detection", 20 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second},
		{"slow gossip, fast detection", 140 * time.Millisecond, 0, time.Second, 1500 * time.Millisecond},
		{"never suspected, slower detection", 20 * time.Millisecond, 500 * time.Millisecond, 12 * time.Second, 12 * time.Second},
	} {
		for _, contact := range []bool{false, true} {
			name := tt.name + ", verdicts only"
			if contact {
				name = tt.name + ", pings"
			}
			t.Run(name, func(t *testing.T) {
				n := newCoreNetCollect(t, sc, 0, "r1-0", "r1-1", "r2-0", "r2-1", "r3-0", "r3-1")
				if !contact {
					n.contactEvery = 0
				}
				n.delay = tt.delay
				n.rate = map[string]float64{"r1-0": 70, "r1-1": 70, "r2-0": 20, "r2-1": 20, "r3-0": 10, "r3-1": 10}
				n.run(n.now.Add(8*sc.Interval), 10*time.Millisecond, nil)
				n.rate = map[string]float64{"r3-0": 100, "r3-1": 100}
				n.run(n.now.Truncate(sc.Interval).Add(7*sc.Interval+tt.crash), 10*time.Millisecond, nil)
				if r3 := n.shares("r3-0")[0]; r3 < 0.9 {
					t.Fatalf("before the crash r3 holds %.3f, want ≥ 0.9", r3)
				}
				crash := n.now
				n.node("r3-0").down, n.node("r3-1").down = true, true
				n.rate = map[string]float64{"r1-0": 50, "r1-1": 50, "r2-0": 50, "r2-1": 50}
				var took time.Duration
				n.run(crash.Add(reclaimAlive+2*sc.Interval), 10*time.Millisecond, func() {
					since := n.now.Sub(crash)
					switch {
					case since >= tt.detect:
						n.node("r3-0").state, n.node("r3-1").state = msg.StateDead, msg.StateDead
					case since >= tt.suspect:
						n.node("r3-0").state, n.node("r3-1").state = msg.StateSuspect, msg.StateSuspect
					}
					s := n.shares("r1-0", "r1-1", "r2-0", "r2-1")
					if total := max(s[0], s[1]) + max(s[2], s[3]); total > 1+1e-9 {
						t.Fatalf("%v after the crash: Σ enforced shares = %v", since, total)
					}
					if took == 0 && s[0]+s[2] > 0.9 && s[1]+s[3] > 0.9 {
						took = since
					}
				})
				silent := reclaim
				if tt.suspect >= time.Duration(sc.PartitionIntervals+1)*sc.Interval {
					silent = reclaimAlive
				}
				hold := n.node("r1-0").core.Hold()
				bound := min(silent, tt.detect+hold) + 20*time.Millisecond // two ticks
				if contact {
					// The last answered ping was at most a ping period before the crash.
					bound = hold + 20*time.Millisecond
				}
				if !contact && silent == reclaimAlive && took != 0 && took < reclaim+sc.Interval {
					t.Errorf("r1+r2 took the share of a region answering every probe %v after its crash, before 2K+2 missed reports", took)
				}
				if took == 0 || took > bound {
					t.Errorf("r1+r2 hold r3's share %v after the crash (0: never), want within %v (r1, r2 at %.3f)",
						took, bound, n.shares("r1-0", "r2-0"))
				}
			})
		}
	}
}

// TestCoreRepeatsReportsAfterLoss: a region sends each report twice for K
// epochs after it starts and for K epochs after a report of a region
// membership sees live went missing, and once otherwise; the receiver
// files the copies as one report.
func TestCoreRepeatsReportsAfterLoss(t *testing.T) {
	sc := testShareConfig()
	k := uint64(sc.PartitionIntervals)
	n := newCoreNet(t, sc, "eu-1", "us-1", "ap-1")
	n.rate = map[string]float64{"eu-1": 60, "us-1": 30, "ap-1": 10}
	start := sc.Epoch(n.now)
	copies := func(from, to int) map[uint64]int { // eu's reports per epoch in n.log[from:to]
		out := map[uint64]int{}
		for _, rd := range n.log[from:to] {
			for _, r := range rd.Reports {
				if r.Region == "eu" {
					out[r.Epoch]++
				}
			}
		}
		return out
	}
	n.run(sc.EpochStart(start+k+4), 10*time.Millisecond, nil)
	got := copies(0, len(n.log))
	for e := start; e < start+k+3; e++ {
		want := 1
		if e <= start+k {
			want = 2
		}
		if got[e] != want {
			t.Errorf("eu sent %d copies of its report of epoch %d (start %d), want %d", got[e], e, start, want)
		}
	}
	if rs := n.node("us-1").core.reports[start+k+2]; len(rs) != 2 {
		t.Errorf("us filed %d reports of epoch %d, want 2 (one per other region)", len(rs), start+k+2)
	}

	// us's report of one epoch never reaches eu: eu repeats its own for K
	// epochs after that rebalance.
	lost := sc.Epoch(n.now) // reported in the next interval
	seen := len(n.log)
	n.run(sc.EpochStart(lost+k+4), 10*time.Millisecond, func() {
		keep := n.inFlite[:0]
		for _, f := range n.inFlite {
			if f.msg.Kind == msg.KindReport && f.msg.Report.Region == "us" && f.msg.Report.Epoch == lost && f.to.region == "eu" {
				continue
			}
			keep = append(keep, f)
		}
		n.inFlite = keep
	})
	got = copies(seen, len(n.log))
	for e := lost; e < lost+k+3; e++ {
		want := 1
		if e > lost && e <= lost+k {
			want = 2
		}
		if got[e] != want {
			t.Errorf("after us's report of epoch %d was lost: eu sent %d copies of its report of epoch %d, want %d", lost, got[e], e, want)
		}
	}
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
