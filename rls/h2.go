package rls

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
)

// The service's own HTTP/2 transport answers the unary calls a proxy
// makes, ShouldRateLimit and Health/Check, on connections whose first call
// is one of them; a connection that starts with any other call (server
// reflection, Health/Watch, a misspelt method) is handed, with the bytes
// read so far, to a grpc-go server that serves every method. A proxy's
// connections thus skip grpc-go's per-call goroutines, buffers and
// message reflection, while tools such as grpcurl find the full service.
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
//     and resets streams in a loop is refused, REFUSED_STREAM, past it);
//   - requests' bytes: connWindow for the connection, flow control
//     returning a request's bytes once its call is answered, and
//     streamWindow and maxDataFrames for one request;
//   - header blocks: maxHeaderBlock bytes as sent (CONTINUATION frames
//     counted with their frame headers), maxHeaderList bytes as decoded,
//     and ConnectionTimeout from a block's first frame to its last;
//   - answers and control frames (PING and SETTINGS acks, RST_STREAM)
//     waiting on a peer that does not read: maxWriteBuffer bytes, and
//     those of the calls in flight, before the connection stops reading
//     from the peer; a write blocked for KeepaliveTimeout ends it;
//   - time: ConnectionTimeout for the preface and first SETTINGS, and,
//     as grpc-go does, a ping after KeepaliveTime of silence and the end
//     after KeepaliveTimeout more; a connection silent before its first
//     call is handed to grpc-go instead;
//   - flow control: a window taken past 2^31-1 is a FLOW_CONTROL_ERROR,
//     of the connection or of the stream, as RFC 9113 6.9 says.
//
// A connection error ends the connection with a GOAWAY of its code.

const (
	pathShouldRateLimit = "/" + ServiceName + "/ShouldRateLimit"
	pathHealthCheck     = "/grpc.health.v1.Health/Check"
)

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
	// maxDataFrames bounds the DATA frames of one request, so that a
	// stream of empty frames ends.
	maxDataFrames = 4096
	// maxWindow is the largest flow control window, 2^31-1 (RFC 9113
	// 6.9.1).
	maxWindow = 1<<31 - 1
	// maxMessageText bounds grpc-message, in bytes before encoding.
	maxMessageText = 1024
)

type method uint8

const (
	methodOther method = iota
	methodRLS
	methodHealth
)

// h2conn is one connection served by the transport. Its reader goroutine
// (serve) owns the frame reader and the header decoder; the fields under
// mu are shared with the calls that answer on it.
type h2conn struct {
	s   *Server
	nc  net.Conn
	rec *recorder
	fr  *http2.Framer
	dec *hpack.Decoder
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
	streams  map[uint32]*h2stream
	wbuf     []byte // frames waiting to be written
	spare    []byte
	writing  bool // a goroutine is writing wbuf out
	werr     error
	sendWin  int64 // connection send window
	initWin  int64 // peer's SETTINGS_INITIAL_WINDOW_SIZE
	maxFrame int   // peer's SETTINGS_MAX_FRAME_SIZE
	pending  []*h2stream
	draining bool // a GOAWAY was sent: no new streams
	active   int  // calls dispatched and not yet answered
	table    hpackTable
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
	method      method
	contentType bool // application/grpc or one of its subtypes
	compressed  bool // a grpc-encoding other than identity
	timeout     time.Duration
	size        int  // bytes of the header block so far, frame headers included
	listSize    int  // bytes of the header list decoded so far
	tooLarge    bool // the header list passed maxHeaderList
	endStream   bool // the request ends with its headers: no message
}

// h2stream is one call: its request, answer and flow control. Streams are
// pooled with the buffers they grew.
type h2stream struct {
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

	req     request
	rep     reply
	scratch scratch
	out     []byte // the answer's gRPC message: prefix and protobuf
	off     int    // bytes of out sent
	// code and msg are the answer's gRPC status.
	code codes.Code
	msg  string
}

var streamPool = sync.Pool{New: func() any { return new(h2stream) }}

func newStream(id uint32, hdr headerState, win int64) *h2stream {
	st := streamPool.Get().(*h2stream)
	st.id, st.hdr, st.sendWin = id, hdr, win
	st.body, st.out, st.off = st.body[:0], st.out[:0], 0
	st.recvd, st.frames = 0, 0
	st.dispatched, st.answered, st.reset = false, false, false
	st.code, st.msg = codes.OK, ""
	return st
}

