package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/internal/testwait"
)

const e2eToken = "e2e-token"

// buildSluice builds the real binary into a temporary directory.
func buildSluice(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end test with the real binary; skipped under -short")
	}
	bin := filepath.Join(t.TempDir(), "sluice")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

type daemon struct {
	t    *testing.T
	cmd  *exec.Cmd
	addr string
	mu   sync.Mutex
	logs bytes.Buffer
	done chan error
	// exited is closed once the process has been waited for, so that a
	// cleanup can tell without reading cmd.ProcessState, which Wait writes
	// on another goroutine.
	exited chan struct{}
}

// startDaemon runs `sluice serve --listen 127.0.0.1:0 args...` and waits
// for the address it logs.
func startDaemon(t *testing.T, bin string, args ...string) *daemon {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"serve", "--listen", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(os.Environ(), "SLUICE_ADMIN_TOKEN="+e2eToken)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemon{t: t, cmd: cmd, done: make(chan error, 1), exited: make(chan struct{})}
	// The first address it listens on is the gateways' listener; it is
	// started once it says it is ready (its decision store warmed).
	addrc, readyc := make(chan string, 1), make(chan struct{}, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			d.mu.Lock()
			d.logs.WriteString(line + "\n")
			d.mu.Unlock()
			var m struct{ Msg, Addr string }
			if json.Unmarshal([]byte(line), &m) != nil {
				continue
			}
			switch m.Msg {
			case "listening":
				select {
				case addrc <- m.Addr:
				default:
				}
			case "ready":
				select {
				case readyc <- struct{}{}:
				default:
				}
			}
		}
		err := cmd.Wait()
		close(d.exited)
		d.done <- err
	}()
	t.Cleanup(func() {
		select {
		case <-d.exited:
		default:
			cmd.Process.Kill()
			<-d.exited
		}
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.log())
		}
	})
	timeout := time.After(20 * time.Second)
	addr, ready := (<-chan string)(addrc), false
	for addr != nil || !ready {
		select {
		case d.addr = <-addr:
			addr = nil // the first only: the admin listener may follow
		case <-readyc:
			ready = true
		case err := <-d.done:
			t.Fatalf("sluice serve exited: %v\n%s", err, d.log())
		case <-timeout:
			t.Fatalf("sluice serve did not start\n%s", d.log())
		}
	}
	return d
}

func (d *daemon) log() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.logs.String()
}

type reply struct {
	status int
	header http.Header
	body   string
}

