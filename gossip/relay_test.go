package gossip

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/sluice-rl/sluice/gossip/gossiptest"
	"github.com/sluice-rl/sluice/internal/testwait"
	"github.com/sluice-rl/sluice/share"
)

// TestRelayedIsDirect: what a relay sends on is byte for byte what the
// sender would have sent each node directly, and a relayed message
// decodes as the direct one does.
func TestRelayedIsDirect(t *testing.T) {
	for _, payload := range []any{testReport("eu", 100, 3), testBorrow("eu"), testLoan("eu", "us")} {
		direct, relayed, err := encode("eu1", "eu", payload, true)
		if err != nil {
			t.Fatal(err)
		}
		dm, denv, err := decode(direct, 0)
		if err != nil || denv.Relay {
			t.Fatalf("decode(direct %T) = relay %v, %v", payload, denv.Relay, err)
		}
		rm, renv, err := decode(relayed, 0)
		if err != nil || !renv.Relay {
			t.Fatalf("decode(relayed %T) = relay %v, %v", payload, renv.Relay, err)
		}
		rm.Size = dm.Size
		if fmt.Sprint(rm) != fmt.Sprint(dm) {
			t.Errorf("relayed %T decodes as %+v, want %+v", payload, rm, dm)
		}
		out, err := unrelayed(renv)
		if err != nil || !bytes.Equal(out, direct) {
			t.Errorf("unrelayed(%T) = %x, %v; want the direct form %x", payload, out, err, direct)
		}
	}
}

