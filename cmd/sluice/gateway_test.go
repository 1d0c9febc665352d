package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/redistest"
	"go.yaml.in/yaml/v3"
)

// The attack suite: the shipped gateway configurations of deploy/, unchanged
// but for their documented placeholders, run by the real gateways in front of
// a small API, with sluice serve started with the default policies and the
// flags each configuration's comments prescribe. Every way a client might try
// to walk around the login policy (5 POSTs per 15 minutes per client) must
// end in 429 without reaching the API, and the gateway must keep the API up
// when Sluice is gone.

// gatewayUnderTest is one shipped configuration and how to run it.
type gatewayUnderTest struct {
	name   string
	config string // path of the shipped file, from this package
	// placeholders maps each placeholder of the shipped file to its value
	// for a gateway listening on listen, asking Sluice at daemon, in front
	// of the API at backend (a URL). Each must occur in the file.
	placeholders func(listen, daemon, backend string) [][2]string
	// start runs the gateway on the substituted configuration and returns
	// once it accepts connections on listen.
	start func(t *testing.T, conf, listen string)
	// flagValues replaces the values of prescribed flags (file paths);
	// each must be prescribed.
	flagValues map[string]string
	// daemonTLS, if set, is the TLS the configuration expects of Sluice:
	// the stand-ins for a broken daemon serve it too.
	daemonTLS *tls.Config
}

func TestGatewayAttackSuite(t *testing.T) {
	gateways := []gatewayUnderTest{
		{
			name:   "nginx",
			config: "../../deploy/nginx/sluice.conf",
			placeholders: func(listen, daemon, backend string) [][2]string {
				return [][2]string{{"127.0.0.1:8080", daemon}, {"listen 80;", "listen " + listen + ";"}, {"http://backend", backend}}
			},
			start: startNginx,
		},
		{
			name:   "caddy",
			config: "../../deploy/caddy/Caddyfile",
			placeholders: func(listen, daemon, backend string) [][2]string {
				_, port, _ := net.SplitHostPort(listen)
				return [][2]string{{"127.0.0.1:8080", daemon}, {"\n:80 {", "\n:" + port + " {"}, {"http://backend", backend}}
			},
			start: startCaddy,
		},
	}
	bin := buildSluice(t)
	for _, gw := range gateways {
		t.Run(gw.name, func(t *testing.T) { runAttackSuite(t, bin, gw) })
	}
}

