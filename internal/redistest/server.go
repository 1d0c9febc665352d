package redistest

import (
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// readyTimeout bounds how long Start and Restart wait for a new process
	// to answer.
	readyTimeout = 10 * time.Second
	// stopTimeout bounds how long Stop waits for a graceful exit before it
	// falls back to SIGKILL.
	stopTimeout = 15 * time.Second
	// probeTimeout bounds each control command the harness sends.
	probeTimeout = 2 * time.Second
	// pollInterval is how long the harness waits between checks of a
	// condition it is polling.
	pollInterval = 20 * time.Millisecond
	// startAttempts is how many fresh ports Start tries when another process
	// takes the chosen port between probing it and redis-server binding it.
	startAttempts = 10
	// logTail bounds how much of a server's log is written to t.Log when a
	// test fails, in bytes.
	logTail = 64 << 10
)

// errAddrInUse reports that redis-server could not bind its port (or, in
// cluster mode, its cluster-bus port).
var errAddrInUse = errors.New("address already in use")

// Option changes how Start configures a server.
type Option func(*config)

type config struct {
	args []string
	tls  *TLS
	// user and pass are the data nodes' credentials (WithAuth).
	user, pass string
	// sentinelUser and sentinelPass are the Sentinels' (WithSentinelAuth).
	sentinelUser, sentinelPass string
}

func newConfig(opts []Option) config {
	var c config
	for _, o := range opts {
		o(&c)
	}
	return c
}

// WithArgs appends redis-server command-line arguments, for example
// WithArgs("--maxmemory", "10mb", "--maxmemory-policy", "allkeys-lru").
// They come after the ones Start sets, so they override them.
func WithArgs(args ...string) Option {
	return func(c *config) { c.args = append(c.args, args...) }
}

// Server is one redis-server process listening on 127.0.0.1. It keeps its
// port and directory across Kill, Stop and Restart; t.Cleanup kills it.
type Server struct {
	t       testing.TB
	bin     string
	dir     string
	logPath string
	conf    string   // config file given before every argument, or ""
	args    []string // arguments after --port
	port    int
	tls     *tls.Config // of the harness's probes; nil: plaintext
	// tlsPort, on a server started with TLS, makes port the TLS port and
	// turns the plaintext one off.
	tlsPort bool
	auth    []string // AUTH arguments of the harness's probes

	mu   sync.Mutex
	proc *process // nil while not running
}

type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once Wait has returned
	err  error         // Wait's result; read only after done is closed
}

// Start starts redis-server on a free loopback port with persistence off,
// waits until it answers, and registers t.Cleanup to kill it. It skips the
// test under -short and fails it if redis-server is not installed.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	skipShort(t)
	bin := lookPath(t, "redis-server")
	cfg := newConfig(opts)
	return startServerWith(t, bin, "", cfg.dataArgs(), &cfg, false, func() (int, error) {
		return (&portPicker{}).pick(false)
	})
}

// startServer starts a server on a port from pick, asking pick again if
// another process takes the port first.
func startServer(t testing.TB, bin string, args []string, pick func() (int, error)) *Server {
	t.Helper()
	return startServerConf(t, bin, "", args, pick)
}

// startServerConf is startServer with a config file: conf, when not empty,
// is written to redis.conf in the server's directory and named before the
// arguments. Redis Sentinel needs one, to record what it learns.
func startServerConf(t testing.TB, bin, conf string, args []string, pick func() (int, error)) *Server {
	t.Helper()
	return startServerWith(t, bin, conf, args, nil, false, pick)
}

// startServerWith is startServerConf for a server of cfg's TLS and
// credentials (nil: neither); sentinel picks the Sentinels' credentials
// for the harness's probes instead of the data nodes'.
func startServerWith(t testing.TB, bin, conf string, args []string, cfg *config, sentinel bool, pick func() (int, error)) *Server {
	t.Helper()
	s := &Server{t: t, bin: bin, dir: t.TempDir(), args: args}
	if cfg != nil {
		s.probeAs(cfg, sentinel)
	}
	s.logPath = filepath.Join(s.dir, "redis.log")
	if conf != "" {
		s.conf = filepath.Join(s.dir, "redis.conf")
		if err := os.WriteFile(s.conf, []byte(conf), 0o644); err != nil {
			t.Fatalf("redistest: write %s: %v", s.conf, err)
		}
	}
	t.Cleanup(s.cleanup)
	if err := s.start(pick); err != nil {
		t.Fatal(err)
	}
	return s
}

