package tlsconfig

import (
	"bytes"
	"crypto/tls"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testlog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-rl/sluice/internal/testcerts"
	"github.com/sluice-rl/sluice/internal/testwait"
)

// memFS is a file system in memory, for ReadFile.
type memFS struct {
	mu    sync.Mutex
	files map[string][]byte
}

func (m *memFS) ReadFile(p string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.files[p]
	if !ok {
		return nil, &fs.PathError{Op: "open", Path: p, Err: fs.ErrNotExist}
	}
	return b, nil
}

func (m *memFS) set(kv ...any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := 0; i < len(kv); i += 2 {
		m.files[kv[i].(string)] = kv[i+1].([]byte)
	}
}

var files = Files{
	Cert:     File{Path: "/c.crt", Flag: "--tls-cert-file"},
	Key:      File{Path: "/c.key", Flag: "--tls-key-file"},
	ClientCA: File{Path: "/ca.crt", Flag: "--tls-client-ca-file"},
}

func TestNewRefuses(t *testing.T) {
	now := time.Now()
	ca := testcerts.NewCA(t, "ca")
	good := ca.Server(t, "good", now.Add(time.Hour))
	other := ca.Server(t, "other", now.Add(time.Hour))
	expired := ca.Server(t, "expired", now.Add(-time.Minute))
	for _, tc := range []struct {
		name  string
		files map[string][]byte
		want  string
	}{
		{"missing cert", map[string][]byte{"/c.key": good.KeyPEM, "/ca.crt": ca.PEM}, "--tls-cert-file: open /c.crt: file does not exist"},
		{"missing key", map[string][]byte{"/c.crt": good.CertPEM, "/ca.crt": ca.PEM}, "--tls-key-file: open /c.key"},
		{"missing CA", map[string][]byte{"/c.crt": good.CertPEM, "/c.key": good.KeyPEM}, "--tls-client-ca-file: open /ca.crt"},
		{"no certificate", map[string][]byte{"/c.crt": good.KeyPEM, "/c.key": good.KeyPEM, "/ca.crt": ca.PEM}, "--tls-cert-file /c.crt: no PEM certificate in it"},
		{"no key", map[string][]byte{"/c.crt": good.CertPEM, "/c.key": []byte("junk"), "/ca.crt": ca.PEM}, "--tls-key-file /c.key: no PEM private key in it"},
		{"mismatched", map[string][]byte{"/c.crt": good.CertPEM, "/c.key": other.KeyPEM, "/ca.crt": ca.PEM}, "--tls-key-file /c.key: the key does not match the certificate of --tls-cert-file /c.crt"},
		{"CA without certificate", map[string][]byte{"/c.crt": good.CertPEM, "/c.key": good.KeyPEM, "/ca.crt": []byte("# empty\n")}, "--tls-client-ca-file /ca.crt: no PEM certificate in it"},
		{"expired", map[string][]byte{"/c.crt": expired.CertPEM, "/c.key": expired.KeyPEM, "/ca.crt": ca.PEM}, "--tls-cert-file /c.crt: the certificate expired at "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &memFS{files: tc.files}
			_, err := New(now, Config{Listener: "gateway", Files: files, ReadFile: m.ReadFile})
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("New = %v, want an error starting %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q is not one line", err)
			}
		})
	}
	t.Run("cert without key", func(t *testing.T) {
		f := files
		f.Key.Path = ""
		if _, err := New(now, Config{Files: f}); err == nil || err.Error() != "--tls-cert-file and --tls-key-file must both be set" {
			t.Fatalf("New = %v", err)
		}
	})
}

// served is the certificate a client is shown in a handshake with c; the
// error is the server's or the client's, whichever refused it.
func served(t *testing.T, c *tls.Config, client *tls.Config) (string, error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	errc := make(chan error, 1)
	go func() {
		sc, err := ln.Accept()
		if err != nil {
			errc <- err
			return
		}
		defer sc.Close()
		errc <- tls.Server(sc, c).Handshake()
	}()
	cc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	cc.SetDeadline(time.Now().Add(time.Minute))
	tc := tls.Client(cc, client)
	cerr := tc.Handshake()
	if serr := <-errc; serr != nil {
		return "", serr
	}
	if cerr != nil {
		return "", cerr
	}
	return tc.ConnectionState().PeerCertificates[0].Subject.CommonName, nil
}

