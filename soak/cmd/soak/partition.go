package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// gossipProxy cuts regions' gossip apart on loopback without privileges:
// each daemon listens for gossip on its own address and advertises its
// proxy's, so every packet and stream to it passes the proxy, which knows
// the sender's region — a UDP packet by its source, the daemon's gossip
// socket; a TCP stream by which daemon's process owns the connecting
// socket (/proc/net/tcp and /proc/PID/fd) — and drops what crosses a cut.
// Both directions are cut, since each side's proxy drops the other's.
//
// gossiptest.FaultNet cuts gossip inside one process, as a transport the
// test hands to memberlist; the soak's daemons are the shipped binary in
// processes of their own, whose transport is memberlist's own sockets, so
// a cut between them has to sit on the network path, and without root
// (no iptables, no network namespaces) a proxy is that path.
type gossipProxy struct {
	dp  *deployment
	log *slog.Logger

	mu    sync.Mutex
	cut   map[string]bool          // regions cut off from the others
	conns map[net.Conn]*proxiedTCP // open streams, closed when a cut crosses them
	udp   map[string]string        // a daemon's gossip address -> its region
}

type proxiedTCP struct{ from, to string } // regions

func newGossipProxy(dp *deployment, log *slog.Logger) *gossipProxy {
	return &gossipProxy{dp: dp, log: log, cut: map[string]bool{}, conns: map[net.Conn]*proxiedTCP{}, udp: map[string]string{}}
}

// blocked reports whether traffic between regions a and b is cut.
func (g *gossipProxy) blocked(a, b string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return a != "" && a != b && (g.cut[a] || g.cut[b])
}

// cutRegion cuts region off and closes the streams crossing the cut.
func (g *gossipProxy) cutRegion(region string) error {
	g.mu.Lock()
	g.cut[region] = true
	var doomed []net.Conn
	for c, p := range g.conns {
		if p.from != p.to && (p.from == region || p.to == region) {
			doomed = append(doomed, c)
		}
	}
	g.mu.Unlock()
	for _, c := range doomed {
		c.Close()
	}
	return nil
}

func (g *gossipProxy) healRegion(region string) error {
	g.mu.Lock()
	delete(g.cut, region)
	g.mu.Unlock()
	return nil
}

// serve proxies advertise (UDP and TCP) to d's gossip address until ctx
// ends.
func (g *gossipProxy) serve(ctx context.Context, d *daemon, advertise string) error {
	g.mu.Lock()
	g.udp[d.gossip] = d.region
	g.mu.Unlock()
	pc, err := net.ListenPacket("udp", advertise)
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", advertise)
	if err != nil {
		pc.Close()
		return err
	}
	go func() { <-ctx.Done(); pc.Close(); l.Close() }()
	go g.serveUDP(pc, d)
	go g.serveTCP(l, d)
	return nil
}

func (g *gossipProxy) serveUDP(pc net.PacketConn, d *daemon) {
	to, err := net.ResolveUDPAddr("udp", d.gossip)
	if err != nil {
		return
	}
	buf := make([]byte, 65536)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		g.mu.Lock()
		src := g.udp[from.String()]
		g.mu.Unlock()
		if g.blocked(src, d.region) {
			continue
		}
		_, _ = pc.WriteTo(buf[:n], to)
	}
}

func (g *gossipProxy) serveTCP(l net.Listener, d *daemon) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go g.pipe(c, d)
	}
}

func (g *gossipProxy) pipe(c net.Conn, d *daemon) {
	src := g.regionOfPeer(c.RemoteAddr().(*net.TCPAddr).Port)
	if g.blocked(src, d.region) {
		c.Close()
		return
	}
	up, err := net.Dial("tcp", d.gossip)
	if err != nil {
		c.Close()
		return
	}
	g.mu.Lock()
	g.conns[c] = &proxiedTCP{from: src, to: d.region}
	g.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
	c.Close()
	up.Close()
	g.mu.Lock()
	delete(g.conns, c)
	g.mu.Unlock()
}

// regionOfPeer finds the region of the daemon whose process owns the
// loopback TCP socket bound to port, "" if none does.
func (g *gossipProxy) regionOfPeer(port int) string {
	inode := socketInode(port)
	if inode == "" {
		return ""
	}
	want := "socket:[" + inode + "]"
	for _, d := range g.dp.daemons() {
		pid := d.pid()
		if pid == 0 {
			continue
		}
		dir := fmt.Sprintf("/proc/%d/fd", pid)
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if link, err := os.Readlink(dir + "/" + e.Name()); err == nil && link == want {
				return d.region
			}
		}
	}
	return ""
}

// socketInode is the inode of the TCP socket whose local port is port,
// from /proc/net/tcp.
func socketInode(port int) string {
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return ""
	}
	defer f.Close()
	hexPort := fmt.Sprintf(":%04X", port)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || !strings.HasSuffix(fields[1], hexPort) {
			continue
		}
		if _, err := strconv.ParseUint(fields[9], 10, 64); err == nil && fields[9] != "0" {
			return fields[9]
		}
	}
	return ""
}

// proxyPartitioner is the nemesis's partitioner over a gossipProxy.
type proxyPartitioner struct{ g *gossipProxy }

func (p proxyPartitioner) cut(region string) error  { return p.g.cutRegion(region) }
func (p proxyPartitioner) heal(region string) error { return p.g.healRegion(region) }
