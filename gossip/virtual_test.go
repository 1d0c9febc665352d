package gossip

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/sluice-rl/sluice/internal/testwait"
)

// memNet is an in-memory network for memberlist, in the manner of its
// MockNetwork, with regions cut off from each other: a packet across a
// cut is dropped, a stream across it refused. Its transports block on
// channels and timers only, so memberlist and the nodes run inside a
// testing/synctest bubble, on its virtual clock. Unlike MockNetwork's, a
// packet is dropped when its receiver's queue is full, as UDP drops it:
// two nodes answering each other's pings on unbuffered channels deadlock.
type memNet struct {
	mu     sync.Mutex
	nodes  map[string]*memTransport // by address
	cut    map[string]bool          // regions cut off from the others
	closed bool                     // shutting down: every send dropped
}

// attach is the Config.Memberlist hook of a node of region on n.
func (n *memNet) attach(region string) MemberlistHook {
	return func(mc *memberlist.Config) error {
		n.mu.Lock()
		defer n.mu.Unlock()
		if n.nodes == nil {
			n.nodes = map[string]*memTransport{}
		}
		port := 7000 + len(n.nodes)
		t := &memTransport{net: n, region: region, addr: "127.0.0.1:" + strconv.Itoa(port),
			packets: make(chan *memberlist.Packet, 1024), streams: make(chan net.Conn, 16)}
		n.nodes[t.addr] = t
		mc.Transport = t
		mc.BindPort, mc.AdvertisePort = port, port
		return nil
	}
}

// peer is the transport at addr a send from region reaches, or nil.
func (n *memNet) peer(region, addr string) *memTransport {
	n.mu.Lock()
	defer n.mu.Unlock()
	t := n.nodes[addr]
	if n.closed || t == nil || t.region != region && (n.cut[region] || n.cut[t.region]) {
		return nil
	}
	return t
}

// partition cuts regions off from the others (none: heal).
func (n *memNet) partition(regions ...string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut = map[string]bool{}
	for _, r := range regions {
		n.cut[r] = true
	}
}

func (n *memNet) close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closed = true
}

type memTransport struct {
	net     *memNet
	region  string
	addr    string
	packets chan *memberlist.Packet
	streams chan net.Conn
}

var _ memberlist.NodeAwareTransport = (*memTransport)(nil)

func (t *memTransport) FinalAdvertiseAddr(string, int) (net.IP, int, error) {
	host, port, _ := net.SplitHostPort(t.addr)
	p, err := strconv.Atoi(port)
	return net.ParseIP(host), p, err
}

