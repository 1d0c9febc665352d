// Package h2serve is a small HTTP/2 server of unary gRPC calls, for the
// rate limit service: it reads and writes HTTP/2 frames and HPACK header
// blocks, keeps flow control and the life of each connection, runs each
// call's Handler on a kept worker, and writes its answer. It serves the
// connections whose first call is Config.Paths[0] and hands every other
// connection, with the bytes read from it, to Config.HandOver (grpc-go in
// the rate limit service); see conn.go for what one connection may hold.
package h2serve

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of Config.
const (
	DefaultWorkers           = 128
	DefaultConnectionTimeout = 120 * time.Second
	DefaultKeepaliveTime     = 2 * time.Hour
	DefaultKeepaliveTimeout  = 20 * time.Second
	// DefaultWriteTimeout is Config.WriteTimeout when zero: far longer
	// than a peer that reads takes to take in a socket buffer of
	// answers, far shorter than the keepalive's bounds.
	DefaultWriteTimeout = 10 * time.Second
	// DefaultMaxConnections is Config.MaxConnections when zero.
	DefaultMaxConnections = 10000
	// DefaultMaxConnectionsPerAddress is Config.MaxConnectionsPerAddress
	// when zero: a tenth of DefaultMaxConnections, so that one address
	// (a client that leaks connections, or reconnects in a loop) takes
	// at most a tenth of the server, and far more than one proxy opens
	// (Envoy opens one connection per worker thread and cluster, tens on
	// a large host), so that many proxies behind one address translator
	// still fit.
	DefaultMaxConnectionsPerAddress = 1000
)

// Handler answers the calls the transport reads.
type Handler interface {
	// Answer answers one call, on a worker goroutine, concurrently with
	// others: it appends the response's message to c.Out, or returns
	// the call's status as an error (status.Convert reads it). ctx is
	// the connection's, cancelled when the connection ends.
	Answer(ctx context.Context, c *Call) error
}

// Call is one call given to Handler.Answer. Calls are pooled with the
// buffers they grew.
type Call struct {
	// Method is the index in Config.Paths of the call's :path.
	Method int
	// Message is the request's one message, uncompressed, without gRPC's
	// length prefix; it is valid until Answer returns.
	Message []byte
	// Out is the response's message as Answer appends it: Answer only
	// appends (what Out holds before is the transport's).
	Out []byte
	// Room is the Handler's own, kept with the call from one use to the
	// next; nil the first time. It must keep nothing alive that a pooled
	// call should not.
	Room any
}

// Config configures a Server.
type Config struct {
	// Paths are the methods served, as :path; a connection whose first
	// call is Paths[0] is served here, and so are its calls of the other
	// Paths. A call of any other path is answered UNIMPLEMENTED.
	Paths []string
	// HandOver takes a connection whose first call is not Paths[0], or
	// that sends no call before KeepaliveTime, or frames without a call
	// past a header block's bound; its reads return the bytes read so far
	// first. Nil closes such a connection.
	HandOver func(net.Conn) error
	// Workers is how many goroutines Serve keeps to run calls; zero is
	// DefaultWorkers. Calls beyond them each get a goroutine of their own.
	Workers int
	// ConnectionTimeout bounds the client preface with its first SETTINGS
	// frame, and one header block from its first frame to its last; zero
	// is DefaultConnectionTimeout.
	ConnectionTimeout time.Duration
	// KeepaliveTime is how long a connection may send nothing before it
	// is pinged, and KeepaliveTimeout how long the ping may then go
	// unanswered; zero is DefaultKeepaliveTime and DefaultKeepaliveTimeout.
	KeepaliveTime, KeepaliveTimeout time.Duration
	// WriteTimeout bounds one write to a connection: a peer that takes in
	// nothing for this long is closed (and counted), freeing the worker
	// that wrote; zero is DefaultWriteTimeout.
	WriteTimeout time.Duration
	// MaxConnections bounds the connections Serve serves at once, those
	// handed over included; a connection past it is closed as soon as it
	// is accepted (and counted). Zero is DefaultMaxConnections.
	MaxConnections int
	// MaxConnectionsPerAddress bounds the connections Serve serves at
	// once from one peer IP address (of a TCP connection; others are not
	// counted by address), those handed over included; a connection past
	// it is closed as soon as it is accepted (and counted). Zero is
	// DefaultMaxConnectionsPerAddress; negative is no bound but
	// MaxConnections (for peers behind a proxy that hides their
	// addresses).
	MaxConnectionsPerAddress int
	// MaxConnectionAge, when positive, is how long a connection of this
	// transport is served before it is sent a GOAWAY (its calls in flight
	// are answered, new ones go to a new connection), jittered by up to
	// ±10% per connection so that connections opened together do not end
	// together; it counts from the connection's accept. Zero is no age,
	// as grpc-go's keepalive.ServerParameters.MaxConnectionAge.
	MaxConnectionAge time.Duration
	// MaxConnectionAgeGrace, when positive, is how long after its
	// MaxConnectionAge GOAWAY a connection is closed with its calls still
	// in flight; zero waits for them, however long, as grpc-go does.
	MaxConnectionAgeGrace time.Duration
	// Registerer receives the transport's metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// OwnAll makes every connection this server's from its preface on,
	// none handed over: for a conformance suite, whose client waits for
	// its SETTINGS to be acknowledged before its first call.
	OwnAll bool
}

