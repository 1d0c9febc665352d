package live

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"time"
)

type redisServer struct {
	addr string
	stop func()
}

// startRedis runs a throwaway redis-server (no persistence) on a free
// loopback port and waits until it answers PING.
func startRedis(ctx context.Context) (*redisServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, errors.New("live store redis: redis-server is not on PATH")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir, err := os.MkdirTemp("", "sluice-live-redis-")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--logfile", "")
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("live store redis: %w", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	srv := &redisServer{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), stop: func() {
		cmd.Process.Kill()
		<-done
		os.RemoveAll(dir)
	}}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if ping(srv.addr) {
			return srv, nil
		}
		select {
		case <-done:
			srv.stop()
			return nil, fmt.Errorf("live store redis: redis-server on port %d exited", port)
		case <-ctx.Done():
			srv.stop()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			srv.stop()
			return nil, errors.New("live store redis: redis-server did not answer within 10 s")
		}
	}
}

func ping(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && line == "+PONG\r\n"
}
