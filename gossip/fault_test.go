package gossip

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluice-rl/sluice/gossip/gossiptest"
	"github.com/sluice-rl/sluice/internal/testwait"
	"github.com/sluice-rl/sluice/share"
)

// startFaultNode is startNode on a FaultNet: a node of region sending
// through fn.
func startFaultNode(t *testing.T, fn *gossiptest.FaultNet, name, region string, join ...string) (*Node, *inbox) {
	t.Helper()
	return runInboxNode(t, Config{Node: name, Region: region, Join: join, Now: testNow, Memberlist: fn.Attach(region)}, nil)
}

// runInboxNode makes a node of cfg with the tests' key, preset, registry
// and logger, records the reports it receives, and runs it until the test
// ends, calling beforeStop (if set) first.
func runInboxNode(t *testing.T, cfg Config, beforeStop func()) (*Node, *inbox) {
	t.Helper()
	cfg.BindAddr, cfg.SecretKey, cfg.Preset = "127.0.0.1", keyA, PresetLocal
	cfg.Registerer, cfg.LeaveTimeout, cfg.Logger = prometheus.NewRegistry(), 500*time.Millisecond, testLogger(cfg.Node)
	n, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%s) = %v", cfg.Node, err)
	}
	in := &inbox{}
	n.OnReport(func(r share.Report) { in.mu.Lock(); in.reports = append(in.reports, r); in.mu.Unlock() })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = n.Run(ctx) }()
	t.Cleanup(func() {
		if beforeStop != nil {
			beforeStop()
		}
		cancel()
		<-done
	})
	return n, in
}

func live(n *Node, name string) bool {
	m, ok := memberState(n, name)
	return ok && m.State.Live()
}

// TestFaultNetPartitionLossDelay drives two regions through a FaultNet: a
// partition makes membership declare the other side dead and stops
// reports, healing brings both back, a lost report never arrives, and a
// delayed one arrives no sooner than its delay.
//
// It runs on real time, on memberlist's sockets on loopback through the
// FaultNet (which a testing/synctest bubble cannot hold: a goroutine in a
// read from the network is not durably blocked), to test the FaultNet's
// loss and delay as well. Its partition and healing are tested on virtual
// time over an in-memory transport by TestPartitionMembershipVirtual, and
// the rules contact and membership time in the coordinator's scripted
// cores. Every wait here is for a condition, with a deadline of 10 to 15 s,
// 16 to 25 times Detect, which a loaded machine only delays; the one bound
// is the delayed send's, which must return before its 300 ms delay: a
// buffered write that takes microseconds.
func TestFaultNetPartitionLossDelay(t *testing.T) {
	t.Parallel()
	fn := gossiptest.NewFaultNet(1)
	fn.Detect = 600 * time.Millisecond
	eu, _ := startFaultNode(t, fn, "eu-1", "eu")
	us, usIn := startFaultNode(t, fn, "us-1", "us", eu.Addr())
	regions := []string{"eu", "us"}
	testwait.For(t, 10*time.Second, "the two nodes to see each other", func() bool { return live(eu, "us-1") && live(us, "eu-1") })
	ctx := context.Background()

	fn.Partition([]string{"us"}, regions)
	testwait.For(t, 10*time.Second, "each side to declare the other dead", func() bool { return !live(eu, "us-1") && !live(us, "eu-1") })
	if c := fn.Counts(); c.CutPackets == 0 {
		t.Errorf("Counts() = %+v during a partition, want packets cut", c)
	}

	fn.Heal()
	testwait.For(t, 15*time.Second, "the partition to heal", func() bool { return live(eu, "us-1") && live(us, "eu-1") })

	fn.SetLoss(1)
	if err := eu.BroadcastReport(ctx, testReport("eu", 100, 1)); err != nil {
		t.Fatalf("BroadcastReport with loss = %v, want the send accepted", err)
	}
	if c := fn.Counts(); c.LostStreams == 0 {
		t.Errorf("Counts() = %+v after a send at loss 1, want a lost stream", c)
	}
	fn.SetLoss(0)
	const delay = 300 * time.Millisecond
	fn.SetDelay(delay, 0)
	sent := time.Now()
	if err := eu.BroadcastReport(ctx, testReport("eu", 101, 1)); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(sent); d >= delay {
		t.Errorf("BroadcastReport took %v at a %v delay, want it not to wait for delivery", d, delay)
	}
	testwait.For(t, 10*time.Second, "the delayed report", func() bool { _, ok := usIn.findReport("eu", 101); return ok })
	if d := time.Since(sent); d < delay {
		t.Errorf("delayed report arrived after %v, want at least %v", d, delay)
	}
	if _, ok := usIn.findReport("eu", 100); ok {
		t.Error("the report sent at loss 1 arrived")
	}
}

