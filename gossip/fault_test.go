package gossip

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluice-rl/sluice/share"
)

// startFaultNode is startNode on a FaultNet: a node of region sending
// through fn.
func startFaultNode(t *testing.T, fn *FaultNet, name, region string, join ...string) (*Node, *inbox) {
	t.Helper()
	n, err := New(Config{Node: name, Region: region, BindAddr: "127.0.0.1", SecretKey: keyA, Preset: PresetLocal,
		Join: join, Registerer: prometheus.NewRegistry(), LeaveTimeout: 500 * time.Millisecond,
		Logger: testLogger(name), Now: testNow, Faults: fn})
	if err != nil {
		t.Fatalf("New(%s) = %v", name, err)
	}
	in := &inbox{}
	n.OnReport(func(r share.Report) { in.mu.Lock(); in.reports = append(in.reports, r); in.mu.Unlock() })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = n.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
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
func TestFaultNetPartitionLossDelay(t *testing.T) {
	t.Parallel()
	fn := NewFaultNet(1)
	fn.Detect = 600 * time.Millisecond
	eu, _ := startFaultNode(t, fn, "eu-1", "eu")
	us, usIn := startFaultNode(t, fn, "us-1", "us", eu.Addr())
	regions := []string{"eu", "us"}
	waitFor(t, 10*time.Second, "the two nodes to see each other", func() bool { return live(eu, "us-1") && live(us, "eu-1") })
	ctx := context.Background()

	fn.Partition([]string{"us"}, regions)
	waitFor(t, 10*time.Second, "each side to declare the other dead", func() bool { return !live(eu, "us-1") && !live(us, "eu-1") })
	if c := fn.Counts(); c.CutPackets == 0 {
		t.Errorf("Counts() = %+v during a partition, want packets cut", c)
	}

	fn.Heal()
	waitFor(t, 15*time.Second, "the partition to heal", func() bool { return live(eu, "us-1") && live(us, "eu-1") })

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
	waitFor(t, 10*time.Second, "the delayed report", func() bool { _, ok := usIn.findReport("eu", 101); return ok })
	if d := time.Since(sent); d < delay {
		t.Errorf("delayed report arrived after %v, want at least %v", d, delay)
	}
	if _, ok := usIn.findReport("eu", 100); ok {
		t.Error("the report sent at loss 1 arrived")
	}
}
