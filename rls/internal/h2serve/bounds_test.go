package h2serve

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/sluice-rl/sluice/internal/testwait"
)

// The transport's bounds against misbehaving peers on real TCP
// connections: each test's client sends what it likes and reads nothing.

// smallBuffers is a listener whose connections have a small kernel send
// buffer, so that a peer that reads nothing blocks the transport's writes
// after kilobytes rather than megabytes.
type smallBuffers struct{ net.Listener }

func (l smallBuffers) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetWriteBuffer(4096)
	}
	return nc, err
}

// tcpServer serves h on a loopback listener of small buffers, its metrics
// on a registry of its own, until the test ends.
func tcpServer(t *testing.T, cfg Config, h *testHandler) (*Server, string, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	s, _ := transportServer(t, cfg, h)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, smallBuffers{ln}) }()
	t.Cleanup(func() {
		ln.Close()
		s.GoAway()
		cancel()
		if err := <-done; !errors.Is(err, net.ErrClosed) {
			t.Errorf("Serve = %v, want net.ErrClosed", err)
		}
		waited := make(chan struct{})
		go func() { s.Wait(); close(waited) }()
		waitClosed(t, waited, "the server's connections and calls")
	})
	return s, ln.Addr().String(), reg
}

// metricValue is the value of the series of name with the label pairs
// given in reg; 0 when there is none.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					found = found || lp.GetName() == labels[i] && lp.GetValue() == labels[i+1]
				}
				if !found {
					continue metrics
				}
			}
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// rawClient is a TCP client that sends the preface, a SETTINGS frame and
// calls, and never reads: its receive buffer is small, so the transport's
// answers soon wait on it.
type rawClient struct {
	nc   net.Conn
	fr   *http2.Framer
	enc  *hpack.Encoder
	hbuf bytes.Buffer
	next uint32
}

// dialRaw connects to addr; window opens the connection's and every
// stream's send window of the server wide, so that answers wait on TCP
// rather than on flow control.
func dialRaw(t *testing.T, addr string, window bool) *rawClient {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	nc.(*net.TCPConn).SetReadBuffer(4096)
	t.Cleanup(func() { nc.Close() })
	c := &rawClient{nc: nc, fr: http2.NewFramer(nc, nil), next: 1}
	c.enc = hpack.NewEncoder(&c.hbuf)
	if _, err := nc.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	var ss []http2.Setting
	if window {
		ss = append(ss, http2.Setting{ID: http2.SettingInitialWindowSize, Val: maxWindow})
	}
	if err := c.fr.WriteSettings(ss...); err != nil {
		t.Fatal(err)
	}
	if window {
		if err := c.fr.WriteWindowUpdate(0, maxWindow-65535); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// calls sends n calls of path Paths[0]; it stops at the first write
// that fails (the server closed the connection) and returns its error.
func (c *rawClient) calls(n int) error {
	for range n {
		c.hbuf.Reset()
		for _, kv := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", pathShouldRateLimit}, {":authority", "rls"}, {"content-type", "application/grpc"}} {
			c.enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
		}
		id := c.next
		c.next += 2
		c.nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
		if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true}); err != nil {
			return err
		}
		if err := c.fr.WriteData(id, true, rlsMessage(nil)); err != nil {
			return err
		}
	}
	return nil
}

// callsEnded reports, once every call s has dispatched has ended (its
// worker free), true; it is to be called once no new call can start.
func callsEnded(s *Server) func() bool {
	done := make(chan struct{})
	go func() { s.calls.Wait(); close(done) }()
	return func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	}
}

