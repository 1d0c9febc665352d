package h2serve

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The transport answers the unary calls a proxy makes (Config.Paths) on
// connections whose first call is Paths[0]; a connection that starts with
// any other call (in the rate limit service: server reflection,
// Health/Watch, a misspelt method) is handed, with the bytes read so far,
// to Config.HandOver, a grpc-go server that serves every method. A
// proxy's connections thus skip grpc-go's per-call goroutines, buffers
// and message reflection, while tools such as grpcurl find the full
// service.
//
// The transport is HTTP/2 without TLS (prior knowledge, as grpc-go's
// plaintext servers are): the client's preface, frames read with
// golang.org/x/net/http2's Framer, header blocks decoded with its hpack
// decoder, and answers' header blocks written by hpackTable.
//
// Its peers are not trusted, and what one connection may make it hold is
// bounded:
//   - calls in flight: maxStreams streams open, a call counting until it
//     is answered even if the peer resets its stream (a peer that opens
//     and resets streams in a loop is refused, REFUSED_STREAM, past it),
//     and a connection that has had maxRefused streams refused more than
//     it had calls answered is closed (GOAWAY ENHANCE_YOUR_CALM): the
//     "rapid reset" of CVE-2023-44487 costs one call per stream held;
//   - requests' bytes: connWindow for the connection, flow control
//     returning a request's bytes once its call is answered, and
//     streamWindow and maxDataFrames for one request;
//   - header blocks: maxHeaderBlock bytes as sent (CONTINUATION frames
//     counted with their frame headers), maxHeaderList bytes as decoded,
//     and ConnectionTimeout from a block's first frame to its last;
//   - answers and control frames (PING and SETTINGS acks, RST_STREAM)
//     waiting on a peer that does not read: maxWriteBuffer bytes before
//     the connection stops reading from the peer, and maxQueued bytes,
//     the answers of the calls in flight counted as they are added,
//     before it is closed; a write blocked for WriteTimeout ends it too,
//     freeing the worker that wrote;
//   - time: ConnectionTimeout for the preface and first SETTINGS, and,
//     as grpc-go does, a ping after KeepaliveTime of silence and the end
//     after KeepaliveTimeout more; a connection silent before its first
//     call is handed to grpc-go instead; and, when set, MaxConnectionAge
//     (jittered) before a GOAWAY, then MaxConnectionAgeGrace before the
//     connection is closed with its calls still in flight;
//   - flow control: a window taken past 2^31-1 is a FLOW_CONTROL_ERROR,
//     of the connection or of the stream, as RFC 9113 6.9 says.
//
// A connection error ends the connection with a GOAWAY of its code. A
// connection that ends, on the peer's GOAWAY or the server's, is closed
// lingering: its write side shut first, then what the peer still sends
// read and discarded, for at most lingerTime and lingerBytes, so that
// unread bytes (a PING after a GOAWAY) do not turn the close into a
// reset that loses what was written last.

// Limits of the transport.
const (
	// streamWindow is the receive window of each stream, advertised once
	// the connection is ours; a request is at most this long, so its
	// stream never needs a WINDOW_UPDATE.
	streamWindow = 1 << 20
	// connWindow is the connection's receive window, and so the most
	// bytes of requests one connection holds: a request's bytes are
	// returned to the peer's window once its call is answered (or the
	// stream is reset or refused), in batches of half the window.
	connWindow = 4 << 20
	// maxStreams is SETTINGS_MAX_CONCURRENT_STREAMS: the streams one
	// connection may have open, counting every call dispatched and not
	// yet answered, whether or not the peer reset its stream. A stream
	// beyond it is refused (REFUSED_STREAM).
	maxStreams = 1000
	// maxRefused bounds the streams a connection may have refused
	// (REFUSED_STREAM) beyond the calls answered on it: each answer
	// forgives one refusal, and past the bound the connection ends
	// (GOAWAY ENHANCE_YOUR_CALM). A client that keeps to maxStreams is
	// refused only while it races a GOAWAY, or while the calls of streams
	// it reset run on; one that opens and resets streams in a loop is
	// closed after this many, as golang.org/x/net/http2's server closes
	// a connection of more than 4 x its limit of streams waiting.
	maxRefused = 4 * maxStreams
	// maxHeaderBlock bounds one request's header block, in bytes as sent,
	// each frame's 9-byte header included; beyond it the connection
	// closes (GOAWAY ENHANCE_YOUR_CALM).
	maxHeaderBlock = 64 << 10
	// maxHeaderList bounds one request's header list as HPACK decodes
	// it, counted as SETTINGS_MAX_HEADER_LIST_SIZE counts (name, value
	// and 32 bytes a field); a call beyond it is answered
	// RESOURCE_EXHAUSTED, the fields past it unread.
	maxHeaderList = 64 << 10
	// maxWriteBuffer is how many bytes of frames may wait to be written
	// while a write is blocked on the peer before the connection stops
	// reading from it.
	maxWriteBuffer = 64 << 10
	// maxQueued bounds the bytes of frames one connection has waiting to
	// be written, answers waiting for flow control window included: the
	// answers of calls in flight are added whatever the reader does, and
	// past it the connection is closed, as one whose peer reads nothing.
	// It is the connection's receive window (connWindow): a peer may make
	// the transport hold as much of its answers as of its requests.
	maxQueued = connWindow
	// lingerTime and lingerBytes bound the reads of a closing connection
	// (see the lingering close above).
	lingerTime  = time.Second
	lingerBytes = 64 << 10
	// maxDataFrames bounds the DATA frames of one request, so that a
	// stream of empty frames ends.
	maxDataFrames = 4096
	// maxWindow is the largest flow control window, 2^31-1 (RFC 9113
	// 6.9.1).
	maxWindow = 1<<31 - 1
	// maxMessageText bounds grpc-message, in bytes before encoding.
	maxMessageText = 1024
)

// methodOther is headerState.method of a path not in Config.Paths.
const methodOther = -1