// start launches s on a port from pick, asking pick again if another
// process takes the port first.
func (s *Server) start(pick func() (int, error)) error {
	for attempt := 1; ; attempt++ {
		port, err := pick()
		if err != nil {
			return fmt.Errorf("redistest: pick a free port: %v", err)
		}
		p, err := s.launch(port)
		if err == nil {
			s.port = port
			s.proc = p
			return nil
		}
		if !errors.Is(err, errAddrInUse) || attempt == startAttempts {
			return fmt.Errorf("redistest: start redis-server on 127.0.0.1:%d (attempt %d): %v", port, attempt, err)
		}
	}
}

// Process is a redis-server started outside a test, for a program that
// needs a throwaway Redis (the live simulator's redis store): on a free
// loopback port, in its own temporary directory, persistence off. Close
// kills it and removes the directory.
type Process struct{ s *Server }

// Launch starts the redis-server at bin (a path, as exec.LookPath finds
// it) as a Process and returns once it answers, within 10 s.
func Launch(bin string) (*Process, error) {
	dir, err := os.MkdirTemp("", "sluice-redis-")
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, dir: dir, logPath: filepath.Join(dir, "redis.log")}
	if err := s.start(func() (int, error) { return (&portPicker{}).pick(false) }); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &Process{s: s}, nil
}

// Addr returns the server's address, "127.0.0.1:port".
func (p *Process) Addr() string { return p.s.Addr() }

// Close kills the server, waits for it to exit and removes its directory.
func (p *Process) Close() {
	p.s.Kill()
	os.RemoveAll(p.s.dir)
}

// launch starts a process on port and waits until it answers. On failure
// the process is dead when launch returns.
func (s *Server) launch(port int) (*process, error) {
	logf, err := os.OpenFile(s.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fi, err := logf.Stat()
	if err != nil {
		logf.Close()
		return nil, err
	}
	logStart := fi.Size()

	var args []string
	if s.conf != "" {
		args = append(args, s.conf)
	}
	portArgs := []string{"--port", strconv.Itoa(port)}
	if s.tlsPort {
		portArgs = []string{"--port", "0", "--tls-port", strconv.Itoa(port)}
	}
	args = append(args, portArgs...)
	args = append(args,
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--logfile", "")
	args = append(args, s.args...)
	cmd := exec.Command(s.bin, args...)
	cmd.Dir = s.dir
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = sysProcAttr()
	err = cmd.Start()
	logf.Close() // the child has its own descriptor
	if err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()

	addr := "127.0.0.1:" + strconv.Itoa(port)
	if err := s.waitReady(p, addr); err != nil {
		_ = cmd.Process.Kill()
		<-p.done
		if logSince(s.logPath, logStart, "Address already in use") {
			return nil, fmt.Errorf("%w: %v", errAddrInUse, err)
		}
		return nil, err
	}
	return p, nil
}

// waitReady polls addr until the process p answers INFO with its own pid.
// Checking the pid, not just PING, keeps a server that lost the race for the
// port from mistaking whoever won it for itself.
func (s *Server) waitReady(p *process, addr string) error {
	want := "process_id:" + strconv.Itoa(p.cmd.Process.Pid) + "\r\n"
	deadline := time.Now().Add(readyTimeout)
	var lastErr error
	for {
		select {
		case <-p.done:
			return fmt.Errorf("redis-server exited before it answered: %v", p.err)
		default:
		}
		v, err := probe(addr, s.tls, s.auth, probeTimeout, "INFO", "server")
		info, _ := v.(string)
		switch {
		case err != nil:
			lastErr = err
		case strings.Contains(info, want):
			return nil
		default:
			lastErr = errors.New("another process answers on this port")
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: %v", readyTimeout, lastErr)
		}
		select {
		case <-p.done:
		case <-time.After(pollInterval):
		}
	}
}

// logSince reports whether the log at path contains substr after offset.
func logSince(path string, offset int64, substr string) bool {
	b, err := os.ReadFile(path)
	if err != nil || int64(len(b)) < offset {
		return false
	}
	return strings.Contains(string(b[offset:]), substr)
}

// Addr returns the server's address, "127.0.0.1:port". It does not change
// across Restart.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Port returns the server's TCP port.
func (s *Server) Port() int { return s.port }

// PID returns the process id of the running redis-server, or 0 after Kill or
// Stop.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return 0
	}
	return s.proc.cmd.Process.Pid
}

