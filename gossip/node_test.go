package gossip

import (
	"context"
	"crypto/rand"
	"log/slog"
	"net"
	"os"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/sluice-rl/sluice/internal/testwait"
	"github.com/sluice-rl/sluice/share"
)

var keyA = []byte("0123456789abcdef0123456789abcdef")

// inbox collects what a node's handlers receive.
type inbox struct {
	mu       sync.Mutex
	reports  []share.Report
	policies []PolicyUpdate
	usage    []NodeUsage
	borrows  []share.BorrowRequest
	loans    []share.Loan
}

func (b *inbox) findReport(region string, epoch uint64) (share.Report, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, r := range b.reports {
		if r.Region == region && r.Epoch == epoch {
			return r, true
		}
	}
	return share.Report{}, false
}

// hasReportSince reports whether region's report of epoch, or of a later
// epoch, was received.
func (b *inbox) hasReportSince(region string, epoch uint64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, r := range b.reports {
		if r.Region == region && r.Epoch >= epoch {
			return true
		}
	}
	return false
}

type testNode struct {
	*Node
	in     *inbox
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan struct{}
}

func (tn *testNode) close() {
	tn.cancel()
	<-tn.done
}

// testNow is the clock test nodes judge received messages by: inside
// epoch 100 of the default interval, the epochs the tests send.
func testNow() time.Time { return time.Unix(0, 100*int64(DefaultInterval)).Add(time.Second) }

func startNode(t *testing.T, name, region string, key []byte, join ...string) *testNode {
	t.Helper()
	return startNodeWith(t, name, region, key, join, nil, nil)
}

