package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/sluice-rl/sluice/internal/testcerts"
	"github.com/sluice-rl/sluice/internal/testwait"
)

// tlsSetup is a CA and, written to files, a server certificate for the
// loopback addresses and a client certificate, both of that CA.
type tlsSetup struct {
	ca                        *testcerts.CA
	dir                       string
	caFile, certFile, keyFile string
	clientCert, clientKeyFile string
	server                    testcerts.Pair
}

func newTLSSetup(t *testing.T) *tlsSetup {
	t.Helper()
	s := &tlsSetup{ca: testcerts.NewCA(t, "sluice test CA"), dir: t.TempDir()}
	s.server = s.ca.Server(t, "sluice", time.Now().Add(24*time.Hour))
	s.caFile = s.ca.WriteCA(t, s.dir, "ca")
	s.certFile, s.keyFile = s.server.Write(t, s.dir, "server")
	s.clientCert, s.clientKeyFile = s.ca.Client(t, "gateway").Write(t, s.dir, "client")
	return s
}

// curl runs curl with args and returns its output and exit code.
func curl(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command("curl", append([]string{"-sS", "--max-time", "20"}, args...)...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	t.Fatalf("curl: %v (curl is required: apt-get install curl)", err)
	return "", 0
}

// logAddr waits for the address a log line with message msg names.
func logAddr(t *testing.T, d *daemon, msg string) string {
	t.Helper()
	var addr string
	testwait.For(t, 10*time.Second, msg+" in the log", func() bool {
		for _, line := range strings.Split(d.log(), "\n") {
			var m struct{ Msg, Addr string }
			if json.Unmarshal([]byte(line), &m) == nil && m.Msg == msg {
				addr = m.Addr
				return true
			}
		}
		return false
	})
	return addr
}

// TestServeTLS serves every listener over TLS (the admin listener with
// mutual TLS) and asks each with a real TLS client: curl with --cacert
// (and --cert) to the gateway and admin listeners, grpc-go with TLS to the
// rate limit service.
func TestServeTLS(t *testing.T) {
	bin := buildSluice(t)
	s := newTLSSetup(t)
	adminAddr := freeLoopbackAddr(t)
	d := startDaemon(t, bin, "--tls-cert-file", s.certFile, "--tls-key-file", s.keyFile,
		"--admin-listen", adminAddr, "--admin-tls-client-ca-file", s.caFile,
		"--rls-listen", "127.0.0.1:0", "--envoy-config", "../../deploy/envoy/ratelimit.yaml")
	gw := "https://" + d.addr

	out, code := curl(t, "--cacert", s.caFile, "-w", "\n%{http_code} %{ssl_verify_result}", "-H", "Content-Type: application/json",
		"-d", `{"api_key":"k1","route":"/v1/orders","method":"POST"}`, gw+"/v1/check")
	if code != 0 || !strings.HasSuffix(out, "\n200 0") {
		t.Errorf("curl --cacert POST %s/v1/check = exit %d %q, want 200 with a verified certificate", gw, code, out)
	}
	out, code = curl(t, "--cacert", s.caFile, gw+"/metrics")
	want := fmt.Sprintf(`sluice_tls_certificate_expiry_timestamp_seconds{listener="gateway"} %s`, strconv.FormatFloat(float64(s.server.Cert.NotAfter.Unix()), 'g', -1, 64))
	if code != 0 || !strings.Contains(out, want) {
		t.Errorf("metrics lack %q (exit %d)", want, code)
	}
	for n, files := range opsMetricNames(t) {
		if strings.HasPrefix(n, "sluice_tls_") && !strings.Contains(out, "\n"+n+"{") {
			t.Errorf("%s (queried by %s) is not exported by a daemon serving TLS", n, strings.Join(files, ", "))
		}
	}
	if out, code := curl(t, "-w", "%{http_code}", "http://"+d.addr+"/healthz"); code != 52 && code != 56 {
		t.Errorf("plaintext curl to the TLS gateway listener = exit %d %q, want a closed connection (52 or 56)", code, out)
	}

	admin := "https://" + adminAddr + "/v1/policies"
	out, code = curl(t, "--cacert", s.caFile, "--cert", s.clientCert, "--key", s.clientKeyFile,
		"-H", "Authorization: Bearer "+e2eToken, "-w", "\n%{http_code}", admin)
	if code != 0 || !strings.HasSuffix(out, "\n200") || !strings.Contains(out, `"policies"`) {
		t.Errorf("curl --cacert --cert GET %s = exit %d %q, want 200 and the policies", admin, code, out)
	}
	out, code = curl(t, "--cacert", s.caFile, "-H", "Authorization: Bearer "+e2eToken, "-w", "\n%{http_code}", admin)
	if code == 0 || strings.HasSuffix(out, "200") {
		t.Errorf("curl without a client certificate to the mutual TLS admin listener = exit %d %q, want refused", code, out)
	}
	// At the handshake: a TLS 1.2 client without a certificate does not
	// complete it (in TLS 1.3 the client learns of it at its first read).
	c, err := tls.Dial("tcp", adminAddr, &tls.Config{RootCAs: s.ca.Pool(), MaxVersion: tls.VersionTLS12})
	if err == nil {
		c.Close()
		t.Errorf("a client without a certificate completed the handshake with the mutual TLS admin listener")
	} else if !strings.Contains(err.Error(), "tls:") {
		t.Errorf("handshake without a client certificate: %v, want a TLS alert", err)
	}

	rlsAddr := logAddr(t, d, "rate limit service listening")
	conn, err := grpc.NewClient(rlsAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: s.ca.Pool(), ServerName: "localhost"})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ip := []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "192.0.2.7"}}}}
	r, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: ip})
	if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("ShouldRateLimit over TLS = %v, %v; want OK", r, err)
	}
}

