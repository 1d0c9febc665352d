package redisstore

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// unreadConns keeps the store's connections to Redis, so that the
// deadline watch can tell a reply that has arrived but not been read from
// one that has not come. On a daemon whose CPU is taken, Go reads its
// sockets late: with goroutines always ready to run, the runtime polls the
// network only when a processor runs out of work, or every 10 ms from its
// monitor, while timers fire on time. A reply then sits in the kernel's
// buffer for milliseconds after Redis sent it; its check was decided by
// Redis, and failing it would let the fallback decide it too.
type unreadConns struct {
	mu        sync.Mutex
	conns     map[*watchedConn]struct{}
	onMachine func(net.Addr) bool // onThisMachine; tests replace it before the first dial
}

// newUnreadConns returns an empty set that judges locality with
// onThisMachine.
func newUnreadConns() *unreadConns {
	return &unreadConns{conns: map[*watchedConn]struct{}{}, onMachine: onThisMachine}
}

// onThisMachine reports whether a is an address of this machine: a Unix
// socket, a loopback address or one of its interfaces' addresses. An
// address it cannot judge counts as this machine's, which keeps the wait
// for a server the machine may not have run.
func onThisMachine(a net.Addr) bool {
	tcp, ok := a.(*net.TCPAddr)
	if !ok {
		return true
	}
	if tcp.IP.IsLoopback() {
		return true
	}
	own, err := net.InterfaceAddrs()
	if err != nil {
		return true
	}
	return ownsIP(own, tcp.IP)
}

// ownsIP reports whether ip is one of the interface addresses own.
func ownsIP(own []net.Addr, ip net.IP) bool {
	for _, o := range own {
		if n, ok := o.(*net.IPNet); ok && n.IP.Equal(ip) {
			return true
		}
	}
	return false
}

// watchedConn is a connection to Redis the store dialled, with the
// address it dialled and its socket, read without consuming.
type watchedConn struct {
	net.Conn
	addr  string
	raw   syscall.RawConn // nil if the connection has no socket to ask
	conns *unreadConns
	local bool // dialled to a server on this machine (onMachine)

	mu      sync.Mutex
	readBy  time.Time // the read deadline the client set last
	writeBy time.Time // the write deadline the client set last
	wrote   time.Time // when the last write returned
	reading bool      // a read is under way
}

// Write records when the request was written.
func (c *watchedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.mu.Lock()
	c.wrote = time.Now()
	c.mu.Unlock()
	return n, err
}

// Read records that a read is under way.
func (c *watchedConn) Read(b []byte) (int, error) {
	c.mu.Lock()
	c.reading = true
	c.mu.Unlock()
	n, err := c.Conn.Read(b)
	c.mu.Lock()
	c.reading = false
	c.mu.Unlock()
	return n, err
}

// SetWriteDeadline records the deadline the client sets.
func (c *watchedConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writeBy = t
	return c.Conn.SetWriteDeadline(t)
}

// behind reports whether the batch whose client calls are bounded by the
// deadline by is on a connection that shows this process, not Redis,
// holding it up: its request written less than d ago (a daemon whose
// threads the machine did not run may have written it late), or no read
// under way. A batch on no connection known by that deadline (the client
// bounds a read by its own ReadTimeout when that is sooner) is not shown
// to be held up here.
func (u *unreadConns) behind(by time.Time, now time.Time, d time.Duration) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	for c := range u.conns {
		c.mu.Lock()
		mine := c.writeBy.Equal(by) || c.readBy.Equal(by)
		held := mine && (!c.reading || now.Sub(c.wrote) < d)
		c.mu.Unlock()
		if held {
			return true
		}
	}
	return false
}

// SetReadDeadline records the deadline the client sets, by which the
// deadline watch finds the connection of its batch (moveReadDeadline).
func (c *watchedConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.readBy = t
	return c.Conn.SetReadDeadline(t)
}