// conn is one connection served by the transport. Its reader goroutine
// (serve) owns the frame reader and the header decoder; the fields under
// mu are shared with the calls that answer on it.
type conn struct {
	s  *Server
	nc net.Conn
	// release, when set, is called once the connection is closed.
	release func()
	// shutting is set by shut: the reader stops at its next read.
	shutting atomic.Bool
	rec      *recorder
	fr       *http2.Framer
	dec      *hpack.Decoder
	// ctx is cancelled when the connection ends, and with it every call.
	ctx    context.Context
	cancel context.CancelFunc

	// lastStream is the highest stream the peer opened.
	lastStream atomic.Uint32

	// Of the reader only.
	hdr headerState
	// headersOf is the stream whose header block continues in the next
	// CONTINUATION frame; 0 when none.
	headersOf uint32
	decided   bool // the first call is ours: the connection is not handed over
	// The read deadlines: for the preface and first SETTINGS frame, for
	// the header block under way and for the keepalive ping's answer;
	// zero when none runs.
	prefaceDue, blockDue, pingDue time.Time
	idle                          bool // no call came before KeepaliveTime

	mu       sync.Mutex
	streams  map[uint32]*stream
	wbuf     []byte // frames waiting to be written
	spare    []byte
	writing  bool // a goroutine is writing wbuf out
	inWrite  int  // bytes of the write under way
	werr     error
	sendWin  int64 // connection send window
	initWin  int64 // peer's SETTINGS_INITIAL_WINDOW_SIZE
	maxFrame int   // peer's SETTINGS_MAX_FRAME_SIZE
	pending  []*stream
	// pendingBytes are the bytes of the answers in pending not yet sent.
	pendingBytes int
	draining     bool // a GOAWAY was sent: no new streams
	active       int  // calls dispatched and not yet answered
	// refused is the streams refused not yet forgiven by an answer.
	refused int
	// born is when the connection was accepted; ageTimer sends its
	// MaxConnectionAge GOAWAY and graceTimer closes it after the grace;
	// ended stops them, once the connection ends.
	born                 time.Time
	ageTimer, graceTimer *time.Timer
	ended                bool
	table                hpackTable
	// recvWin is what is left of the window the peer may send DATA in;
	// recvFree the bytes of requests done with and not yet returned to
	// it.
	recvWin, recvFree int64
	// drained is signalled when a write ends: the reader waits on it
	// while maxWriteBuffer bytes wait to be written.
	drained sync.Cond
	stalls  int // times the reader stopped for a write
}

// headerState is what a request's header block said, as it is decoded.
type headerState struct {
	method      int  // index in Config.Paths; methodOther when none
	contentType bool // application/grpc or one of its subtypes
	compressed  bool // a grpc-encoding other than identity
	timeout     time.Duration
	size        int  // bytes of the header block so far, frame headers included
	listSize    int  // bytes of the header list decoded so far
	tooLarge    bool // the header list passed maxHeaderList
	selfDep     bool // the stream depends on itself (RFC 9113 5.3.1)
	endStream   bool // the request ends with its headers: no message
}

// stream is one call: its request, answer and flow control. Streams are
// pooled with the buffers they grew.
type stream struct {
	id         uint32
	hdr        headerState
	body       []byte
	sendWin    int64
	recvd      int64 // bytes of DATA received, flow control's count
	frames     int   // DATA frames received
	dispatched bool
	answered   bool // its call ended; what is left of its answer waits for window
	reset      bool // the peer reset it; its answer is dropped
	// deadline is when the peer stops waiting (grpc-timeout); zero when
	// it did not say.
	deadline time.Time

	call Call   // the Handler's view of it
	out  []byte // the answer's gRPC message: prefix and protobuf
	off  int    // bytes of out sent
	// code and msg are the answer's gRPC status.
	code codes.Code
	msg  string
}

func (s *Server) newStream(id uint32, hdr headerState, win int64) *stream {
	st := s.streams.Get().(*stream)
	st.id, st.hdr, st.sendWin = id, hdr, win
	st.body, st.out, st.off = st.body[:0], st.out[:0], 0
	st.recvd, st.frames = 0, 0
	st.dispatched, st.answered, st.reset = false, false, false
	st.code, st.msg = codes.OK, ""
	return st
}

func (s *Server) releaseStream(st *stream) {
	st.deadline = time.Time{}
	if cap(st.body) > 64<<10 {
		st.body = nil
	}
	st.call.Message, st.call.Out = nil, nil
	s.streams.Put(st)
}

// recorder reads the connection for its reader, under the read
// deadlines, and keeps what is read until the first call is known, for a
// handover to grpc-go.
type recorder struct {
	c    *conn
	buf  []byte
	keep bool
}

func (r *recorder) Read(p []byte) (int, error) {
	c := r.c
	for {
		c.nc.SetReadDeadline(c.readDeadline(time.Now()))
		// After the deadline is set: shut's deadline in the past then
		// either came after it or finds the flag set here.
		if c.shutting.Load() {
			return 0, errShut
		}
		n, err := c.nc.Read(p)
		if r.keep {
			r.buf = append(r.buf, p[:n]...)
		}
		if n > 0 {
			c.pingDue = time.Time{}
			return n, err
		}
		if c.shutting.Load() {
			return 0, errShut
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) || !c.keepalive(time.Now()) {
			return n, err
		}
	}
}

// readDeadline is when the read under way fails: the preface's or the
// header block's deadline, else KeepaliveTime from now, or the end of the
// wait for the keepalive ping's answer.
func (c *conn) readDeadline(now time.Time) time.Time {
	dl := now.Add(c.s.cfg.KeepaliveTime)
	switch {
	case !c.prefaceDue.IsZero():
		dl = c.prefaceDue
	case !c.pingDue.IsZero():
		dl = c.pingDue
	}
	if !c.blockDue.IsZero() && c.blockDue.Before(dl) {
		dl = c.blockDue
	}
	return dl
}

// keepalive acts on a read that timed out and reports whether to read
// on: a connection that sent nothing for KeepaliveTime is pinged, once;
// one not yet known to be a proxy's goes to grpc-go, which keeps it alive
// as it does its own. A preface, a header block or a ping overdue ends
// the connection.
func (c *conn) keepalive(now time.Time) bool {
	switch {
	case !c.prefaceDue.IsZero(), !c.blockDue.IsZero() && !now.Before(c.blockDue), !c.pingDue.IsZero():
		return false
	case !c.decided:
		c.idle = true
		return false
	}
	c.pingDue = now.Add(c.s.cfg.KeepaliveTimeout)
	c.mu.Lock()
	c.wbuf = appendFrameHeader(c.wbuf, 8, http2.FramePing, 0, 0)
	c.wbuf = append(c.wbuf, "keepaliv"...)
	c.flushLocked()
	c.mu.Unlock()
	return true
}

// replayConn is a connection handed over: its reads return the recorded
// bytes first; release, when set, is called on its first Close.
type replayConn struct {
	net.Conn
	replay  []byte
	release func()
	closed  sync.Once
}

func (c *replayConn) Close() error {
	err := c.Conn.Close()
	if c.release != nil {
		c.closed.Do(c.release)
	}
	return err
}