func counterValue(v *prometheus.CounterVec, labels ...string) float64 {
	var m dto.Metric
	if err := v.WithLabelValues(labels...).Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// oldBuild makes n advertise no relaying, as a node of an older build.
func oldBuild(n *Node) { readvertise(n, func(m *nodeMeta) { m.Relays = false }) }

// readvertise changes what n advertises in its metadata and announces it.
func readvertise(n *Node, edit func(*nodeMeta)) {
	edit(&n.metaFields)
	meta, err := marshal(n.metaFields)
	if err != nil {
		panic(err)
	}
	n.meta.Store(&meta)
	if err := n.ml.UpdateNode(time.Second); err != nil {
		panic(err)
	}
}

func waitLive(t *testing.T, nodes []*testNode) {
	t.Helper()
	testwait.For(t, 60*time.Second, fmt.Sprintf("%d nodes to see each other", len(nodes)), func() bool {
		for _, n := range nodes {
			if n.NumLive() != len(nodes) {
				return false
			}
		}
		return true
	})
}

func waitReport(t *testing.T, nodes []*testNode, region string, epoch uint64) {
	t.Helper()
	for _, n := range nodes {
		testwait.For(t, 30*time.Second, fmt.Sprintf("%s to receive %s's report %d", n.Name(), region, epoch), func() bool {
			_, ok := n.in.findReport(region, epoch)
			return ok
		})
	}
}

// TestReportThroughRelay: a report goes once to the other region, to its
// relay (its smallest node), which sends it on to the region's other
// nodes; when the relay dies without a word, the next report falls back
// to the next node at once, counted in sluice_gossip_relay_changes_total.
// A region with a node of an older build (no relaying advertised) is sent
// to node by node.
func TestReportThroughRelay(t *testing.T) {
	t.Parallel()
	us1 := startNode(t, "us1", "us", keyA)
	eu1 := startNode(t, "eu1", "eu", keyA, us1.Addr())
	eu2 := startNode(t, "eu2", "eu", keyA, us1.Addr())
	eu3 := startNode(t, "eu3", "eu", keyA, us1.Addr())
	waitLive(t, []*testNode{us1, eu1, eu2, eu3})
	ctx := context.Background()
	if err := us1.BroadcastReport(ctx, testReport("us", 100, 2)); err != nil {
		t.Fatal(err)
	}
	waitReport(t, []*testNode{eu1, eu2, eu3}, "us", 100)
	if got := counterValue(us1.metrics.sent, "report", pathReliable); got != 1 {
		t.Errorf("us1 sent its report %v times, want once, to eu's relay", got)
	}
	testwait.For(t, 30*time.Second, "eu1 to send the report on to eu2 and eu3", func() bool {
		return counterValue(eu1.metrics.sent, "report", pathRelay) == 2
	})

	eu1.Shutdown() // dies: eu1 is alive in us1's membership for a while yet
	if err := us1.BroadcastReport(ctx, testReport("us", 101, 2)); err != nil {
		t.Fatalf("BroadcastReport with a dead relay = %v, want the next node to take it", err)
	}
	waitReport(t, []*testNode{eu2, eu3}, "us", 101)
	if got := counterValue(us1.metrics.relayChanges, "eu"); got != 1 {
		t.Errorf("sluice_gossip_relay_changes_total{region=eu} = %v, want 1", got)
	}

	ap1 := startNode(t, "ap1", "ap", keyA, us1.Addr())
	ap2 := startNodeWith(t, "ap2", "ap", keyA, []string{us1.Addr()}, nil, oldBuild)
	testwait.For(t, 60*time.Second, "us1, ap1 and ap2 to see ap1 and ap2", func() bool {
		for _, n := range []*testNode{us1, ap1, ap2} {
			if !slices.Equal(n.Regions()["ap"], []string{"ap1", "ap2"}) {
				return false
			}
		}
		return true
	})
	before := counterValue(us1.metrics.sent, "report", pathReliable)
	if err := us1.BroadcastReport(ctx, testReport("us", 102, 2)); err != nil {
		t.Fatal(err)
	}
	waitReport(t, []*testNode{ap1, ap2}, "us", 102)
	// eu2 (the relay now, eu1 dead or suspected) once, ap1 and ap2 each.
	if got := counterValue(us1.metrics.sent, "report", pathReliable) - before; got != 3 {
		t.Errorf("us1 sent report 102 %v times, want 3: once to eu, node by node to ap", got)
	}
	if got := counterValue(ap1.metrics.sent, "report", pathRelay); got != 0 {
		t.Errorf("ap1 sent on %v reports sent to it directly, want 0", got)
	}
}

// TestGossipTrafficLive measures, on real memberlist nodes on loopback,
// what the busiest node of 3 regions × 2 and × 4 nodes sends: each round
// (an interval), each region's publisher sends a 50-key report and every
// node its usage of 5 keys to its region, counted in bytes per round from
// sluice_gossip_sent_total and sluice_gossip_sent_bytes_total; the pings
// run every 50 ms, counted per second from
// sluice_gossip_contact_pings_total. It asserts only that each region's
// last report reaches every node of the other regions (sent again, as
// the next interval would, if a loaded machine lost it: waitCurrentReport
// logs why): wall-clock figures are measurements, printed with -v (make
// gossip-traffic).
func TestGossipTrafficLive(t *testing.T) {
	for _, nodes := range []int{2, 4} {
		cross, relayed, lan, pings := liveTraffic(t, nodes)
		t.Logf("3×%d: busiest node sends %.0f B/round of reports to other regions, relays %.0f B/round and sends %.0f B/round of node usage in its region; %.1f pings/s",
			nodes, cross, relayed, lan, pings)
	}
}

// waitCurrentReport waits until every node of others holds pub's report
// of epoch or a later one. A report the region's other nodes miss is
// replaced by the next interval's in a daemon; here the last round has no
// next, so pub sends the next epoch's every 5 s, as its next interval
// would (the same epoch again would not do: the relay, having delivered
// it once, does not send it on again), and each resend is logged with the
// missing nodes' drop counts: the figures then include it, and the log
// says why it was needed.
func waitCurrentReport(t *testing.T, pub *testNode, others []*testNode, epoch uint64) {
	t.Helper()
	last, sent := time.Now(), epoch
	testwait.For(t, 90*time.Second, fmt.Sprintf("every node of the other regions to hold %s's report %d or a later one", pub.Region(), epoch), func() bool {
		var missing []string
		for _, n := range others {
			if !n.in.hasReportSince(pub.Region(), epoch) {
				missing = append(missing, fmt.Sprintf("%s (dropped: sender %v, queue_full %v, relay_full %v, epoch %v)", n.Name(),
					dropped(n, ReasonSender), dropped(n, ReasonQueueFull), dropped(n, ReasonRelayFull), dropped(n, ReasonEpoch)))
			}
		}
		if len(missing) == 0 {
			return true
		}
		if time.Since(last) > 5*time.Second {
			last = time.Now()
			sent++
			t.Logf("%s sends its next report, %d: %d missing at %v", pub.Name(), sent, epoch, missing)
			if err := pub.BroadcastReport(context.Background(), testReport(pub.Region(), sent, 50)); err != nil {
				t.Logf("resend: %v", err)
			}
		}
		return false
	})
}

func liveTraffic(t *testing.T, nodes int) (cross, relayed, lan, pings float64) {
	t.Helper()
	var all []*testNode
	regions := []string{"eu", "us", "ap"}
	config := func(c *Config) { c.ContactEvery, c.ClockTolerance = 50*time.Millisecond, 1000*time.Hour }
	for _, r := range regions {
		for i := range nodes {
			var join []string
			if len(all) > 0 {
				join = []string{all[0].Addr()}
			}
			all = append(all, startNodeWith(t, fmt.Sprintf("%s-%d", r, i), r, keyA, join, config, nil))
		}
	}
	waitLive(t, all)
	ctx := context.Background()
	const rounds = 10
	pingsAt := func(n *testNode) float64 {
		return counterValue(n.metrics.pings, "answered") + counterValue(n.metrics.pings, "unanswered")
	}
	pings0 := map[string]float64{}
	for _, n := range all {
		pings0[n.Name()] = pingsAt(n)
	}
	start := time.Now()
	for round := range uint64(rounds) {
		for i, n := range all {
			if i%nodes == 0 {
				if err := n.BroadcastReport(ctx, testReport(n.Region(), 100+round, 50)); err != nil {
					t.Fatal(err)
				}
			}
			u := NodeUsage{Epoch: 100 + round}
			for k := range 5 {
				u.Keys = append(u.Keys, KeyUsage{Key: share.Key{Policy: "policy-10", Subject: fmt.Sprintf("subject-%014d", k)}, Limit: 100, Offered: 1})
			}
			// Node usage is best effort (the next round's replaces it), and
			// a loaded machine can time out a dial: the test asserts only
			// that the reports arrive.
			if err := n.SendNodeUsage(ctx, u); err != nil {
				t.Logf("round %d: %v", round, err)
			}
		}
		time.Sleep(100 * time.Millisecond) // pacing of the load, not a wait for a condition
	}
	for i, r := range regions {
		var others []*testNode
		for _, n := range all {
			if n.Region() != r {
				others = append(others, n)
			}
		}
		waitCurrentReport(t, all[i*nodes], others, 100+rounds-1)
	}
	secs := time.Since(start).Seconds()
	size := float64(len(must(Encode("eu-0", "eu", testReport("eu", 100, 50)))))
	for _, n := range all {
		m := n.metrics
		cross = max(cross, counterValue(m.sent, "report", pathReliable)*size/rounds)
		relayed = max(relayed, counterValue(m.sent, "report", pathRelay)*size/rounds)
		lan = max(lan, counterValue(m.sentBytes, "node_usage")/rounds)
		pings = max(pings, (pingsAt(n)-pings0[n.Name()])/secs)
	}
	for _, n := range all {
		n.close()
	}
	return cross, relayed, lan, pings
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// TestRelayRetriesFailedForward: when the relay's send on to a node of its
// region fails (a dial refused once, as one timing out on a loaded host),
// the relay sends it again, so that node still gets the round's report;
// the failed send is counted in sluice_gossip_send_errors_total.
func TestRelayRetriesFailedForward(t *testing.T) {
	t.Parallel()
	fn := gossiptest.NewFaultNet(1)
	us, _ := startFaultNode(t, fn, "us1", "us")
	eu1, _ := startFaultNode(t, fn, "eu1", "eu", us.Addr())
	eu2, eu2In := startFaultNode(t, fn, "eu2", "eu", us.Addr())
	testwait.For(t, 30*time.Second, "the three nodes to see each other", func() bool {
		return us.NumLive() == 3 && eu1.NumLive() == 3 && eu2.NumLive() == 3
	})
	fn.RefuseDials(eu2.Addr(), 1)
	if err := us.BroadcastReport(context.Background(), testReport("us", 100, 2)); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 30*time.Second, "eu2 to receive us's report 100 through eu1", func() bool {
		_, ok := eu2In.findReport("us", 100)
		return ok
	})
	if got := fn.Counts().RefusedDials; got != 1 {
		t.Errorf("the fault net refused %d dials, want 1", got)
	}
	if got := counterValue(eu1.metrics.sendErrors, "report"); got != 1 {
		t.Errorf("eu1's sluice_gossip_send_errors_total{kind=report} = %v, want 1: the refused forward", got)
	}
}