// TestMaxConnections serves two connections on a server of at most two:
// a third is closed as soon as it is accepted, and counted; once one of
// the two ends, a new one is served.
func TestMaxConnections(t *testing.T) {
	_, addr, reg := tcpServer(t, Config{MaxConnections: 2}, nil)
	a := dialRaw(t, addr, false)
	dialRaw(t, addr, false)
	testwait.For(t, 30*time.Second, "two connections served", func() bool {
		return metricValue(t, reg, "sluice_rls_connections") == 2
	})
	// firstRead is what a new connection reads first: the server's
	// SETTINGS frame, or the error of a connection closed at once.
	firstRead := func() (http2.Frame, error) {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		nc.SetReadDeadline(time.Now().Add(30 * time.Second))
		return http2.NewFramer(nil, nc).ReadFrame()
	}
	if f, err := firstRead(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a third connection read %v, %v; want it closed at once", f, err)
	}
	if n := metricValue(t, reg, "sluice_rls_connections_refused_total", "reason", "max_connections"); n != 1 {
		t.Errorf("sluice_rls_connections_refused_total{reason=max_connections} = %v, want 1", n)
	}
	a.nc.Close()
	testwait.For(t, 30*time.Second, "the closed connection to be forgotten", func() bool {
		return metricValue(t, reg, "sluice_rls_connections") == 1
	})
	if f, err := firstRead(); err != nil || f.Header().Type != http2.FrameSettings {
		t.Errorf("a connection after one closed read %v, %v; want the server's SETTINGS", f, err)
	}
}

// TestWriteTimeout has a peer send calls whose answers it never reads:
// the write that blocks ends at the write deadline, long before the
// keepalive's, the connection is closed and counted, and the worker that
// wrote is free.
func TestWriteTimeout(t *testing.T) {
	const long = time.Hour
	h := &testHandler{size: 16 << 10}
	s, addr, reg := tcpServer(t, Config{WriteTimeout: 200 * time.Millisecond, KeepaliveTime: long, KeepaliveTimeout: long}, h)
	c := dialRaw(t, addr, true)
	go c.calls(64) // 1 MiB of answers: far more than the sockets hold
	testwait.For(t, 30*time.Second, "the connection closed on its write deadline", func() bool {
		return metricValue(t, reg, "sluice_rls_connections_closed_total", "reason", "write_timeout") == 1
	})
	testwait.For(t, 30*time.Second, "the connection forgotten", func() bool {
		return metricValue(t, reg, "sluice_rls_connections") == 0
	})
	testwait.For(t, 30*time.Second, "its calls' workers free", callsEnded(s)) // no call starts on a connection forgotten
	if n := metricValue(t, reg, "sluice_rls_connections_closed_total", "reason", "write_bound"); n != 0 {
		t.Errorf("closed for its write bound %v times, want 0", n)
	}
}

// TestWriteBound has a peer make calls that are all in flight at once,
// their answers (16 KiB each, 6.4 MiB in all) then added together while
// the peer reads nothing, either on TCP or by giving no flow control
// window: past maxQueued bytes waiting, the connection is closed and
// counted, long before any write deadline.
func TestWriteBound(t *testing.T) {
	const long = time.Hour
	for _, tt := range []struct {
		name   string
		window bool
	}{{"socket full", true}, {"no window", false}} {
		t.Run(tt.name, func(t *testing.T) {
			h := &testHandler{size: 16 << 10, release: make(chan struct{})}
			s, addr, reg := tcpServer(t, Config{WriteTimeout: long, KeepaliveTime: long, KeepaliveTimeout: long}, h)
			c := dialRaw(t, addr, tt.window)
			const n = 400
			if err := c.calls(n); err != nil {
				t.Fatal(err)
			}
			testwait.For(t, 30*time.Second, "every call in flight", func() bool { return h.now.Load() == n })
			close(h.release)
			testwait.For(t, 30*time.Second, "the connection closed on its write bound", func() bool {
				return metricValue(t, reg, "sluice_rls_connections_closed_total", "reason", "write_bound") == 1
			})
			testwait.For(t, 30*time.Second, "the connection forgotten", func() bool {
				return metricValue(t, reg, "sluice_rls_connections") == 0
			})
			testwait.For(t, 30*time.Second, "its calls' workers free", callsEnded(s)) // no call starts on a connection forgotten
		})
	}
}