func runAttackSuite(t *testing.T, bin string, gw gatewayUnderTest) {
	raw, err := os.ReadFile(gw.config)
	if err != nil {
		t.Fatal(err)
	}
	shipped := string(raw)
	api := startAttackBackend(t)
	daemonAddr := freeLoopbackAddr(t)
	gwAddr := freeLoopbackAddr(t)
	conf := shipped
	for _, p := range gw.placeholders(gwAddr, daemonAddr, api.url) {
		if !strings.Contains(conf, p[0]) {
			t.Fatalf("%s lacks the placeholder %q", gw.config, p[0])
		}
		conf = strings.ReplaceAll(conf, p[0], p[1])
	}
	flags := prescribedFlags(t, gw.config, shipped, daemonAddr)
	for flag, v := range gw.flagValues {
		i := slices.Index(flags, flag)
		if i < 0 || i+1 == len(flags) {
			t.Fatalf("%s: the prescribed command lacks %s", gw.config, flag)
		}
		flags[i+1] = v
	}
	t.Logf("sluice serve %s", strings.Join(flags, " "))
	d := startDaemon(t, bin, flags...)
	stopDaemon := sync.OnceFunc(func() {
		d.cmd.Process.Kill()
		<-d.done
	})
	gw.start(t, conf, gwAddr)

	clients := &attackClients{gw: gwAddr, next: 10}
	login := func(t *testing.T, c *attackClient, path string, hdr ...string) reply {
		t.Helper()
		return c.send("POST", path, "user=alice&password=guess", hdr...)
	}
	// fiveLogins spends the client's login quota with plain POST /login.
	fiveLogins := func(t *testing.T, c *attackClient) {
		t.Helper()
		before := api.served("/login")
		for i := range 5 {
			if r := login(t, c, "/login"); r.status != 200 {
				t.Fatalf("plain POST /login %d of 5 = %d %q, want 200", i+1, r.status, r.body)
			}
		}
		if got := api.served("/login") - before; got != 5 {
			t.Fatalf("the API served %d of five plain POST /login, want 5", got)
		}
	}

	bypasses := []struct {
		name string
		path string
		hdr  func(i int) []string // headers of the i-th attempt
	}{
		{name: "path /%6Cogin", path: "/%6Cogin"},
		{name: "path //login", path: "//login"},
		{name: "path /login/", path: "/login/"},
		{name: "path /./login", path: "/./login"},
		{name: "path /x/../login", path: "/x/../login"},
		{name: "path /x/..%2Flogin", path: "/x/..%2Flogin"},
		{name: "query /login?a=N", path: "/login?a=1"},
		{name: "rotating Forwarded", path: "/login", hdr: func(i int) []string { return []string{"Forwarded", fmt.Sprintf("for=198.51.100.%d", i+1)} }},
		{name: "rotating X-Forwarded-For", path: "/login", hdr: func(i int) []string { return []string{"X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i+1)} }},
		{name: "rotating X-Real-IP", path: "/login", hdr: func(i int) []string { return []string{"X-Real-IP", fmt.Sprintf("198.51.100.%d", i+1)} }},
		{name: "X-Forwarded-Method GET", path: "/login", hdr: func(int) []string { return []string{"X-Forwarded-Method", "GET"} }},
		{name: "X-Forwarded-Uri elsewhere", path: "/login", hdr: func(int) []string { return []string{"X-Forwarded-Uri", "/elsewhere"} }},
		{name: "X-Original-Method GET", path: "/login", hdr: func(int) []string { return []string{"X-Original-Method", "GET"} }},
		{name: "X-Original-URI elsewhere", path: "/login", hdr: func(int) []string { return []string{"X-Original-URI", "/elsewhere"} }},
		{name: "method and URI pairs sent twice", path: "/login", hdr: func(int) []string {
			return []string{
				"X-Original-Method", "GET", "X-Original-Method", "GET", "X-Original-URI", "/elsewhere", "X-Original-URI", "/elsewhere",
				"X-Forwarded-Method", "GET", "X-Forwarded-Method", "GET", "X-Forwarded-Uri", "/elsewhere", "X-Forwarded-Uri", "/elsewhere",
			}
		}},
		{name: "tier header pro", path: "/login", hdr: func(int) []string { return []string{"X-Sluice-Tier", "pro"} }},
		{name: "rotating user header", path: "/login", hdr: func(i int) []string { return []string{"X-Sluice-User", fmt.Sprintf("user-%d", i+1)} }},
		{name: "invented Authorization Bearer keys", path: "/login", hdr: func(i int) []string { return []string{"Authorization", fmt.Sprintf("Bearer invented-key-%d", i+1)} }},
		{name: "invented X-API-Key keys", path: "/login", hdr: func(i int) []string { return []string{"X-API-Key", fmt.Sprintf("invented-key-%d", i+1)} }},
		{name: "invented keys with tier header pro", path: "/login", hdr: func(i int) []string {
			return []string{"Authorization", fmt.Sprintf("Bearer invented-key-%d", i+1), "X-Sluice-Tier", "pro"}
		}},
	}
	for _, bp := range bypasses {
		t.Run("bypass/"+bp.name, func(t *testing.T) {
			c := clients.new(t)
			fiveLogins(t, c)
			before := api.served("/login")
			for i := range 3 {
				var hdr []string
				if bp.hdr != nil {
					hdr = bp.hdr(i)
				}
				if r := login(t, c, bp.path, hdr...); r.status != 429 {
					t.Errorf("attempt %d: POST %s %v after five logins = %d %q, want 429", i+1, bp.path, hdr, r.status, r.body)
				}
			}
			if got := api.served("/login") - before; got != 0 {
				t.Errorf("the API served %d attempts after the limit, want 0", got)
			}
		})
	}

	t.Run("spoofed tier buys no quota", func(t *testing.T) {
		c := clients.new(t)
		r := c.send("GET", "/v1/orders", "", "X-Sluice-Tier", "pro")
		if r.status != 200 {
			t.Fatalf("GET /v1/orders with X-Sluice-Tier: pro = %d %q, want 200", r.status, r.body)
		}
		if got := r.header.Get("RateLimit-Policy"); !strings.HasPrefix(got, `"anonymous-per-ip";q=10`) {
			t.Errorf("RateLimit-Policy with X-Sluice-Tier: pro = %q, want the anonymous policy (q=10)", got)
		}
		// The pro policy's burst is 200; the anonymous one's is 10 at 5/s.
		for i := 2; i <= 100; i++ {
			r = c.send("GET", "/v1/orders", "", "X-Sluice-Tier", "pro")
			if r.status == 429 {
				return
			}
			if r.status != 200 {
				t.Fatalf("request %d = %d %q", i, r.status, r.body)
			}
		}
		t.Errorf("100 quick requests with X-Sluice-Tier: pro were all admitted: the tier was believed")
	})

	t.Run("RateLimit headers on 200 and 429", func(t *testing.T) {
		c := clients.new(t)
		before := api.served("/orders")
		admitted := 0
		for i := 1; i <= 100; i++ {
			r := c.send("GET", "/orders", "")
			if got := r.header.Get("RateLimit-Policy"); !strings.HasPrefix(got, `"anonymous-per-ip";q=10`) {
				t.Errorf("response %d (%d): RateLimit-Policy = %q", i, r.status, got)
			}
			if got := r.header.Get("RateLimit"); !strings.HasPrefix(got, `"anonymous-per-ip";r=`) {
				t.Errorf("response %d (%d): RateLimit = %q", i, r.status, got)
			}
			if r.status == 200 {
				admitted++
				continue
			}
			if r.status != 429 {
				t.Fatalf("response %d = %d %q, want 200 or 429", i, r.status, r.body)
			}
			if got := r.header.Get("RateLimit"); !strings.HasPrefix(got, `"anonymous-per-ip";r=0;`) {
				t.Errorf("429 RateLimit = %q, want r=0", got)
			}
			if ra := r.header.Get("Retry-After"); ra == "" || ra == "0" {
				t.Errorf("429 Retry-After = %q, want a positive number of seconds", ra)
			}
			if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("429 Content-Type = %q", ct)
			}
			if got := api.served("/orders") - before; got != admitted {
				t.Errorf("the API served %d, but %d were admitted", got, admitted)
			}
			return
		}
		t.Errorf("no 429 in 100 quick requests under a burst of 10")
	})

	t.Run("900-byte bearer token", func(t *testing.T) {
		c := clients.new(t)
		token := "eyJ" + strings.Repeat("a", 896) + "." // an ordinary JWT's length
		before := api.served("/orders")
		r := c.send("GET", "/orders", "", "Authorization", "Bearer "+token)
		if r.status != 200 {
			t.Fatalf("GET /orders with a 900-byte bearer token = %d %q, want 200", r.status, r.body)
		}
		if got := api.served("/orders") - before; got != 1 {
			t.Errorf("the API served %d, want 1", got)
		}
		// Decided by Sluice (limited by address), not let through because
		// the gateway failed open.
		if got := r.header.Get("RateLimit-Policy"); !strings.HasPrefix(got, `"anonymous-per-ip"`) {
			t.Errorf("RateLimit-Policy = %q, want the anonymous policy: Sluice did not decide this request", got)
		}
	})

	t.Run("request body reaches the API", func(t *testing.T) {
		c := clients.new(t)
		r := c.send("POST", "/orders", "order=42")
		if r.status != 200 || r.body != "POST /orders 8\n" {
			t.Errorf("POST /orders with an 8-byte body = %d %q, want 200 %q", r.status, r.body, "POST /orders 8\n")
		}
	})

	t.Run("daemon down fails open", func(t *testing.T) {
		stopDaemon()
		c := clients.new(t)
		before := api.served("/orders")
		if r := c.send("GET", "/orders", ""); r.status != 200 {
			t.Errorf("GET /orders with sluice down = %d %q, want 200", r.status, r.body)
		}
		if r := c.send("POST", "/orders", "order=42"); r.status != 200 || r.body != "POST /orders 8\n" {
			t.Errorf("POST /orders with sluice down = %d %q, want 200 %q", r.status, r.body, "POST /orders 8\n")
		}
		if got := api.served("/orders") - before; got != 2 {
			t.Errorf("the API served %d, want 2", got)
		}
	})

	t.Run("daemon answering 5xx fails open, 4xx does not", func(t *testing.T) {
		stopDaemon() // its address is taken over by a broken one
		for _, tc := range []struct {
			status     int // what the broken daemon answers
			wantStatus int // what the client gets
			wantServed int // how many the API serves
		}{
			{500, 200, 1},
			{503, 200, 1}, // no X-Sluice-Status: not a policy's answer
			{400, 400, 0}, // a request Sluice could not read is not let through
		} {
			l, err := net.Listen("tcp", daemonAddr)
			if err != nil {
				t.Fatal(err)
			}
			if gw.daemonTLS != nil {
				l = tls.NewListener(l, gw.daemonTLS)
			}
			broken := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tc.status)
			})}
			go broken.Serve(l)
			c := clients.new(t)
			before := api.served("/orders")
			if r := c.send("POST", "/orders", "order=42"); r.status != tc.wantStatus {
				t.Errorf("sluice answering %d: POST /orders = %d %q, want %d", tc.status, r.status, r.body, tc.wantStatus)
			}
			if got := api.served("/orders") - before; got != tc.wantServed {
				t.Errorf("sluice answering %d: the API served %d, want %d", tc.status, got, tc.wantServed)
			}
			broken.Close()
		}
	})

	t.Run("closed policy answers 503 when its store fails", func(t *testing.T) {
		stopDaemon() // its address is taken over by one on Redis
		rs := redistest.Start(t)
		// A generous store timeout: the store must answer the first login
		// even on a loaded machine; once it is killed it refuses at once.
		rflags := append(withoutFlag(flags, "--store"), "--store", "redis://"+rs.Addr(), "--store-timeout", "500ms")
		startDaemon(t, bin, rflags...)
		c := clients.new(t)
		if r := login(t, c, "/login"); r.status != 200 {
			t.Fatalf("POST /login with the store up = %d %q, want 200", r.status, r.body)
		}
		rs.Kill()
		before := api.served("/login")
		r := login(t, c, "/login")
		if r.status != 503 {
			t.Errorf("POST /login with the store down = %d %q, want 503 (login fails closed)", r.status, r.body)
		}
		if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
			t.Errorf("503 Content-Type = %q", ct)
		}
		if got := api.served("/login") - before; got != 0 {
			t.Errorf("the API served %d logins with the store down, want 0", got)
		}
		// anonymous-per-ip fails open: the API stays up.
		if r := c.send("GET", "/orders", ""); r.status != 200 {
			t.Errorf("GET /orders with the store down = %d %q, want 200", r.status, r.body)
		}
	})
}

