package h2serve

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-rl/sluice/internal/testwait"
)

func TestParseTimeout(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want string
		ok   bool
	}{{"5S", "5s", true}, {"20m", "20ms", true}, {"99999999H", "2562047h47m16.854775807s", true}, {"1", "0s", false}, {"-1S", "0s", false}, {"1x", "0s", false}} {
		got, ok := parseTimeout(tt.in)
		if got.String() != tt.want || ok != tt.ok {
			t.Errorf("parseTimeout(%q) = %v, %v, want %s, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

// TestHPACKTable decodes the answers' header blocks with x/net's HPACK
// decoder while the peer's table size changes: the fields read back are
// those sent, and once in the table each takes one byte.
func TestHPACKTable(t *testing.T) {
	var tab hpackTable
	var got []string
	dec := hpack.NewDecoder(4096, func(f hpack.HeaderField) { got = append(got, f.Name+": "+f.Value) })
	name := map[int]string{fieldContentType: "content-type: application/grpc", fieldGRPCStatusOK: "grpc-status: 0"}
	for i, step := range []struct {
		limit  int // the peer's new SETTINGS_HEADER_TABLE_SIZE; -1 for none
		fields []int
		max    int // bytes of the block at most
	}{
		{-1, []int{fieldContentType}, 100},
		{-1, []int{fieldGRPCStatusOK}, 100},
		{-1, []int{fieldContentType}, 1},
		{-1, []int{fieldGRPCStatusOK}, 1},
		{0, []int{fieldContentType, fieldGRPCStatusOK}, 100},
		{-1, []int{fieldContentType, fieldGRPCStatusOK}, 100},
		{4096, []int{fieldGRPCStatusOK, fieldContentType}, 100},
		{-1, []int{fieldContentType, fieldGRPCStatusOK}, 2},
	} {
		if step.limit >= 0 {
			tab.setLimit(uint32(step.limit))
			dec.SetAllowedMaxDynamicTableSize(uint32(step.limit))
		}
		b := tab.begin(nil)
		var want []string
		for _, f := range step.fields {
			b = tab.appendField(b, f)
			want = append(want, name[f])
		}
		got = got[:0]
		if _, err := dec.Write(b); err != nil {
			t.Fatalf("step %d: decoding %x: %v", i, b, err)
		}
		if err := dec.Close(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if strings.Join(got, ", ") != strings.Join(want, ", ") {
			t.Errorf("step %d: decoded %v, want %v", i, got, want)
		}
		if len(b) > step.max {
			t.Errorf("step %d: block of %d bytes (%x), want at most %d", i, len(b), b, step.max)
		}
	}
}

// The transport against hostile and broken peers: each test drives one
// connection with a raw HTTP/2 framer and checks a bound.

// The paths the test servers serve, those of the rate limit service.
const (
	pathShouldRateLimit = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
	pathHealthCheck     = "/grpc.health.v1.Health/Check"
)

// testHandler answers every call with a message of size bytes (5 when
// zero), each held until release is closed when release is set; it
// counts the calls it holds.
type testHandler struct {
	release      chan struct{}
	size         int
	now, highest atomic.Int64
}

func (h *testHandler) Answer(ctx context.Context, c *Call) error {
	if len(c.Message) == 0 && c.Method == 0 {
		return status.Error(codes.Internal, "an empty request")
	}
	if h.release != nil {
		n := h.now.Add(1)
		for {
			m := h.highest.Load()
			if n <= m || h.highest.CompareAndSwap(m, n) {
				break
			}
		}
		<-h.release
		defer h.now.Add(-1)
	}
	size := h.size
	if size == 0 {
		size = 5
	}
	c.Out = append(c.Out, bytes.Repeat([]byte{'a'}, size)...)
	return nil
}

// transportServer is a Server of the test paths whose connections the
// test serves itself, with newConn; its handovers are counted and closed.
// A nil h answers at once.
func transportServer(t testing.TB, cfg Config, h *testHandler) (*Server, *atomic.Int32) {
	t.Helper()
	if h == nil {
		h = &testHandler{}
	}
	var handed atomic.Int32
	cfg.Paths = []string{pathShouldRateLimit, pathHealthCheck}
	cfg.HandOver = func(nc net.Conn) error { handed.Add(1); return nc.Close() }
	s, err := New(cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	return s, &handed
}

// frame is what the tests read of a frame the transport wrote.
type frame struct {
	typ    http2.FrameType
	flags  http2.Flags
	stream uint32
	code   http2.ErrCode // of RST_STREAM and GOAWAY
	data   []byte        // of PING and DATA
	fields map[string]string
}

// peer is the client end of a connection the transport serves.
type peer struct {
	t      *testing.T
	nc     net.Conn
	fr     *http2.Framer
	enc    *hpack.Encoder
	hbuf   bytes.Buffer
	frames chan frame // closed when the connection ends
	c      *conn
	done   chan struct{} // closed when serve returns
	next   uint32        // the next stream id
}

// startPeer serves one end of a pipe with s and returns the other, the
// preface and an empty SETTINGS sent. A nil server is wrapped as srv
// wants; srv is the net.Conn the transport serves, given the pipe's end.
func startPeer(t *testing.T, s *Server, srv func(net.Conn) net.Conn) *peer {
	t.Helper()
	a, b := net.Pipe()
	if srv != nil {
		b = srv(b)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &peer{t: t, nc: a, fr: http2.NewFramer(a, a), frames: make(chan frame, 1<<16), done: make(chan struct{}), next: 1}
	p.enc = hpack.NewEncoder(&p.hbuf)
	p.c = s.newConn(ctx, b)
	go func() { defer close(p.done); p.c.serve() }()
	go p.readAll()
	t.Cleanup(func() {
		cancel()
		a.Close()
		waitClosed(t, p.done, "the connection's reader")
		calls := make(chan struct{})
		go func() { s.calls.Wait(); close(calls) }()
		waitClosed(t, calls, "the connection's calls")
	})
	if _, err := a.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	if err := p.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return p
}

// waitClosed waits for ch to close; ten seconds is a hang, not a bound
// of the test.
func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not end", what)
	}
}

func (p *peer) readAll() {
	defer close(p.frames)
	fr := http2.NewFramer(nil, p.nc)
	dec := hpack.NewDecoder(4096, nil)
	fr.ReadMetaHeaders = dec
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		out := frame{typ: f.Header().Type, flags: f.Header().Flags, stream: f.Header().StreamID}
		switch f := f.(type) {
		case *http2.RSTStreamFrame:
			out.code = f.ErrCode
		case *http2.GoAwayFrame:
			out.code = f.ErrCode
		case *http2.PingFrame:
			out.data = append([]byte(nil), f.Data[:]...)
		case *http2.DataFrame:
			out.data = append([]byte(nil), f.Data()...)
		case *http2.MetaHeadersFrame:
			out.typ = http2.FrameHeaders
			out.fields = map[string]string{}
			for _, hf := range f.Fields {
				out.fields[hf.Name] = hf.Value
			}
		}
		p.frames <- out
	}
}

// await reads frames until one satisfies ok, failing when the
// connection ends first.
func (p *peer) await(what string, ok func(frame) bool) frame {
	p.t.Helper()
	for {
		select {
		case f, open := <-p.frames:
			if !open {
				p.t.Fatalf("the connection ended before %s", what)
			}
			if ok(f) {
				return f
			}
		case <-time.After(10 * time.Second):
			p.t.Fatalf("no %s", what)
		}
	}
}

// awaitEnd reads frames until the connection ends and returns them.
func (p *peer) awaitEnd() []frame {
	p.t.Helper()
	var fs []frame
	for {
		select {
		case f, open := <-p.frames:
			if !open {
				return fs
			}
			fs = append(fs, f)
		case <-time.After(10 * time.Second):
			p.t.Fatalf("the connection did not end")
		}
	}
}

// block is the header block of a call of path, with the extra fields.
func (p *peer) block(path string, extra ...string) []byte {
	p.hbuf.Reset()
	fields := append([]string{":method", "POST", ":scheme", "http", ":path", path, ":authority", "rls", "content-type", "application/grpc", "te", "trailers"}, extra...)
	for i := 0; i+1 < len(fields); i += 2 {
		if err := p.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]}); err != nil {
			p.t.Fatal(err)
		}
	}
	return append([]byte(nil), p.hbuf.Bytes()...)
}

