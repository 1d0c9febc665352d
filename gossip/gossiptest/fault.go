// Package gossiptest is test support for gossip: a network with injected
// faults (FaultNet) that the live simulator and the tests put under gossip
// nodes on one machine through gossip.Config.Memberlist.
package gossiptest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// FaultNet is a network with injected faults for nodes on one machine (the
// live simulator and tests): every node whose gossip.Config.Memberlist is
// Attach(region) sends through it. It cuts regions apart (Partition, Heal), loses and delays
// messages between regions (SetLoss, SetDelay), refuses stream dials to one
// node (RefuseDials), and makes memberlist's
// failure detector as fast as Detect asks.
//
// Partitions cut everything between the regions on either side: packets
// (memberlist's failure detector and gossip) and streams (memberlist's
// reliable path, which carries every report, node usage, borrow request
// and loan, and its push/pull). Loss and delay act on streams between
// different regions only, never inside a region and never on packets: they
// model what the virtual-time simulator's loss and delay model, reports
// that arrive late or not at all, while membership notices partitions and
// crashes only. SetSlowPackets delays packets between regions instead (a
// slow region, whose every answer comes late). A lost stream is accepted by the sender and never arrives
// (a fire-and-forget message vanishes; a request/response stream reads
// EOF); a delayed one is delivered Delay plus up to Jitter later, without
// holding up its sender.
//
// A node on a FaultNet sends its packets uncompressed (memberlist's
// EnableCompression off): memberlist compresses each packet with a fresh
// LZW writer, a 64 KB table, and the daemons' contact pings (every
// interval/40 to every node of the other regions) at the live
// simulator's tenfold compressed time, ten daemons on one machine, made
// that garbage, and the GC after it, half the run's CPU. What the faults
// model does not depend on packet sizes.
//
// Faults are applied by the sending node, on both sides, so a cut holds in
// both directions. Nodes are told apart by the address they bind; a node
// restarted on a new port is known again once it is created. The zero
// value is not usable: use NewFaultNet. Methods are safe for concurrent
// use.
type FaultNet struct {
	// Detect, if positive, is about how long memberlist should take to
	// declare a silent node dead: its probe interval becomes Detect/5, its
	// probe timeout half that, and its gossip and push/pull intervals
	// shrink in proportion. The suspicion multiplier stays 3, so a suspect
	// is declared dead 3 probe intervals after another node confirms it (a
	// crash: about Detect in all) and only after 18 when none does (a node
	// slow to answer on a loaded machine has time to refute).
	// Set it before creating nodes; zero keeps the preset's timings.
	Detect time.Duration

	mu       sync.Mutex
	rng      *rand.Rand
	regionOf map[string]string // bound "ip:port" → region
	cut      map[[2]string]bool
	loss     float64
	delay    time.Duration
	jitter   time.Duration
	slow     time.Duration  // delay of packets between regions
	refuse   map[string]int // "ip:port" → stream dials still to refuse
	counts   FaultCounts
}

// FaultCounts says what a FaultNet did, for tests and reports.
type FaultCounts struct {
	// CutPackets and CutStreams were refused by a partition.
	CutPackets, CutStreams int64
	// LostStreams were accepted and never delivered; DelayedStreams were
	// delivered late, and so were SlowPackets.
	LostStreams, DelayedStreams, SlowPackets int64
	// RefusedDials failed as RefuseDials asked.
	RefusedDials int64
}

// NewFaultNet returns a network without faults; seed makes its loss and
// jitter draws repeatable (the timing of real goroutines still is not).
func NewFaultNet(seed uint64) *FaultNet {
	return &FaultNet{rng: rand.New(rand.NewPCG(seed, 0xfa017)), regionOf: map[string]string{}, cut: map[[2]string]bool{},
		refuse: map[string]int{}}
}

// RefuseDials makes the next n stream dials to addr, from any node and in
// any region, fail at once, as dials that timed out on a loaded host: the
// node stays live to membership, whose packets still pass.
func (f *FaultNet) RefuseDials(addr string, n int) {
	f.mu.Lock()
	f.refuse[addr] += n
	f.mu.Unlock()
}

// Partition cuts every region in side off from every region not in it, on
// top of any cut already in force. regions lists every region of the
// cluster.
func (f *FaultNet) Partition(side, regions []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, a := range side {
		for _, b := range regions {
			if !slices.Contains(side, b) {
				f.cut[pair(a, b)] = true
			}
		}
	}
}

