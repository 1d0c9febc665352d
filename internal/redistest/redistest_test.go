package redistest_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/internal/redistest"
)

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestStartSetGet(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	c := s.Client(t)
	ctx := ctxT(t, 5*time.Second)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET k v = %v, want nil", err)
	}
	if got, err := c.Get(ctx, "k").Result(); got != "v" || err != nil {
		t.Fatalf("GET k = %q, %v, want \"v\", nil", got, err)
	}
	if s.PID() == 0 {
		t.Errorf("PID() = 0 for a running server")
	}
}

func TestStartWithArgs(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.WithArgs("--maxmemory", "7mb"))
	got, err := s.Client(t).ConfigGet(ctxT(t, 5*time.Second), "maxmemory").Result()
	if err != nil || got["maxmemory"] != strconv.Itoa(7<<20) {
		t.Fatalf("CONFIG GET maxmemory = %v, %v, want %d", got, err, 7<<20)
	}
}

// TestDownAndRestart checks that Kill and Stop leave nothing answering on the
// port and that Restart brings up an empty server on the same address.
func TestDownAndRestart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		down func(*redistest.Server)
	}{
		{"Kill", (*redistest.Server).Kill},
		{"Stop", (*redistest.Server).Stop},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := redistest.Start(t)
			c := s.Client(t)
			addr, oldPID := s.Addr(), s.PID()
			if err := c.Set(ctxT(t, 5*time.Second), "k", "v", 0).Err(); err != nil {
				t.Fatalf("SET = %v", err)
			}

			tc.down(s)
			if s.PID() != 0 {
				t.Errorf("after %s: PID() = %d, want 0", tc.name, s.PID())
			}
			if err := c.Ping(ctxT(t, time.Second)).Err(); err == nil {
				t.Fatalf("after %s: PING = nil, want an error", tc.name)
			}
			if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
				conn.Close()
				t.Fatalf("after %s: something still accepts on %s", tc.name, addr)
			}

			s.Restart()
			if s.Addr() != addr {
				t.Errorf("after Restart: Addr() = %s, want %s", s.Addr(), addr)
			}
			if pid := s.PID(); pid == 0 || pid == oldPID {
				t.Errorf("after Restart: PID() = %d, want a new non-zero pid (old %d)", pid, oldPID)
			}
			if err := c.Ping(ctxT(t, 5*time.Second)).Err(); err != nil {
				t.Fatalf("after Restart: PING = %v, want nil", err)
			}
			if err := c.Get(ctxT(t, 5*time.Second), "k").Err(); !errors.Is(err, redis.Nil) {
				t.Fatalf("after Restart: GET k = %v, want redis.Nil (no persistence)", err)
			}
		})
	}
}

func TestPause(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	c := s.Client(t)
	if err := c.Ping(ctxT(t, 5*time.Second)).Err(); err != nil {
		t.Fatalf("PING = %v", err)
	}

	const pause = 500 * time.Millisecond
	start := time.Now()
	s.Pause(pause)

	err := c.Get(ctxT(t, 50*time.Millisecond), "k").Err()
	var ne net.Error
	if !errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("GET with a 50ms deadline during a pause = %v, want a deadline error", err)
	}

	if err := c.Ping(ctxT(t, 5*time.Second)).Err(); err != nil {
		t.Fatalf("PING after the pause = %v, want nil", err)
	}
	// Allow for the millisecond rounding of pause deadlines in Redis.
	if elapsed := time.Since(start); elapsed < pause-10*time.Millisecond {
		t.Errorf("PING answered %v after a %v pause began, want after the pause", elapsed, pause)
	}
}

func TestCleanupKillsServer(t *testing.T) {
	t.Parallel()
	var pid int
	if !t.Run("start", func(t *testing.T) { pid = redistest.Start(t).PID() }) || pid == 0 {
		return // skipped or failed: nothing to check
	}
	if alive(pid) {
		t.Fatalf("redis-server pid %d still alive after its test's cleanup", pid)
	}
}

// TestServerDiesWithTestBinary runs this test binary again as a helper that
// starts a server and exits without running cleanups, as a crash would, and
// checks that the kernel kills the server with it.
func TestServerDiesWithTestBinary(t *testing.T) {
	if os.Getenv("REDISTEST_HELPER") == "1" {
		s := redistest.Start(t)
		fmt.Printf("PID %d\n", s.PID())
		os.Exit(3)
	}
	if testing.Short() {
		t.Skip("redistest: needs redis-server; skipped under -short")
	}
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestServerDiesWithTestBinary$")
	// The helper exits without its cleanups, so its temporary directory
	// stays: put it inside this test's, which is removed.
	cmd.Env = append(os.Environ(), "REDISTEST_HELPER=1", "TMPDIR="+t.TempDir())
	out, _ := cmd.CombinedOutput()
	pid := 0
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if p, ok := strings.CutPrefix(sc.Text(), "PID "); ok {
			pid, _ = strconv.Atoi(p)
		}
	}
	if pid == 0 {
		t.Fatalf("helper printed no PID; output:\n%s", out)
	}
	deadline := time.Now().Add(5 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("redis-server pid %d outlived its test binary by 5s", pid)
		}
		<-time.After(10 * time.Millisecond)
	}
}

