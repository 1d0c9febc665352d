package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// h2conn is a gRPC client connection of its own (-client h2): HTTP/2
// (over TLS or not), the requests encoded once, a call's HEADERS and DATA
// frames written together, and the calls of all senders written in one
// write when they meet. It does per call little more than a proxy does,
// so that on a machine the servers share with it the generator takes less
// of the CPU than grpc-go's client (-client grpc), which does per call
// about what a server does. Both send the same requests with the same
// headers: :method POST, :scheme http, :path, :authority, content-type
// application/grpc, te trailers, grpc-timeout and user-agent, indexed in
// HPACK's dynamic table after the first call as grpc-go's are.
type h2conn struct {
	nc   net.Conn
	reqs [][]byte // one gRPC message (prefix and protobuf) per user

	mu      sync.Mutex
	wbuf    []byte
	spare   []byte
	writing bool
	err     error // the connection failed: every call fails
	enc     *hpack.Encoder
	encBuf  bytes.Buffer
	block   []byte // the header block, once it is all indexed
	fields  []hpack.HeaderField
	nextID  uint32
	calls   map[uint32]*h2call
	sendWin int64
	winWait *sync.Cond
}

// h2call is one sender's call in flight; a sender reuses it.
type h2call struct {
	id      uint32
	status  string // :status
	grpc    string // grpc-status
	message string // grpc-message
	body    []byte
	done    chan h2result
}

type h2result struct {
	id   uint32
	code rlsv3.RateLimitResponse_Code
	err  error
}

const (
	clientStreamWindow = 1 << 20
	clientConnWindow   = 1 << 30
)

// dialH2 opens an HTTP/2 connection to addr, over TLS when tc is set (its
// handshake done before the preface is sent).
func dialH2(addr string, tc *tls.Config, timeout time.Duration, reqs []*rlsv3.RateLimitRequest) (*h2conn, error) {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	scheme := "http"
	if tc != nil {
		t := tls.Client(nc, tc)
		nc.SetDeadline(time.Now().Add(timeout))
		if err := t.Handshake(); err != nil {
			nc.Close()
			return nil, fmt.Errorf("TLS handshake: %w", err)
		}
		nc.SetDeadline(time.Time{})
		if p := t.ConnectionState().NegotiatedProtocol; p != "h2" {
			t.Close()
			return nil, fmt.Errorf("TLS: the server did not agree to h2 by ALPN (got %q)", p)
		}
		nc, scheme = t, "https"
	}
	c := &h2conn{nc: nc, nextID: 1, calls: make(map[uint32]*h2call), sendWin: 65535}
	c.winWait = sync.NewCond(&c.mu)
	for _, r := range reqs {
		b, err := proto.Marshal(r)
		if err != nil {
			nc.Close()
			return nil, err
		}
		m := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(b)))
		c.reqs = append(c.reqs, append(m, b...))
	}
	c.enc = hpack.NewEncoder(&c.encBuf)
	c.fields = []hpack.HeaderField{
		{Name: ":method", Value: "POST"},
		{Name: ":scheme", Value: scheme},
		{Name: ":path", Value: "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"},
		{Name: ":authority", Value: addr},
		{Name: "content-type", Value: "application/grpc"},
		{Name: "user-agent", Value: "rlsload"},
		{Name: "te", Value: "trailers"},
		{Name: "grpc-timeout", Value: strconv.FormatInt(max(timeout.Milliseconds(), 1), 10) + "m"},
	}
	b := []byte(http2.ClientPreface)
	b = appendFrameHeader(b, 12, http2.FrameSettings, 0, 0)
	b = binary.BigEndian.AppendUint16(b, uint16(http2.SettingEnablePush))
	b = binary.BigEndian.AppendUint32(b, 0)
	b = binary.BigEndian.AppendUint16(b, uint16(http2.SettingInitialWindowSize))
	b = binary.BigEndian.AppendUint32(b, clientStreamWindow)
	b = appendFrameHeader(b, 4, http2.FrameWindowUpdate, 0, 0)
	b = binary.BigEndian.AppendUint32(b, clientConnWindow-65535)
	if _, err := nc.Write(b); err != nil {
		nc.Close()
		return nil, err
	}
	go c.read()
	return c, nil
}

