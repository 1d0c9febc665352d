package gossip

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluice-rl/sluice/gossip/gossiptest"
	"github.com/sluice-rl/sluice/internal/testwait"
)

// TestPingBook walks the bookkeeping of contact pings on a clock moved by
// hand: an answer within the timeout is timely, one after it late (the
// ping was given up once, and counts as contact still), one after keep is
// stale, and an answer from another node than the one pinged is not
// taken.
func TestPingBook(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	b := newPingBook(200*time.Millisecond, time.Second)
	timely := b.send("us-1", at(0), at(0))
	late := b.send("us-2", at(10), at(10))
	stale := b.send("ap-1", at(20), at(20))
	wrong := b.send("ap-2", at(30), at(30))

	if got := b.expire(at(150)); len(got) != 0 {
		t.Errorf("expire before the timeout gave up %v, want none", got)
	}
	if p, ok := b.answer("us-1", timely); !ok || p.givenUp || !p.sent.Equal(at(0)) {
		t.Errorf("answer(us-1) within the timeout = %+v, %v; want its ping, not given up", p, ok)
	}
	if _, ok := b.answer("us-1", timely); ok {
		t.Error("a second answer to the same ping was taken")
	}
	if _, ok := b.answer("ap-1", wrong); ok {
		t.Error("ap-1's answer to the ping sent to ap-2 was taken")
	}
	givenUp := b.expire(at(240))
	var nodes []string
	for _, p := range givenUp {
		nodes = append(nodes, p.node)
	}
	slices.Sort(nodes)
	if want := []string{"ap-1", "ap-2", "us-2"}; !slices.Equal(nodes, want) {
		t.Errorf("expire after the timeout gave up %v, want %v", nodes, want)
	}
	if got := b.expire(at(500)); len(got) != 0 {
		t.Errorf("a second expire gave up %d pings again", len(got))
	}
	if p, ok := b.answer("us-2", late); !ok || !p.givenUp || !p.sent.Equal(at(10)) {
		t.Errorf("answer(us-2) after the timeout = %+v, %v; want its ping, given up (late)", p, ok)
	}
	b.expire(at(1030))
	if _, ok := b.answer("ap-1", stale); ok {
		t.Error("an answer after keep was taken")
	}
	if len(b.pending) != 0 {
		t.Errorf("%d pings still kept after keep, want none", len(b.pending))
	}
	seq := b.send("us-1", at(2000), at(2000))
	b.forget(seq)
	if _, ok := b.answer("us-1", seq); ok {
		t.Error("an answer to a forgotten ping was taken")
	}
}

// TestUnconfirmed: a node is confirmed once a seed has answered (or,
// without seeds, another node is known) and every live node of another
// region that watches it and pings with pings of its own has pinged it.
func TestUnconfirmed(t *testing.T) {
	m := func(node, region string, state State) Member { return Member{Node: node, Region: region, State: state} }
	cluster := []Member{m("eu-1", "eu", StateAlive), m("eu-2", "eu", StateAlive), m("us-1", "us", StateAlive),
		m("us-2", "us", StateAlive), m("ap-1", "ap", StateAlive)}
	all := map[string]bool{"eu-1": true, "eu-2": true, "us-1": true, "us-2": true, "ap-1": true}
	tests := []struct {
		name         string
		members      []Member
		pings        map[string]bool
		pingedBy     map[string]bool
		answered     bool
		seeded       bool
		joined       bool
		wantWaiting  []string
		wantNotReady bool
	}{
		{"no seed answered yet", cluster, all, nil, false, true, false, nil, true},
		{"seedless and alone", cluster[:1], all, nil, true, false, false, nil, true},
		{"seedless, found by the others", cluster, all, nil, true, false, true, []string{"ap-1", "us-1", "us-2"}, true},
		{"joined, pinged by one region", cluster, all, map[string]bool{"us-1": true, "us-2": true}, true, true, true, []string{"ap-1"}, true},
		{"joined, pinged by every watcher", cluster, all, map[string]bool{"us-1": true, "us-2": true, "ap-1": true}, true, true, true, nil, false},
		{"an older build's pings cannot be seen", cluster, map[string]bool{"us-1": true, "us-2": true}, map[string]bool{"us-1": true, "us-2": true}, true, true, true, nil, false},
		{"a suspect or dead watcher is not waited for", []Member{m("eu-1", "eu", StateAlive), m("us-1", "us", StateSuspect), m("ap-1", "ap", StateDead)}, all, nil, true, true, true, nil, false},
		{"own region's nodes never ping", cluster[:2], all, nil, true, true, true, nil, false},
		// Four nodes in eu: us-1 watches eu-1 and eu-2, us-2 eu-2 and eu-3
		// (coordinator.PingTargets), so eu-1 waits for us-1 alone.
		{"only the nodes that watch it are waited for", []Member{m("eu-1", "eu", StateAlive), m("eu-2", "eu", StateAlive), m("eu-3", "eu", StateAlive),
			m("eu-4", "eu", StateAlive), m("us-1", "us", StateAlive), m("us-2", "us", StateAlive)}, all, map[string]bool{"us-1": true}, true, true, true, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			joined, waiting := unconfirmed(tt.members, tt.pings, tt.pingedBy, "eu-1", "eu", tt.answered, tt.seeded)
			if joined != tt.joined || !slices.Equal(waiting, tt.wantWaiting) {
				t.Errorf("unconfirmed = %v, %v; want %v, %v", joined, waiting, tt.joined, tt.wantWaiting)
			}
			if notReady := !joined || len(waiting) > 0; notReady != tt.wantNotReady {
				t.Errorf("not ready = %v, want %v", notReady, tt.wantNotReady)
			}
		})
	}
}