// rlsMessage is a gRPC message of a request, with its length prefix.
func rlsMessage(t testing.TB) []byte {
	b := []byte("\x0a\x01d\x12\x08\x0a\x06\x0a\x01k\x12\x01v") // a RateLimitRequest
	return append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(b))), b...)
}

// call sends a ShouldRateLimit call and returns its stream.
func (p *peer) call() uint32 {
	p.t.Helper()
	id := p.next
	p.next += 2
	if err := p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: p.block(pathShouldRateLimit), EndHeaders: true}); err != nil {
		p.t.Fatal(err)
	}
	if err := p.fr.WriteData(id, true, rlsMessage(p.t)); err != nil {
		p.t.Fatal(err)
	}
	return id
}

// trailersOf waits for the trailers of stream id.
func (p *peer) trailersOf(id uint32) frame {
	p.t.Helper()
	return p.await(fmt.Sprintf("trailers of stream %d", id), func(f frame) bool {
		return f.typ == http2.FrameHeaders && f.stream == id && f.flags.Has(http2.FlagHeadersEndStream)
	})
}

// TestTransportRapidReset opens and at once resets many more streams than
// maxStreams, each a complete call whose decision is held: the calls in
// flight never pass maxStreams, the streams beyond are refused, and once
// the decisions end the connection serves calls again.
func TestTransportRapidReset(t *testing.T) {
	fd := &testHandler{release: make(chan struct{})}
	s, _ := transportServer(t, Config{}, fd)
	p := startPeer(t, s, nil)
	first := p.call()
	const opened = 4 * maxStreams
	for range opened {
		id := p.call()
		if err := p.fr.WriteRSTStream(id, http2.ErrCodeCancel); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.fr.WritePing(false, [8]byte{'d', 'o', 'n', 'e'}); err != nil {
		t.Fatal(err)
	}
	// Frames are handled in order: once the ping is answered, every
	// stream has been opened, refused or reset.
	refused := 0
	p.await("the ping's answer", func(f frame) bool {
		if f.typ == http2.FrameRSTStream && f.code == http2.ErrCodeRefusedStream {
			refused++
		}
		return f.typ == http2.FramePing && f.flags.Has(http2.FlagPingAck)
	})
	if n := fd.highest.Load(); n > maxStreams {
		t.Errorf("%d decisions in flight at most, want at most maxStreams = %d", n, maxStreams)
	}
	if want := opened + 1 - maxStreams; refused < want {
		t.Errorf("%d streams refused, want at least %d", refused, want)
	}
	close(fd.release)
	if f := p.trailersOf(first); f.fields["grpc-status"] != "0" {
		t.Errorf("the first call = %v, want grpc-status 0", f.fields)
	}
	testwait.For(t, 10*time.Second, "the reset calls to end", func() bool {
		p.c.mu.Lock()
		defer p.c.mu.Unlock()
		return len(p.c.streams) == 0 && p.c.active == 0
	})
	if f := p.trailersOf(p.call()); f.fields["grpc-status"] != "0" {
		t.Errorf("a call after the resets = %v, want grpc-status 0", f.fields)
	}
}

// gatedConn is the transport's end of a pipe whose writes block, once
// shut is called, until open is: a peer that stops reading.
type gatedConn struct {
	net.Conn
	shut     atomic.Bool
	gate     chan struct{}
	blocked  atomic.Int32 // writes waiting at the gate
	mu       sync.Mutex
	maxWrite int // the longest write once shut
}

func (g *gatedConn) Write(b []byte) (int, error) {
	if g.shut.Load() {
		g.mu.Lock()
		g.maxWrite = max(g.maxWrite, len(b))
		g.mu.Unlock()
		g.blocked.Add(1)
		<-g.gate
	}
	return g.Conn.Write(b)
}

// TestTransportUnreadAnswers floods a connection whose peer has stopped
// reading, with a write of an answer blocked: pings, settings and calls
// that are answered at once. The transport stops reading the flood once
// maxWriteBuffer bytes wait, and every write it then makes is at most
// that and one frame; all is answered once the peer reads again.
func TestTransportUnreadAnswers(t *testing.T) {
	const flood = 20000
	for _, tt := range []struct {
		name string
		send func(p *peer) error
		// answers is the frame answering one of the flood.
		answers func(frame) bool
	}{
		{"ping", func(p *peer) error { return p.fr.WritePing(false, [8]byte{1}) },
			func(f frame) bool { return f.typ == http2.FramePing && f.flags.Has(http2.FlagPingAck) }},
		{"settings", func(p *peer) error { return p.fr.WriteSettings() },
			func(f frame) bool { return f.typ == http2.FrameSettings && f.flags.Has(http2.FlagSettingsAck) }},
		{"unknown method", func(p *peer) error {
			id := p.next
			p.next += 2
			return p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: p.block("/x.Y/Z"), EndHeaders: true, EndStream: true})
		}, func(f frame) bool { return f.typ == http2.FrameHeaders && f.fields["grpc-status"] == "12" }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fd := &testHandler{release: make(chan struct{})}
			s, _ := transportServer(t, Config{}, fd)
			g := &gatedConn{gate: make(chan struct{})}
			p := startPeer(t, s, func(nc net.Conn) net.Conn { g.Conn = nc; return g })
			p.trailersOf(func() uint32 { close(fd.release); return p.call() }())
			// The peer stops reading; a call's answer is the write that
			// blocks.
			fd.release = make(chan struct{})
			g.shut.Store(true)
			held := p.call()
			testwait.For(t, 10*time.Second, "the call to be decided", func() bool { return fd.now.Load() == 1 })
			close(fd.release)
			testwait.For(t, 10*time.Second, "the answer's write to block", func() bool { return g.blocked.Load() == 1 })
			sent := make(chan error, 1)
			go func() {
				for range flood {
					if err := tt.send(p); err != nil {
						sent <- err
						return
					}
				}
				sent <- nil
			}()
			testwait.For(t, 10*time.Second, "the transport to stop reading", func() bool {
				select {
				case err := <-sent:
					t.Fatalf("the whole flood was read with a write blocked (%v)", err)
				default:
				}
				p.c.mu.Lock()
				defer p.c.mu.Unlock()
				return p.c.stalls > 0
			})
			close(g.gate)
			if err := <-sent; err != nil {
				t.Fatal(err)
			}
			n, answered := 0, false
			p.await("every answer to the flood and the call's", func(f frame) bool {
				if tt.answers(f) {
					n++
				}
				if f.typ == http2.FrameHeaders && f.stream == held && f.flags.Has(http2.FlagHeadersEndStream) {
					answered = true
				}
				return n == flood && answered
			})
			g.mu.Lock()
			defer g.mu.Unlock()
			// One frame over: the one that passed the limit. The blocked
			// answer's frames are added once.
			if bound := maxWriteBuffer + 512; g.maxWrite > bound {
				t.Errorf("a write of %d bytes, want at most %d", g.maxWrite, bound)
			}
		})
	}
}