func (c *replayConn) Read(p []byte) (int, error) {
	if len(c.replay) > 0 {
		n := copy(p, c.replay)
		c.replay = c.replay[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// errHandedOver ends a connection's reader once grpc-go has it.
var errHandedOver = errors.New("handed over to grpc-go")

// errShut ends a connection's reader once shut is called.
var errShut = errors.New("the connection is closing")

// errOverBound is a connection's write error once more than maxQueued
// bytes wait to be written.
var errOverBound = errors.New("more than maxQueued bytes wait to be written")

// connError is an error of the connection (RFC 9113 5.4.1): the
// connection ends with a GOAWAY of its code.
type connError struct {
	code http2.ErrCode
	why  string
}

func (e connError) Error() string { return "http2: " + e.code.String() + ": " + e.why }

// newConn is the transport's state for an accepted connection; serve
// serves it. The connection closes when ctx ends.
func (s *Server) newConn(ctx context.Context, nc net.Conn) *conn {
	c := &conn{s: s, nc: nc, streams: make(map[uint32]*stream), sendWin: 65535, initWin: 65535, maxFrame: 16384, recvWin: 65535, born: time.Now()}
	c.ctx, c.cancel = context.WithCancel(ctx)
	c.rec = &recorder{c: c, keep: true}
	c.drained.L = &c.mu
	return c
}

// serve serves the connection until it closes or is handed over.
func (c *conn) serve() {
	stop := context.AfterFunc(c.ctx, func() { c.nc.Close() })
	defer stop()
	defer c.cancel()
	if c.s.stopping.Load() {
		c.goAway(nil)
	}
	br := bufio.NewReaderSize(c.rec, 32<<10)
	c.fr = http2.NewFramer(io.Discard, br)
	c.fr.SetReuseFrames()
	c.fr.SetMaxReadFrameSize(16384) // SETTINGS_MAX_FRAME_SIZE left at its default
	c.dec = hpack.NewDecoder(4096, c.onField)
	c.dec.SetMaxStringLength(maxHeaderBlock)
	c.prefaceDue = time.Now().Add(c.s.cfg.ConnectionTimeout)

	// The server's preface: an empty SETTINGS, all defaults, as grpc-go's
	// would be bar an explicit default frame size, so that a connection
	// handed over sees nothing it would not have sent itself.
	c.mu.Lock()
	c.wbuf = appendFrameHeader(c.wbuf, 0, http2.FrameSettings, 0, 0)
	c.flushLocked()
	c.mu.Unlock()

	err := c.read(br)
	// From here the connection closes here, lingering, or is grpc-go's.
	stop()
	if errors.Is(err, errHandedOver) {
		return
	}
	c.end(err)
}

// end ends the connection after its reader's error err: a GOAWAY of err's
// code, if it has one, the calls cancelled, and a lingering close.
func (c *conn) end(err error) {
	c.mu.Lock()
	var ce connError
	var he http2.ConnectionError
	var se http2.StreamError
	switch {
	case errors.As(err, &ce):
	case errors.As(err, &he):
		ce.code = http2.ErrCode(he)
	case errors.As(err, &se):
		ce.code = se.Code
	}
	if ce.code != 0 {
		// Said after the write under way, which a peer that reads
		// nothing holds up to the write deadline.
		for c.writing && c.werr == nil {
			c.drained.Wait()
		}
		c.wbuf = appendGoAway(c.wbuf, c.lastStream.Load(), ce.code)
		c.flushLocked()
	}
	c.mu.Unlock()
	c.cancel()
	c.mu.Lock()
	c.draining = true
	c.stopTimersLocked()
	for _, st := range c.streams {
		if !st.dispatched {
			c.s.releaseStream(st)
		}
	}
	clear(c.streams)
	c.mu.Unlock()
	c.linger()
	c.nc.Close()
	if c.release != nil {
		c.release()
	}
}

// startAge starts the MaxConnectionAge timer of a connection that is
// the transport's, if it has an age: jittered, from its accept.
func (c *conn) startAge() {
	age := c.s.cfg.MaxConnectionAge
	if age <= 0 {
		return
	}
	d := jitterAge(age, rand.Int64N) - time.Since(c.born)
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.ended {
		c.ageTimer = time.AfterFunc(d, c.ageOut)
	}
}

// jitterAge is age moved by up to ±10%, as grpc-go moves its
// MaxConnectionAge: by n(2r+1)-r, r being a tenth of age, n returning a
// number in [0, its argument).
func jitterAge(age time.Duration, n func(int64) int64) time.Duration {
	r := int64(age / 10)
	if r <= 0 {
		return age
	}
	return age + time.Duration(n(2*r+1)-r)
}

// ageOut is the connection's MaxConnectionAge: a GOAWAY, and the close
// MaxConnectionAgeGrace later of a connection whose calls have not all
// been answered by then.
func (c *conn) ageOut() {
	if !c.goAway(c.s.metrics.aged) {
		return // closing already: on shutdown, or after an error
	}
	grace := c.s.cfg.MaxConnectionAgeGrace
	if grace <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.ended {
		c.graceTimer = time.AfterFunc(grace, func() {
			c.mu.Lock()
			ended := c.ended
			c.mu.Unlock()
			if !ended && c.ctx.Err() == nil {
				c.s.metrics.agedGrace.Inc()
				c.cancel() // the connection closes, and its calls' answers are dropped
			}
		})
	}
}

// stopTimersLocked stops the age timers of a connection that ends.
func (c *conn) stopTimersLocked() {
	c.ended = true
	for _, t := range []*time.Timer{c.ageTimer, c.graceTimer} {
		if t != nil {
			t.Stop()
		}
	}
}

// linger shuts the connection's write side, once the write under way is
// done, and reads what the peer still sends until it closes its side,
// for at most lingerTime and lingerBytes: closed with unread bytes
// waiting, a TCP connection would be reset, and the peer might lose the
// last frames written (a GOAWAY). Answers of calls still in flight are
// dropped from here on. A connection whose writes failed, or that cannot
// shut its write side alone (CloseWrite), is not lingered on.
func (c *conn) linger() {
	c.mu.Lock()
	for c.writing && c.werr == nil {
		c.drained.Wait()
	}
	ok := c.werr == nil
	if ok {
		c.werr = net.ErrClosed
	}
	c.mu.Unlock()
	cw, can := c.nc.(interface{ CloseWrite() error })
	if !ok || !can || cw.CloseWrite() != nil {
		return
	}
	c.nc.SetReadDeadline(time.Now().Add(lingerTime))
	io.CopyN(io.Discard, c.nc, lingerBytes)
}

// shut ends the connection from any goroutine: its reader stops at its
// next read, or at once if it is reading, and the connection closes as a
// reader's error closes it (end). A connection whose ctx is cancelled is
// closed at once instead.
func (c *conn) shut() {
	c.shutting.Store(true)
	c.nc.SetReadDeadline(time.Unix(1, 0))
}

// read reads frames until the connection fails or is handed over.
func (c *conn) read(br *bufio.Reader) error {
	var preface [len(http2.ClientPreface)]byte
	if _, err := io.ReadFull(br, preface[:]); err != nil {
		return err
	}
	if string(preface[:]) != http2.ClientPreface {
		return errors.New("not an HTTP/2 client preface")
	}
	if c.s.cfg.OwnAll {
		c.take(0, nil)
	}
	var early earlyFrames
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			if c.idle {
				return c.handOver(br)
			}
			return err
		}
		if !c.prefaceDue.IsZero() {
			if f, ok := f.(*http2.SettingsFrame); !ok || f.IsAck() {
				return connError{http2.ErrCodeProtocol, "the client preface is not followed by SETTINGS"}
			}
			c.prefaceDue = time.Time{}
		}
		if c.decided {
			if err := c.onFrame(f); err != nil {
				return err
			}
			if err := c.throttle(); err != nil {
				return err
			}
			continue
		}
		if len(c.rec.buf) > maxHeaderBlock {
			// Frames and frames and no call: grpc-go, whose
			// defences against a misbehaving peer are complete,
			// takes it from here.
			return c.handOver(br)
		}
		first, err := c.onEarlyFrame(f, &early)
		switch {
		case err != nil:
			return err
		case !first:
			continue
		case c.hdr.method != 0:
			// The first header block is complete: a connection whose
			// first call is not Paths[0] is no proxy's.
			return c.handOver(br)
		}
		c.take(early.settingsAcks, early.pings)
		if err := c.endHeaders(); err != nil {
			return err
		}
	}
}

// earlyFrames are the answers to the peer's frames before its first call
// is known, which wait: a connection handed over must not have had them.
type earlyFrames struct {
	settingsAcks int
	pings        [][8]byte
}

// onEarlyFrame handles a frame before the first call is known, and
// reports whether it ended the first call's header block.
func (c *conn) onEarlyFrame(f http2.Frame, early *earlyFrames) (bool, error) {
	switch f := f.(type) {
	case *http2.SettingsFrame:
		if !f.IsAck() {
			if err := c.applySettings(f); err != nil {
				return false, err
			}
			early.settingsAcks++
		}
	case *http2.PingFrame:
		if !f.IsAck() {
			early.pings = append(early.pings, f.Data)
		}
	case *http2.WindowUpdateFrame:
		if f.StreamID == 0 {
			if c.sendWin+int64(f.Increment) > maxWindow {
				return false, connError{http2.ErrCodeFlowControl, "the connection's send window passed 2^31-1"}
			}
			c.sendWin += int64(f.Increment)
		}
	case *http2.HeadersFrame:
		if err := c.onHeaders(f); err != nil {
			return false, err
		}
		return f.HeadersEnded(), nil
	case *http2.ContinuationFrame:
		if err := c.onContinuation(f); err != nil {
			return false, err
		}
		return f.HeadersEnded(), nil
	case *http2.GoAwayFrame:
		return false, io.EOF
	}
	// PRIORITY or an extension's: kept for grpc-go, ignored here.
	return false, nil
}

// take makes the connection the transport's: the answers to the peer's
// frames held until now (settingsAcks SETTINGS, pings) are written, then
// the transport's settings and connection window.
func (c *conn) take(settingsAcks int, pings [][8]byte) {
	c.decided = true
	c.rec.keep, c.rec.buf = false, nil
	c.startAge()
	c.mu.Lock()
	defer c.mu.Unlock()
	for range settingsAcks {
		c.wbuf = appendFrameHeader(c.wbuf, 0, http2.FrameSettings, http2.FlagSettingsAck, 0)
	}
	for _, p := range pings {
		c.wbuf = appendFrameHeader(c.wbuf, 8, http2.FramePing, http2.FlagPingAck, 0)
		c.wbuf = append(c.wbuf, p[:]...)
	}
	c.wbuf = appendSettings(c.wbuf, http2.Setting{ID: http2.SettingInitialWindowSize, Val: streamWindow},
		http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: maxStreams},
		http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: maxHeaderList})
	c.wbuf = appendWindowUpdate(c.wbuf, 0, connWindow-65535)
	c.recvWin += connWindow - 65535
	c.flushLocked()
}