func (t *memTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (t *memTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	now := time.Now()
	if to := t.net.peer(t.region, a.Addr); to != nil {
		select {
		case to.packets <- &memberlist.Packet{Buf: append([]byte(nil), b...), From: memAddr(t.addr), Timestamp: now}:
		default: // the receiver's queue is full: lost, as UDP
		}
	}
	return now, nil
}

func (t *memTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }

func (t *memTransport) IngestPacket(conn net.Conn, addr net.Addr, now time.Time, shouldClose bool) error {
	return errors.New("memTransport: no packets over streams")
}

func (t *memTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

func (t *memTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	to := t.net.peer(t.region, a.Addr)
	if to == nil {
		return nil, fmt.Errorf("dial %s: unreachable", a.Addr)
	}
	local, remote := net.Pipe()
	select {
	case to.streams <- remote:
		return local, nil
	case <-time.After(timeout):
		return nil, fmt.Errorf("dial %s: timeout", a.Addr)
	}
}

func (t *memTransport) StreamCh() <-chan net.Conn { return t.streams }

func (t *memTransport) IngestStream(conn net.Conn) error {
	t.streams <- conn
	return nil
}

func (t *memTransport) Shutdown() error { return nil }

type memAddr string

func (a memAddr) Network() string { return "mem" }
func (a memAddr) String() string  { return string(a) }

// startMemNode starts a node of region on mn, inside the test's synctest
// bubble, reporting what it receives to the inbox returned; it stops when
// the test ends. The first call also makes the test's last cleanup let
// virtual time run for a minute after the nodes have stopped: time stops
// once the bubble's main goroutine exits, and memberlist's probes in
// flight when the nodes stop wait for their timeouts.
func startMemNode(t *testing.T, mn *memNet, name, region string, contactEvery time.Duration, join ...string) (*Node, *inbox) {
	t.Helper()
	if mn.nodes == nil {
		t.Cleanup(func() { time.Sleep(time.Minute) })
	}
	return runInboxNode(t, Config{Node: name, Region: region, Join: join, ContactEvery: contactEvery, Memberlist: mn.attach(region)}, mn.close)
}

// TestContactFollowsReachabilityVirtual is TestContactFollowsReachability
// on virtual time: the same nodes and memberlist over an in-memory network
// in a testing/synctest bubble, so that its bounds are the protocol's own
// rather than waits a loaded machine may stretch: while reachable a
// contact is never older than ContactLag; after a cut it stops within
// ContactLag before the cut; after healing it is back within ContactLag.
func TestContactFollowsReachabilityVirtual(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mn := &memNet{}
		const every = 20 * time.Millisecond
		eu, _ := startMemNode(t, mn, "eu-1", "eu", every)
		eu2, _ := startMemNode(t, mn, "eu-2", "eu", every, eu.Addr())
		us, _ := startMemNode(t, mn, "us-1", "us", every, eu.Addr())
		contact := func(n *Node, name string) time.Time {
			m, _ := memberState(n, name)
			return m.Contact
		}
		lag := eu.ContactLag()
		testwait.For(t, 5*time.Second, "contact both ways", func() bool {
			return time.Since(contact(eu, "us-1")) <= lag && time.Since(contact(us, "eu-1")) <= lag &&
				time.Since(contact(us, "eu-2")) <= lag && live(eu, "eu-2")
		})
		for range 50 { // a second, in steps of a ping period
			time.Sleep(every)
			if got := time.Since(contact(eu, "us-1")); got > lag {
				t.Fatalf("eu-1's contact with us-1 is %v old while reachable, want ≤ ContactLag %v", got, lag)
			}
		}

		mn.partition("us")
		cut := time.Now()
		time.Sleep(2 * lag)
		pairs := []struct {
			n    *Node
			peer string
		}{{eu, "us-1"}, {us, "eu-1"}, {us, "eu-2"}}
		for _, c := range pairs {
			if got := contact(c.n, c.peer); !got.Before(cut) || cut.Sub(got) > lag {
				t.Errorf("%s's contact with %s = %v, want within ContactLag %v before the cut at %v", c.n.Name(), c.peer, got, lag, cut)
			}
		}

		healed := time.Now()
		mn.partition()
		time.Sleep(lag)
		for _, c := range pairs {
			if got := contact(c.n, c.peer); !got.After(healed) {
				t.Errorf("%s's contact with %s = %v, want after the heal at %v (within ContactLag %v)", c.n.Name(), c.peer, got, healed, lag)
			}
		}
		if got := contact(eu, "eu-2"); !got.IsZero() {
			t.Errorf("eu-1's contact with eu-2, of its own region, = %v, want zero (never pinged)", got)
		}
		if got := contact(eu2, "eu-1"); !got.IsZero() {
			t.Errorf("eu-2's contact with eu-1, of its own region, = %v, want zero (never pinged)", got)
		}
	})
}

// TestPartitionMembershipVirtual is the partition part of
// TestFaultNetPartitionLossDelay on virtual time: cut off, each side's
// membership declares the other dead and no report crosses; healed, both
// are alive again and a report arrives. The deadlines are virtual: how
// long memberlist's suspicion takes on the local preset, not how long a
// loaded machine keeps it from running.
func TestPartitionMembershipVirtual(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mn := &memNet{}
		eu, _ := startMemNode(t, mn, "eu-1", "eu", 0)
		us, usIn := startMemNode(t, mn, "us-1", "us", 0, eu.Addr())
		testwait.For(t, 5*time.Second, "the two nodes to see each other", func() bool { return live(eu, "us-1") && live(us, "eu-1") })

		mn.partition("us")
		cut := time.Now()
		testwait.For(t, 30*time.Second, "each side to declare the other dead", func() bool { return !live(eu, "us-1") && !live(us, "eu-1") })
		t.Logf("both sides declared the other dead %v after the cut", time.Since(cut))
		if err := eu.BroadcastReport(context.Background(), testReport("eu", 100, 1)); err != nil {
			t.Fatalf("BroadcastReport during the partition = %v, want the send accepted", err)
		}

		mn.partition()
		healed := time.Now()
		testwait.For(t, 30*time.Second, "the partition to heal", func() bool { return live(eu, "us-1") && live(us, "eu-1") })
		t.Logf("both sides alive again %v after healing", time.Since(healed))
		if err := eu.BroadcastReport(context.Background(), testReport("eu", 101, 1)); err != nil {
			t.Fatal(err)
		}
		testwait.For(t, 5*time.Second, "the report sent after healing", func() bool { _, ok := usIn.findReport("eu", 101); return ok })
		if _, ok := usIn.findReport("eu", 100); ok {
			t.Error("the report sent during the partition arrived")
		}
	})
}