// goAwayOf waits for the connection to end and returns its GOAWAY's
// code; the test fails if it sent none.
func (p *peer) goAwayOf() http2.ErrCode {
	p.t.Helper()
	for _, f := range p.awaitEnd() {
		if f.typ == http2.FrameGoAway {
			return f.code
		}
	}
	p.t.Fatal("the connection ended without a GOAWAY")
	return 0
}

// TestTransportWindowOverflow sends WINDOW_UPDATEs and SETTINGS that take
// a send window past 2^31-1: a FLOW_CONTROL_ERROR of the connection, or
// of the stream alone for a stream's window.
func TestTransportWindowOverflow(t *testing.T) {
	s, _ := transportServer(t, Config{}, nil)
	open := func(p *peer) uint32 { // a stream whose request goes on
		p.trailersOf(p.call())
		id := p.next
		p.next += 2
		if err := p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: p.block(pathShouldRateLimit), EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
		return id
	}
	t.Run("connection", func(t *testing.T) {
		p := startPeer(t, s, nil)
		p.trailersOf(p.call())
		// The window is 65535 less the answer sent; 2^31-1 takes it past.
		if err := p.fr.WriteWindowUpdate(0, maxWindow); err != nil {
			t.Fatal(err)
		}
		if code := p.goAwayOf(); code != http2.ErrCodeFlowControl {
			t.Errorf("GOAWAY %v, want FLOW_CONTROL_ERROR", code)
		}
	})
	t.Run("connection before the first call", func(t *testing.T) {
		p := startPeer(t, s, nil)
		if err := p.fr.WriteWindowUpdate(0, maxWindow-65535+1); err != nil {
			t.Fatal(err)
		}
		if code := p.goAwayOf(); code != http2.ErrCodeFlowControl {
			t.Errorf("GOAWAY %v, want FLOW_CONTROL_ERROR", code)
		}
	})
	t.Run("stream", func(t *testing.T) {
		p := startPeer(t, s, nil)
		id := open(p)
		if err := p.fr.WriteWindowUpdate(id, maxWindow-65535+1); err != nil {
			t.Fatal(err)
		}
		f := p.await("a RST_STREAM", func(f frame) bool { return f.typ == http2.FrameRSTStream })
		if f.stream != id || f.code != http2.ErrCodeFlowControl {
			t.Errorf("RST_STREAM %v of stream %d, want FLOW_CONTROL_ERROR of %d", f.code, f.stream, id)
		}
		if g := p.trailersOf(p.call()); g.fields["grpc-status"] != "0" {
			t.Errorf("a call after = %v, want grpc-status 0", g.fields)
		}
	})
	t.Run("initial window size", func(t *testing.T) {
		p := startPeer(t, s, nil)
		id := open(p)
		if err := p.fr.WriteWindowUpdate(id, maxWindow-65535); err != nil {
			t.Fatal(err)
		}
		if err := p.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 65536}); err != nil {
			t.Fatal(err)
		}
		if code := p.goAwayOf(); code != http2.ErrCodeFlowControl {
			t.Errorf("GOAWAY %v, want FLOW_CONTROL_ERROR", code)
		}
	})
	t.Run("receive window", func(t *testing.T) {
		p := startPeer(t, s, nil)
		p.trailersOf(p.call())
		// A request held open: its bytes stay in the connection's window.
		id := p.next
		p.next += 2
		if err := p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: p.block(pathShouldRateLimit), EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
		chunk := make([]byte, 16384)
		err := error(nil)
		for sent := 0; sent <= connWindow && err == nil; sent += len(chunk) {
			// Over many streams, each under its own window.
			if sent%(streamWindow/2) == 0 && sent > 0 {
				id = p.next
				p.next += 2
				err = p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: p.block(pathShouldRateLimit), EndHeaders: true})
			}
			if err == nil {
				err = p.fr.WriteData(id, false, chunk)
			}
		}
		if code := p.goAwayOf(); code != http2.ErrCodeFlowControl {
			t.Errorf("GOAWAY %v, want FLOW_CONTROL_ERROR", code)
		}
	})
}