// startNodeWith is startNode with cfg changed by config (if set) before
// New, and the node by before (if set) before Run.
func startNodeWith(t *testing.T, name, region string, key []byte, join []string, config func(*Config), before func(*Node)) *testNode {
	t.Helper()
	reg := prometheus.NewRegistry()
	// The local preset's 1 s TCP timeout and a short leave are what a
	// loaded test machine misses (a dial timing out, a leave not yet
	// gossiped, so the node is declared dead instead); no test here is
	// about either, so they get the margin of a busy host.
	cfg := Config{Node: name, Region: region, BindAddr: "127.0.0.1", SecretKey: key, Preset: PresetLocal,
		Join: join, Registerer: reg, LeaveTimeout: 5 * time.Second, Logger: testLogger(name), Now: testNow,
		Memberlist: func(mc *memberlist.Config) error { mc.TCPTimeout = 10 * time.Second; return nil }}
	if config != nil {
		config(&cfg)
	}
	n, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%s) = %v", name, err)
	}
	if before != nil {
		before(n)
	}
	in := &inbox{}
	n.OnReport(func(r share.Report) { in.mu.Lock(); in.reports = append(in.reports, r); in.mu.Unlock() })
	n.OnPolicy(func(p PolicyUpdate) { in.mu.Lock(); in.policies = append(in.policies, p); in.mu.Unlock() })
	n.OnNodeUsage(func(u NodeUsage) { in.mu.Lock(); in.usage = append(in.usage, u); in.mu.Unlock() })
	n.OnMessage(func(m Message) {
		in.mu.Lock()
		defer in.mu.Unlock()
		switch m.Kind {
		case KindBorrow:
			in.borrows = append(in.borrows, m.Borrow)
		case KindLoan:
			in.loans = append(in.loans, m.Loan)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	tn := &testNode{Node: n, in: in, reg: reg, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(tn.done)
		if err := n.Run(ctx); err != nil {
			t.Errorf("Run(%s) = %v", name, err)
		}
	}()
	t.Cleanup(tn.close)
	return tn
}

func testLogger(name string) *slog.Logger {
	if os.Getenv("GOSSIP_DEBUG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("node", name)
}

func memberState(n *Node, name string) (Member, bool) {
	for _, m := range n.Members() {
		if m.Node == name {
			return m, true
		}
	}
	return Member{}, false
}

func dropped(tn *testNode, reason string) float64 { return droppedN(tn.Node, reason) }

// droppedN counts n's messages dropped or rejected for reason (the two
// vectors' reasons are disjoint).
func droppedN(n *Node, reason string) float64 {
	total := 0.0
	for _, v := range []*prometheus.CounterVec{n.metrics.dropped, n.metrics.rejected} {
		var m dto.Metric
		if err := v.WithLabelValues(reason).Write(&m); err != nil {
			panic(err)
		}
		total += m.GetCounter().GetValue()
	}
	return total
}

func TestClusterMembershipAndReports(t *testing.T) {
	t.Parallel()
	n1 := startNode(t, "n1", "eu", keyA)
	n2 := startNode(t, "n2", "us", keyA, n1.Addr())
	n3 := startNode(t, "n3", "ap", keyA, n1.Addr())
	nodes := []*testNode{n1, n2, n3}
	want := map[string][]string{"eu": {"n1"}, "us": {"n2"}, "ap": {"n3"}}
	testwait.For(t, 30*time.Second, "3 nodes to see each other", func() bool {
		for _, n := range nodes {
			if !reflect.DeepEqual(n.Regions(), want) || n.NumLive() != 3 {
				return false
			}
		}
		return true
	})

	ctx := context.Background()
	small := testReport("eu", 100, 2)
	if err := n1.BroadcastReport(ctx, small); err != nil {
		t.Fatal(err)
	}
	// A receiver keeps only the newest epoch per region, and two reports
	// travel on two TCP streams handled concurrently: let the first land
	// before sending the second, or a loaded machine may deliver 101 first
	// and rightly drop 100 as stale.
	for _, n := range nodes[1:] {
		testwait.For(t, 30*time.Second, n.Name()+" to receive the small report", func() bool {
			_, ok := n.in.findReport("eu", 100)
			return ok
		})
	}
	big := testReport("eu", 101, 5000)
	if err := n1.BroadcastReport(ctx, big); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes[1:] {
		testwait.For(t, 30*time.Second, n.Name()+" to receive both reports", func() bool {
			_, ok1 := n.in.findReport("eu", 100)
			_, ok2 := n.in.findReport("eu", 101)
			return ok1 && ok2
		})
		got, _ := n.in.findReport("eu", 101)
		if !reflect.DeepEqual(got, big) {
			t.Errorf("%s received a report of %d keys, want the %d sent", n.Name(), len(got.Keys), len(big.Keys))
		}
		got, _ = n.in.findReport("eu", 100)
		if !reflect.DeepEqual(got, small) {
			t.Errorf("%s received %+v, want %+v", n.Name(), got, small)
		}
	}
	if err := n2.BroadcastReport(ctx, testReport("eu", 1, 1)); err == nil {
		t.Error("BroadcastReport of another region's report succeeded")
	}

	// Node usage stays in its region: a second eu node gets it, us does not.
	n4 := startNode(t, "n4", "eu", keyA, n1.Addr())
	// Usage is sent once, and a node takes a message only from a member it
	// knows: wait until n4 knows n1 as well (under the race detector n1
	// saw n4 first, and n4 turned the usage away).
	testwait.For(t, 30*time.Second, "n1 and n4 to see each other", func() bool {
		return len(n1.Regions()["eu"]) == 2 && len(n4.Regions()["eu"]) == 2
	})
	if err := n1.SendNodeUsage(ctx, NodeUsage{Epoch: 100, Keys: []KeyUsage{{Key: share.Key{Policy: "g", Subject: "s"}, Limit: 5, Offered: 1}}}); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 30*time.Second, "n4 to receive n1's usage", func() bool {
		n4.in.mu.Lock()
		defer n4.in.mu.Unlock()
		return len(n4.in.usage) == 1 && n4.in.usage[0].Node == "n1" && n4.in.usage[0].Epoch == 100
	})
	n2.in.mu.Lock()
	if len(n2.in.usage) != 0 {
		t.Errorf("us node received eu node usage: %+v", n2.in.usage)
	}
	n2.in.mu.Unlock()

	// Policies: newest version wins, each delivered once.
	if err := n1.BroadcastPolicy(ctx, PolicyUpdate{Version: 2, Data: []byte("v2")}); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 30*time.Second, "policy v2 everywhere", func() bool {
		for _, n := range []*testNode{n2, n3, n4} {
			n.in.mu.Lock()
			ok := len(n.in.policies) == 1 && n.in.policies[0].Version == 2
			if os.Getenv("GOSSIP_DEBUG") != "" {
				t.Logf("%s policies %+v dropped self %v", n.Name(), n.in.policies, dropped(n, ReasonSelf))
			}
			n.in.mu.Unlock()
			if !ok {
				return false
			}
		}
		return true
	})
	if err := n3.BroadcastPolicy(ctx, PolicyUpdate{Version: 1, Data: []byte("v1")}); err == nil {
		t.Error("BroadcastPolicy of an older version succeeded")
	}
}

// TestBorrowRouting: a borrow request reaches every node of the other
// regions and none of its own; a loan reaches the lender's other nodes and
// the borrower's nodes, not a third region.
func TestBorrowRouting(t *testing.T) {
	t.Parallel()
	eu1 := startNode(t, "eu1", "eu", keyA)
	eu2 := startNode(t, "eu2", "eu", keyA, eu1.Addr())
	us1 := startNode(t, "us1", "us", keyA, eu1.Addr())
	us2 := startNode(t, "us2", "us", keyA, eu1.Addr())
	ap1 := startNode(t, "ap1", "ap", keyA, eu1.Addr())
	nodes := []*testNode{eu1, eu2, us1, us2, ap1}
	testwait.For(t, 30*time.Second, "5 nodes to see each other", func() bool {
		for _, n := range nodes {
			if n.NumLive() != 5 {
				return false
			}
		}
		return true
	})
	count := func(n *testNode) (borrows, loans int) {
		n.in.mu.Lock()
		defer n.in.mu.Unlock()
		return len(n.in.borrows), len(n.in.loans)
	}
	ctx := context.Background()
	req := testBorrow("us")
	req.Epoch = 100
	if err := us1.SendBorrowRequest(ctx, req); err != nil {
		t.Fatal(err)
	}
	loan := testLoan("eu", "us")
	loan.Epoch = 100
	if err := eu1.SendLoan(ctx, loan); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 30*time.Second, "the request and the loan delivered", func() bool {
		for _, c := range []struct {
			n             *testNode
			borrow, loans int
		}{{eu1, 1, 0}, {eu2, 1, 1}, {us1, 0, 1}, {us2, 0, 1}, {ap1, 1, 0}} {
			if b, l := count(c.n); b < c.borrow || l < c.loans {
				return false
			}
		}
		return true
	})
	// Anything misrouted would have travelled alongside: check the exact counts.
	for _, c := range []struct {
		n             *testNode
		borrow, loans int
	}{{eu1, 1, 0}, {eu2, 1, 1}, {us1, 0, 1}, {us2, 0, 1}, {ap1, 1, 0}} {
		if b, l := count(c.n); b != c.borrow || l != c.loans {
			t.Errorf("%s received %d requests and %d loans, want %d and %d", c.n.Name(), b, l, c.borrow, c.loans)
		}
	}
	eu2.in.mu.Lock()
	if got := eu2.in.borrows[0]; got != req {
		t.Errorf("eu2 received %+v, want %+v", got, req)
	}
	if got := eu2.in.loans[0]; got != loan {
		t.Errorf("eu2 received %+v, want %+v", got, loan)
	}
	eu2.in.mu.Unlock()
	if err := eu1.SendBorrowRequest(ctx, req); err == nil {
		t.Error("SendBorrowRequest of another region's request succeeded")
	}
	if err := us1.SendLoan(ctx, loan); err == nil {
		t.Error("SendLoan of another region's loan succeeded")
	}
}