// TestServeTLSBadInputExit1: a TLS setting that cannot work is one line
// naming the flag and the reason, and exit status 1, at start.
func TestServeTLSBadInputExit1(t *testing.T) {
	bin := buildSluice(t)
	s := newTLSSetup(t)
	other := s.ca.Server(t, "other", time.Now().Add(time.Hour))
	expiredCert, expiredKey := s.ca.Server(t, "expired", time.Now().Add(-time.Minute)).Write(t, s.dir, "expired")
	otherCert, _ := other.Write(t, s.dir, "other")
	noCA := writeFile(t, "empty-ca.pem", "# no certificate here\n")
	unreadable := filepath.Join(s.dir, "unreadable.key")
	testcerts.WriteFile(t, unreadable, s.server.KeyPEM)
	os.Chmod(unreadable, 0)
	requireTLS := writeFile(t, "require.json", `{"require-tls": true}`)
	pair := []string{"--tls-cert-file", s.certFile, "--tls-key-file", s.keyFile}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"key file a directory", []string{"--tls-cert-file", s.certFile, "--tls-key-file", s.dir}, "sluice: --tls-key-file: read " + s.dir + ": is a directory"},
		{"missing cert", []string{"--tls-cert-file", s.dir + "/nope.crt", "--tls-key-file", s.keyFile}, "sluice: --tls-cert-file: open " + s.dir + "/nope.crt: no such file or directory"},
		{"mismatched key", []string{"--tls-cert-file", otherCert, "--tls-key-file", s.keyFile}, "sluice: --tls-key-file " + s.keyFile + ": the key does not match the certificate of --tls-cert-file " + otherCert},
		{"key in place of cert", []string{"--tls-cert-file", s.keyFile, "--tls-key-file", s.keyFile}, "sluice: --tls-cert-file " + s.keyFile + ": no PEM certificate in it"},
		{"CA without a certificate", append([]string{"--tls-client-ca-file", noCA}, pair...), "sluice: --tls-client-ca-file " + noCA + ": no PEM certificate in it"},
		{"expired", []string{"--tls-cert-file", expiredCert, "--tls-key-file", expiredKey}, "sluice: --tls-cert-file " + expiredCert + ": the certificate expired at "},
		{"cert without key", []string{"--tls-cert-file", s.certFile}, "sluice: --tls-cert-file and --tls-key-file must be set together"},
		{"client CA without cert", []string{"--tls-client-ca-file", s.caFile}, "sluice: --tls-client-ca-file: a client CA needs a certificate on --listen 127.0.0.1:0: set --tls-cert-file and --tls-key-file"},
		{"admin TLS without admin listener", append([]string{"--admin-tls-client-ca-file", s.caFile}, pair...), "sluice: --admin-tls-client-ca-file: set without --admin-listen"},
		{"rls pair half set", []string{"--rls-listen", "127.0.0.1:0", "--rls-tls-key-file", s.keyFile}, "sluice: --rls-tls-cert-file and --rls-tls-key-file must be set together"},
		{"require-tls plaintext", []string{"--require-tls"}, "sluice: --require-tls: --listen 127.0.0.1:0 is plaintext"},
		{"require-tls with TLS on the admin listener only", []string{"--require-tls", "--admin-listen", "127.0.0.1:0", "--admin-tls-cert-file", s.certFile, "--admin-tls-key-file", s.keyFile}, "sluice: --require-tls: --listen 127.0.0.1:0 is plaintext"},
		{"require-tls from --config", []string{"--config", requireTLS, "--admin-listen", "127.0.0.1:0"}, "sluice: --require-tls: --listen 127.0.0.1:0 is plaintext"},
		{"admin pair half set", append([]string{"--require-tls", "--admin-listen", "127.0.0.1:0", "--admin-tls-cert-file", s.certFile}, pair...), "sluice: --admin-tls-cert-file and --admin-tls-key-file must be set together"},
	}
	if os.Geteuid() != 0 { // root reads a file of mode 0
		tests = append(tests, struct {
			name string
			args []string
			want string
		}{"unreadable key", []string{"--tls-cert-file", s.certFile, "--tls-key-file", unreadable}, "sluice: --tls-key-file: open " + unreadable + ": permission denied"})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(bin, append([]string{"serve", "--listen", "127.0.0.1:0"}, tt.args...)...)
			cmd.Env = append(os.Environ(), "SLUICE_ADMIN_TOKEN="+e2eToken)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Fatalf("sluice serve %v: %v, want exit status 1; stderr:\n%s", tt.args, err, stderr.String())
			}
			out := strings.TrimSuffix(stderr.String(), "\n")
			if strings.Contains(out, "\n") || !strings.HasPrefix(out, tt.want) {
				t.Errorf("stderr = %q, want one line starting %q", stderr.String(), tt.want)
			}
		})
	}
}