// Heal removes every cut.
func (f *FaultNet) Heal() {
	f.mu.Lock()
	clear(f.cut)
	f.mu.Unlock()
}

// SetLoss sets the probability, in [0, 1], that a stream between two
// regions is lost.
func (f *FaultNet) SetLoss(p float64) {
	f.mu.Lock()
	f.loss = min(max(p, 0), 1)
	f.mu.Unlock()
}

// SetDelay delays every stream between two regions by d plus a uniform
// draw in [0, jitter).
func (f *FaultNet) SetDelay(d, jitter time.Duration) {
	f.mu.Lock()
	f.delay, f.jitter = max(d, 0), max(jitter, 0)
	f.mu.Unlock()
}

// SetSlowPackets delays every packet between two regions by d (zero: no
// delay), without holding up its sender: memberlist's probes and acks and
// the daemons' contact pings and their answers, as between regions whose
// daemons are starved of CPU and answer late.
func (f *FaultNet) SetSlowPackets(d time.Duration) {
	f.mu.Lock()
	f.slow = max(d, 0)
	f.mu.Unlock()
}

// Counts returns what the network has done so far.
func (f *FaultNet) Counts() FaultCounts {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.counts
}

func pair(a, b string) [2]string {
	if a > b {
		a, b = b, a
	}
	return [2]string{a, b}
}

// fate is what happens to one send from region src to address dst.
type fate struct {
	cut   bool
	lost  bool
	delay time.Duration
}

func (f *FaultNet) fate(src, dst string, stream bool) fate {
	f.mu.Lock()
	defer f.mu.Unlock()
	if stream && f.refuse[dst] > 0 {
		f.refuse[dst]--
		f.counts.RefusedDials++
		return fate{cut: true}
	}
	to, ok := f.regionOf[dst]
	if !ok || to == src {
		return fate{}
	}
	if f.cut[pair(src, to)] {
		if stream {
			f.counts.CutStreams++
		} else {
			f.counts.CutPackets++
		}
		return fate{cut: true}
	}
	if !stream {
		if f.slow > 0 {
			f.counts.SlowPackets++
		}
		return fate{delay: f.slow}
	}
	var ft fate
	if f.loss > 0 && f.rng.Float64() < f.loss {
		ft.lost = true
		f.counts.LostStreams++
	}
	ft.delay = f.delay
	if f.jitter > 0 {
		ft.delay += time.Duration(f.rng.Int64N(int64(f.jitter)))
	}
	if ft.delay > 0 && !ft.lost {
		f.counts.DelayedStreams++
	}
	return ft
}

// Attach returns the gossip.Config.Memberlist hook of a node of region on
// f: it gives memberlist a transport through f, bound as mc.BindAddr and
// mc.BindPort say, and applies Detect.
func (f *FaultNet) Attach(region string) func(*memberlist.Config) error {
	return func(mc *memberlist.Config) error { return f.attach(mc, region) }
}

func (f *FaultNet) attach(mc *memberlist.Config, region string) error {
	nc := &memberlist.NetTransportConfig{BindAddrs: []string{mc.BindAddr}, BindPort: mc.BindPort,
		Logger: log.New(mc.LogOutput, "", 0)}
	var inner *memberlist.NetTransport
	var err error
	for range 10 { // a free port for UDP may be taken for TCP: try another
		if inner, err = memberlist.NewNetTransport(nc); err == nil || mc.BindPort != 0 ||
			!strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("gossip: fault transport: %w", err)
	}
	// memberlist fills in a port picked by its own transport, not by ours.
	if mc.BindPort == 0 {
		mc.BindPort = inner.GetAutoBindPort()
	}
	if mc.AdvertisePort == 0 {
		mc.AdvertisePort = mc.BindPort
	}
	ip, port, err := inner.FinalAdvertiseAddr(mc.AdvertiseAddr, mc.AdvertisePort)
	if err != nil {
		_ = inner.Shutdown()
		return fmt.Errorf("gossip: fault transport: %w", err)
	}
	self := net.JoinHostPort(ip.String(), strconv.Itoa(port))
	f.mu.Lock()
	f.regionOf[self] = region
	f.mu.Unlock()
	mc.Transport = &faultTransport{NetTransport: inner, net: f, region: region, self: self}
	mc.EnableCompression = false // see FaultNet
	if f.Detect > 0 {
		p := max(f.Detect/5, 10*time.Millisecond)
		mc.ProbeInterval = p
		mc.ProbeTimeout = p / 2
		mc.SuspicionMult = 3
		mc.SuspicionMaxTimeoutMult = 6
		mc.GossipInterval = min(mc.GossipInterval, p/2)
		mc.PushPullInterval = min(mc.PushPullInterval, 10*p)
		mc.GossipToTheDeadTime = min(mc.GossipToTheDeadTime, 10*p)
	}
	return nil
}