func releaseStream(st *h2stream) {
	st.deadline = time.Time{}
	if cap(st.body) > 64<<10 {
		st.body = nil
	}
	st.req.reset()
	clear(st.scratch.applied[:cap(st.scratch.applied)]) // keeps no policy alive in the pool
	streamPool.Put(st)
}

// recorder reads the connection for its reader, under the read
// deadlines, and keeps what is read until the first call is known, for a
// handover to grpc-go.
type recorder struct {
	c    *h2conn
	buf  []byte
	keep bool
}

func (r *recorder) Read(p []byte) (int, error) {
	c := r.c
	for {
		c.nc.SetReadDeadline(c.readDeadline(time.Now()))
		n, err := c.nc.Read(p)
		if r.keep {
			r.buf = append(r.buf, p[:n]...)
		}
		if n > 0 {
			c.pingDue = time.Time{}
			return n, err
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) || !c.keepalive(time.Now()) {
			return n, err
		}
	}
}

// readDeadline is when the read under way fails: the preface's or the
// header block's deadline, else KeepaliveTime from now, or the end of the
// wait for the keepalive ping's answer.
func (c *h2conn) readDeadline(now time.Time) time.Time {
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
func (c *h2conn) keepalive(now time.Time) bool {
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
// bytes first.
type replayConn struct {
	net.Conn
	replay []byte
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

// connError is an error of the connection (RFC 9113 5.4.1): the
// connection ends with a GOAWAY of its code.
type connError struct {
	code http2.ErrCode
	why  string
}

func (e connError) Error() string { return "http2: " + e.code.String() + ": " + e.why }

// newConn is the transport's state for an accepted connection; serve
// serves it. The connection closes when ctx ends.
func (s *Server) newConn(ctx context.Context, nc net.Conn) *h2conn {
	c := &h2conn{s: s, nc: nc, streams: make(map[uint32]*h2stream), sendWin: 65535, initWin: 65535, maxFrame: 16384, recvWin: 65535}
	c.ctx, c.cancel = context.WithCancel(ctx)
	c.rec = &recorder{c: c, keep: true}
	c.drained.L = &c.mu
	return c
}

// serve serves the connection until it closes or is handed over.
func (c *h2conn) serve() {
	stop := context.AfterFunc(c.ctx, func() { c.nc.Close() })
	defer stop()
	defer c.cancel()
	if c.s.stopping.Load() {
		c.goAway()
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
	if errors.Is(err, errHandedOver) {
		stop()
		return
	}
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
		// nothing holds up to KeepaliveTimeout.
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
	for _, st := range c.streams {
		if !st.dispatched {
			releaseStream(st)
		}
	}
	clear(c.streams)
	c.mu.Unlock()
	c.nc.Close()
}

// read reads frames until the connection fails or is handed over.
func (c *h2conn) read(br *bufio.Reader) error {
	var preface [len(http2.ClientPreface)]byte
	if _, err := io.ReadFull(br, preface[:]); err != nil {
		return err
	}
	if string(preface[:]) != http2.ClientPreface {
		return errors.New("not an HTTP/2 client preface")
	}
	if c.s.ownAll {
		c.take(0, nil)
	}
	// Until the first call is known, answers to the peer's frames wait
	// here: a connection handed over must not have had them.
	var settingsAcks int
	var pings [][8]byte
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
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				if err := c.applySettings(f); err != nil {
					return err
				}
				settingsAcks++
			}
			continue
		case *http2.PingFrame:
			if !f.IsAck() {
				pings = append(pings, f.Data)
			}
			continue
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				if c.sendWin+int64(f.Increment) > maxWindow {
					return connError{http2.ErrCodeFlowControl, "the connection's send window passed 2^31-1"}
				}
				c.sendWin += int64(f.Increment)
			}
			continue
		case *http2.HeadersFrame:
			if err := c.onHeaders(f); err != nil {
				return err
			}
			if !f.HeadersEnded() {
				continue
			}
		case *http2.ContinuationFrame:
			if err := c.onContinuation(f); err != nil {
				return err
			}
			if !f.HeadersEnded() {
				continue
			}
		case *http2.GoAwayFrame:
			return io.EOF
		default:
			// PRIORITY or an extension's: kept for grpc-go, ignored
			// here.
			continue
		}
		// The first header block is complete: a connection whose first
		// call is not ShouldRateLimit is no proxy's.
		if c.hdr.method != methodRLS {
			return c.handOver(br)
		}
		c.take(settingsAcks, pings)
		c.endHeaders()
	}
}