// TestLingeringClose sends a call, then a GOAWAY followed by more bytes
// than the transport reads at once (PINGs): the transport closes on the
// GOAWAY, and the peer reads everything up to a clean end of stream,
// not a reset that unread bytes would have made of the close.
func TestLingeringClose(t *testing.T) {
	_, addr, _ := tcpServer(t, Config{}, nil)
	c := dialRaw(t, addr, false)
	if err := c.calls(1); err != nil {
		t.Fatal(err)
	}
	var after bytes.Buffer
	fr := http2.NewFramer(&after, nil)
	fr.WriteGoAway(0, http2.ErrCodeNo, nil)
	for after.Len() < 48<<10 {
		fr.WritePing(false, [8]byte{'l', 'i', 'n', 'g', 'e', 'r'})
	}
	// The call's answer first, so that the GOAWAY finds the connection
	// idle and ends it at once.
	rd := http2.NewFramer(nil, c.nc)
	c.nc.SetReadDeadline(time.Now().Add(30 * time.Second))
	for {
		f, err := rd.ReadFrame()
		if err != nil {
			t.Fatalf("reading the call's answer: %v", err)
		}
		if f.Header().Type == http2.FrameHeaders && f.Header().Flags.Has(http2.FlagHeadersEndStream) {
			break
		}
	}
	if _, err := c.nc.Write(after.Bytes()); err != nil {
		t.Fatal(err)
	}
	_, err := io.Copy(io.Discard, c.nc)
	if err != nil {
		t.Errorf("the connection ended with %v, want a clean end of stream", err)
	}
}

// firstRead is what a new connection to addr from the loopback address
// from reads first: the server's SETTINGS frame, or the error of a
// connection closed at once.
func firstRead(t *testing.T, addr, from string) (http2.Frame, error) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetReadDeadline(time.Now().Add(30 * time.Second))
	return http2.NewFramer(nil, nc).ReadFrame()
}

// TestMaxConnectionsPerAddress serves two connections from one address
// on a server of at most two per address: a third from that address is
// closed as soon as it is accepted, and counted, while one from another
// address is served; once one of the two ends, a new one is served.
func TestMaxConnectionsPerAddress(t *testing.T) {
	_, addr, reg := tcpServer(t, Config{MaxConnectionsPerAddress: 2}, nil)
	a := dialRaw(t, addr, false) // from 127.0.0.1
	dialRaw(t, addr, false)
	testwait.For(t, 30*time.Second, "two connections served", func() bool {
		return metricValue(t, reg, "sluice_rls_connections") == 2
	})
	if f, err := firstRead(t, addr, "127.0.0.1"); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a third connection from 127.0.0.1 read %v, %v; want it closed at once", f, err)
	}
	if n := metricValue(t, reg, "sluice_rls_connections_refused_total", "reason", "max_connections_per_address"); n != 1 {
		t.Errorf("sluice_rls_connections_refused_total{reason=max_connections_per_address} = %v, want 1", n)
	}
	if f, err := firstRead(t, addr, "127.0.0.2"); err != nil || f.Header().Type != http2.FrameSettings {
		t.Errorf("a connection from 127.0.0.2 read %v, %v; want the server's SETTINGS", f, err)
	}
	a.nc.Close()
	testwait.For(t, 30*time.Second, "the closed connection to be forgotten", func() bool {
		return metricValue(t, reg, "sluice_rls_connections") == 2
	})
	if f, err := firstRead(t, addr, "127.0.0.1"); err != nil || f.Header().Type != http2.FrameSettings {
		t.Errorf("a connection from 127.0.0.1 after one closed read %v, %v; want the server's SETTINGS", f, err)
	}
	if n := metricValue(t, reg, "sluice_rls_connections_refused_total", "reason", "max_connections"); n != 0 {
		t.Errorf("refused for --rls-max-connections %v times, want 0", n)
	}
}

// readingClient is a client of dialRaw that reads the server's frames,
// its header blocks decoded.
type readingClient struct {
	*rawClient
	rd *http2.Framer
}