// Server serves connections: Serve accepts them, GoAway starts the
// graceful end, Wait waits for it.
type Server struct {
	cfg Config
	h   Handler

	work      chan job
	startOnce sync.Once
	stopOnce  sync.Once
	calls     sync.WaitGroup
	readers   sync.WaitGroup
	accepting chan struct{} // closed when Serve returns
	stopping  atomic.Bool
	conns     sync.Map // the *conn being read
	open      atomic.Int64
	addrsMu   sync.Mutex
	addrs     map[netip.Addr]int // connections open per peer address
	streams   sync.Pool

	metrics  metrics
	unimplem string // the message of a call of an unknown path
}

// metrics are the transport's series.
type metrics struct {
	open            prometheus.GaugeFunc
	refused         *prometheus.CounterVec
	refusedMax      prometheus.Counter // refused{reason="max_connections"}
	refusedPerAddr  prometheus.Counter // refused{reason="max_connections_per_address"}
	closed          *prometheus.CounterVec
	timeouts        prometheus.Counter // closed{reason="write_timeout"}
	overBound       prometheus.Counter // closed{reason="write_bound"}
	refusedStreams  prometheus.Counter // closed{reason="refused_streams"}
	aged, agedGrace prometheus.Counter // closed{reason="max_age"}, closed{reason="max_age_grace"}
}

// New returns a Server answering calls with h; it registers its metrics
// on cfg.Registerer.
func New(cfg Config, h Handler) (*Server, error) {
	if len(cfg.Paths) == 0 || h == nil {
		return nil, errors.New("h2serve: Paths and a Handler are required")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.ConnectionTimeout, DefaultConnectionTimeout)
	def(&cfg.KeepaliveTime, DefaultKeepaliveTime)
	def(&cfg.KeepaliveTimeout, DefaultKeepaliveTimeout)
	def(&cfg.WriteTimeout, DefaultWriteTimeout)
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.MaxConnections <= 0 {
		cfg.MaxConnections = DefaultMaxConnections
	}
	if cfg.MaxConnectionsPerAddress == 0 {
		cfg.MaxConnectionsPerAddress = DefaultMaxConnectionsPerAddress
	}
	s := &Server{cfg: cfg, h: h, accepting: make(chan struct{}), addrs: make(map[netip.Addr]int)}
	s.streams.New = func() any { return new(stream) }
	s.unimplem = "unknown method: this connection serves " + cfg.Paths[0]
	for i, p := range cfg.Paths[1:] {
		if i == len(cfg.Paths)-2 {
			s.unimplem += " and " + p
		} else {
			s.unimplem += ", " + p
		}
	}
	m := &s.metrics
	m.open = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_rls_connections",
		Help: "Connections of the rate limit service's own transport open now, those handed to grpc-go included.",
	}, func() float64 { return float64(s.open.Load()) })
	m.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_rls_connections_refused_total",
		Help: "Connections the rate limit service closed as soon as accepted: max_connections (serving --rls-max-connections already), max_connections_per_address (serving --rls-max-connections-per-address from the peer's address already).",
	}, []string{"reason"})
	m.refusedMax = m.refused.WithLabelValues("max_connections")
	m.refusedPerAddr = m.refused.WithLabelValues("max_connections_per_address")
	m.closed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_rls_connections_closed_total",
		Help: "Connections the rate limit service ended: write_timeout (a peer that reads nothing, a write blocked for --rls-write-timeout), write_bound (answers waiting past the connection's bound), refused_streams (a peer that keeps opening streams past its limit, GOAWAY ENHANCE_YOUR_CALM), max_age (a GOAWAY at --rls-max-connection-age), max_age_grace (closed with calls in flight --rls-max-connection-age-grace later).",
	}, []string{"reason"})
	m.timeouts = m.closed.WithLabelValues("write_timeout")
	m.overBound = m.closed.WithLabelValues("write_bound")
	m.refusedStreams = m.closed.WithLabelValues("refused_streams")
	m.aged = m.closed.WithLabelValues("max_age")
	m.agedGrace = m.closed.WithLabelValues("max_age_grace")
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{m.open, m.refused, m.closed} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("h2serve: metrics: %w", err)
			}
		}
	}
	return s, nil
}