// throttle stops reading from the peer while maxWriteBuffer bytes wait
// for a write under way (or for window): a peer that sends but does not
// read gets no more answers buffered than that, and those of the calls
// in flight, which maxQueued bounds.
func (c *conn) throttle() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.writing && len(c.wbuf)+c.pendingBytes > maxWriteBuffer && c.werr == nil {
		c.stalls++
		for c.writing && len(c.wbuf)+c.pendingBytes > maxWriteBuffer && c.werr == nil {
			c.drained.Wait()
		}
	}
	return c.werr
}

// handOver gives the connection, and every byte read from it, to the
// grpc-go server.
func (c *conn) handOver(br *bufio.Reader) error {
	c.nc.SetDeadline(time.Time{}) // grpc-go sets its own
	rc := &replayConn{Conn: c.nc, replay: c.rec.buf, release: c.release}
	if c.s.cfg.HandOver == nil {
		return errors.New("no handover for a connection that is not a proxy's")
	}
	if err := c.s.cfg.HandOver(rc); err != nil {
		return err
	}
	c.release = nil // rc's Close calls it
	return errHandedOver
}

func (c *conn) applySettings(f *http2.SettingsFrame) error {
	initWin := int64(-1)
	err := f.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			return err
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		switch s.ID {
		case http2.SettingInitialWindowSize:
			initWin = int64(s.Val) // the last one counts
		case http2.SettingMaxFrameSize:
			c.maxFrame = int(s.Val)
		case http2.SettingHeaderTableSize:
			c.table.setLimit(s.Val)
		}
		return nil
	})
	if err != nil || initWin < 0 {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delta := initWin - c.initWin
	c.initWin = initWin
	for _, st := range c.streams {
		st.sendWin += delta
		if st.sendWin > maxWindow && !st.reset {
			return connError{http2.ErrCodeFlowControl, "SETTINGS_INITIAL_WINDOW_SIZE took a stream's window past 2^31-1"}
		}
	}
	return nil
}