// SetDeadline records both deadlines.
func (c *watchedConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.readBy, c.writeBy = t, t
	return c.Conn.SetDeadline(t)
}

// Close forgets the connection and closes it.
func (c *watchedConn) Close() error {
	c.conns.mu.Lock()
	delete(c.conns.conns, c)
	c.conns.mu.Unlock()
	return c.Conn.Close()
}

// watchedSysConn is a watchedConn whose connection is a socket of its
// own (not TLS): it lets go-redis's pool check its health as it would the
// bare connection's, which go-redis does for no other kind.
type watchedSysConn struct {
	*watchedConn
	sys syscall.Conn
}

// SyscallConn is the bare connection's.
func (c watchedSysConn) SyscallConn() (syscall.RawConn, error) { return c.sys.SyscallConn() }

// watch wraps conn, dialled to addr, and keeps it until it is closed.
func (u *unreadConns) watch(conn net.Conn, addr string) net.Conn {
	sock := conn
	if tc, ok := conn.(*tls.Conn); ok {
		sock = tc.NetConn()
	}
	c := &watchedConn{Conn: conn, addr: addr, conns: u, local: u.onMachine(conn.RemoteAddr())}
	if sc, ok := sock.(syscall.Conn); ok {
		c.raw, _ = sc.SyscallConn()
	}
	u.mu.Lock()
	u.conns[c] = struct{}{}
	u.mu.Unlock()
	if sc, ok := conn.(syscall.Conn); ok {
		return watchedSysConn{c, sc}
	}
	return c
}

// colocated reports whether a connection open to addr (any, for "") goes
// to a server on this machine: only such a server waits for this
// machine's CPUs, so only then does the machine's CPU pressure excuse a
// late reply (Store.machineShort). It is judged per primary and by the
// connections open now: on a Cluster whose primaries are some on this
// machine and some elsewhere, or after a failover moved the primary
// elsewhere, a server elsewhere that hangs fails its checks at their
// deadline however busy this machine is.
func (u *unreadConns) colocated(addr string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	for c := range u.conns {
		if c.local && (addr == "" || c.addr == addr) {
			return true
		}
	}
	return false
}

// waiting reports whether a connection to addr (any, for "") holds bytes
// Redis sent that this process has not read yet. It peeks at each socket
// without taking its read lock, so a goroutine blocked reading it does not
// block it.
func (u *unreadConns) waiting(addr string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	for c := range u.conns {
		if c.raw == nil || (addr != "" && c.addr != addr) {
			continue
		}
		if peekable(c.raw) {
			return true
		}
	}
	return false
}

// moveReadDeadline moves to to the read deadline of every connection
// whose client last set it to was: a batch's reads are bounded by its
// context's deadline, which is how the watch finds them, and a daemon
// that did not run meanwhile lengthens that bound by as long. The client
// may set was again afterwards, on a read it has not begun yet; the watch
// then moves it again at its next fire.
func (u *unreadConns) moveReadDeadline(was, to time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for c := range u.conns {
		c.mu.Lock()
		if c.readBy.Equal(was) {
			_ = c.Conn.SetReadDeadline(to)
		}
		c.mu.Unlock()
	}
}

// DialHook records every connection the client dials.
func (u *unreadConns) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil {
			return conn, err
		}
		return u.watch(conn, addr), nil
	}
}

// ProcessHook passes commands through.
func (u *unreadConns) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

// ProcessPipelineHook passes pipelines through.
func (u *unreadConns) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// hookConns installs u on c's connections: those of a single server's (or
// a Sentinel's primary's) client, or of every node a Cluster client
// creates from now on. It reports false for a client it cannot hook (a
// test double), whose replies the watch then cannot see unread.
func (u *unreadConns) hookConns(c Scripter) bool {
	switch c := c.(type) {
	case *redis.ClusterClient:
		c.OnNewNode(func(n *redis.Client) { n.AddHook(u) })
		return true
	case *redis.Client:
		c.AddHook(u)
		return true
	}
	return false
}
