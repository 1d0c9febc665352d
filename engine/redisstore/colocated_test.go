package redisstore

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/engine/limiter"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/internal/testwait"
)

// TestOnThisMachine tells the addresses of servers that share this
// machine's CPUs from those of servers elsewhere.
func TestOnThisMachine(t *testing.T) {
	own := []net.Addr{
		&net.IPNet{IP: net.ParseIP("10.1.2.3"), Mask: net.CIDRMask(24, 32)},
		&net.IPNet{IP: net.ParseIP("fd00::5"), Mask: net.CIDRMask(64, 128)},
	}
	for _, tt := range []struct {
		name string
		ip   string
		want bool
	}{
		{"an interface's address", "10.1.2.3", true},
		{"an interface's IPv6 address", "fd00::5", true},
		{"a neighbour on the same network", "10.1.2.4", false},
		{"another network", "192.0.2.7", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := ownsIP(own, net.ParseIP(tt.ip)); got != tt.want {
				t.Errorf("ownsIP(%s) = %v, want %v", tt.ip, got, tt.want)
			}
		})
	}
	for _, tt := range []struct {
		name string
		addr net.Addr
	}{
		{"IPv4 loopback", &net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 6379}},
		{"IPv6 loopback", &net.TCPAddr{IP: net.IPv6loopback, Port: 6379}},
		{"a Unix socket", &net.UnixAddr{Name: "/run/redis.sock", Net: "unix"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if !onThisMachine(tt.addr) {
				t.Errorf("onThisMachine(%v) = false, want true", tt.addr)
			}
		})
	}
	if onThisMachine(&net.TCPAddr{IP: net.ParseIP("192.0.2.7"), Port: 6379}) {
		t.Error("onThisMachine(192.0.2.7, a documentation address no interface holds) = true, want false")
	}
}

// shortOfCPU writes a CPU pressure file that reads 62%, well past the
// share at which the machine counts as short of CPU, and returns its path.
func shortOfCPU(t *testing.T) string {
	t.Helper()
	psi := filepath.Join(t.TempDir(), "psi")
	if err := os.WriteFile(psi, []byte("some avg10=62.66 avg60=0.00 avg300=0.00 total=1000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return psi
}

// TestPausedServerElsewhereFailsAtDeadlineUnderPressure pauses a real
// server while the machine reads as short of CPU. A server on this machine
// may be one the machine does not run, and the store waits for its reply
// (about a second, here until the pause ends); a server on another
// machine does not wait for this one's CPUs, and its checks fail at their
// deadline as on an idle machine. Only the locality of the connection
// differs between the two cases.
func TestPausedServerElsewhereFailsAtDeadlineUnderPressure(t *testing.T) {
	const deadline = 20 * time.Millisecond
	const pause = 3 * time.Second
	psi := shortOfCPU(t)
	for _, tt := range []struct {
		name      string
		onMachine bool
	}{
		{"server elsewhere", false},
		{"server on this machine", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var store *Store
			srv, lim, req := warmLimiter(t, deadline, func(s *Store) {
				store = s
				s.pressure = &cpuPressure{psi: psi}
				s.unread.onMachine = func(net.Addr) bool { return tt.onMachine }
			})
			ctx := context.Background()
			if got := store.unread.colocated(""); got != tt.onMachine {
				t.Fatalf("colocated = %v after dialling, want %v", got, tt.onMachine)
			}
			srv.Pause(pause)
			start := time.Now()
			o, err := lim.Check(ctx, req)
			took := time.Since(start)
			if err != nil {
				t.Fatalf("check during pause: %v", err)
			}
			t.Logf("check during a %v pause took %v, source %v", pause, took, o.Source)
			// Not speed assertions: the bounds tell a deadline (20 ms
			// plus scheduling) from a wait for the paused server (seconds).
			if tt.onMachine {
				if took < 750*time.Millisecond {
					t.Errorf("a server on this machine was given up after %v under CPU pressure; want a wait of about a second or until it answers", took)
				}
				return
			}
			if !o.Degraded {
				t.Errorf("a check to a paused server elsewhere was not degraded: %+v", o)
			}
			if took > 750*time.Millisecond {
				t.Errorf("a check to a paused server elsewhere took %v under CPU pressure, want about the %v deadline", took, deadline)
			}
		})
	}
}

// TestClusterPrimaryElsewhereFailsAtDeadlineUnderPressure pauses, while
// the machine reads as short of CPU, each of two primaries of a real
// Cluster, of which only the first counts as on this machine: a check to
// the first waits for it about a second, a server the machine may not be
// running, while a check to the second fails at its deadline, as a server
// elsewhere's does. Where a server is is judged per primary: one primary
// on this machine (a Redis pod on the daemon's node) does not make every
// other primary's silence wait a second.
func TestClusterPrimaryElsewhereFailsAtDeadlineUnderPressure(t *testing.T) {
	const deadline = 20 * time.Millisecond
	const pause = 3 * time.Second
	cl := redistest.StartCluster(t, 3, 0)
	c, err := NewClient("redis-cluster://" + strings.Join(cl.Addrs(), ","))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	near, far := cl.Nodes()[0], cl.Nodes()[1]
	store := New(c, Config{Timeout: deadline})
	store.pressure = &cpuPressure{psi: shortOfCPU(t)}
	store.unread.onMachine = func(a net.Addr) bool {
		tcp, ok := a.(*net.TCPAddr)
		return ok && tcp.Port == near.Port()
	}
	lim := limiter.New(limiter.Config{Store: store, Timeout: deadline, Breaker: limiter.BreakerConfig{MinCalls: 1000}})
	ctx := context.Background()
	// subjectOn returns a subject held by srv, checked once by the store,
	// so that its lane has connections open.
	subjectOn := func(srv *redistest.Server) engine.Request {
		t.Helper()
		for i := 0; ; i++ {
			sub := fmt.Sprint("colocated-", i)
			if store.Shard(ctx, sub) != srv.Addr() {
				continue
			}
			req := engine.Request{Subject: sub, Checks: []engine.Check{{Policy: "q", Limit: engine.Limit{Algorithm: engine.TokenBucket, Rate: 10, Burst: 10}, Cost: 1}}}
			testwait.For(t, 30*time.Second, "a warm-up check decided by the store", func() bool {
				o, err := lim.Check(ctx, req)
				return err == nil && o.Source == limiter.FromStore
			})
			return req
		}
	}
	// Both lanes have connections open before either primary is paused.
	reqs := map[*redistest.Server]engine.Request{near: subjectOn(near), far: subjectOn(far)}
	for _, tt := range []struct {
		name   string
		srv    *redistest.Server
		nearby bool
	}{
		{"primary elsewhere", far, false},
		{"primary on this machine", near, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req := reqs[tt.srv]
			if got := store.unread.colocated(tt.srv.Addr()); got != tt.nearby {
				t.Fatalf("colocated(%s) = %v, want %v", tt.srv.Addr(), got, tt.nearby)
			}
			tt.srv.Pause(pause)
			start := time.Now()
			o, err := lim.Check(ctx, req)
			took := time.Since(start)
			if err != nil {
				t.Fatalf("check during pause: %v", err)
			}
			t.Logf("check to a paused %s took %v, source %v", tt.name, took, o.Source)
			// Not speed assertions: the bounds tell a deadline (20 ms
			// plus scheduling) from a wait for the paused server (seconds).
			if tt.nearby {
				if took < 750*time.Millisecond {
					t.Errorf("a primary on this machine was given up after %v under CPU pressure; want a wait of about a second or until it answers", took)
				}
				return
			}
			if !o.Degraded || took > 750*time.Millisecond {
				t.Errorf("a check to a paused primary elsewhere took %v (%+v) under CPU pressure, beside a primary on this machine; want it failed at about its %v deadline", took, o, deadline)
			}
		})
	}
}

