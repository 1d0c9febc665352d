package tlsconfig

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// HandshakeTimeout bounds a client's TLS handshake; one that has not
// finished by then is closed.
const HandshakeTimeout = 10 * time.Second

// handshakeLogEvery is how often at most a failed handshake is logged per
// listener; every one is counted in sluice_tls_handshake_errors_total.
const handshakeLogEvery = 10 * time.Second

// NewListener returns a listener that accepts on ln and completes each
// connection's TLS handshake, with r's configuration, before Accept returns
// it. A client that fails the handshake (a plaintext client, one without a
// valid certificate on a mutual TLS listener, one too slow) is closed and
// counted, and logged at most once every 10 s: the server behind the
// listener never sees it, so it neither answers nor logs it.
func NewListener(ln net.Listener, r *Reloader) net.Listener {
	l := &listener{Listener: ln, r: r, config: r.TLSConfig(), conns: make(chan net.Conn),
		done: make(chan struct{}), closed: make(chan struct{}), logs: rate.Sometimes{Interval: handshakeLogEvery}}
	go l.accept()
	return l
}

type listener struct {
	net.Listener
	r      *Reloader
	config *tls.Config
	conns  chan net.Conn
	done   chan struct{} // closed when accept has stopped, err then set
	err    error
	closed chan struct{}
	once   sync.Once
	logs   rate.Sometimes
}

func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, l.err
	}
}

func (l *listener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// accept accepts until ln fails for good, handshaking each connection in
// a goroutine of its own so that a slow client holds up no other.
func (l *listener) accept() {
	defer close(l.done)
	pause := 5 * time.Millisecond
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || isTemporary(err) {
				select {
				case <-time.After(pause): // the back-off of net/http's Serve
				case <-l.closed:
					l.err = net.ErrClosed
					return
				}
				pause = min(2*pause, time.Second)
				continue
			}
			l.err = err
			return
		}
		pause = 5 * time.Millisecond
		go l.handshake(c)
	}
}

func isTemporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

func (l *listener) handshake(c net.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), HandshakeTimeout)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	tc := tls.Server(c, l.config)
	err := tc.HandshakeContext(ctx)
	if !stop() || err != nil {
		c.Close()
		l.r.cfg.Metrics.handshakeFailed(l.r.cfg.Listener)
		l.logs.Do(func() {
			l.r.cfg.Logger.Warn("TLS handshake failed (logged once every 10s at most; counted in sluice_tls_handshake_errors_total)",
				"listener", l.r.cfg.Listener, "peer", c.RemoteAddr().String(), "err", err)
		})
		return
	}
	select {
	case l.conns <- tc:
	case <-l.done:
		tc.Close()
	}
}

// Run reloads the files every interval until ctx ends; it returns nil.
func (r *Reloader) Run(ctx context.Context, every time.Duration) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			r.Reload(now) // a refused set is logged and counted by Reload
		}
	}
}