func TestDifferentKeysNeverExchange(t *testing.T) {
	t.Parallel()
	keyB := []byte("fedcba9876543210")
	n1 := startNode(t, "k1", "eu", keyA)
	n2 := startNode(t, "k2", "us", keyB, n1.Addr())
	testwait.For(t, 30*time.Second, "k1 to reject k2's join as undecryptable", func() bool { return dropped(n1, ReasonAuth) > 0 })

	// k2 sends a report straight at k1, bypassing membership.
	host, port, _ := net.SplitHostPort(n1.Addr())
	p, _ := strconv.Atoi(port)
	target := &memberlist.Node{Name: "k1", Addr: net.ParseIP(host), Port: uint16(p)}
	b, _ := Encode("k2", "us", testReport("us", 7, 3))
	_ = n2.ml.SendReliable(target, b)
	_ = n2.ml.SendBestEffort(target, b)
	before := dropped(n1, ReasonAuth)
	testwait.For(t, 30*time.Second, "k1 to drop k2's direct messages", func() bool { return dropped(n1, ReasonAuth) >= before+1 })
	if n1.NumLive() != 1 || n2.NumLive() != 1 {
		t.Errorf("nodes with different keys joined: k1 sees %d, k2 sees %d live", n1.NumLive(), n2.NumLive())
	}
	if _, ok := n1.in.findReport("us", 7); ok {
		t.Error("k1 accepted a report encrypted with another key")
	}
}