// TestTransportHeaderBlocks sends header blocks too long as sent, or as
// decoded: the first end the connection, the second the call alone.
func TestTransportHeaderBlocks(t *testing.T) {
	s, _ := transportServer(t, Config{}, nil)
	start := func(p *peer) uint32 {
		p.trailersOf(p.call())
		id := p.next
		p.next += 2
		if err := p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: p.block(pathShouldRateLimit)}); err != nil {
			t.Fatal(err)
		}
		return id
	}
	for _, tt := range []struct {
		name string
		frag []byte // of each CONTINUATION
	}{
		{"continuations", bytes.Repeat([]byte{0x80 | 2}, 1024)}, // :method GET, again and again
		{"empty continuations", nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := startPeer(t, s, nil)
			id := start(p)
			var err error
			sent := 0
			for ; sent < 4*maxHeaderBlock && err == nil; sent += 9 + len(tt.frag) {
				err = p.fr.WriteContinuation(id, false, tt.frag)
			}
			if code := p.goAwayOf(); code != http2.ErrCodeEnhanceYourCalm {
				t.Errorf("GOAWAY %v, want ENHANCE_YOUR_CALM", code)
			}
			if read := sent; err == nil {
				t.Errorf("all %d bytes of the header block were read, want the connection closed after %d", read, maxHeaderBlock)
			}
		})
	}
	t.Run("decoded", func(t *testing.T) {
		p := startPeer(t, s, nil)
		p.trailersOf(p.call())
		// One field of 4000 bytes in the dynamic table, then a byte
		// that names it, many times: a small block of a large list.
		big := strings.Repeat("a", 4000)
		var extra []string
		for range 1000 {
			extra = append(extra, "x-big", big)
		}
		block := p.block(pathShouldRateLimit, extra...)
		if len(block) > 8000 {
			t.Fatalf("a block of %d bytes; the test wants a small one", len(block))
		}
		id := p.next
		p.next += 2
		if err := p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
		if err := p.fr.WriteData(id, true, rlsMessage(t)); err != nil {
			t.Fatal(err)
		}
		if f := p.trailersOf(id); f.fields["grpc-status"] != strconv.Itoa(int(codes.ResourceExhausted)) {
			t.Errorf("a call of a large header list = %v, want RESOURCE_EXHAUSTED", f.fields)
		}
		if f := p.trailersOf(p.call()); f.fields["grpc-status"] != "0" {
			t.Errorf("a call after = %v, want grpc-status 0", f.fields)
		}
	})
}