// onFrame handles one frame once the connection is ours.
func (c *conn) onFrame(f http2.Frame) error {
	if err := c.checkStream(f); err != nil {
		return err
	}
	switch f := f.(type) {
	case *http2.HeadersFrame:
		if err := c.onHeaders(f); err != nil {
			return err
		}
		if f.HeadersEnded() {
			return c.endHeaders()
		}
	case *http2.ContinuationFrame:
		if err := c.onContinuation(f); err != nil {
			return err
		}
		if f.HeadersEnded() {
			return c.endHeaders()
		}
	case *http2.DataFrame:
		return c.onData(f)
	case *http2.SettingsFrame:
		if f.IsAck() {
			return nil
		}
		if err := c.applySettings(f); err != nil {
			return err
		}
		c.mu.Lock()
		c.wbuf = appendFrameHeader(c.wbuf, 0, http2.FrameSettings, http2.FlagSettingsAck, 0)
		c.drainPendingLocked()
		c.flushLocked()
		c.shutIfDoneLocked()
		c.mu.Unlock()
	case *http2.PingFrame:
		if f.IsAck() {
			return nil
		}
		c.mu.Lock()
		c.wbuf = appendFrameHeader(c.wbuf, 8, http2.FramePing, http2.FlagPingAck, 0)
		c.wbuf = append(c.wbuf, f.Data[:]...)
		c.flushLocked()
		c.mu.Unlock()
	case *http2.WindowUpdateFrame:
		return c.onWindowUpdate(f)
	case *http2.RSTStreamFrame:
		c.mu.Lock()
		if st := c.streams[f.StreamID]; st != nil && !st.reset {
			c.resetLocked(st)
			c.flushLocked() // the window it returned, if any
			c.shutIfDoneLocked()
		}
		c.mu.Unlock()
	case *http2.PriorityFrame:
		if f.StreamDep == f.StreamID { // a stream error (RFC 9113 5.3.1)
			c.mu.Lock()
			if st := c.streams[f.StreamID]; st != nil && !st.reset {
				c.resetLocked(st)
			}
			c.wbuf = appendRST(c.wbuf, f.StreamID, http2.ErrCodeProtocol)
			c.flushLocked()
			c.mu.Unlock()
		}
	case *http2.GoAwayFrame:
		c.mu.Lock()
		c.draining = true
		idle := c.active == 0
		c.mu.Unlock()
		if idle {
			return io.EOF
		}
	}
	return nil
}

// onWindowUpdate takes a WINDOW_UPDATE once the connection is ours.
func (c *conn) onWindowUpdate(f *http2.WindowUpdateFrame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	inc := int64(f.Increment)
	if f.StreamID == 0 {
		if c.sendWin+inc > maxWindow {
			return connError{http2.ErrCodeFlowControl, "the connection's send window passed 2^31-1"}
		}
		c.sendWin += inc
	} else if st := c.streams[f.StreamID]; st != nil && !st.reset {
		if st.sendWin+inc > maxWindow {
			// A stream error (RFC 9113 6.9.1): the stream alone ends.
			c.resetLocked(st)
			c.wbuf = appendRST(c.wbuf, f.StreamID, http2.ErrCodeFlowControl)
		} else {
			st.sendWin += inc
		}
	}
	c.drainPendingLocked()
	c.flushLocked()
	c.shutIfDoneLocked()
	return nil
}

// checkStream is the connection error (RFC 9113 5.1, 8.4) of a frame
// that no stream state allows: DATA, RST_STREAM or WINDOW_UPDATE on an
// idle stream (one the peer has not opened, or one only a server would
// open), and PUSH_PROMISE, which a client never sends. Frames on closed
// streams are discarded instead (see onData).
func (c *conn) checkStream(f http2.Frame) error {
	h := f.Header()
	switch h.Type {
	case http2.FrameData, http2.FrameRSTStream, http2.FrameWindowUpdate:
		if id := h.StreamID; id != 0 && (id%2 == 0 || id > c.lastStream.Load()) {
			return connError{http2.ErrCodeProtocol, h.Type.String() + " on an idle stream"}
		}
	case http2.FramePushPromise:
		return connError{http2.ErrCodeProtocol, "PUSH_PROMISE from a client"}
	}
	return nil
}

// resetLocked ends a stream that the peer reset. A stream whose call
// runs stays counted among the streams until the call ends, so that
// maxStreams bounds the calls in flight however fast the peer opens and
// resets streams; its answer is then dropped.
func (c *conn) resetLocked(st *stream) {
	st.reset = true
	switch {
	case !st.dispatched:
		c.creditLocked(st.recvd)
		c.closeLocked(st)
	case st.answered: // waiting for window, in c.pending
		for i, p := range c.pending {
			if p == st {
				c.pendingBytes -= len(st.out) - st.off
				c.pending = append(c.pending[:i], c.pending[i+1:]...)
				c.pending = c.pending[:len(c.pending):cap(c.pending)]
				break
			}
		}
		c.closeLocked(st)
	}
}

// creditLocked returns n bytes of requests done with to the peer's
// connection window, once half the window is due.
func (c *conn) creditLocked(n int64) {
	c.recvFree += n
	if c.recvFree >= connWindow/2 {
		c.wbuf = appendWindowUpdate(c.wbuf, 0, uint32(c.recvFree))
		c.recvWin += c.recvFree
		c.recvFree = 0
	}
}

// onHeaders starts a header block: a new stream's request headers.
func (c *conn) onHeaders(f *http2.HeadersFrame) error {
	if f.StreamID%2 == 0 || f.StreamID <= c.lastStream.Load() {
		// Trailers from the client, or a reused id: gRPC clients send
		// neither. On a stream the peer has ended or reset it is
		// STREAM_CLOSED (RFC 9113 5.1).
		c.mu.Lock()
		st := c.streams[f.StreamID]
		open := st != nil && !st.dispatched && !st.reset
		c.mu.Unlock()
		if f.StreamID%2 == 1 && !open {
			return connError{http2.ErrCodeStreamClosed, "headers on a closed stream"}
		}
		return connError{http2.ErrCodeProtocol, "headers on a stream that is not new"}
	}
	c.lastStream.Store(f.StreamID)
	c.hdr = headerState{method: methodOther, size: 9 + len(f.HeaderBlockFragment()), endStream: f.StreamEnded(),
		selfDep: f.HasPriority() && f.Priority.StreamDep == f.StreamID}
	c.headersOf = f.StreamID
	c.dec.SetEmitEnabled(true)
	if _, err := c.dec.Write(f.HeaderBlockFragment()); err != nil {
		return connError{http2.ErrCodeCompression, err.Error()}
	}
	if !f.HeadersEnded() {
		c.blockDue = time.Now().Add(c.s.cfg.ConnectionTimeout)
		return nil
	}
	if err := c.dec.Close(); err != nil {
		return connError{http2.ErrCodeCompression, err.Error()}
	}
	return nil
}

func (c *conn) onContinuation(f *http2.ContinuationFrame) error {
	c.hdr.size += 9 + len(f.HeaderBlockFragment())
	if c.hdr.size > maxHeaderBlock {
		return connError{http2.ErrCodeEnhanceYourCalm, "header block too long"}
	}
	if _, err := c.dec.Write(f.HeaderBlockFragment()); err != nil {
		return connError{http2.ErrCodeCompression, err.Error()}
	}
	if !f.HeadersEnded() {
		return nil
	}
	c.blockDue = time.Time{}
	if err := c.dec.Close(); err != nil {
		return connError{http2.ErrCodeCompression, err.Error()}
	}
	return nil
}