// TestLateAnswersKeepContact: between regions whose packets all come late
// (every answer after the probe timeout, as from a region starved of
// CPU), a node that answers the contact pings of its own stays in contact,
// its pings given up and then answered late, while a node of an older
// build, pinged through memberlist's Ping, which drops a late answer,
// falls out of contact. Partitioned, neither answers at all.
//
// On real time, as TestFaultNetPartitionLossDelay, for the same reason.
// The packet delay is 150 ms each way against a 60 ms probe timeout, so
// no answer of either kind can come in time; the freshness thresholds are
// waits with a 15 s deadline, not bounds.
func TestLateAnswersKeepContact(t *testing.T) {
	t.Parallel()
	fn := gossiptest.NewFaultNet(3)
	fn.Detect = 600 * time.Millisecond
	start := func(name, region string, config func(*Node), join ...string) *Node {
		n, err := New(Config{Node: name, Region: region, BindAddr: "127.0.0.1", SecretKey: keyA, Preset: PresetLocal,
			Join: join, Registerer: prometheus.NewRegistry(), LeaveTimeout: 500 * time.Millisecond,
			Logger: testLogger(name), ContactEvery: 20 * time.Millisecond, Memberlist: fn.Attach(region)})
		if err != nil {
			t.Fatalf("New(%s) = %v", name, err)
		}
		if config != nil {
			config(n)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = n.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		return n
	}
	eu := start("eu-1", "eu", nil)
	us := start("us-1", "us", nil, eu.Addr())
	start("ap-1", "ap", noOwnPings, eu.Addr())
	contact := func(n *Node, name string) time.Time {
		m, _ := memberState(n, name)
		return m.Contact
	}
	testwait.For(t, 15*time.Second, "contact with both", func() bool {
		return time.Since(contact(eu, "us-1")) < 200*time.Millisecond && time.Since(contact(eu, "ap-1")) < 200*time.Millisecond
	})
	if _, waiting := us.Unconfirmed(); slices.Contains(waiting, "eu-1") {
		t.Errorf("us-1 still waits for eu-1's first ping after eu-1 had contact with it: %v", waiting)
	}

	const delay = 150 * time.Millisecond // each way; the probe timeout is fn.Detect/10 = 60 ms
	fn.SetSlowPackets(delay)
	slow := time.Now()
	late := func() float64 { return counterValue(eu.metrics.pings, pingLate) }
	testwait.For(t, 15*time.Second, "late answers from us-1 to count as contact", func() bool {
		return late() > 0 && contact(eu, "us-1").After(slow)
	})
	testwait.For(t, 15*time.Second, "the older build's contact to go stale", func() bool {
		return time.Since(contact(eu, "ap-1")) > time.Second
	})
	if got := contact(eu, "ap-1"); got.After(slow.Add(time.Millisecond)) {
		t.Errorf("contact with ap-1 (memberlist's Ping) = %v, after the packets slowed at %v: a late answer counted", got, slow)
	}
	if got := time.Since(contact(eu, "us-1")); got > time.Second {
		t.Errorf("contact with us-1 is %v old while it answers late, want it kept fresh", got)
	}
	if m, _ := memberState(eu, "us-1"); !m.Unanswered.After(slow) {
		t.Errorf("us-1's Unanswered = %v, want a ping given up after %v (every answer comes after the timeout)", m.Unanswered, slow)
	}

	fn.Partition([]string{"us"}, []string{"eu", "us", "ap"})
	cut := time.Now().Add(-delay) // an answer in flight at the cut may still land
	testwait.For(t, 15*time.Second, "contact with us-1 to go stale once cut off", func() bool {
		return time.Since(contact(eu, "us-1")) > time.Second
	})
	if got := contact(eu, "us-1"); got.After(cut) {
		t.Errorf("contact with us-1 = %v, after the cut at %v", got, cut)
	}
}

// TestPingFromUnknownNodeAnswered: a node answers a contact ping from a
// node it does not know (restarted, its membership still partial) at the
// address the ping gives, so the pinger keeps contact with it.
func TestPingFromUnknownNodeAnswered(t *testing.T) {
	t.Parallel()
	eu := startNode(t, "u-eu", "eu", keyA)
	us := startNode(t, "u-us", "us", keyA) // joins no one: neither knows the other
	us.sendPing(member{Member: Member{Node: "u-eu", Region: "eu", Addr: eu.Addr()}})
	testwait.For(t, 15*time.Second, "u-eu's answer to a ping from a node it does not know", func() bool {
		us.mu.Lock()
		defer us.mu.Unlock()
		return !us.contact["u-eu"].IsZero()
	})
	if _, known := memberState(eu.Node, "u-us"); known {
		t.Fatal("u-eu knows u-us: the test needs a pinger it does not know")
	}
}

// noOwnPings makes n advertise no contact pings of its own, as a node of
// an older build: the others ping it through memberlist's Ping.
func noOwnPings(n *Node) { readvertise(n, func(m *nodeMeta) { m.Pings = false }) }