// TestTransportTimeouts holds connections open doing nothing, on servers
// of short timeouts (and long ones for what the case does not test): a
// connection without its preface or first SETTINGS, or in the middle of
// a header block, is closed; one idle after a call is pinged, and closed
// if it does not answer; one idle before any call is handed to grpc-go.
func TestTransportTimeouts(t *testing.T) {
	const short, long = 20 * time.Millisecond, time.Hour
	preface := Config{ConnectionTimeout: short, KeepaliveTime: long, KeepaliveTimeout: long}
	// raw is a connection whose peer sends what it is given, not the
	// preface and SETTINGS.
	raw := func(t *testing.T, s *Server, sent []byte) *peer {
		a, b := net.Pipe()
		p := &peer{t: t, nc: a, fr: http2.NewFramer(a, a), frames: make(chan frame, 64), done: make(chan struct{}), next: 1}
		p.c = s.newConn(context.Background(), b)
		go func() { defer close(p.done); p.c.serve() }()
		go p.readAll()
		t.Cleanup(func() { a.Close(); waitClosed(t, p.done, "the connection's reader") })
		if _, err := a.Write(sent); err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Run("nothing", func(t *testing.T) {
		s, _ := transportServer(t, preface, nil)
		raw(t, s, nil).awaitEnd()
	})
	t.Run("preface only", func(t *testing.T) {
		s, _ := transportServer(t, preface, nil)
		raw(t, s, []byte(http2.ClientPreface)).awaitEnd()
	})
	t.Run("half a header block", func(t *testing.T) {
		s, _ := transportServer(t, preface, nil)
		p := startPeer(t, s, nil)
		p.trailersOf(p.call())
		if err := p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: p.next, BlockFragment: p.block(pathShouldRateLimit)}); err != nil {
			t.Fatal(err)
		}
		p.awaitEnd()
	})
	t.Run("ping unanswered", func(t *testing.T) {
		s, _ := transportServer(t, Config{ConnectionTimeout: long, KeepaliveTime: short, KeepaliveTimeout: short}, nil)
		p := startPeer(t, s, nil)
		p.trailersOf(p.call())
		p.await("a keepalive ping", func(f frame) bool { return f.typ == http2.FramePing && !f.flags.Has(http2.FlagPingAck) })
		p.awaitEnd()
	})
	t.Run("ping answered", func(t *testing.T) {
		s, _ := transportServer(t, Config{ConnectionTimeout: long, KeepaliveTime: short, KeepaliveTimeout: long}, nil)
		p := startPeer(t, s, nil)
		p.trailersOf(p.call())
		for range 3 {
			f := p.await("a keepalive ping", func(f frame) bool { return f.typ == http2.FramePing && !f.flags.Has(http2.FlagPingAck) })
			if err := p.fr.WritePing(true, [8]byte(f.data)); err != nil {
				t.Fatalf("answering the ping: %v", err)
			}
		}
		if f := p.trailersOf(p.call()); f.fields["grpc-status"] != "0" {
			t.Errorf("a call after = %v, want grpc-status 0", f.fields)
		}
	})
	t.Run("answers unread", func(t *testing.T) {
		s, _ := transportServer(t, Config{ConnectionTimeout: long, KeepaliveTime: long, KeepaliveTimeout: short}, nil)
		a, b := net.Pipe()
		defer a.Close()
		done := make(chan struct{})
		go func() { defer close(done); s.newConn(context.Background(), b).serve() }()
		go func() {
			// The request is sent, and nothing is ever read.
			var in bytes.Buffer
			fr := http2.NewFramer(&in, nil)
			p := &peer{t: t, fr: fr, next: 1}
			p.enc = hpack.NewEncoder(&p.hbuf)
			in.WriteString(http2.ClientPreface)
			_ = fr.WriteSettings()
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: p.block(pathShouldRateLimit), EndHeaders: true})
			_ = fr.WriteData(1, true, rlsMessage(t))
			_, _ = a.Write(in.Bytes())
		}()
		waitClosed(t, done, "a connection whose peer reads nothing")
	})
	t.Run("idle before a call", func(t *testing.T) {
		s, handed := transportServer(t, Config{ConnectionTimeout: long, KeepaliveTime: short, KeepaliveTimeout: long}, nil)
		p := startPeer(t, s, nil)
		p.awaitEnd()
		if handed.Load() != 1 {
			t.Errorf("an idle connection without a call was not handed to grpc-go")
		}
	})
}

