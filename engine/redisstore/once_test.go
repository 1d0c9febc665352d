package redisstore

import (
	"bytes"
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/engine/storetest"
	"github.com/sluice-rl/sluice/internal/redistest"
)

// replyDropper is a TCP proxy to a Redis server that, once armed, passes
// the next script call on but drops its reply and the client's
// connection: Redis ran the script, and the client saw its connection
// break.
type replyDropper struct {
	ln    net.Listener
	to    string
	armed atomic.Bool
}

func startReplyDropper(t *testing.T, to string) *replyDropper {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &replyDropper{ln: ln, to: to}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go d.serve(c)
		}
	}()
	return d
}

func (d *replyDropper) serve(c net.Conn) {
	defer c.Close()
	s, err := net.Dial("tcp", d.to)
	if err != nil {
		return
	}
	defer s.Close()
	var script atomic.Bool // the last request holds a script call
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			script.Store(bytes.Contains(bytes.ToLower(buf[:n]), []byte("evalsha")))
			if _, err := s.Write(buf[:n]); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := s.Read(buf)
		if err != nil {
			return
		}
		if script.Load() && d.armed.CompareAndSwap(true, false) {
			return // the reply is lost and the connection broken
		}
		if _, err := c.Write(buf[:n]); err != nil {
			return
		}
	}
}

// TestRedisScriptSentOnce breaks the connection of a check after Redis ran
// it, before its reply comes back: the client must not send the script
// again (go-redis resends a command whose connection broke, MaxRetries),
// which would spend the check's tokens twice. The check fails, and the
// bucket holds its burst less one check. Both ways a batch goes: one call
// per check (a pipeline) and one merged call.
func TestRedisScriptSentOnce(t *testing.T) {
	srv := redistest.Start(t)
	d := startReplyDropper(t, srv.Addr())
	c, err := NewClient("redis://" + d.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	s := New(c, Config{Timeout: time.Second})
	s.pressure = nil // the watch's deadline is not what this tests
	l := engine.Limit{Algorithm: engine.TokenBucket, Rate: 0.001, Burst: 10}
	storetest.MustCheck(t, s, storetest.One("warm", "p", l, 0))
	remaining := func(subject string) int64 {
		t.Helper()
		d, err := New(srv.Client(t), Config{Timeout: time.Second}).Check(context.Background(), storetest.One(subject, "p", l, 0))
		if err != nil {
			t.Fatal(err)
		}
		return d.Results[0].Remaining
	}

	d.armed.Store(true)
	if _, err := s.Check(context.Background(), storetest.One("each", "p", l, 1)); err == nil {
		t.Error("a check whose connection broke before its reply was decided, want an error")
	}
	if got := remaining("each"); got != 9 {
		t.Errorf("a check sent alone whose reply was lost: the bucket holds %d, want 9 (the script ran once)", got)
	}

	d.armed.Store(true)
	answers := sendMerged(t, s, []engine.Request{storetest.One("merged", "p", l, 1), storetest.One("merged", "p", l, 1)})
	for i, a := range answers {
		if a.err == nil {
			t.Errorf("check %d of a merged call whose reply was lost was decided, want an error", i)
		}
	}
	if got := remaining("merged"); got != 8 {
		t.Errorf("a merged call of two checks whose reply was lost: the bucket holds %d, want 8 (the script ran once)", got)
	}
}