// TestSilentServerFailsAtDeadlineUnderPressure pauses a real server on
// this machine while the machine reads as short of CPU. The first check
// waits for it about a second, as for a server the machine may not be
// running; once that wait went unanswered, the checks sent during the rest
// of the pause fail at their deadline instead of waiting a second each;
// once the server has answered again, a new pause is waited for again.
func TestSilentServerFailsAtDeadlineUnderPressure(t *testing.T) {
	const deadline = 20 * time.Millisecond
	const pause = 5 * time.Second
	psi := shortOfCPU(t)
	srv, lim, req := warmLimiter(t, deadline, func(s *Store) {
		s.pressure = &cpuPressure{psi: psi}
		s.unread.onMachine = func(net.Addr) bool { return true }
	})
	ctx := context.Background()
	n := 0
	// check sends a check of a subject of its own, which no deny cache
	// answers, and returns how long it took and its outcome.
	check := func() (time.Duration, limiter.Outcome) {
		t.Helper()
		n++
		r := req
		r.Subject = fmt.Sprint("silent-", n)
		start := time.Now()
		o, err := lim.Check(ctx, r)
		if err != nil {
			t.Fatalf("check %d: %v", n, err)
		}
		return time.Since(start), o
	}
	// Not speed assertions: the bounds tell a deadline (20 ms plus
	// scheduling) from a wait for the paused server (about a second).
	srv.Pause(pause)
	paused := time.Now()
	if took, o := check(); took < 750*time.Millisecond {
		t.Fatalf("the first check of a pause was given up after %v (%+v); want a wait of about a second", took, o)
	}
	took, o := check()
	if since := time.Since(paused); since >= pause {
		t.Fatalf("the pause of %v ended before the second check was answered (%v after it began)", pause, since)
	}
	if took > 750*time.Millisecond || !o.Degraded {
		t.Errorf("a check sent after the server went unanswered for a second took %v (%+v); want it failed at about its %v deadline", took, o, deadline)
	}

	testwait.For(t, 30*time.Second, "a check decided by the store after the pause", func() bool {
		_, o := check()
		return o.Source == limiter.FromStore
	})
	srv.Pause(pause)
	if took, o := check(); took < 750*time.Millisecond {
		t.Errorf("after the server answered again, the first check of a new pause was given up after %v (%+v); want a wait of about a second", took, o)
	}
}