// prescribedFlags reads the `sluice serve --...` command from the comments of
// a shipped configuration (continued with trailing backslashes) and returns
// its flags, with --listen set to listen.
func prescribedFlags(t *testing.T, name, conf, listen string) []string {
	t.Helper()
	var cmd []string
	in := false
	for _, line := range strings.Split(conf, "\n") {
		line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "#"))
		if !in {
			i := strings.Index(line, "sluice serve --")
			if i < 0 {
				continue
			}
			in, line = true, line[i+len("sluice serve "):]
		}
		more := strings.HasSuffix(line, `\`)
		cmd = append(cmd, strings.Fields(strings.TrimSuffix(line, `\`))...)
		if !more {
			break
		}
	}
	if len(cmd) == 0 {
		t.Fatalf("%s: no `sluice serve ...` command in its comments", name)
	}
	for i, f := range cmd {
		if strings.ContainsAny(f, "<>") {
			t.Fatalf("%s: the prescribed command has a placeholder %q; write a working value", name, f)
		}
		if f == "--listen" && i+1 < len(cmd) {
			cmd[i+1] = listen
		}
	}
	return cmd
}

// withoutFlag returns flags without flag and its value.
func withoutFlag(flags []string, flag string) []string {
	var out []string
	for i := 0; i < len(flags); i++ {
		if flags[i] == flag {
			i++
			continue
		}
		out = append(out, flags[i])
	}
	return out
}

// freeLoopbackAddr returns 127.0.0.1:port for a port that stays free
// until a daemon or a gateway binds it (freePort).
func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	return "127.0.0.1:" + strconv.Itoa(freePort(t, false))
}

// attackBackend is the API behind the gateway. Like most backends it serves
// /login for /%6Cogin, //login, /login/, /./login and /x/../login, and it
// counts what it served by that cleaned path. It answers "METHOD path
// body-length".
type attackBackend struct {
	url string
	mu  sync.Mutex
	n   map[string]int
}

func startAttackBackend(t *testing.T) *attackBackend {
	t.Helper()
	b := &attackBackend{n: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := url.PathUnescape(r.URL.EscapedPath())
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		p = path.Clean(p)
		body, _ := io.ReadAll(r.Body)
		b.mu.Lock()
		b.n[p]++
		b.mu.Unlock()
		fmt.Fprintf(w, "%s %s %d\n", r.Method, p, len(body))
	}))
	t.Cleanup(srv.Close)
	b.url = srv.URL
	return b
}

// served is how many requests for the cleaned path p the API answered.
func (b *attackBackend) served(p string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n[p]
}

// attackClients hands each subtest a client with its own source address,
// 127.0.0.N, so that each starts with fresh per-address limits.
type attackClients struct {
	gw   string
	mu   sync.Mutex
	next int
}

type attackClient struct {
	t    *testing.T
	base string
	http *http.Client
}

func (cs *attackClients) new(t *testing.T) *attackClient {
	t.Helper()
	cs.mu.Lock()
	n := cs.next
	cs.next++
	cs.mu.Unlock()
	if n > 254 {
		t.Fatal("out of loopback source addresses")
	}
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(n))}, Timeout: 5 * time.Second}
	tr := &http.Transport{DialContext: d.DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	return &attackClient{t: t, base: "http://" + cs.gw, http: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
}

// send makes one request; path is sent as written (/%6Cogin, //login and
// /x/../login included).
func (c *attackClient) send(method, path, body string, hdr ...string) reply {
	c.t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, c.base+path, strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	if got := req.URL.RequestURI(); got != path {
		c.t.Fatalf("the client would send %q, not %q", got, path)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1]) // a name given twice is sent twice
	}
	res, err := c.http.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return reply{res.StatusCode, res.Header, string(b)}
}

// waitListening waits until addr accepts TCP connections or the process
// behind it exits.
func waitListening(t *testing.T, addr string, exited <-chan struct{}, out func() string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-exited:
			t.Fatalf("exited before listening on %s:\n%s", addr, out())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("not listening on %s after 15s: %v\n%s", addr, err, out())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// gatewayProcess runs cmd until the test ends (SIGQUIT, then kill), logging
// its output and logs if the test failed.
func gatewayProcess(t *testing.T, cmd *exec.Cmd, logs func() string) (exited <-chan struct{}, out func() string) {
	t.Helper()
	var mu sync.Mutex
	var buf bytes.Buffer
	w := writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	})
	cmd.Stdout, cmd.Stderr = w, w
	out = func() string {
		mu.Lock()
		defer mu.Unlock()
		return buf.String() + logs()
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", filepath.Base(cmd.Path), out())
		}
	})
	return done, out
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// startNginx runs the Debian nginx with serverConf (a file that goes inside
// http {}) included in a minimal nginx.conf of its own directory.
func startNginx(t *testing.T, serverConf, listen string) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs a real nginx; skipped under -short")
	}
	const nginxBin = "/usr/sbin/nginx"
	if _, err := os.Stat(nginxBin); err != nil {
		t.Fatalf("nginx is required for this test (apt-get install nginx): %v", err)
	}
	dir := t.TempDir()
	for _, sub := range []string{"tmp", "logs"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	user := ""
	if os.Geteuid() == 0 {
		user = "user root;"
	}
	conf := fmt.Sprintf(`%s
worker_processes 1;
pid %[2]s/nginx.pid;
error_log %[2]s/logs/error.log info;
events { worker_connections 256; }
http {
  access_log off;
  client_body_temp_path %[2]s/tmp/body;
  proxy_temp_path %[2]s/tmp/proxy;
  fastcgi_temp_path %[2]s/tmp/fastcgi;
  uwsgi_temp_path %[2]s/tmp/uwsgi;
  scgi_temp_path %[2]s/tmp/scgi;
  include %[2]s/sluice.conf;
}
`, user, dir)
	if err := os.WriteFile(filepath.Join(dir, "sluice.conf"), []byte(serverConf), 0o644); err != nil {
		t.Fatal(err)
	}
	confPath := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(nginxBin, "-c", confPath, "-p", dir, "-g", "daemon off;")
	exited, out := gatewayProcess(t, cmd, func() string {
		logs, _ := os.ReadFile(filepath.Join(dir, "logs", "error.log"))
		return "error.log:\n" + string(logs)
	})
	waitListening(t, listen, exited, out)
}

// startCaddy runs the Debian caddy on the Caddyfile site block siteConf,
// after a global block that turns off the admin endpoint and automatic
// HTTPS, with its state in a temporary directory.
func startCaddy(t *testing.T, siteConf, listen string) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs a real caddy; skipped under -short")
	}
	caddyBin, err := exec.LookPath("caddy")
	if err != nil {
		t.Fatalf("caddy is required for this test (apt-get install caddy): %v", err)
	}
	dir := t.TempDir()
	global := "{\n\tadmin off\n\tauto_https off\n}\n\n"
	confPath := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(confPath, []byte(global+siteConf), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(caddyBin, "run", "--config", confPath, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	exited, out := gatewayProcess(t, cmd, func() string { return "" })
	waitListening(t, listen, exited, out)
}

// traefikDynamic is the part of Traefik's (v3.7) dynamic configuration that
// deploy/traefik/dynamic.yml uses, field names as in Traefik's
// pkg/config/dynamic; decoding with KnownFields catches a misspelt option,
// which Traefik would otherwise ignore.
type traefikDynamic struct {
	HTTP struct {
		Middlewares map[string]struct {
			ForwardAuth *struct {
				Address             string   `yaml:"address"`
				TrustForwardHeader  *bool    `yaml:"trustForwardHeader"`
				AuthRequestHeaders  []string `yaml:"authRequestHeaders"`
				AuthResponseHeaders []string `yaml:"authResponseHeaders"`
			} `yaml:"forwardAuth"`
		} `yaml:"middlewares"`
		Routers map[string]struct {
			Rule        string   `yaml:"rule"`
			Service     string   `yaml:"service"`
			Middlewares []string `yaml:"middlewares"`
		} `yaml:"routers"`
		Services map[string]struct {
			LoadBalancer struct {
				Servers []struct {
					URL string `yaml:"url"`
				} `yaml:"servers"`
			} `yaml:"loadBalancer"`
		} `yaml:"services"`
	} `yaml:"http"`
}

// TestTraefikConfigStructure checks deploy/traefik/dynamic.yml without a
// Traefik binary (none can be built here): every option is one Traefik
// knows, the client's forwarding headers are not trusted, only the API key
// headers reach Sluice, and every router goes through Sluice.
func TestTraefikConfigStructure(t *testing.T) {
	const name = "../../deploy/traefik/dynamic.yml"
	raw, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	var c traefikDynamic
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	mw, ok := c.HTTP.Middlewares["sluice"]
	if !ok || mw.ForwardAuth == nil {
		t.Fatalf("%s: no forwardAuth middleware named sluice", name)
	}
	fa := mw.ForwardAuth
	if fa.Address != "http://127.0.0.1:8080/v1/authz" {
		t.Errorf("forwardAuth.address = %q, want http://127.0.0.1:8080/v1/authz", fa.Address)
	}
	if fa.TrustForwardHeader == nil || *fa.TrustForwardHeader {
		t.Errorf("forwardAuth.trustForwardHeader must be false, explicitly (unset keeps some client X-Forwarded-* headers)")
	}
	if got, want := canonicalSet(fa.AuthRequestHeaders), canonicalSet([]string{"Authorization", "X-API-Key"}); !equalSets(got, want) {
		t.Errorf("forwardAuth.authRequestHeaders = %v, want exactly %v (the API key headers)", fa.AuthRequestHeaders, []string{"Authorization", "X-API-Key"})
	}
	// The headers Sluice may believe from a trusted gateway: Traefik must
	// set them itself, never pass the client's.
	believed := []string{
		"Forwarded", "X-Forwarded-For", "X-Real-IP",
		"X-Forwarded-Method", "X-Forwarded-Uri", "X-Original-Method", "X-Original-URI",
		"X-Sluice-Tier", "X-Sluice-User",
	}
	for _, h := range believed {
		if canonicalSet(fa.AuthRequestHeaders)[http.CanonicalHeaderKey(h)] {
			t.Errorf("forwardAuth.authRequestHeaders passes the client's %s to Sluice", h)
		}
	}
	for _, h := range []string{"RateLimit", "RateLimit-Policy"} {
		if !canonicalSet(fa.AuthResponseHeaders)[http.CanonicalHeaderKey(h)] {
			t.Errorf("forwardAuth.authResponseHeaders lacks %s", h)
		}
	}
	if len(c.HTTP.Routers) == 0 {
		t.Errorf("%s: no routers", name)
	}
	for rn, r := range c.HTTP.Routers {
		if !slices.Contains(r.Middlewares, "sluice") {
			t.Errorf("router %s does not use the sluice middleware", rn)
		}
		s, ok := c.HTTP.Services[r.Service]
		if !ok || len(s.LoadBalancer.Servers) == 0 {
			t.Errorf("router %s: service %q has no servers", rn, r.Service)
		}
	}
	flags := prescribedFlags(t, name, string(raw), "127.0.0.1:8080")
	if got := flagValue(flags, "--forward-auth-headers"); got != "forwarded" {
		t.Errorf("prescribed --forward-auth-headers = %q, want forwarded (Traefik sends X-Forwarded-Method/-Uri)", got)
	}
	if got := flagValue(flags, "--trusted-proxies"); got == "" {
		t.Errorf("prescribed flags lack --trusted-proxies")
	}
}

// TestEnvoyConfigStructure checks deploy/envoy/envoy.yaml without an Envoy
// binary (none can be installed here): the ext_authz filter asks Sluice at
// /v1/authz/<path>, fails open, sends only the API key and X-Forwarded-For
// (which Envoy appends the socket peer to), and passes the RateLimit
// headers to the client. Envoy's own schema (protobuf) is not checked.
func TestEnvoyConfigStructure(t *testing.T) {
	const name = "../../deploy/envoy/envoy.yaml"
	raw, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	var root map[string]any
	if err := yaml.Unmarshal(raw, &root); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	hcm, _ := yamlAt(t, root, "static_resources", "listeners", 0, "filter_chains", 0, "filters", 0, "typed_config").(map[string]any)
	if got := yamlAt(t, hcm, "@type"); got != "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager" {
		t.Errorf("first network filter is %v, want the HTTP connection manager", got)
	}
	if got := yamlAt(t, hcm, "use_remote_address"); got != true {
		t.Errorf("use_remote_address = %v, want true (else Envoy does not append the client's address to X-Forwarded-For)", got)
	}
	if hops, ok := hcm["xff_num_trusted_hops"]; ok && hops != 0 {
		t.Errorf("xff_num_trusted_hops = %v, want 0", hops)
	}
	filters, _ := yamlAt(t, hcm, "http_filters").([]any)
	authz, router := -1, -1
	for i, f := range filters {
		switch yamlAt(t, f, "name") {
		case "envoy.filters.http.ext_authz":
			authz = i
		case "envoy.filters.http.router":
			router = i
		}
	}
	if authz < 0 || router < 0 || authz > router {
		t.Fatalf("http_filters: ext_authz at %d, router at %d; want ext_authz before router", authz, router)
	}
	ea := yamlAt(t, filters[authz], "typed_config")
	if got := yamlAt(t, ea, "@type"); got != "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz" {
		t.Errorf("ext_authz @type = %v", got)
	}
	if got := yamlAt(t, ea, "failure_mode_allow"); got != true {
		t.Errorf("failure_mode_allow = %v, want true (Sluice down must not take the API down)", got)
	}
	hs := yamlAt(t, ea, "http_service")
	if got := yamlAt(t, hs, "path_prefix"); got != "/v1/authz" {
		t.Errorf("http_service.path_prefix = %v, want /v1/authz", got)
	}
	cluster := yamlAt(t, hs, "server_uri", "cluster")
	found := false
	for _, c := range yamlAt(t, root, "static_resources", "clusters").([]any) {
		if yamlAt(t, c, "name") == cluster {
			found = true
			sa := yamlAt(t, c, "load_assignment", "endpoints", 0, "lb_endpoints", 0, "endpoint", "address", "socket_address")
			if yamlAt(t, sa, "address") != "127.0.0.1" || yamlAt(t, sa, "port_value") != 8080 {
				t.Errorf("cluster %v is at %v, want 127.0.0.1:8080", cluster, sa)
			}
		}
	}
	if !found {
		t.Errorf("server_uri.cluster %v is not among the clusters", cluster)
	}
	if got, want := envoyPatterns(t, yamlAt(t, hs, "authorization_request", "allowed_headers")), canonicalSet([]string{"Authorization", "X-API-Key", "X-Forwarded-For"}); !equalSets(got, want) {
		t.Errorf("allowed_headers = %v, want exactly %v", keys(got), keys(want))
	}
	for field, want := range map[string][]string{
		"allowed_client_headers":            {"RateLimit", "RateLimit-Policy", "Retry-After"},
		"allowed_client_headers_on_success": {"RateLimit", "RateLimit-Policy"},
	} {
		got := envoyPatterns(t, yamlAt(t, hs, "authorization_response", field))
		for _, h := range want {
			if !got[http.CanonicalHeaderKey(h)] {
				t.Errorf("authorization_response.%s lacks %s", field, h)
			}
		}
	}
	flags := prescribedFlags(t, name, string(raw), "127.0.0.1:8080")
	if got := flagValue(flags, "--trusted-proxies"); got == "" {
		t.Errorf("prescribed flags lack --trusted-proxies")
	}
}

// yamlAt walks a decoded YAML document by map keys and list indexes.
func yamlAt(t *testing.T, v any, path ...any) any {
	t.Helper()
	for i, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				t.Fatalf("at %v: not a map", path[:i+1])
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				t.Fatalf("at %v: no item %d", path[:i+1], k)
			}
			v = l[k]
		}
	}
	return v
}

// envoyPatterns returns the header names of a ListStringMatcher of exact
// patterns; any other kind of pattern fails the test, since it could let
// more headers through than the list shows.
func envoyPatterns(t *testing.T, v any) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	pats, _ := yamlAt(t, v, "patterns").([]any)
	for _, p := range pats {
		m, _ := p.(map[string]any)
		s, ok := m["exact"].(string)
		if len(m) != 1 || !ok {
			t.Errorf("header pattern %v: want only exact names", p)
			continue
		}
		out[http.CanonicalHeaderKey(s)] = true
	}
	return out
}

func canonicalSet(names []string) map[string]bool {
	out := map[string]bool{}
	for _, n := range names {
		out[http.CanonicalHeaderKey(n)] = true
	}
	return out
}

func equalSets(a, b map[string]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}

func keys(m map[string]bool) []string {
	return slices.Sorted(maps.Keys(m))
}

// flagValue is the value given to flag in flags, or "".
func flagValue(flags []string, flag string) string {
	for i := 0; i+1 < len(flags); i++ {
		if flags[i] == flag {
			return flags[i+1]
		}
	}
	return ""
}