// Running reports whether a process started by Start or Restart has been
// neither killed nor stopped, nor exited on its own.
func (s *Server) Running() bool {
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	if p == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Client returns a go-redis client for the server, closed by t.Cleanup. It
// sets ContextTimeoutEnabled so that a context deadline bounds each call;
// build your own client from Addr to test other options.
func (s *Server) Client(t testing.TB) *redis.Client {
	o := &redis.Options{Addr: s.Addr(), ContextTimeoutEnabled: true, TLSConfig: s.tls}
	o.Username, o.Password = s.credentials()
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// credentials are the user and password of the harness's probes, empty
// for a server that requires none.
func (s *Server) credentials() (user, pass string) {
	switch len(s.auth) {
	case 1:
		return "", s.auth[0]
	case 2:
		return s.auth[0], s.auth[1]
	}
	return "", ""
}

// Kill sends SIGKILL and returns once the process has exited, as a crash
// would: clients see their connections reset. It does nothing if the server
// is not running.
func (s *Server) Kill() {
	s.mu.Lock()
	p := s.proc
	s.proc = nil
	s.mu.Unlock()
	if p == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Stop sends SIGTERM, so Redis shuts down as it would in a deploy, and
// returns once the process has exited. If it has not exited within 15 s, Stop
// kills it and fails the test.
func (s *Server) Stop() {
	s.t.Helper()
	s.mu.Lock()
	p := s.proc
	s.proc = nil
	s.mu.Unlock()
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(stopTimeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		s.t.Fatalf("redistest: redis-server %s ignored SIGTERM for %v; killed it", s.Addr(), stopTimeout)
	}
}

// Restart kills the server if it is running and starts a fresh process on
// the same port and in the same directory, returning once it answers. The
// new process starts empty, since persistence is off; a cluster node keeps
// its identity, which is in nodes.conf.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	deadline := time.Now().Add(readyTimeout)
	for {
		p, err := s.launch(s.port)
		if err == nil {
			s.mu.Lock()
			s.proc = p
			s.mu.Unlock()
			return
		}
		if !errors.Is(err, errAddrInUse) || time.Now().After(deadline) {
			s.t.Fatalf("redistest: restart redis-server on %s: %v", s.Addr(), err)
		}
		// Someone holds the port; it is ours, so wait for them to let go.
		<-time.After(pollInterval)
	}
}

// Pause makes the server hold every client's commands for d (CLIENT PAUSE
// d ALL), as a long fork or a slow disk would. It returns at once; the pause
// ends by itself. Connections made during the pause connect but get no reply.
func (s *Server) Pause(d time.Duration) {
	s.t.Helper()
	ms := d.Milliseconds()
	if ms < 1 {
		ms = 1
	}
	if _, err := s.doString(probeTimeout, "CLIENT", "PAUSE", strconv.FormatInt(ms, 10), "ALL"); err != nil {
		s.t.Fatalf("redistest: CLIENT PAUSE on %s: %v", s.Addr(), err)
	}
}

// cleanup kills the server and, if the test failed, logs what it wrote.
func (s *Server) cleanup() {
	s.Kill()
	if !s.t.Failed() {
		return
	}
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		s.t.Logf("redistest: read redis-server log for %s: %v", s.Addr(), err)
		return
	}
	if len(b) > logTail {
		b = append([]byte("...\n"), b[len(b)-logTail:]...)
	}
	s.t.Logf("redistest: redis-server %s log:\n%s", s.Addr(), b)
}

func skipShort(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("redistest: needs redis-server; skipped under -short")
	}
}

func lookPath(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("redistest: %s is not on PATH (%v); these tests run a real Redis: apt-get install -y redis-server redis-tools", name, err)
	}
	return p
}