func newReadingClient(t *testing.T, addr string) *readingClient {
	c := &readingClient{rawClient: dialRaw(t, addr, false)}
	c.rd = http2.NewFramer(nil, c.nc)
	c.rd.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	return c
}

// next reads the next frame but SETTINGS, PING and WINDOW_UPDATE; it
// returns the error of a connection that ended. The deadline is a hang,
// not a bound of the test.
func (c *readingClient) next() (http2.Frame, error) {
	c.nc.SetReadDeadline(time.Now().Add(30 * time.Second))
	for {
		f, err := c.rd.ReadFrame()
		if err != nil {
			return nil, err
		}
		switch f.(type) {
		case *http2.SettingsFrame, *http2.PingFrame, *http2.WindowUpdateFrame:
			continue
		}
		return f, nil
	}
}

// TestMaxConnectionAge makes a call that its handler holds past the
// connection's age: the server sends a GOAWAY naming the call's stream,
// the call is answered when its handler ends, and the connection closes
// then; with a grace shorter than the call, the connection is closed at
// the grace's end, the call unanswered.
func TestMaxConnectionAge(t *testing.T) {
	const age = 200 * time.Millisecond
	for _, tt := range []struct {
		name  string
		grace time.Duration
	}{{"graceful", time.Hour}, {"past the grace", 300 * time.Millisecond}} {
		t.Run(tt.name, func(t *testing.T) {
			h := &testHandler{release: make(chan struct{})}
			_, addr, reg := tcpServer(t, Config{MaxConnectionAge: age, MaxConnectionAgeGrace: tt.grace}, h)
			released := false
			release := func() {
				if !released {
					released = true
					close(h.release)
				}
			}
			t.Cleanup(release) // before the server's cleanup waits for the call
			c := newReadingClient(t, addr)
			if err := c.calls(1); err != nil {
				t.Fatal(err)
			}
			testwait.For(t, 30*time.Second, "the call in flight", func() bool { return h.now.Load() == 1 })
			f, err := c.next()
			if err != nil {
				t.Fatalf("reading the GOAWAY: %v", err)
			}
			if ga, ok := f.(*http2.GoAwayFrame); !ok || ga.ErrCode != http2.ErrCodeNo || ga.LastStreamID != 1 {
				t.Fatalf("read %v, want a GOAWAY NO_ERROR of last stream 1", f)
			}
			if n := metricValue(t, reg, "sluice_rls_connections_closed_total", "reason", "max_age"); n != 1 {
				t.Errorf("closed{reason=max_age} = %v, want 1", n)
			}
			if tt.grace > time.Minute {
				release()
				assertAnswered(t, c)
			}
			if f, err := c.next(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("read %v, %v; want the connection closed", f, err)
			}
			want := 0.0
			if tt.grace < time.Minute {
				want = 1
			}
			if n := metricValue(t, reg, "sluice_rls_connections_closed_total", "reason", "max_age_grace"); n != want {
				t.Errorf("closed{reason=max_age_grace} = %v, want %v", n, want)
			}
		})
	}
}

// assertAnswered reads the answer of stream 1, a grpc-status 0.
func assertAnswered(t *testing.T, c *readingClient) {
	t.Helper()
	for {
		f, err := c.next()
		if err != nil {
			t.Fatalf("reading the call's answer: %v", err)
		}
		mh, ok := f.(*http2.MetaHeadersFrame)
		if !ok || !mh.StreamEnded() {
			continue
		}
		if mh.StreamID != 1 || mh.PseudoValue("status") != "" || headerValue(mh, "grpc-status") != "0" {
			t.Fatalf("trailers %v of stream %d, want grpc-status 0 of stream 1", mh.Fields, mh.StreamID)
		}
		return
	}
}

func headerValue(f *http2.MetaHeadersFrame, name string) string {
	for _, hf := range f.Fields {
		if hf.Name == name {
			return hf.Value
		}
	}
	return ""
}

