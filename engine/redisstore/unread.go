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
	mu    sync.Mutex
	conns map[*watchedConn]struct{}
}

// watchedConn is a connection to Redis the store dialled, with the
// address it dialled and its socket, read without consuming.
type watchedConn struct {
	net.Conn
	addr  string
	raw   syscall.RawConn // nil if the connection has no socket to ask
	conns *unreadConns

	mu     sync.Mutex
	readBy time.Time // the read deadline the client set last
}

// SetReadDeadline records the deadline the client sets, by which the
// deadline watch finds the connection of its batch (moveReadDeadline).
func (c *watchedConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.readBy = t
	return c.Conn.SetReadDeadline(t)
}

// SetDeadline records the read deadline too.
func (c *watchedConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.readBy = t
	return c.Conn.SetDeadline(t)
}

// Close forgets the connection and closes it.
func (c *watchedConn) Close() error {
	c.conns.mu.Lock()
	delete(c.conns.conns, c)
	c.conns.mu.Unlock()
	return c.Conn.Close()
}

// SyscallConn lets go-redis's pool check the connection's health as it
// would the bare connection's.
func (c *watchedConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, syscall.EINVAL
}

// watch wraps conn, dialled to addr, and keeps it until it is closed.
func (u *unreadConns) watch(conn net.Conn, addr string) net.Conn {
	sock := conn
	if tc, ok := conn.(*tls.Conn); ok {
		sock = tc.NetConn()
	}
	c := &watchedConn{Conn: conn, addr: addr, conns: u}
	if sc, ok := sock.(syscall.Conn); ok {
		c.raw, _ = sc.SyscallConn()
	}
	u.mu.Lock()
	u.conns[c] = struct{}{}
	u.mu.Unlock()
	return c
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