func (d *daemon) do(method, path, body string, hdr ...string) reply {
	d.t.Helper()
	req, err := http.NewRequest(method, "http://"+d.addr+path, strings.NewReader(body))
	if err != nil {
		d.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		d.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return reply{res.StatusCode, res.Header, string(b)}
}

func (d *daemon) admin(method, path, body string, hdr ...string) reply {
	d.t.Helper()
	return d.do(method, path, body, append([]string{"Authorization", "Bearer " + e2eToken}, hdr...)...)
}

// allowedAcross sends check tries times, alternating between daemons a and
// b, and counts the checks allowed; anything but 200 or 429 fails the test.
func allowedAcross(t *testing.T, a, b *daemon, check string, tries int) int {
	t.Helper()
	allowed := 0
	for j := range tries {
		d := a
		if j%2 == 1 {
			d = b
		}
		switch r := d.do("POST", "/v1/check", check); r.status {
		case 200:
			allowed++
		case 429:
		default:
			t.Fatalf("check %d of %s = %d %s", j, check, r.status, r.body)
		}
	}
	return allowed
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestServeEndToEnd(t *testing.T) {
	bin := buildSluice(t)
	stores := map[string]func(t *testing.T) string{
		"memory": func(*testing.T) string { return "memory" },
		"redis":  func(t *testing.T) string { return "redis://" + redistest.Start(t).Addr() },
	}
	for _, name := range []string{"memory", "redis"} {
		t.Run(name, func(t *testing.T) {
			empty := writeFile(t, "policies.json", "[]")
			// The decisions asserted are the store's: a deadline far above
			// the 5 ms default keeps a loaded test machine from turning
			// them into fallback ones (deadlines have their own tests).
			d := startDaemon(t, bin, "--store", stores[name](t), "--policies", empty, "--data-dir", t.TempDir(), "--store-timeout", "250ms")
			if r := d.admin("GET", "/v1/policies", ""); r.status != 200 || !strings.Contains(r.body, `"policies":[]`) {
				t.Fatalf("policies = %d %s, want none", r.status, r.body)
			}
			r := d.admin("PUT", "/v1/policies/burst", `{"algorithm":"token_bucket","rate_per_sec":1,"burst":100,"mode":"enforce"}`)
			if r.status != 201 || r.header.Get("ETag") != `"1"` {
				t.Fatalf("PUT = %d %v %s", r.status, r.header, r.body)
			}
			if r := d.admin("PUT", "/v1/keys/client-1", `{"tier":"gold"}`); r.status != 200 {
				t.Fatalf("PUT key = %d %s", r.status, r.body)
			}
			check := `{"api_key":"client-1","route":"/v1/orders","method":"POST"}`
			for i := 1; i <= 100; i++ {
				r := d.do("POST", "/v1/check", check)
				if r.status != 200 {
					t.Fatalf("check %d = %d %s", i, r.status, r.body)
				}
				if i == 1 && (r.header.Get("RateLimit-Policy") != `"burst";q=100;w=100` || r.header.Get("RateLimit") != `"burst";r=99;t=1`) {
					t.Errorf("first check headers: RateLimit-Policy %q RateLimit %q", r.header.Get("RateLimit-Policy"), r.header.Get("RateLimit"))
				}
			}
			r = d.do("POST", "/v1/check", check)
			if r.status != 429 || r.header.Get("Retry-After") != "1" || r.header.Get("RateLimit") != `"burst";r=0;t=1` {
				t.Fatalf("101st = %d Retry-After %q RateLimit %q %s", r.status, r.header.Get("Retry-After"), r.header.Get("RateLimit"), r.body)
			}
			var body map[string]any
			json.Unmarshal([]byte(r.body), &body)
			if body["type"] != "https://iana.org/assignments/http-problem-types#quota-exceeded" || body["policy"] != "burst" || body["remaining"] != float64(0) {
				t.Errorf("429 body = %s", r.body)
			}
			// Forward-auth sees the same state.
			r = d.do("GET", "/v1/authz", "", "X-Original-URI", "/v1/orders", "X-Original-Method", "POST", "X-API-Key", "client-1")
			if r.status != 429 || !strings.Contains(r.header.Get("Content-Type"), "problem+json") || !strings.Contains(r.body, `"violated-policies":["burst"]`) {
				t.Errorf("authz = %d %s", r.status, r.body)
			}

			// A bad policy is refused, naming the field; version 1 stays.
			r = d.admin("PUT", "/v1/policies/burst", `{"algorithm":"token_bucket","rate_per_sec":1,"burst":"lots","mode":"enforce"}`)
			if r.status != 400 || !strings.Contains(r.body, `"field":"burst"`) {
				t.Fatalf("bad PUT = %d %s", r.status, r.body)
			}
			if r = d.admin("GET", "/v1/policies/burst/versions", ""); !strings.Contains(r.body, `"in_force":1`) {
				t.Fatalf("versions after bad PUT = %s", r.body)
			}
			// Raise the limit (v2), then roll back (v3 = v1's content).
			r = d.admin("PUT", "/v1/policies/burst", `{"algorithm":"token_bucket","rate_per_sec":1,"burst":1000,"mode":"enforce"}`, "If-Match", `"1"`)
			if r.status != 200 {
				t.Fatalf("PUT v2 = %d %s", r.status, r.body)
			}
			// A raised burst is the bucket's new capacity at once (the
			// tokens already spent stay spent).
			if r = d.do("POST", "/v1/check", check); r.header.Get("RateLimit-Policy") != `"burst";q=1000;w=1000` {
				t.Fatalf("after raising the limit: RateLimit-Policy %q", r.header.Get("RateLimit-Policy"))
			}
			if r = d.admin("POST", "/v1/policies/burst/rollback", ""); r.status != 200 || !strings.Contains(r.body, `"burst":100`) || r.header.Get("ETag") != `"3"` {
				t.Fatalf("rollback = %d %s", r.status, r.body)
			}
			if r = d.do("POST", "/v1/check", check); r.status != 429 || r.header.Get("RateLimit-Policy") != `"burst";q=100;w=100` {
				t.Fatalf("after rollback = %d %q, want 429 under q=100", r.status, r.header.Get("RateLimit-Policy"))
			}

			// Shadow: would reject, allowed.
			r = d.admin("PUT", "/v1/policies/new-limit", `{"match":{"routes":["/v2/*"]},"algorithm":"fixed_window","limit":1,"window":3600}`)
			if r.status != 201 || !strings.Contains(r.body, `"mode":"shadow"`) {
				t.Fatalf("shadow PUT = %d %s", r.status, r.body)
			}
			shadow := `{"user":"u1","route":"/v2/things"}`
			d.do("POST", "/v1/check", shadow)
			r = d.do("POST", "/v1/check", shadow)
			if r.status != 200 || !strings.Contains(r.body, `"would_reject":true`) || strings.Contains(r.header.Get("RateLimit"), "new-limit") {
				t.Fatalf("shadow = %d %s %v", r.status, r.body, r.header)
			}
			if m := d.do("GET", "/metrics", ""); !strings.Contains(m.body, `sluice_shadow_would_reject_total{policy="new-limit"} 1`) || !strings.Contains(m.body, `sluice_checks_total{decision="rejected"`) {
				t.Errorf("metrics lack shadow or check counts")
			}
			if r = d.do("GET", "/readyz", ""); r.status != 200 {
				t.Errorf("readyz = %d %s", r.status, r.body)
			}
		})
	}
}

// TestServeSharedPolicies runs two daemons on one Redis: a change made
// through one is enforced by the other within a second, without restart.
func TestServeSharedPolicies(t *testing.T) {
	bin := buildSluice(t)
	store := "redis://" + redistest.Start(t).Addr()
	empty := writeFile(t, "policies.json", "[]")
	// Shared state is asserted, so a deadline far above the default keeps
	// a loaded test machine from deciding on the fallback.
	a := startDaemon(t, bin, "--store", store, "--policies", empty, "--store-timeout", "250ms")
	b := startDaemon(t, bin, "--store", store, "--policies", empty, "--store-timeout", "250ms")

	waitVersion := func(d *daemon, id string, want int) time.Duration {
		t.Helper()
		start := time.Now()
		testwait.For(t, time.Second, fmt.Sprintf("daemon b to apply %s version %d", id, want), func() bool {
			return strings.Contains(d.admin("GET", "/v1/policies/"+id+"/versions", "").body, fmt.Sprintf(`"in_force":%d`, want))
		})
		return time.Since(start)
	}
	if r := a.admin("PUT", "/v1/policies/shared", `{"algorithm":"fixed_window","limit":2,"window":3600,"mode":"enforce"}`); r.status != 201 {
		t.Fatalf("PUT on a = %d %s", r.status, r.body)
	}
	took := waitVersion(b, "shared", 1)
	t.Logf("b applied version 1 after %v", took)
	check := `{"user":"bob","route":"/x"}`
	for i := 0; i < 2; i++ {
		if r := b.do("POST", "/v1/check", check); r.status != 200 {
			t.Fatalf("check %d on b = %d %s", i, r.status, r.body)
		}
	}
	if r := b.do("POST", "/v1/check", check); r.status != 429 {
		t.Fatalf("3rd check on b = %d, want 429", r.status)
	}
	// The state is shared too: a rejects the same subject.
	if r := a.do("POST", "/v1/check", check); r.status != 429 {
		t.Fatalf("check on a = %d, want 429 (shared Redis state)", r.status)
	}
	// Raise the limit on a; b enforces it within a second.
	if r := a.admin("PUT", "/v1/policies/shared", `{"algorithm":"fixed_window","limit":5,"window":3600,"mode":"enforce"}`); r.status != 200 {
		t.Fatalf("PUT v2 = %d %s", r.status, r.body)
	}
	waitVersion(b, "shared", 2)
	if r := b.do("POST", "/v1/check", check); r.status != 200 {
		t.Fatalf("b after raise = %d %s", r.status, r.body)
	}
	// A bad policy changes nothing anywhere.
	if r := a.admin("PUT", "/v1/policies/shared", `{"algorithm":"fixed_window","limit":5,"window":-1,"mode":"enforce"}`); r.status != 400 || !strings.Contains(r.body, `"field":"window"`) {
		t.Fatalf("bad PUT = %d %s", r.status, r.body)
	}
	// Rollback on b reaches a.
	if r := b.admin("POST", "/v1/policies/shared/rollback", ""); r.status != 200 {
		t.Fatalf("rollback on b = %d %s", r.status, r.body)
	}
	waitVersion(a, "shared", 3)
	if r := a.do("POST", "/v1/check", check); r.status != 429 {
		t.Fatalf("a after rollback = %d, want 429", r.status)
	}
}

// TestServeGracefulShutdown sends SIGTERM while a check is in flight (its
// handler reading a body only half sent) and requires that check to
// complete with 200.
func TestServeGracefulShutdown(t *testing.T) {
	bin := buildSluice(t)
	d := startDaemon(t, bin)
	conn, err := net.Dial("tcp", d.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"ip":"192.0.2.7","route":"/v1/things"}`
	half := len(body) / 2
	// With Expect: 100-continue the server answers 100 Continue when the
	// handler starts reading the body: from then on the request is in
	// flight, not a connection the shutdown may close unread.
	fmt.Fprintf(conn, "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n", len(body))
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(conn)
	if res, err := http.ReadResponse(br, nil); err != nil || res.StatusCode != http.StatusContinue {
		t.Fatalf("before the body: %v %v, want 100 Continue", res, err)
	}
	if _, err := conn.Write([]byte(body[:half])); err != nil {
		t.Fatalf("sending half the body: %v", err)
	}
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 5*time.Second, "the shutdown log after SIGTERM", func() bool { return strings.Contains(d.log(), "shutting down") })
	if _, err := conn.Write([]byte(body[half:])); err != nil {
		t.Fatalf("finishing the in-flight request: %v", err)
	}
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("in-flight request got no response: %v", err)
	}
	if res.StatusCode != 200 || res.Header.Get("RateLimit") == "" {
		t.Fatalf("in-flight request = %d %v", res.StatusCode, res.Header)
	}
	select {
	case err := <-d.done:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("sluice did not exit after SIGTERM")
	}
	// New connections are refused once it has exited.
	if c, err := net.DialTimeout("tcp", d.addr, time.Second); err == nil {
		c.Close()
		t.Errorf("still accepting after exit")
	}
}

// TestServeThroughNginx puts a real nginx in front: auth_request to
// /v1/authz, the RateLimit headers passed on with auth_request_set, and a
// rejection turned back into 429 (nginx's auth_request accepts only 2xx,
// 401 and 403 from the subrequest). It runs deploy/nginx/sluice.conf as
// shipped, but for its placeholders; gateway_test.go attacks it.
func TestServeThroughNginx(t *testing.T) {
	bin := buildSluice(t)
	empty := writeFile(t, "policies.json", "[]")
	d := startDaemon(t, bin, "--policies", empty, "--trusted-proxies", "127.0.0.1/32")
	if r := d.admin("PUT", "/v1/policies/hello", `{"match":{"routes":["/hello.txt"]},"algorithm":"fixed_window","limit":2,"window":3600,"mode":"enforce"}`); r.status != 201 {
		t.Fatalf("PUT = %d %s", r.status, r.body)
	}
	api := startAttackBackend(t)
	listen := freeLoopbackAddr(t)
	deployConf, err := os.ReadFile("../../deploy/nginx/sluice.conf")
	if err != nil {
		t.Fatal(err)
	}
	conf := strings.NewReplacer("127.0.0.1:8080", d.addr, "listen 80;", "listen "+listen+";", "http://backend", api.url).Replace(string(deployConf))
	startNginx(t, conf, listen)
	url := "http://" + listen + "/hello.txt"
	get := func() (*http.Response, string) {
		t.Helper()
		res, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res, string(b)
	}
	for i := 0; i < 2; i++ {
		res, body := get()
		if res.StatusCode != 200 || body != "GET /hello.txt 0\n" {
			t.Fatalf("request %d through nginx = %d %q", i+1, res.StatusCode, body)
		}
		if got, want := res.Header.Get("RateLimit"), fmt.Sprintf(`"hello";r=%d;t=`, 1-i); !strings.HasPrefix(got, want) {
			t.Errorf("request %d RateLimit = %q, want %s...", i+1, got, want)
		}
		if got := res.Header.Get("RateLimit-Policy"); got != `"hello";q=2;w=3600` {
			t.Errorf("RateLimit-Policy = %q", got)
		}
	}
	res, body := get()
	if res.StatusCode != 429 {
		t.Fatalf("3rd request through nginx = %d %q, want 429", res.StatusCode, body)
	}
	if ra := res.Header.Get("Retry-After"); ra == "" || ra == "0" {
		t.Errorf("Retry-After = %q", ra)
	}
	if got := res.Header.Get("RateLimit"); !strings.HasPrefix(got, `"hello";r=0;t=`) {
		t.Errorf("429 RateLimit = %q", got)
	}
	if ct := res.Header.Get("Content-Type"); ct != "application/problem+json" || !strings.Contains(body, "quota-exceeded") {
		t.Errorf("429 body = %s %q", ct, body)
	}
}