// memConn is a connection whose input is given and whose output is kept:
// reads return the input, then io.EOF; each write is kept whole.
type memConn struct {
	in     *bytes.Reader
	mu     sync.Mutex
	out    bytes.Buffer
	closed bool
}

func (m *memConn) Read(b []byte) (int, error) { return m.in.Read(b) }

func (m *memConn) Write(b []byte) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, net.ErrClosed
	}
	return m.out.Write(b)
}

func (m *memConn) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	return nil
}

func (m *memConn) LocalAddr() net.Addr                { return &net.TCPAddr{} }
func (m *memConn) RemoteAddr() net.Addr               { return &net.TCPAddr{} }
func (m *memConn) SetDeadline(t time.Time) error      { return nil }
func (m *memConn) SetReadDeadline(t time.Time) error  { return nil }
func (m *memConn) SetWriteDeadline(t time.Time) error { return nil }

// FuzzTransport gives arbitrary bytes to the transport as one
// connection's input: no panic, the connection's reader and its calls
// end, and what it wrote is HTTP/2 frames.
func FuzzTransport(f *testing.F) {
	var seed bytes.Buffer
	fr := http2.NewFramer(&seed, nil)
	var hbuf bytes.Buffer
	enc := hpack.NewEncoder(&hbuf)
	block := func(path string) []byte {
		hbuf.Reset()
		for _, kv := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", path}, {":authority", "rls"}, {"content-type", "application/grpc"}, {"grpc-timeout", "1S"}} {
			_ = enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
		}
		return append([]byte(nil), hbuf.Bytes()...)
	}
	msg := rlsMessage(f)
	start := func() {
		seed.Reset()
		seed.WriteString(http2.ClientPreface)
		_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20})
	}
	add := func(build func()) {
		hbuf.Reset()
		enc = hpack.NewEncoder(&hbuf)
		start()
		build()
		f.Add(append([]byte(nil), seed.Bytes()...))
	}
	call := func(id uint32) {
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block(pathShouldRateLimit), EndHeaders: true})
		_ = fr.WriteData(id, true, msg)
	}
	add(func() { call(1) })
	add(func() {
		call(1)
		call(3)
		_ = fr.WriteRSTStream(3, http2.ErrCodeCancel)
		_ = fr.WritePing(false, [8]byte{1})
	})
	add(func() {
		b := block(pathShouldRateLimit)
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: b[:3]})
		_ = fr.WriteContinuation(1, false, nil)
		_ = fr.WriteContinuation(1, true, b[3:])
		_ = fr.WriteData(1, false, nil)
		_ = fr.WriteData(1, true, msg)
	})
	add(func() { call(1); _ = fr.WriteWindowUpdate(0, maxWindow); call(3) })
	add(func() {
		call(1)
		_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
		call(3)
		_ = fr.WriteWindowUpdate(3, 100)
	})
	add(func() {
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(pathHealthCheck), EndHeaders: true, EndStream: true})
	})
	add(func() {
		call(1)
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: block("/x.Y/Z"), EndHeaders: true})
	})
	add(func() { call(1); _ = fr.WriteGoAway(1, http2.ErrCodeNo, nil); call(3) })

	s, _ := transportServer(f, Config{}, nil)
	f.Fuzz(func(t *testing.T, in []byte) {
		m := &memConn{in: bytes.NewReader(in)}
		c := s.newConn(context.Background(), m)
		done := make(chan struct{})
		go func() { defer close(done); c.serve() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the connection's reader did not end")
		}
		calls := make(chan struct{})
		go func() { s.calls.Wait(); close(calls) }()
		select {
		case <-calls:
		case <-time.After(10 * time.Second):
			t.Fatal("the connection's calls did not end")
		}
		m.mu.Lock()
		out := append([]byte(nil), m.out.Bytes()...)
		m.mu.Unlock()
		rd := http2.NewFramer(nil, bytes.NewReader(out))
		rd.SetMaxReadFrameSize(1 << 24)
		for {
			_, err := rd.ReadFrame()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("the transport wrote %x: %v", out, err)
			}
		}
	})
}