func TestReload(t *testing.T) {
	now := time.Now()
	ca := testcerts.NewCA(t, "ca")
	one := ca.Server(t, "one", now.Add(time.Hour))
	two := ca.Server(t, "two", now.Add(2*time.Hour))
	client := ca.Client(t, "client")
	m := &memFS{files: map[string][]byte{"/c.crt": one.CertPEM, "/c.key": one.KeyPEM, "/ca.crt": ca.PEM}}
	reg := prometheus.NewPedanticRegistry()
	met, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	r, err := New(now, Config{Listener: "gateway", Files: files, ReadFile: m.ReadFile, Metrics: met,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	cfg := r.TLSConfig()
	cli := &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost", Certificates: []tls.Certificate{client.TLS(t)}}
	expect := func(step, want string) {
		t.Helper()
		if got, err := served(t, cfg, cli); err != nil || got != want {
			t.Fatalf("%s: served %q (%v), want %q", step, got, err, want)
		}
	}
	expiry := func() float64 { return testutil.ToFloat64(met.expiry.WithLabelValues("gateway")) }
	errorsCounted := func() float64 { return testutil.ToFloat64(met.reloadErrs.WithLabelValues("gateway")) }
	expect("start", "one")
	if got, want := expiry(), float64(one.Cert.NotAfter.Unix()); got != want {
		t.Errorf("expiry = %v, want %v", got, want)
	}
	if changed, err := r.Reload(now); changed || err != nil {
		t.Errorf("Reload of unchanged files = %v, %v; want false, nil", changed, err)
	}

	// A half-written swap: the new certificate beside the old key.
	m.set("/c.crt", two.CertPEM)
	for range 3 {
		r.Reload(now)
	}
	expect("mismatched pair", "one")
	if got := errorsCounted(); got != 1 {
		t.Errorf("reload errors after three reloads of one mismatched pair = %v, want 1", got)
	}
	if n := strings.Count(logs.String(), "TLS files not reloaded"); n != 1 {
		t.Errorf("%d log lines for one mismatched pair, want 1:\n%s", n, logs.String())
	}

	m.set("/c.key", two.KeyPEM)
	if changed, err := r.Reload(now); !changed || err != nil {
		t.Fatalf("Reload of a good new pair = %v, %v; want true, nil", changed, err)
	}
	expect("new pair", "two")
	if got, want := expiry(), float64(two.Cert.NotAfter.Unix()); got != want {
		t.Errorf("expiry after reload = %v, want %v", got, want)
	}
	if got := testutil.ToFloat64(met.reloads.WithLabelValues("gateway")); got != 1 {
		t.Errorf("reloads = %v, want 1", got)
	}

	// Expired by the time of the reload: refused.
	m.set("/c.crt", one.CertPEM, "/c.key", one.KeyPEM)
	if _, err := r.Reload(now.Add(90 * time.Minute)); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Errorf("Reload of an expired pair = %v, want expired", err)
	}
	expect("expired pair", "two")

	// A new client CA applies to the next handshake.
	other := testcerts.NewCA(t, "other")
	m.set("/c.crt", two.CertPEM, "/c.key", two.KeyPEM, "/ca.crt", other.PEM)
	if changed, err := r.Reload(now); !changed || err != nil {
		t.Fatalf("Reload of a new CA = %v, %v", changed, err)
	}
	if _, err := served(t, cfg, cli); err == nil {
		t.Errorf("a client certificate of the old CA was accepted after the CA changed")
	}
	if got := errorsCounted(); got != 2 {
		t.Errorf("reload errors = %v, want 2", got)
	}
}

func TestMutualTLSRefusesClientWithoutCertificate(t *testing.T) {
	ca := testcerts.NewCA(t, "ca")
	p := ca.Server(t, "srv", time.Now().Add(time.Hour))
	m := &memFS{files: map[string][]byte{"/c.crt": p.CertPEM, "/c.key": p.KeyPEM, "/ca.crt": ca.PEM}}
	r, err := New(time.Now(), Config{Files: files, ReadFile: m.ReadFile})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := served(t, r.TLSConfig(), &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost"}); err == nil {
		t.Fatal("a client without a certificate completed the handshake")
	}
}

func TestListener(t *testing.T) {
	ca := testcerts.NewCA(t, "ca")
	p := ca.Server(t, "srv", time.Now().Add(time.Hour))
	f := files
	f.ClientCA = File{}
	m := &memFS{files: map[string][]byte{"/c.crt": p.CertPEM, "/c.key": p.KeyPEM}}
	met, _ := NewMetrics(prometheus.NewRegistry())
	var logs testlog.Buffer
	r, err := New(time.Now(), Config{Listener: "admin", Files: f, ReadFile: m.ReadFile, NextProtos: []string{"h2"},
		Metrics: met, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := NewListener(raw, r)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()

	// Plaintext clients: closed, counted, logged once.
	for range 5 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		if n, err := io.ReadAll(c); len(n) != 0 || err != nil {
			t.Errorf("a plaintext client read %q, %v; want a closed connection and nothing", n, err)
		}
		c.Close()
	}
	testwait.For(t, 30*time.Second, "five handshake errors counted", func() bool {
		return testutil.ToFloat64(met.handshakes.WithLabelValues("admin")) == 5
	})
	if n := strings.Count(logs.String(), "TLS handshake failed"); n != 1 {
		t.Errorf("%d log lines for five plaintext clients, want 1:\n%s", n, logs.String())
	}

	c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost", NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := c.ConnectionState(); got.NegotiatedProtocol != "h2" || got.Version < tls.VersionTLS12 {
		t.Errorf("negotiated %q, version %x; want h2, TLS 1.2 or later", got.NegotiatedProtocol, got.Version)
	}
	io.WriteString(c, "ping")
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Errorf("echo = %q, %v", buf, err)
	}

	ln.Close()
	if _, err := ln.Accept(); err == nil {
		t.Errorf("Accept after Close succeeded")
	}
}

func TestMinVersion(t *testing.T) {
	ca := testcerts.NewCA(t, "ca")
	p := ca.Server(t, "srv", time.Now().Add(time.Hour))
	f := files
	f.ClientCA = File{}
	m := &memFS{files: map[string][]byte{"/c.crt": p.CertPEM, "/c.key": p.KeyPEM}}
	r, err := New(time.Now(), Config{Files: f, ReadFile: m.ReadFile})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := served(t, r.TLSConfig(), &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost", MaxVersion: tls.VersionTLS11, MinVersion: tls.VersionTLS10}); err == nil {
		t.Errorf("a TLS 1.1 client completed the handshake")
	}
}