// onField takes one request header field.
func (c *conn) onField(f hpack.HeaderField) {
	c.hdr.listSize += len(f.Name) + len(f.Value) + 32
	if c.hdr.listSize > maxHeaderList {
		// The decoder reads on, to keep its table as the peer's, but
		// says no more.
		c.hdr.tooLarge = true
		c.dec.SetEmitEnabled(false)
		return
	}
	switch f.Name {
	case ":path":
		for i, p := range c.s.cfg.Paths {
			if f.Value == p {
				c.hdr.method = i
				break
			}
		}
	case "content-type":
		v := f.Value
		c.hdr.contentType = v == "application/grpc" ||
			len(v) > len("application/grpc") && v[:len("application/grpc")] == "application/grpc" &&
				(v[len("application/grpc")] == '+' || v[len("application/grpc")] == ';')
	case "grpc-encoding":
		c.hdr.compressed = f.Value != "identity"
	case "grpc-timeout":
		c.hdr.timeout, _ = parseTimeout(f.Value)
	}
}

// endHeaders opens the stream whose header block just ended; a stream
// refused past maxRefused ends the connection (ENHANCE_YOUR_CALM).
func (c *conn) endHeaders() error {
	id, hdr := c.headersOf, c.hdr
	c.headersOf = 0
	endStream := hdr.endStream
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.draining || len(c.streams) >= maxStreams || hdr.selfDep {
		code := http2.ErrCodeRefusedStream
		if hdr.selfDep { // a stream error: PRIORITY is otherwise ignored
			code = http2.ErrCodeProtocol
		}
		c.wbuf = appendRST(c.wbuf, id, code)
		c.flushLocked()
		if code == http2.ErrCodeRefusedStream {
			if c.refused++; c.refused > maxRefused {
				c.s.metrics.refusedStreams.Inc()
				return connError{http2.ErrCodeEnhanceYourCalm, "streams refused past maxRefused"}
			}
		}
		return nil
	}
	st := c.s.newStream(id, hdr, c.initWin)
	c.streams[id] = st
	if hdr.method == methodOther || hdr.tooLarge {
		// Answered at once, whether or not the request goes on (a stream
		// of server reflection would wait for an answer).
		st.dispatched = true
		c.active++
		st.code, st.msg = codes.Unimplemented, c.s.unimplem
		if hdr.tooLarge {
			st.code, st.msg = codes.ResourceExhausted, "header list larger than "+strconv.Itoa(maxHeaderList)+" bytes"
		}
		c.respondLocked(st)
		if !endStream {
			c.wbuf = appendRST(c.wbuf, id, http2.ErrCodeNo)
		}
		c.flushLocked()
		return nil
	}
	if endStream {
		c.dispatchLocked(st)
	}
	return nil
}

func (c *conn) onData(f *http2.DataFrame) error {
	n := int64(f.Length) // padding included, as flow control counts it
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recvWin -= n
	if c.recvWin < 0 {
		return connError{http2.ErrCodeFlowControl, "the connection's receive window exceeded"}
	}
	st := c.streams[f.StreamID]
	if st == nil || st.dispatched {
		// Half-closed (remote) or closed: reset, refused or answered
		// already. Discarded, its room given back, and a stream error
		// (RFC 9113 5.1): a peer that sent it after a reset of the
		// server's ignores the RST_STREAM.
		c.creditLocked(n)
		if st != nil && !st.reset {
			c.resetLocked(st)
		}
		c.wbuf = appendRST(c.wbuf, f.StreamID, http2.ErrCodeStreamClosed)
		c.flushLocked()
		return nil
	}
	st.recvd += n
	st.frames++
	switch {
	case st.recvd > streamWindow:
		return connError{http2.ErrCodeFlowControl, "stream window exceeded"}
	case st.frames > maxDataFrames:
		return connError{http2.ErrCodeEnhanceYourCalm, "too many DATA frames in one request"}
	}
	st.body = append(st.body, f.Data()...)
	if f.StreamEnded() {
		c.dispatchLocked(st)
	}
	return nil
}

// dispatchLocked hands a complete request to a worker.
func (c *conn) dispatchLocked(st *stream) {
	st.dispatched = true
	c.active++
	c.s.calls.Add(1)
	if st.hdr.timeout > 0 {
		st.deadline = time.Now().Add(st.hdr.timeout)
	}
	j := job{c: c, st: st}
	select {
	case c.s.work <- j:
	default:
		go j.run()
	}
}

// job is one call for a worker.
type job struct {
	c  *conn
	st *stream
}

func (j job) run() {
	j.c.s.answer(j.c.ctx, j.st)
	j.c.respond(j.st)
	j.c.s.calls.Done()
}

// answer has the Handler answer a call and leaves its answer in st. The
// call runs in ctx, the connection's, not in a context of the call's own
// with a timer: the rate limit service's decision store bounds every
// decision with its own timeout, so a call the peer resets or gives up on
// runs at most that long, and its answer is dropped. The call's deadline
// keeps a call that waited past it from being answered at all.
func (s *Server) answer(ctx context.Context, st *stream) {
	msg, err := grpcMessage(st)
	if err == nil && !st.deadline.IsZero() && !time.Now().Before(st.deadline) {
		err = status.Error(codes.DeadlineExceeded, "the call's deadline passed before it was decided")
	}
	if err == nil {
		c := &st.call
		c.Method, c.Message, c.Out = st.hdr.method, msg, append(st.out[:0], 0, 0, 0, 0, 0)
		err = s.h.Answer(ctx, c)
		st.out, c.Message = c.Out, nil
		binary.BigEndian.PutUint32(st.out[1:5], uint32(len(st.out)-5))
	}
	if err != nil {
		s := status.Convert(err)
		st.code, st.msg = s.Code(), s.Message()
	}
}

// grpcMessage is a unary request's one message, uncompressed.
func grpcMessage(st *stream) ([]byte, error) {
	switch {
	case !st.hdr.contentType:
		return nil, status.Error(codes.Internal, "content-type is not application/grpc")
	case st.hdr.compressed:
		return nil, status.Error(codes.Unimplemented, "compressed requests are not supported; send grpc-encoding identity")
	}
	b := st.body
	if len(b) < 5 {
		return nil, status.Error(codes.Internal, "the request is not one gRPC message")
	}
	if b[0] != 0 {
		return nil, status.Error(codes.Internal, "a compressed message without grpc-encoding")
	}
	if n := binary.BigEndian.Uint32(b[1:5]); uint64(n) != uint64(len(b)-5) {
		return nil, status.Error(codes.Internal, "the request is not one gRPC message")
	}
	return b[5:], nil
}

// respond writes a call's answer: the response headers, its message as
// flow control allows, then the trailers; or the trailers alone for an
// error.
func (c *conn) respond(st *stream) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.respondLocked(st)
	if !c.writing && c.active > 0 {
		// Other calls are in flight: let those whose answers are ready
		// add them first, for one write of all (as grpc-go's writer
		// yields before a small write).
		c.writing = true
		c.mu.Unlock()
		runtime.Gosched()
		c.mu.Lock()
		c.writing = false
	}
	c.flushLocked()
	c.shutIfDoneLocked()
}