// TestServeRequireTLSStarts: with --require-tls and a certificate on every
// listener the daemon starts, and on SIGTERM it stops with status 0.
func TestServeRequireTLSStarts(t *testing.T) {
	bin := buildSluice(t)
	s := newTLSSetup(t)
	d := startDaemon(t, bin, "--require-tls", "--tls-cert-file", s.certFile, "--tls-key-file", s.keyFile,
		"--admin-listen", freeLoopbackAddr(t), "--rls-listen", "127.0.0.1:0")
	if out, code := curl(t, "--cacert", s.caFile, "-w", "%{http_code}", "-o", "/dev/null", "https://"+d.addr+"/healthz"); code != 0 || out != "200" {
		t.Errorf("healthz = exit %d %q", code, out)
	}
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-d.done:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", err, d.log())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("sluice did not exit after SIGTERM")
	}
}

// TestServeAdminPlaintextWarning: an admin API with a token on a
// non-loopback address without TLS is said at start, with the address; on
// loopback it is not.
func TestServeAdminPlaintextWarning(t *testing.T) {
	bin := buildSluice(t)
	const warning = "the admin API is served without TLS on a non-loopback address"
	_, port, _ := net.SplitHostPort(freeLoopbackAddr(t))
	d := startDaemon(t, bin, "--admin-listen", "0.0.0.0:"+port)
	var found bool
	for _, line := range strings.Split(d.log(), "\n") {
		var m struct{ Level, Msg, Addr string }
		if json.Unmarshal([]byte(line), &m) == nil && strings.HasPrefix(m.Msg, warning) {
			found = m.Level == "WARN" && m.Addr == "0.0.0.0:"+port
		}
	}
	if !found {
		t.Errorf("no warning naming 0.0.0.0:%s in the log:\n%s", port, d.log())
	}
	d = startDaemon(t, bin, "--admin-listen", freeLoopbackAddr(t))
	if strings.Contains(d.log(), warning) {
		t.Errorf("warned of a loopback admin listener:\n%s", d.log())
	}
}

// k8sSecretDir lays files out as a Kubernetes Secret volume does: each
// name a symlink into ..data, itself a symlink to a timestamped directory
// that an update replaces by renaming a new ..data over it.
type k8sSecretDir struct {
	t   *testing.T
	dir string
	gen int
}

func (k *k8sSecretDir) write(files map[string][]byte) {
	k.t.Helper()
	k.gen++
	ts := fmt.Sprintf("..2026_12_01_00_00_%02d.%d", k.gen, k.gen)
	if err := os.Mkdir(filepath.Join(k.dir, ts), 0o755); err != nil {
		k.t.Fatal(err)
	}
	for name, b := range files {
		testcerts.WriteFile(k.t, filepath.Join(k.dir, ts, name), b)
		link := filepath.Join(k.dir, name)
		if _, err := os.Lstat(link); err != nil {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				k.t.Fatal(err)
			}
		}
	}
	tmp := filepath.Join(k.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		k.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(k.dir, "..data")); err != nil {
		k.t.Fatal(err)
	}
}

