package redisstore

import (
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testwait"
)

// TestUnreadConnsSeeAWaitingReply dials a loopback listener through
// unreadConns: bytes the peer sent show as waiting until they are read,
// peeking does not consume them, a closed connection is forgotten, and
// moveReadDeadline moves the read deadline it names; a request just
// written on a connection shows it behind.
func TestUnreadConnsSeeAWaitingReply(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	u := newUnreadConns()
	c := u.watch(raw, ln.Addr().String())
	if _, ok := c.(syscall.Conn); !ok {
		t.Error("a watched TCP connection is not a syscall.Conn: go-redis would skip its health check")
	}
	peer := <-accepted
	defer peer.Close()

	if u.waiting("") {
		t.Fatal("waiting before the peer sent anything")
	}
	if _, err := peer.Write([]byte("+OK\r\n")); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 5*time.Second, "the reply seen waiting", func() bool { return u.waiting(ln.Addr().String()) })
	if u.waiting("127.0.0.1:1") {
		t.Error("a reply on one address shows as waiting on another")
	}
	buf := make([]byte, 5)
	if n, err := c.Read(buf); err != nil || string(buf[:n]) != "+OK\r\n" {
		t.Fatalf("Read = %q, %v; want the whole reply, which peeking left in place", buf[:n], err)
	}
	if u.waiting("") {
		t.Error("waiting after the reply was read")
	}

	by := time.Now().Add(time.Minute)
	if err := c.SetWriteDeadline(by); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	if !u.behind(by, time.Now(), time.Hour) {
		t.Error("behind = false for a request written just now and no read under way, want true")
	}
	if u.behind(by.Add(time.Second), time.Now(), time.Hour) {
		t.Error("behind = true for a deadline no connection was given, want false")
	}

	was := time.Now().Add(time.Hour)
	if err := c.SetReadDeadline(was); err != nil {
		t.Fatal(err)
	}
	u.moveReadDeadline(was, time.Now())
	if _, err := c.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("Read after its deadline was moved to now: %v, want a deadline error", err)
	}

	_ = c.Close()
	u.mu.Lock()
	n := len(u.conns)
	u.mu.Unlock()
	if n != 0 {
		t.Errorf("%d connections kept after Close, want none", n)
	}
}