// shutIfDoneLocked ends a connection that sent its GOAWAY once it has no
// stream left: every call answered, every answer handed to TCP, and no
// stream waiting for the rest of its request. The GOAWAY promised to
// serve each stream up to its last stream id, those whose DATA has not
// all arrived too; closing on them would fail their calls.
func (c *conn) shutIfDoneLocked() {
	if c.draining && len(c.streams) == 0 {
		c.shut()
	}
}

func (c *conn) respondLocked(st *stream) {
	c.active--
	c.refused = max(c.refused-1, 0) // an answer forgives a refusal
	st.answered = true
	c.creditLocked(st.recvd)
	if st.reset {
		c.closeLocked(st)
	} else if st.code != codes.OK {
		c.wbuf = appendHeaders(c.wbuf, st.id, true, func(b []byte) []byte {
			b = append(c.table.begin(b), hdrStatus200...)
			b = c.table.appendField(b, fieldContentType)
			return appendGRPCStatus(b, st.code, st.msg)
		})
		c.closeLocked(st)
	} else {
		c.wbuf = appendHeaders(c.wbuf, st.id, false, func(b []byte) []byte {
			b = append(c.table.begin(b), hdrStatus200...)
			return c.table.appendField(b, fieldContentType)
		})
		if done, _ := c.sendLocked(st); !done {
			c.pending = append(c.pending, st)
			c.pendingBytes += len(st.out) - st.off
		}
	}
}

// sendLocked writes as much of st's message as the windows allow and,
// once all of it is out, the trailers; it reports whether st is done. It
// returns how many bytes of the message it wrote.
func (c *conn) sendLocked(st *stream) (done bool, sent int) {
	for st.off < len(st.out) {
		n := min(int64(len(st.out)-st.off), c.sendWin, st.sendWin, int64(c.maxFrame))
		if n <= 0 {
			return false, sent
		}
		c.wbuf = appendFrameHeader(c.wbuf, int(n), http2.FrameData, 0, st.id)
		c.wbuf = append(c.wbuf, st.out[st.off:st.off+int(n)]...)
		st.off += int(n)
		sent += int(n)
		c.sendWin -= n
		st.sendWin -= n
	}
	c.wbuf = appendHeaders(c.wbuf, st.id, true, func(b []byte) []byte {
		return c.table.appendField(c.table.begin(b), fieldGRPCStatusOK)
	})
	c.closeLocked(st)
	return true, sent
}

// closeLocked forgets an answered stream.
func (c *conn) closeLocked(st *stream) {
	delete(c.streams, st.id)
	c.s.releaseStream(st)
}

// drainPendingLocked sends the answers that waited for window.
func (c *conn) drainPendingLocked() {
	kept := c.pending[:0]
	for _, st := range c.pending { // reset ones are gone: see resetLocked
		done, sent := c.sendLocked(st)
		c.pendingBytes -= sent
		if !done {
			kept = append(kept, st)
		}
	}
	clear(c.pending[len(kept):])
	c.pending = kept
}

// queuedLocked is how many bytes wait to be written: in wbuf, in the
// write under way and in the answers that wait for window.
func (c *conn) queuedLocked() int { return len(c.wbuf) + c.inWrite + c.pendingBytes }

// flushLocked writes wbuf out, unless another goroutine is doing so: it
// then writes what was added meanwhile too. Past maxQueued bytes waiting
// the connection is closed instead. Called with mu held; mu is released
// during the write.
func (c *conn) flushLocked() {
	if c.werr == nil && c.queuedLocked() > maxQueued {
		c.werr = errOverBound
		c.s.metrics.overBound.Inc()
		c.nc.Close() // and the reader's read fails, and the write under way
		c.drained.Broadcast()
	}
	if c.writing {
		return
	}
	c.writing = true
	// A peer that takes in nothing for this long is as dead as one that
	// leaves a keepalive ping unanswered, and holds the goroutine that
	// writes (a worker, as often as not).
	timeout := min(c.s.cfg.WriteTimeout, c.s.cfg.KeepaliveTimeout)
	for len(c.wbuf) > 0 && c.werr == nil {
		buf := c.wbuf
		c.wbuf = c.spare[:0]
		c.inWrite = len(buf)
		c.mu.Unlock()
		c.nc.SetWriteDeadline(time.Now().Add(timeout))
		_, err := c.nc.Write(buf)
		if err != nil {
			c.nc.Close() // and the reader's read fails
		}
		c.mu.Lock()
		c.spare, c.inWrite = buf[:0], 0
		if err != nil && c.werr == nil {
			c.werr = err
			if errors.Is(err, os.ErrDeadlineExceeded) {
				c.s.metrics.timeouts.Inc()
			}
		}
		c.drained.Broadcast()
	}
	if c.werr != nil {
		c.wbuf = c.wbuf[:0]
	}
	c.writing = false
	c.drained.Broadcast()
}

// goAway starts a graceful close: no new streams; the connection closes
// once the streams it has are answered, those whose requests are still
// arriving included. It reports whether it started the close (false when
// the connection was closing already); when it does, it counts it in
// counted, if set, before the GOAWAY is written.
func (c *conn) goAway(counted prometheus.Counter) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.draining {
		return false
	}
	if counted != nil {
		counted.Inc()
	}
	lastStream := c.lastStream.Load()
	c.draining = true
	c.wbuf = appendGoAway(c.wbuf, lastStream, http2.ErrCodeNo)
	c.flushLocked()
	c.shutIfDoneLocked()
	return true
}