// TestTransportStreamStates sends frames that no stream state allows
// (RFC 9113 5.1, 5.3.1, 8.4): each is the stream or connection error
// the RFC names, and a stream error leaves the connection serving.
func TestTransportStreamStates(t *testing.T) {
	s, _ := transportServer(t, Config{}, nil)
	for _, tt := range []struct {
		name string
		send func(p *peer, answered uint32) error
		// conn is the GOAWAY's code of a connection error; stream the
		// RST_STREAM's of a stream error.
		conn, stream http2.ErrCode
	}{
		{"DATA on an idle stream", func(p *peer, _ uint32) error { return p.fr.WriteData(p.next+8, true, []byte("x")) }, http2.ErrCodeProtocol, 0},
		{"RST_STREAM on an idle stream", func(p *peer, _ uint32) error { return p.fr.WriteRSTStream(p.next+8, http2.ErrCodeCancel) }, http2.ErrCodeProtocol, 0},
		{"WINDOW_UPDATE on a server's stream", func(p *peer, _ uint32) error { return p.fr.WriteWindowUpdate(2, 1) }, http2.ErrCodeProtocol, 0},
		{"PUSH_PROMISE", func(p *peer, a uint32) error {
			return p.fr.WritePushPromise(http2.PushPromiseParam{StreamID: a, PromiseID: 2, BlockFragment: p.block(pathShouldRateLimit), EndHeaders: true})
		}, http2.ErrCodeProtocol, 0},
		{"HEADERS on a closed stream", func(p *peer, a uint32) error {
			return p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: a, BlockFragment: p.block(pathShouldRateLimit), EndHeaders: true})
		}, http2.ErrCodeStreamClosed, 0},
		{"DATA on a closed stream", func(p *peer, a uint32) error { return p.fr.WriteData(a, true, []byte("x")) }, 0, http2.ErrCodeStreamClosed},
		{"PRIORITY on itself", func(p *peer, a uint32) error {
			return p.fr.WritePriority(a, http2.PriorityParam{StreamDep: a})
		}, 0, http2.ErrCodeProtocol},
		{"HEADERS on itself", func(p *peer, _ uint32) error {
			id := p.next
			p.next += 2
			return p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: p.block(pathShouldRateLimit), EndHeaders: true, EndStream: true,
				Priority: http2.PriorityParam{StreamDep: id, Weight: 15}})
		}, 0, http2.ErrCodeProtocol},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := startPeer(t, s, nil)
			answered := p.call()
			p.trailersOf(answered)
			if err := tt.send(p, answered); err != nil {
				t.Fatal(err)
			}
			if tt.conn != 0 {
				if code := p.goAwayOf(); code != tt.conn {
					t.Errorf("GOAWAY %v, want %v", code, tt.conn)
				}
				return
			}
			f := p.await("a RST_STREAM", func(f frame) bool { return f.typ == http2.FrameRSTStream })
			if f.code != tt.stream {
				t.Errorf("RST_STREAM %v, want %v", f.code, tt.stream)
			}
			if g := p.trailersOf(p.call()); g.fields["grpc-status"] != "0" {
				t.Errorf("a call after = %v, want grpc-status 0", g.fields)
			}
		})
	}
}