// TestServeTLSRotation swaps the certificate as a Kubernetes Secret update
// does, under a steady load of checks on kept-alive and on new
// connections: new connections see the new certificate within 2 s, and
// no check fails. A pair the daemon cannot load on the way keeps the
// served one.
func TestServeTLSRotation(t *testing.T) {
	bin := buildSluice(t)
	ca := testcerts.NewCA(t, "rotation CA")
	one := ca.Server(t, "one", time.Now().Add(24*time.Hour))
	two := ca.Server(t, "two", time.Now().Add(48*time.Hour))
	k := &k8sSecretDir{t: t, dir: t.TempDir()}
	k.write(map[string][]byte{"tls.crt": one.CertPEM, "tls.key": one.KeyPEM})
	policies := writeFile(t, "policies.json", `[{"id":"wide","algorithm":"token_bucket","rate_per_sec":1000000,"burst":1000000,"mode":"enforce"}]`)
	d := startDaemon(t, bin, "--policies", policies, "--tls-cert-file", filepath.Join(k.dir, "tls.crt"), "--tls-key-file", filepath.Join(k.dir, "tls.key"))

	served := func() (string, error) {
		c, err := tls.Dial("tcp", d.addr, &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost"})
		if err != nil {
			return "", err
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].Subject.CommonName, nil
	}
	if cn, err := served(); err != nil || cn != "one" {
		t.Fatalf("served %q, %v; want one", cn, err)
	}

	ctx, stop := context.WithCancel(t.Context())
	var checks, failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for _, keepAlive := range []bool{true, false} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			loadChecks(ctx, d.addr, ca, keepAlive, &checks, &failed, &firstErr)
		}()
	}
	testwait.For(t, 20*time.Second, "checks under way", func() bool { return checks.Load() > 20 })

	// The new certificate beside the old key: refused, the old one served.
	k.write(map[string][]byte{"tls.crt": two.CertPEM, "tls.key": one.KeyPEM})
	testwait.For(t, 20*time.Second, "the refused reload logged", func() bool { return strings.Contains(d.log(), "TLS files not reloaded") })
	if cn, err := served(); err != nil || cn != "one" {
		t.Errorf("after a mismatched pair, served %q, %v; want one", cn, err)
	}

	k.write(map[string][]byte{"tls.crt": two.CertPEM, "tls.key": two.KeyPEM})
	swapped := time.Now()
	testwait.For(t, 2*time.Second, "the new certificate on new connections", func() bool {
		cn, err := served()
		return err == nil && cn == "two"
	})
	t.Logf("new certificate served %v after the swap", time.Since(swapped).Round(time.Millisecond))
	n := checks.Load()
	testwait.For(t, 20*time.Second, "more checks after the swap", func() bool { return checks.Load() > n+20 })
	stop()
	wg.Wait()
	if f := failed.Load(); f != 0 {
		t.Errorf("%d of %d checks failed during the rotation; first: %v", f, checks.Load(), firstErr.Load())
	}
	out, _ := curl(t, "--cacert", filepath.Join(writeCA(t, ca)), "https://"+d.addr+"/metrics")
	for _, want := range []string{`sluice_tls_reload_errors_total{listener="gateway"} 1`, `sluice_tls_reloads_total{listener="gateway"} 1`} {
		if !strings.Contains(out, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func writeCA(t *testing.T, ca *testcerts.CA) string { return ca.WriteCA(t, t.TempDir(), "ca") }

// loadChecks sends checks until ctx ends, on one kept-alive connection or
// on a new connection each; any answer but 200 is a failure.
func loadChecks(ctx context.Context, addr string, ca *testcerts.CA, keepAlive bool, checks, failed *atomic.Int64, firstErr *atomic.Value) {
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost"}, DisableKeepAlives: !keepAlive}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 20 * time.Second}
	for ctx.Err() == nil {
		req, _ := http.NewRequest("POST", "https://"+addr+"/v1/check", strings.NewReader(`{"api_key":"k","route":"/r","method":"GET"}`))
		req.Header.Set("Content-Type", "application/json")
		res, err := client.Do(req)
		if err == nil {
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode != 200 {
				err = fmt.Errorf("status %d", res.StatusCode)
			}
		}
		checks.Add(1)
		if err != nil {
			failed.Add(1)
			firstErr.CompareAndSwap(nil, err.Error())
		}
	}
}