func (c *h2conn) Close() error { return c.nc.Close() }

// call sends user's request and waits for its answer or the timeout.
func (c *h2conn) call(cl *h2call, user int, timer *time.Timer, timeout time.Duration) (rlsv3.RateLimitResponse_Code, error) {
	msg := c.reqs[user]
	c.mu.Lock()
	for c.err == nil && c.sendWin < int64(len(msg)) {
		c.winWait.Wait()
	}
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return 0, err
	}
	id := c.nextID
	c.nextID += 2
	cl.id, cl.status, cl.grpc, cl.message, cl.body = id, "", "", "", cl.body[:0]
	c.calls[id] = cl
	block := c.block
	if block == nil {
		c.encBuf.Reset()
		for _, f := range c.fields {
			c.enc.WriteField(f)
		}
		block = c.encBuf.Bytes()
		if len(block) == len(c.fields) { // every field indexed: it stays so
			c.block = bytes.Clone(block)
		}
	}
	c.wbuf = appendFrameHeader(c.wbuf, len(block), http2.FrameHeaders, http2.FlagHeadersEndHeaders, id)
	c.wbuf = append(c.wbuf, block...)
	c.wbuf = appendFrameHeader(c.wbuf, len(msg), http2.FrameData, http2.FlagDataEndStream, id)
	c.wbuf = append(c.wbuf, msg...)
	c.sendWin -= int64(len(msg))
	c.flushLocked()
	c.mu.Unlock()

	timer.Reset(timeout)
	defer timer.Stop()
	for {
		select {
		case r := <-cl.done:
			if r.id != id {
				continue // of a call that timed out before
			}
			return r.code, r.err
		case <-timer.C:
			c.mu.Lock()
			delete(c.calls, id)
			c.wbuf = appendFrameHeader(c.wbuf, 4, http2.FrameRSTStream, 0, id)
			c.wbuf = binary.BigEndian.AppendUint32(c.wbuf, uint32(http2.ErrCodeCancel))
			c.flushLocked()
			c.mu.Unlock()
			return 0, fmt.Errorf("no answer within %v", timeout)
		}
	}
}

// flushLocked writes wbuf out unless another goroutine is writing; that
// one then writes what was added meanwhile too.
func (c *h2conn) flushLocked() {
	if c.writing {
		return
	}
	c.writing = true
	for len(c.wbuf) > 0 && c.err == nil {
		buf := c.wbuf
		c.wbuf = c.spare[:0]
		c.mu.Unlock()
		_, err := c.nc.Write(buf)
		c.mu.Lock()
		c.spare = buf[:0]
		if err != nil {
			c.failLocked(err)
		}
	}
	c.writing = false
}

// failLocked fails the connection and every call in flight.
func (c *h2conn) failLocked(err error) {
	if c.err == nil {
		c.err = err
	}
	for id, cl := range c.calls {
		cl.done <- h2result{id: id, err: c.err}
		delete(c.calls, id)
	}
	c.wbuf = c.wbuf[:0]
	c.winWait.Broadcast()
}