func TestGarbageOnPortsKeepsServing(t *testing.T) {
	t.Parallel()
	n1 := startNode(t, "g1", "eu", keyA)
	n2 := startNode(t, "g2", "us", keyA, n1.Addr())
	testwait.For(t, 30*time.Second, "g1 and g2 to join", func() bool { return n1.NumLive() == 2 && n2.NumLive() == 2 })

	junk := make([]byte, 4096)
	for i := range 50 {
		_, _ = rand.Read(junk)
		if u, err := net.Dial("udp", n1.Addr()); err == nil {
			_, _ = u.Write(junk[:1+i*60])
			_ = u.Close()
		}
		if c, err := net.DialTimeout("tcp", n1.Addr(), time.Second); err == nil {
			_ = c.SetDeadline(time.Now().Add(time.Second))
			_, _ = c.Write(junk[:1+i*80])
			_ = c.Close()
		}
	}
	// Garbage that passes memberlist (it decrypts) but not our decoder:
	// only a keyholder can produce it, sent as a user message.
	host, port, _ := net.SplitHostPort(n1.Addr())
	p, _ := strconv.Atoi(port)
	target := &memberlist.Node{Name: "g1", Addr: net.ParseIP(host), Port: uint16(p)}
	_ = n2.ml.SendReliable(target, []byte{0x83, 0xa1, 0x76, 0x01, 0xff})
	testwait.For(t, 30*time.Second, "g1 to count the malformed user message", func() bool { return dropped(n1, ReasonMalformed) >= 1 })

	if err := n2.BroadcastReport(context.Background(), testReport("us", 99, 2)); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 30*time.Second, "g1 to receive a valid report after the junk", func() bool {
		_, ok := n1.in.findReport("us", 99)
		return ok
	})
	if n1.NumLive() != 2 {
		t.Errorf("after junk g1 sees %d live nodes, want 2", n1.NumLive())
	}
}