// alive reports whether pid is a process that has not exited; a zombie
// waiting for a reaper counts as exited.
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	_, rest, _ := strings.Cut(string(stat), ") ")
	return !strings.HasPrefix(rest, "Z") && !strings.HasPrefix(rest, "X")
}

func TestClusterRouting(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3, 0)
	cc := cl.Client(t)
	ctx := ctxT(t, 10*time.Second)

	t.Run("each primary", func(t *testing.T) {
		// Find one key on each primary, so every slot range is exercised.
		keyOn := make(map[*redistest.Server]string)
		for i := 0; len(keyOn) < 3; i++ {
			if i == 1000 {
				t.Fatalf("1000 keys landed on only %d primaries", len(keyOn))
			}
			k := "key:" + strconv.Itoa(i)
			p := cl.PrimaryForKey(k)
			if _, ok := keyOn[p]; !ok {
				keyOn[p] = k
			}
		}
		for p, k := range keyOn {
			if err := cc.Set(ctx, k, "v-"+k, 0).Err(); err != nil {
				t.Fatalf("cluster SET %s = %v", k, err)
			}
			if got, err := cc.Get(ctx, k).Result(); got != "v-"+k || err != nil {
				t.Fatalf("cluster GET %s = %q, %v, want %q, nil", k, got, err, "v-"+k)
			}
			// The key must be on the node PrimaryForKey named.
			if n, err := p.Client(t).Exists(ctx, k).Result(); n != 1 || err != nil {
				t.Fatalf("EXISTS %s on %s = %d, %v, want 1, nil", k, p.Addr(), n, err)
			}
		}
	})

	t.Run("hash tag", func(t *testing.T) {
		keys := []string{"{x}a", "{x}b", "sluice:{x}:c"}
		p := cl.PrimaryForKey(keys[0])
		for _, k := range keys[1:] {
			if got := cl.PrimaryForKey(k); got != p {
				t.Fatalf("PrimaryForKey(%q) = %s, want %s like %q", k, got.Addr(), p.Addr(), keys[0])
			}
		}
		// A multi-key command fails across slots, so this proves one slot.
		if err := cc.MSet(ctx, keys[0], 1, keys[1], 2, keys[2], 3).Err(); err != nil {
			t.Fatalf("cluster MSET of {x} keys = %v", err)
		}
		if n, err := p.Client(t).Exists(ctx, keys...).Result(); n != 3 || err != nil {
			t.Fatalf("EXISTS {x} keys on %s = %d, %v, want 3, nil", p.Addr(), n, err)
		}
	})
}

func TestClusterFailover(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3, 1)
	if n := len(cl.Nodes()); n != 6 {
		t.Fatalf("len(Nodes()) = %d, want 6", n)
	}
	cc := cl.Client(t)
	ctx := ctxT(t, 20*time.Second)
	const key = "sluice:failover"

	// Write through the primary and wait for its replica to have it, so the
	// value must survive the failover.
	before := cl.PrimaryForKey(key)
	pc := before.Client(t)
	if err := pc.Set(ctx, key, "before", 0).Err(); err != nil {
		t.Fatalf("SET on primary = %v", err)
	}
	if n, err := pc.Wait(ctx, 1, 5*time.Second).Result(); n != 1 || err != nil {
		t.Fatalf("WAIT 1 = %d, %v, want 1, nil", n, err)
	}

	killed, promoted := cl.KillPrimaryAndWaitFailover(key)
	if killed != before {
		t.Errorf("killed %s, want the key's primary %s", killed.Addr(), before.Addr())
	}
	if killed.PID() != 0 || promoted == killed || promoted.PID() == 0 {
		t.Fatalf("killed %s (pid %d), promoted %s (pid %d)", killed.Addr(), killed.PID(), promoted.Addr(), promoted.PID())
	}
	if got := cl.PrimaryForKey(key); got != promoted {
		t.Errorf("PrimaryForKey after failover = %s, want %s", got.Addr(), promoted.Addr())
	}

	if got, err := cc.Get(ctx, key).Result(); got != "before" || err != nil {
		t.Fatalf("cluster GET after failover = %q, %v, want \"before\", nil", got, err)
	}
	if err := cc.Set(ctx, key, "after", 0).Err(); err != nil {
		t.Fatalf("cluster SET after failover = %v", err)
	}
	if got, err := cc.Get(ctx, key).Result(); got != "after" || err != nil {
		t.Fatalf("cluster GET after failover = %q, %v, want \"after\", nil", got, err)
	}
}