// faultTransport is memberlist's NetTransport with f's faults on what this
// node sends.
type faultTransport struct {
	*memberlist.NetTransport
	net    *FaultNet
	region string
	self   string // the address other nodes dial
}

var _ memberlist.NodeAwareTransport = (*faultTransport)(nil)

func (t *faultTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	ft := t.net.fate(t.region, addr, false)
	switch {
	case ft.cut:
		return time.Now(), nil // sent into the void, as on a real network
	case ft.delay > 0:
		late := bytes.Clone(b) // memberlist reuses its buffer
		time.AfterFunc(ft.delay, func() { _, _ = t.NetTransport.WriteTo(late, addr) })
		return time.Now(), nil
	}
	return t.NetTransport.WriteTo(b, addr)
}

func (t *faultTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	return t.WriteTo(b, a.Addr)
}

func (t *faultTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	ft := t.net.fate(t.region, addr, true)
	switch {
	case ft.cut:
		return nil, fmt.Errorf("gossip: fault: %s unreachable (partition or refused dial)", addr)
	case !ft.lost && ft.delay == 0:
		return t.NetTransport.DialTimeout(addr, timeout)
	}
	return &lateConn{dial: func() (net.Conn, error) { return t.NetTransport.DialTimeout(addr, timeout) },
		lost: ft.lost, due: time.Now().Add(ft.delay)}, nil
}

func (t *faultTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	return t.DialTimeout(a.Addr, timeout)
}

func (t *faultTransport) Shutdown() error {
	t.net.mu.Lock()
	delete(t.net.regionOf, t.self)
	t.net.mu.Unlock()
	return t.NetTransport.Shutdown()
}

// lateConn is a stream that is delivered at due, or never when lost. Writes
// are buffered; Close hands the buffer to a goroutine that dials at due and
// sends it, so a fire-and-forget message (memberlist's SendReliable) does
// not hold up its sender. A Read first (a request/response stream such as
// push/pull) waits for due, dials and from then on is a plain connection;
// on a lost stream it reads EOF.
type lateConn struct {
	dial func() (net.Conn, error)
	lost bool
	due  time.Time

	mu       sync.Mutex
	buf      bytes.Buffer
	conn     net.Conn // once dialled
	deadline time.Time
	closed   bool
}

var errLateClosed = errors.New("gossip: fault: stream closed")

// connect dials at due and sends what was written so far. Called with mu
// held.
func (c *lateConn) connect() error {
	if c.conn != nil {
		return nil
	}
	if c.lost {
		return io.EOF
	}
	if d := time.Until(c.due); d > 0 {
		t := time.NewTimer(d)
		<-t.C // the injected delay itself, not a wait for a condition
	}
	conn, err := c.dial()
	if err != nil {
		return err
	}
	if !c.deadline.IsZero() {
		_ = conn.SetDeadline(c.deadline)
	}
	if _, err := conn.Write(c.buf.Bytes()); err != nil {
		conn.Close()
		return err
	}
	c.buf.Reset()
	c.conn = conn
	return nil
}

func (c *lateConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return 0, errLateClosed
	case c.conn != nil:
		return c.conn.Write(b)
	}
	return c.buf.Write(b)
}

func (c *lateConn) Read(b []byte) (int, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return 0, errLateClosed
	}
	err := c.connect()
	conn := c.conn
	c.mu.Unlock()
	if err != nil {
		return 0, err
	}
	return conn.Read(b)
}

func (c *lateConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if c.conn != nil {
		return c.conn.Close()
	}
	if c.lost || c.buf.Len() == 0 {
		return nil
	}
	go func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if err := c.connect(); err == nil {
			c.conn.Close()
		}
	}()
	return nil
}

func (c *lateConn) LocalAddr() net.Addr  { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }
func (c *lateConn) RemoteAddr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

func (c *lateConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deadline = t
	if c.conn != nil {
		return c.conn.SetDeadline(t)
	}
	return nil
}

func (c *lateConn) SetReadDeadline(t time.Time) error  { return c.SetDeadline(t) }
func (c *lateConn) SetWriteDeadline(t time.Time) error { return c.SetDeadline(t) }