// TestJitterAge moves an age by up to ±10%, as grpc-go does.
func TestJitterAge(t *testing.T) {
	for _, tt := range []struct {
		age  time.Duration
		n    func(int64) int64
		want time.Duration
	}{
		{time.Hour, func(int64) int64 { return 0 }, 54 * time.Minute},
		{time.Hour, func(m int64) int64 { return m - 1 }, 66 * time.Minute},
		{time.Hour, func(m int64) int64 { return m / 2 }, time.Hour},
		{5 * time.Nanosecond, func(int64) int64 { return 0 }, 5 * time.Nanosecond},
	} {
		if got := jitterAge(tt.age, tt.n); got != tt.want {
			t.Errorf("jitterAge(%v, n) = %v, want %v", tt.age, got, tt.want)
		}
	}
}

// TestRefusedStreams opens and at once resets streams, each a complete
// call whose decision is held, as the "rapid reset" attack does: the
// calls in flight stop at maxStreams, and the streams refused past them
// end the connection, GOAWAY ENHANCE_YOUR_CALM, after maxRefused.
func TestRefusedStreams(t *testing.T) {
	fd := &testHandler{release: make(chan struct{})}
	reg := prometheus.NewRegistry()
	s, _ := transportServer(t, Config{Registerer: reg}, fd)
	p := startPeer(t, s, nil)
	t.Cleanup(func() { close(fd.release) }) // before the peer's cleanup waits for the calls
	var err error
	for i := 0; i < maxStreams+maxRefused+1 && err == nil; i++ {
		id := p.next
		p.next += 2
		// As p.call, but the writes fail once the server closes.
		err = p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: p.block(pathShouldRateLimit), EndHeaders: true})
		if err == nil {
			err = p.fr.WriteData(id, true, rlsMessage(t))
		}
		if err == nil {
			err = p.fr.WriteRSTStream(id, http2.ErrCodeCancel)
		}
	}
	if code := p.goAwayOf(); code != http2.ErrCodeEnhanceYourCalm {
		t.Errorf("GOAWAY %v, want ENHANCE_YOUR_CALM", code)
	}
	if n := fd.highest.Load(); n > maxStreams {
		t.Errorf("%d decisions in flight at most, want at most maxStreams = %d", n, maxStreams)
	}
	if n := metricValue(t, reg, "sluice_rls_connections_closed_total", "reason", "refused_streams"); n != 1 {
		t.Errorf("closed{reason=refused_streams} = %v, want 1", n)
	}
}

// TestGoAwayWaitsForRequests opens a stream whose request has not all
// arrived when the server sends its GOAWAY (at a connection's age, or on
// shutdown): the GOAWAY covers the stream, so the rest of the request is
// read and the call answered before the connection closes. grpc-go's
// client failed such a call (UNAVAILABLE, EOF after a GOAWAY) when the
// connection closed as soon as no call was running.
func TestGoAwayWaitsForRequests(t *testing.T) {
	s, _ := transportServer(t, Config{}, nil)
	p := startPeer(t, s, nil)
	p.trailersOf(p.call()) // the connection is the transport's
	id := p.next
	p.next += 2
	if err := p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: p.block(pathShouldRateLimit), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	if err := p.fr.WritePing(false, [8]byte{'h', 'e', 'a', 'd', 'e', 'r', 's'}); err != nil {
		t.Fatal(err)
	}
	p.await("the ping's answer", func(f frame) bool { return f.typ == http2.FramePing && f.flags.Has(http2.FlagPingAck) })
	p.c.goAway(nil) // as Server.GoAway and a connection's age do
	p.await("the GOAWAY", func(f frame) bool { return f.typ == http2.FrameGoAway })
	if err := p.fr.WriteData(id, true, rlsMessage(t)); err != nil {
		t.Fatal(err)
	}
	if f := p.trailersOf(id); f.fields["grpc-status"] != "0" {
		t.Errorf("the call covered by the GOAWAY = %v, want grpc-status 0", f.fields)
	}
	p.awaitEnd()
}