// TestContactFollowsReachability: every node pings the nodes of the other
// regions and reports the send time of the last answered ping as
// Member.Contact; a partition stops it advancing (the last answered ping
// was sent before the cut), healing starts it again, and a node of the
// same region is never pinged.
//
// On real time, as TestFaultNetPartitionLossDelay, for the same reason;
// TestContactFollowsReachabilityVirtual is the same protocol on virtual
// time, with ContactLag as its bounds. Here the freshness thresholds are
// waits with a 10 s deadline, not bounds: a
// contact fresher than 200 ms (ten ping periods, three probe timeouts)
// has 10 s to appear, and one staler than 300 ms after the cut
// only grows staler; what is asserted, a contact stamped before the cut
// and none with a node of the same region, does not depend on timing.
func TestContactFollowsReachability(t *testing.T) {
	t.Parallel()
	fn := gossiptest.NewFaultNet(2)
	fn.Detect = 600 * time.Millisecond
	start := func(name, region string, join ...string) *Node {
		n, err := New(Config{Node: name, Region: region, BindAddr: "127.0.0.1", SecretKey: keyA, Preset: PresetLocal,
			Join: join, Registerer: prometheus.NewRegistry(), LeaveTimeout: 500 * time.Millisecond,
			Logger: testLogger(name), ContactEvery: 20 * time.Millisecond, Memberlist: fn.Attach(region)})
		if err != nil {
			t.Fatalf("New(%s) = %v", name, err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = n.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		return n
	}
	eu := start("eu-1", "eu")
	eu2 := start("eu-2", "eu", eu.Addr())
	us := start("us-1", "us", eu.Addr())
	if got, want := eu.ContactLag(), 20*time.Millisecond+fn.Detect/10; got != want {
		t.Errorf("ContactLag() = %v, want the ping period plus the probe timeout, %v", got, want)
	}
	contact := func(n *Node, name string) time.Time {
		m, _ := memberState(n, name)
		return m.Contact
	}
	testwait.For(t, 10*time.Second, "contact both ways", func() bool {
		return time.Since(contact(eu, "us-1")) < 200*time.Millisecond && time.Since(contact(us, "eu-1")) < 200*time.Millisecond &&
			time.Since(contact(us, "eu-2")) < 200*time.Millisecond && live(eu, "eu-2")
	})

	fn.Partition([]string{"us"}, []string{"eu", "us"})
	cut := time.Now() // a ping stamped before this and answered was sent before the cut
	testwait.For(t, 10*time.Second, "contact to go stale on both sides", func() bool {
		return time.Since(contact(eu, "us-1")) > 300*time.Millisecond && time.Since(contact(us, "eu-1")) > 300*time.Millisecond
	})
	for _, c := range []struct {
		n    *Node
		peer string
	}{{eu, "us-1"}, {us, "eu-1"}, {us, "eu-2"}} {
		if got := contact(c.n, c.peer); !got.Before(cut) {
			t.Errorf("%s's contact with %s = %v, want before the cut at %v", c.n.Name(), c.peer, got, cut)
		}
	}

	healed := time.Now()
	fn.Heal()
	testwait.For(t, 10*time.Second, "contact after healing", func() bool {
		return contact(eu, "us-1").After(healed) && contact(us, "eu-1").After(healed)
	})
	if got := contact(eu, "eu-2"); !got.IsZero() {
		t.Errorf("eu-1's contact with eu-2, of its own region, = %v, want zero (never pinged)", got)
	}
	if got := contact(eu2, "eu-1"); !got.IsZero() {
		t.Errorf("eu-2's contact with eu-1, of its own region, = %v, want zero (never pinged)", got)
	}
}