// parseTimeout reads grpc-timeout: up to 8 digits and a unit.
func parseTimeout(v string) (time.Duration, bool) {
	if len(v) < 2 || len(v) > 9 {
		return 0, false
	}
	var unit time.Duration
	switch v[len(v)-1] {
	case 'H':
		unit = time.Hour
	case 'M':
		unit = time.Minute
	case 'S':
		unit = time.Second
	case 'm':
		unit = time.Millisecond
	case 'u':
		unit = time.Microsecond
	case 'n':
		unit = time.Nanosecond
	default:
		return 0, false
	}
	n, err := strconv.ParseInt(v[:len(v)-1], 10, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	if n > int64(1<<63-1)/int64(unit) {
		return 1<<63 - 1, true
	}
	return time.Duration(n) * unit, true
}

// Frame and header block encoding.

func appendFrameHeader(b []byte, length int, t http2.FrameType, flags http2.Flags, stream uint32) []byte {
	return append(b, byte(length>>16), byte(length>>8), byte(length), byte(t), byte(flags),
		byte(stream>>24)&0x7f, byte(stream>>16), byte(stream>>8), byte(stream))
}

func appendSettings(b []byte, ss ...http2.Setting) []byte {
	b = appendFrameHeader(b, 6*len(ss), http2.FrameSettings, 0, 0)
	for _, s := range ss {
		b = binary.BigEndian.AppendUint16(b, uint16(s.ID))
		b = binary.BigEndian.AppendUint32(b, s.Val)
	}
	return b
}

func appendWindowUpdate(b []byte, stream, incr uint32) []byte {
	b = appendFrameHeader(b, 4, http2.FrameWindowUpdate, 0, stream)
	return binary.BigEndian.AppendUint32(b, incr&0x7fffffff)
}

func appendGoAway(b []byte, lastStream uint32, code http2.ErrCode) []byte {
	b = appendFrameHeader(b, 8, http2.FrameGoAway, 0, 0)
	b = binary.BigEndian.AppendUint32(b, lastStream&0x7fffffff)
	return binary.BigEndian.AppendUint32(b, uint32(code))
}

func appendRST(b []byte, stream uint32, code http2.ErrCode) []byte {
	b = appendFrameHeader(b, 4, http2.FrameRSTStream, 0, stream)
	return binary.BigEndian.AppendUint32(b, uint32(code))
}

// appendHeaders appends one HEADERS frame whose block block appends; the
// blocks written here are far below the smallest frame size allowed.
func appendHeaders(b []byte, stream uint32, endStream bool, block func([]byte) []byte) []byte {
	start := len(b)
	flags := http2.FlagHeadersEndHeaders
	if endStream {
		flags |= http2.FlagHeadersEndStream
	}
	b = appendFrameHeader(b, 0, http2.FrameHeaders, flags, stream)
	b = block(b)
	n := len(b) - start - 9
	b[start], b[start+1], b[start+2] = byte(n>>16), byte(n>>8), byte(n)
	return b
}

// Header fields, hpack-encoded without Huffman coding (RFC 7541 6.1 and
// 6.2): the two that every answer carries go through hpackTable; the
// others are literals that the dynamic table does not keep.
var (
	hdrStatus200     = []byte{0x88} // :status 200, static index 8
	hdrGRPCStatusKey = appendLiteral([]byte{0x00}, "grpc-status")
	hdrGRPCMsgKey    = appendLiteral([]byte{0x00}, "grpc-message")
)

// The fields hpackTable adds to the peer's dynamic table.
const (
	fieldContentType  = iota // content-type: application/grpc
	fieldGRPCStatusOK        // grpc-status: 0
)

var (
	// Each added with incremental indexing (RFC 7541 6.2.1): the
	// first by static name index 31, the second by a new name.
	addField = [...][]byte{
		fieldContentType:  appendLiteral([]byte{0x40 | 31}, "application/grpc"),
		fieldGRPCStatusOK: appendLiteral(appendLiteral([]byte{0x40}, "grpc-status"), "0"),
	}
	// Their size in the table (RFC 7541 4.1): 32 bytes more than name
	// and value each.
	tableNeeds = uint32(32+len("content-type")+len("application/grpc")) + uint32(32+len("grpc-status")+len("0"))
)

// hpackTable is the transport's side of the peer's HPACK dynamic table,
// for the answers' header blocks, which are written in the order they are
// encoded (under the connection's lock). The fields every answer carries
// are added to the table the first time, then sent as one-byte indexes,
// as grpc-go's server and the proxies' decoders expect; a peer whose
// SETTINGS_HEADER_TABLE_SIZE cannot hold them gets literals.
type hpackTable struct {
	limit   uint32 // the peer's SETTINGS_HEADER_TABLE_SIZE
	limitOK bool   // limit was set; the default is 4096
	resize  bool   // the limit changed: the next block empties the table
	added   []int  // the fields added, oldest first
}

func (t *hpackTable) setLimit(v uint32) {
	if !t.limitOK || v != t.limit {
		t.limit, t.limitOK, t.resize = v, true, true
	}
}

// begin starts a header block: after a change of the peer's limit, a
// dynamic table size update to 0 (the table empties), then to the
// size used from now on.
func (t *hpackTable) begin(b []byte) []byte {
	if !t.resize {
		return b
	}
	t.resize, t.added = false, t.added[:0]
	b = append(b, 0x20) // size update to 0
	return appendInt(b, 5, 0x20, uint64(min(t.limit, 4096)))
}

// appendField appends field f: its index once it is in the table, else
// it is added when it fits.
func (t *hpackTable) appendField(b []byte, f int) []byte {
	for i, a := range t.added {
		if a == f { // the newest entry is index 62, the first dynamic one
			return appendInt(b, 7, 0x80, uint64(62+len(t.added)-1-i))
		}
	}
	limit := uint32(4096)
	if t.limitOK {
		limit = min(t.limit, 4096)
	}
	if limit < tableNeeds { // literals without indexing
		if f == fieldContentType {
			return appendLiteral(append(b, 0x0f, 0x10), "application/grpc")
		}
		return appendLiteral(appendLiteral(append(b, 0x00), "grpc-status"), "0")
	}
	t.added = append(t.added, f)
	return append(b, addField[f]...)
}

// appendInt appends an HPACK integer of an n-bit prefix (RFC 7541 5.1),
// the first byte's other bits being flags.
func appendInt(b []byte, n uint, flags byte, v uint64) []byte {
	max := uint64(1)<<n - 1
	if v < max {
		return append(b, flags|byte(v))
	}
	b = append(b, flags|byte(max))
	v -= max
	for v >= 128 {
		b = append(b, byte(v&0x7f|0x80))
		v >>= 7
	}
	return append(b, byte(v))
}

// appendLiteral appends a string literal: its length, 7-bit prefix, and
// its bytes.
func appendLiteral(b []byte, s string) []byte {
	n := uint64(len(s))
	if n < 127 {
		b = append(b, byte(n))
	} else {
		b = append(b, 127)
		n -= 127
		for n >= 128 {
			b = append(b, byte(n&0x7f|0x80))
			n >>= 7
		}
		b = append(b, byte(n))
	}
	return append(b, s...)
}

// appendGRPCStatus appends grpc-status and, when there is one,
// grpc-message, percent-encoded as gRPC over HTTP/2 says.
func appendGRPCStatus(b []byte, code codes.Code, msg string) []byte {
	b = append(b, hdrGRPCStatusKey...)
	b = appendLiteral(b, strconv.Itoa(int(code)))
	if msg == "" {
		return b
	}
	if len(msg) > maxMessageText {
		msg = msg[:maxMessageText]
	}
	b = append(b, hdrGRPCMsgKey...)
	return appendLiteral(b, percentEncode(msg))
}

func percentEncode(s string) string {
	const hex = "0123456789ABCDEF"
	clean := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '%' {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	out := make([]byte, 0, len(s)+16)
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '%' {
			out = append(out, '%', hex[c>>4], hex[c&0xf])
		} else {
			out = append(out, c)
		}
	}
	return string(out)
}