func TestFailureLeaveAndRestart(t *testing.T) {
	t.Parallel()
	n1 := startNode(t, "r1", "eu", keyA)
	n2 := startNode(t, "r2", "us", keyA, n1.Addr())
	n3 := startNode(t, "r3", "ap", keyA, n1.Addr())
	testwait.For(t, 30*time.Second, "3 nodes to join", func() bool { return n1.NumLive() == 3 && n2.NumLive() == 3 && n3.NumLive() == 3 })
	ctx := context.Background()
	if err := n1.BroadcastPolicy(ctx, PolicyUpdate{Version: 5, Data: []byte("p5")}); err != nil {
		t.Fatal(err)
	}
	oldAddr := n3.Addr()

	// Crash r3: no leave message. Local preset: probe 1 s, suspicion 3 s.
	start := time.Now()
	n3.stop(false)
	testwait.For(t, 30*time.Second, "r3 to be declared dead", func() bool {
		m1, _ := memberState(n1.Node, "r3")
		m2, _ := memberState(n2.Node, "r3")
		if os.Getenv("GOSSIP_DEBUG") != "" {
			t.Logf("r3 seen by r1 %+v, by r2 %+v", m1, m2)
		}
		return m1.State == StateDead && m2.State == StateDead
	})
	t.Logf("crash detected in %v", time.Since(start).Round(10*time.Millisecond))
	if _, ok := n1.Regions()["ap"]; ok {
		t.Error("region ap still live with its only node dead")
	}
	n3.close()

	// Restart r3 under the same name on a new port: it rejoins and catches
	// up with the policy set by push/pull.
	n3b := startNode(t, "r3", "ap", keyA, n1.Addr())
	if n3b.Addr() == oldAddr {
		t.Fatalf("restart reused the address %s", oldAddr)
	}
	testwait.For(t, 30*time.Second, "r3 to rejoin at its new address", func() bool {
		m1, _ := memberState(n1.Node, "r3")
		m2, _ := memberState(n2.Node, "r3")
		return m1.State == StateAlive && m1.Addr == n3b.Addr() && m2.State == StateAlive && n3b.NumLive() == 3
	})
	testwait.For(t, 30*time.Second, "restarted r3 to catch up with policy v5", func() bool {
		n3b.in.mu.Lock()
		defer n3b.in.mu.Unlock()
		return len(n3b.in.policies) > 0 && n3b.in.policies[len(n3b.in.policies)-1].Version == 5
	})
	if err := n3b.BroadcastReport(ctx, testReport("ap", 100, 1)); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 30*time.Second, "r1 to receive the restarted node's report", func() bool {
		_, ok := n1.in.findReport("ap", 100)
		return ok
	})

	// Graceful leave of r2.
	n2.close()
	testwait.For(t, 30*time.Second, "r2 to be seen as left", func() bool {
		m, _ := memberState(n1.Node, "r2")
		return m.State == StateLeft
	})
	if got := n1.Regions(); !reflect.DeepEqual(got, map[string][]string{"eu": {"r1"}, "ap": {"r3"}}) {
		t.Errorf("Regions() after r2 left = %v", got)
	}
}

func TestQueueFullDropsWithoutBlocking(t *testing.T) {
	n, err := New(Config{Node: "q", Region: "eu", BindAddr: "127.0.0.1", Dev: true, Preset: PresetLocal, QueueSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer n.stop(false)
	b, _ := Encode("x", "eu", testReport("eu", 1, 1))
	d := (*delegate)(n)
	for range 5 {
		d.NotifyMsg(b) // no decoder running: must not block
	}
	if got := droppedN(n, ReasonQueueFull); got != 3 {
		t.Errorf("dropped{queue_full} = %v, want 3", got)
	}
	d.NotifyMsg(make([]byte, DefaultMaxMessageSize+1))
	if got := droppedN(n, ReasonOversized); got != 1 {
		t.Errorf("dropped{oversized} = %v, want 1", got)
	}
}

func TestConfigValidate(t *testing.T) {
	ok := Config{Node: "a", Region: "eu", SecretKey: keyA}
	tests := []struct {
		name string
		mod  func(*Config)
		ok   bool
	}{
		{"valid", func(*Config) {}, true},
		{"dev without key", func(c *Config) { c.SecretKey = nil; c.Dev = true }, true},
		{"no key", func(c *Config) { c.SecretKey = nil }, false},
		{"bad key length", func(c *Config) { c.SecretKey = []byte("short") }, false},
		{"no node", func(c *Config) { c.Node = "" }, false},
		{"no region", func(c *Config) { c.Region = "" }, false},
		{"bad preset", func(c *Config) { c.Preset = "moon" }, false},
		{"join without port", func(c *Config) { c.Join = []string{"10.0.0.1"} }, false},
		{"join ok", func(c *Config) { c.Join = []string{"10.0.0.1:7946", "[::1]:7946"} }, true},
		{"message too big", func(c *Config) { c.MaxMessageSize = 30 << 20 }, false},
	}
	for _, tt := range tests {
		c := ok
		tt.mod(&c)
		if err := c.Validate(); (err == nil) != tt.ok {
			t.Errorf("Validate(%s) = %v, want ok=%v", tt.name, err, tt.ok)
		}
	}
}
