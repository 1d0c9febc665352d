package h2serve

import (
	"net"
	"sync"
)

// ConnQueue is a net.Listener whose connections are those handed to it
// (with Put): Config.HandOver for a grpc-go server's Serve.
type ConnQueue struct {
	addr   net.Addr
	conns  chan net.Conn
	done   chan struct{}
	closed sync.Once
}

// NewConnQueue returns a ConnQueue whose Addr is addr.
func NewConnQueue(addr net.Addr) *ConnQueue {
	return &ConnQueue{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

// Put hands c to Accept; it fails once the queue is closed.
func (q *ConnQueue) Put(c net.Conn) error {
	select {
	case q.conns <- c:
		return nil
	case <-q.done:
		return net.ErrClosed
	}
}

func (q *ConnQueue) Accept() (net.Conn, error) {
	select {
	case c := <-q.conns:
		return c, nil
	case <-q.done:
		return nil, net.ErrClosed
	}
}

func (q *ConnQueue) Close() error {
	q.closed.Do(func() { close(q.done) })
	return nil
}

func (q *ConnQueue) Addr() net.Addr { return q.addr }