// take makes the connection the transport's: the answers to the peer's
// frames held until now (settingsAcks SETTINGS, pings) are written, then
// the transport's settings and connection window.
func (c *h2conn) take(settingsAcks int, pings [][8]byte) {
	c.decided = true
	c.rec.keep, c.rec.buf = false, nil
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
// for a write under way: a peer that sends but does not read gets no
// more answers buffered than that, and those of the calls in flight.
func (c *h2conn) throttle() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.writing && len(c.wbuf) > maxWriteBuffer && c.werr == nil {
		c.stalls++
		for c.writing && len(c.wbuf) > maxWriteBuffer && c.werr == nil {
			c.drained.Wait()
		}
	}
	return c.werr
}

// handOver gives the connection, and every byte read from it, to the
// grpc-go server.
func (c *h2conn) handOver(br *bufio.Reader) error {
	c.nc.SetDeadline(time.Time{}) // grpc-go sets its own
	if err := c.s.handOver(&replayConn{Conn: c.nc, replay: c.rec.buf}); err != nil {
		return err
	}
	return errHandedOver
}

func (c *h2conn) applySettings(f *http2.SettingsFrame) error {
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
func (c *h2conn) onFrame(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.HeadersFrame:
		if err := c.onHeaders(f); err != nil {
			return err
		}
		if f.HeadersEnded() {
			c.endHeaders()
		}
	case *http2.ContinuationFrame:
		if err := c.onContinuation(f); err != nil {
			return err
		}
		if f.HeadersEnded() {
			c.endHeaders()
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
	case *http2.RSTStreamFrame:
		c.mu.Lock()
		if st := c.streams[f.StreamID]; st != nil && !st.reset {
			c.resetLocked(st)
			c.flushLocked() // the window it returned, if any
		}
		c.mu.Unlock()
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

// resetLocked ends a stream that the peer reset. A stream whose call
// runs stays counted among the streams until the call ends, so that
// maxStreams bounds the calls in flight however fast the peer opens and
// resets streams; its answer is then dropped.
func (c *h2conn) resetLocked(st *h2stream) {
	st.reset = true
	switch {
	case !st.dispatched:
		c.creditLocked(st.recvd)
		c.closeLocked(st)
	case st.answered: // waiting for window, in c.pending
		for i, p := range c.pending {
			if p == st {
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
func (c *h2conn) creditLocked(n int64) {
	c.recvFree += n
	if c.recvFree >= connWindow/2 {
		c.wbuf = appendWindowUpdate(c.wbuf, 0, uint32(c.recvFree))
		c.recvWin += c.recvFree
		c.recvFree = 0
	}
}

// onHeaders starts a header block: a new stream's request headers.
func (c *h2conn) onHeaders(f *http2.HeadersFrame) error {
	if f.StreamID%2 == 0 || f.StreamID <= c.lastStream.Load() {
		// Trailers from the client, or a reused id: gRPC clients send
		// neither.
		return connError{http2.ErrCodeProtocol, "headers on a stream that is not new"}
	}
	c.lastStream.Store(f.StreamID)
	c.hdr = headerState{size: 9 + len(f.HeaderBlockFragment()), endStream: f.StreamEnded()}
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

func (c *h2conn) onContinuation(f *http2.ContinuationFrame) error {
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
func (c *h2conn) onField(f hpack.HeaderField) {
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
		switch f.Value {
		case pathShouldRateLimit:
			c.hdr.method = methodRLS
		case pathHealthCheck:
			c.hdr.method = methodHealth
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

// endHeaders opens the stream whose header block just ended.
func (c *h2conn) endHeaders() {
	id, hdr := c.headersOf, c.hdr
	c.headersOf = 0
	endStream := hdr.endStream
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.draining || len(c.streams) >= maxStreams {
		c.wbuf = appendRST(c.wbuf, id, http2.ErrCodeRefusedStream)
		c.flushLocked()
		return
	}
	st := newStream(id, hdr, c.initWin)
	c.streams[id] = st
	if hdr.method == methodOther || hdr.tooLarge {
		// Answered at once, whether or not the request goes on (a stream
		// of server reflection would wait for an answer).
		st.dispatched = true
		c.active++
		st.code, st.msg = codes.Unimplemented, "unknown method: this connection serves "+pathShouldRateLimit+" and "+pathHealthCheck
		if hdr.tooLarge {
			st.code, st.msg = codes.ResourceExhausted, "header list larger than "+strconv.Itoa(maxHeaderList)+" bytes"
		}
		c.respondLocked(st)
		if !endStream {
			c.wbuf = appendRST(c.wbuf, id, http2.ErrCodeNo)
		}
		c.flushLocked()
		return
	}
	if endStream {
		c.dispatchLocked(st)
	}
}

func (c *h2conn) onData(f *http2.DataFrame) error {
	n := int64(f.Length) // padding included, as flow control counts it
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recvWin -= n
	if c.recvWin < 0 {
		return connError{http2.ErrCodeFlowControl, "the connection's receive window exceeded"}
	}
	st := c.streams[f.StreamID]
	if st == nil || st.dispatched {
		// Reset, refused or answered already: discarded, and its room
		// given back.
		c.creditLocked(n)
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
func (c *h2conn) dispatchLocked(st *h2stream) {
	st.dispatched = true
	c.active++
	c.s.calls.Add(1)
	if st.hdr.timeout > 0 {
		st.deadline = time.Now().Add(st.hdr.timeout)
	}
	job := h2job{c: c, st: st}
	select {
	case c.s.work <- job:
	default:
		go job.run()
	}
}

// h2job is one call for a worker.
type h2job struct {
	c  *h2conn
	st *h2stream
}

func (j h2job) run() {
	j.c.s.answer(j.c.ctx, j.st)
	j.c.respond(j.st)
	j.c.s.calls.Done()
}

// answer decides a call and leaves its answer in st. The decision runs
// in ctx, the connection's, not in a context of the call's own with a
// timer: the decision store's timeout already bounds every decision, so a
// call the peer resets or gives up on runs at most that long, and its
// answer is dropped. The call's deadline keeps a call that waited past it
// from being decided at all.
func (s *Server) answer(ctx context.Context, st *h2stream) {
	msg, err := grpcMessage(st)
	if err == nil && !st.deadline.IsZero() && !time.Now().Before(st.deadline) {
		err = status.Error(codes.DeadlineExceeded, "the call's deadline passed before it was decided")
	}
	if err == nil {
		switch st.hdr.method {
		case methodRLS:
			err = s.decodeAndDecide(ctx, msg, st)
		case methodHealth:
			err = s.health(msg, st)
		}
	}
	if err != nil {
		s := status.Convert(err)
		st.code, st.msg = s.Code(), s.Message()
	}
}

// grpcMessage is a unary request's one message, uncompressed.
func grpcMessage(st *h2stream) ([]byte, error) {
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

func (s *Server) decodeAndDecide(ctx context.Context, msg []byte, st *h2stream) error {
	if err := decodeRequest(msg, &st.req); err != nil {
		return status.Error(codes.Internal, "grpc: error unmarshalling request: "+err.Error())
	}
	err := s.decide(ctx, &st.req, &st.rep, &st.scratch)
	s.count(&st.rep, err)
	if err != nil {
		return err
	}
	out := appendResponse(append(st.out[:0], 0, 0, 0, 0, 0), &st.rep.resp)
	binary.BigEndian.PutUint32(out[1:5], uint32(len(out)-5))
	st.out = out
	return nil
}

// health answers grpc.health.v1.Health/Check for the service and for ""
// (the server): SERVING until shutdown begins, then NOT_SERVING.
func (s *Server) health(msg []byte, st *h2stream) error {
	service, err := decodeHealthRequest(msg)
	if err != nil {
		return status.Error(codes.Internal, "grpc: error unmarshalling request: "+err.Error())
	}
	if service != "" && service != ServiceName {
		return status.Error(codes.NotFound, "unknown service")
	}
	const serving, notServing = 1, 2
	v := uint64(serving)
	if s.stopping.Load() {
		v = notServing
	}
	st.out = append(st.out[:0], 0, 0, 0, 0, 2, 1<<3|0, byte(v)) // status (1): varint
	return nil
}

// decodeHealthRequest reads HealthCheckRequest.service (field 1).
func decodeHealthRequest(b []byte) (string, error) {
	var service string
	for off := 0; off < len(b); {
		num, typ, n := consumeTag(b[off:])
		if n < 0 {
			return "", errMalformed
		}
		off += n
		if num == 1 && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b[off:])
			if n < 0 {
				return "", errMalformed
			}
			service = string(v)
			off += n
			continue
		}
		if n = protowire.ConsumeFieldValue(num, typ, b[off:]); n < 0 {
			return "", errMalformed
		}
		off += n
	}
	return service, nil
}

// respond writes a call's answer: the response headers, its message as
// flow control allows, then the trailers; or the trailers alone for an
// error.
func (c *h2conn) respond(st *h2stream) {
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
	if c.draining && c.active == 0 && len(c.pending) == 0 {
		c.nc.Close()
	}
}

func (c *h2conn) respondLocked(st *h2stream) {
	c.active--
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
		if !c.sendLocked(st) {
			c.pending = append(c.pending, st)
		}
	}
}

// sendLocked writes as much of st's message as the windows allow and,
// once all of it is out, the trailers; it reports whether st is done.
func (c *h2conn) sendLocked(st *h2stream) bool {
	for st.off < len(st.out) {
		n := min(int64(len(st.out)-st.off), c.sendWin, st.sendWin, int64(c.maxFrame))
		if n <= 0 {
			return false
		}
		c.wbuf = appendFrameHeader(c.wbuf, int(n), http2.FrameData, 0, st.id)
		c.wbuf = append(c.wbuf, st.out[st.off:st.off+int(n)]...)
		st.off += int(n)
		c.sendWin -= n
		st.sendWin -= n
	}
	c.wbuf = appendHeaders(c.wbuf, st.id, true, func(b []byte) []byte {
		return c.table.appendField(c.table.begin(b), fieldGRPCStatusOK)
	})
	c.closeLocked(st)
	return true
}

// closeLocked forgets an answered stream.
func (c *h2conn) closeLocked(st *h2stream) {
	delete(c.streams, st.id)
	releaseStream(st)
}

// drainPendingLocked sends the answers that waited for window.
func (c *h2conn) drainPendingLocked() {
	kept := c.pending[:0]
	for _, st := range c.pending { // reset ones are gone: see resetLocked
		if !c.sendLocked(st) {
			kept = append(kept, st)
		}
	}
	clear(c.pending[len(kept):])
	c.pending = kept
}

// flushLocked writes wbuf out, unless another goroutine is doing so: it
// then writes what was added meanwhile too. Called with mu held; mu is
// released during the write.
func (c *h2conn) flushLocked() {
	if c.writing {
		return
	}
	c.writing = true
	for len(c.wbuf) > 0 && c.werr == nil {
		buf := c.wbuf
		c.wbuf = c.spare[:0]
		c.mu.Unlock()
		// A peer that takes in nothing for this long is as dead as one
		// that leaves a keepalive ping unanswered.
		c.nc.SetWriteDeadline(time.Now().Add(c.s.cfg.KeepaliveTimeout))
		_, err := c.nc.Write(buf)
		if err != nil {
			c.nc.Close() // and the reader's read fails
		}
		c.mu.Lock()
		c.spare = buf[:0]
		if err != nil {
			c.werr = err
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
// once its calls are answered.
func (c *h2conn) goAway() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.draining {
		return
	}
	lastStream := c.lastStream.Load()
	c.draining = true
	c.wbuf = appendGoAway(c.wbuf, lastStream, http2.ErrCodeNo)
	c.flushLocked()
	if c.active == 0 {
		c.nc.Close()
	}
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

// connQueue is a net.Listener whose connections are those handed to it.
type connQueue struct {
	addr   net.Addr
	conns  chan net.Conn
	done   chan struct{}
	closed sync.Once
}

func newConnQueue(addr net.Addr) *connQueue {
	return &connQueue{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

// put hands c to Accept; it fails once the queue is closed.
func (q *connQueue) put(c net.Conn) error {
	select {
	case q.conns <- c:
		return nil
	case <-q.done:
		return net.ErrClosed
	}
}

func (q *connQueue) Accept() (net.Conn, error) {
	select {
	case c := <-q.conns:
		return c, nil
	case <-q.done:
		return nil, net.ErrClosed
	}
}

func (q *connQueue) Close() error {
	q.closed.Do(func() { close(q.done) })
	return nil
}

func (q *connQueue) Addr() net.Addr { return q.addr }