func (c *h2conn) read() {
	fr := http2.NewFramer(io.Discard, bufio.NewReaderSize(c.nc, 32<<10))
	fr.SetReuseFrames()
	var cur *h2call // the call whose header block is being decoded
	dec := hpack.NewDecoder(4096, func(f hpack.HeaderField) {
		if cur == nil {
			return
		}
		switch f.Name {
		case ":status":
			cur.status = f.Value
		case "grpc-status":
			cur.grpc = f.Value
		case "grpc-message":
			cur.message = f.Value
		}
	})
	var unacked uint32
	err := func() error {
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return err
			}
			switch f := f.(type) {
			case *http2.HeadersFrame:
				c.mu.Lock()
				cur = c.calls[f.StreamID]
				c.mu.Unlock()
				if _, err := dec.Write(f.HeaderBlockFragment()); err != nil {
					return err
				}
				if f.HeadersEnded() {
					if err := dec.Close(); err != nil {
						return err
					}
				}
				if f.StreamEnded() {
					c.finish(f.StreamID, cur)
				}
			case *http2.ContinuationFrame:
				if _, err := dec.Write(f.HeaderBlockFragment()); err != nil {
					return err
				}
				if f.HeadersEnded() {
					if err := dec.Close(); err != nil {
						return err
					}
				}
			case *http2.DataFrame:
				if unacked += f.Length; unacked >= clientConnWindow/2 {
					c.mu.Lock()
					c.wbuf = appendFrameHeader(c.wbuf, 4, http2.FrameWindowUpdate, 0, 0)
					c.wbuf = binary.BigEndian.AppendUint32(c.wbuf, unacked)
					c.flushLocked()
					c.mu.Unlock()
					unacked = 0
				}
				c.mu.Lock()
				cl := c.calls[f.StreamID]
				if cl != nil {
					cl.body = append(cl.body, f.Data()...)
				}
				c.mu.Unlock()
				if f.StreamEnded() {
					c.finish(f.StreamID, cl)
				}
			case *http2.SettingsFrame:
				if f.IsAck() {
					continue
				}
				c.mu.Lock()
				c.wbuf = appendFrameHeader(c.wbuf, 0, http2.FrameSettings, http2.FlagSettingsAck, 0)
				c.flushLocked()
				c.mu.Unlock()
			case *http2.PingFrame:
				if f.IsAck() {
					continue
				}
				c.mu.Lock()
				c.wbuf = appendFrameHeader(c.wbuf, 8, http2.FramePing, http2.FlagPingAck, 0)
				c.wbuf = append(c.wbuf, f.Data[:]...)
				c.flushLocked()
				c.mu.Unlock()
			case *http2.WindowUpdateFrame:
				if f.StreamID == 0 {
					c.mu.Lock()
					c.sendWin += int64(f.Increment)
					c.winWait.Broadcast()
					c.mu.Unlock()
				}
			case *http2.RSTStreamFrame:
				c.mu.Lock()
				if cl := c.calls[f.StreamID]; cl != nil {
					delete(c.calls, f.StreamID)
					cl.done <- h2result{id: f.StreamID, err: fmt.Errorf("stream reset: %v", f.ErrCode)}
				}
				c.mu.Unlock()
			case *http2.GoAwayFrame:
				return fmt.Errorf("server sent GOAWAY: %v", f.ErrCode)
			}
		}
	}()
	c.mu.Lock()
	c.failLocked(err)
	c.mu.Unlock()
}

// finish answers the call of a stream that ended: its message's
// overall_code when the status is OK, else an error.
func (c *h2conn) finish(id uint32, cl *h2call) {
	if cl == nil {
		return // timed out and forgotten
	}
	c.mu.Lock()
	if c.calls[id] != cl {
		c.mu.Unlock()
		return
	}
	delete(c.calls, id)
	c.mu.Unlock()
	r := h2result{id: id}
	switch {
	case cl.status != "200":
		r.err = fmt.Errorf("HTTP status %q", cl.status)
	case cl.grpc != "0":
		r.err = fmt.Errorf("grpc-status %s: %s", cl.grpc, cl.message)
	default:
		r.code, r.err = overallCode(cl.body)
	}
	cl.done <- r
}

// overallCode reads RateLimitResponse.overall_code (field 1) from one
// gRPC message.
func overallCode(b []byte) (rlsv3.RateLimitResponse_Code, error) {
	if len(b) < 5 || b[0] != 0 || int(binary.BigEndian.Uint32(b[1:5])) != len(b)-5 {
		return 0, errors.New("the answer is not one uncompressed gRPC message")
	}
	b = b[5:]
	var code rlsv3.RateLimitResponse_Code
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, errors.New("malformed RateLimitResponse")
		}
		b = b[n:]
		if num == 1 && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return 0, errors.New("malformed RateLimitResponse")
			}
			code, b = rlsv3.RateLimitResponse_Code(v), b[n:]
			continue
		}
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return 0, errors.New("malformed RateLimitResponse")
		}
		b = b[n:]
	}
	return code, nil
}

func appendFrameHeader(b []byte, length int, t http2.FrameType, flags http2.Flags, stream uint32) []byte {
	return append(b, byte(length>>16), byte(length>>8), byte(length), byte(t), byte(flags),
		byte(stream>>24)&0x7f, byte(stream>>16), byte(stream>>8), byte(stream))
}