// Serve serves the connections of ln until Accept fails (ln is closed),
// and returns that error; the connections go on, each until it ends or
// ctx is cancelled. Call it once; Wait waits for what it started.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	defer close(s.accepting)
	s.startOnce.Do(func() {
		s.work = make(chan job)
		for range s.cfg.Workers {
			go func() {
				for j := range s.work {
					j.run()
				}
			}()
		}
	})
	for {
		nc, err := ln.Accept()
		if err != nil {
			return err
		}
		release, ok := s.admit(nc)
		if !ok {
			nc.Close()
			continue
		}
		s.readers.Add(1)
		go func() {
			defer s.readers.Done()
			c := s.newConn(ctx, nc)
			c.release = release
			s.conns.Store(c, struct{}{})
			defer s.conns.Delete(c)
			c.serve()
		}()
	}
}

// admit counts a connection just accepted among those open, in all and
// from its peer's address, and returns what uncounts it once it closes;
// a connection past MaxConnections or MaxConnectionsPerAddress is not
// admitted, and counted as refused.
func (s *Server) admit(nc net.Conn) (release func(), ok bool) {
	if s.open.Add(1) > int64(s.cfg.MaxConnections) {
		s.open.Add(-1)
		s.metrics.refusedMax.Inc()
		return nil, false
	}
	ta, isTCP := nc.RemoteAddr().(*net.TCPAddr)
	if !isTCP || s.cfg.MaxConnectionsPerAddress < 0 {
		return func() { s.open.Add(-1) }, true
	}
	a := ta.AddrPort().Addr().Unmap()
	s.addrsMu.Lock()
	defer s.addrsMu.Unlock()
	if s.addrs[a] >= s.cfg.MaxConnectionsPerAddress {
		s.open.Add(-1)
		s.metrics.refusedPerAddr.Inc()
		return nil, false
	}
	s.addrs[a]++
	return func() {
		s.open.Add(-1)
		s.addrsMu.Lock()
		defer s.addrsMu.Unlock()
		if s.addrs[a]--; s.addrs[a] <= 0 {
			delete(s.addrs, a)
		}
	}, true
}

// GoAway starts the graceful end of every connection, and of those still
// to be read: a GOAWAY, no new streams, and the connection closes once
// its calls are answered.
func (s *Server) GoAway() {
	s.stopping.Store(true)
	s.conns.Range(func(c, _ any) bool { c.(*conn).goAway(nil); return true })
}

// Wait waits, once Serve has returned, for every connection it read and
// every call to end, then stops the workers.
func (s *Server) Wait() {
	<-s.accepting
	s.readers.Wait()
	s.calls.Wait()
	s.stopOnce.Do(func() {
		if s.work != nil {
			close(s.work)
		}
	})
}

// The transport's receive windows, for a server that is to compare with
// it on the same terms.
const (
	// StreamWindow is the receive window of each stream: a request is at
	// most this long.
	StreamWindow = streamWindow
	// ConnWindow is each connection's receive window.
	ConnWindow = connWindow
)
