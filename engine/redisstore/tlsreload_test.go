package redisstore

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testlog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/internal/testcerts"
	"github.com/sluice-rl/sluice/internal/testwait"
	"github.com/sluice-rl/sluice/internal/tlsconfig"
)

// secretDir is a directory laid out as a Kubernetes Secret volume: the
// files are symlinks through ..data, which points at one version's
// directory and is replaced in one rename.
type secretDir struct {
	t   *testing.T
	dir string
	n   int
}

func newSecretDir(t *testing.T, files map[string][]byte) *secretDir {
	d := &secretDir{t: t, dir: t.TempDir()}
	d.swap(files)
	for name := range files {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(d.dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

func (d *secretDir) path(name string) string { return filepath.Join(d.dir, name) }

// swap writes a new version of the files and points ..data at it.
func (d *secretDir) swap(files map[string][]byte) {
	d.n++
	v := filepath.Join(d.dir, "..v"+string(rune('0'+d.n)))
	if err := os.Mkdir(v, 0o700); err != nil {
		d.t.Fatal(err)
	}
	for name, b := range files {
		testcerts.WriteFile(d.t, filepath.Join(v, name), b)
	}
	tmp := filepath.Join(d.dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(v), tmp); err != nil {
		d.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(d.dir, "..data")); err != nil {
		d.t.Fatal(err)
	}
}

// tlsCounter is the value of the counter name{listener="redis"} in reg.
func tlsCounter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "listener" && l.GetValue() == tlsMetricName {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{listener=%q} in the registry", name, tlsMetricName)
	return 0
}

// TestTLSClientCertificateRotation rotates a Redis client's certificate
// files by symlink swap, as Kubernetes replaces a Secret volume's, against
// a real redis-server that requires client certificates: once the server
// trusts only the new certificate's CA, new connections succeed, so they
// present the new certificate; a bad set swapped in after it is refused,
// logged once and counted in sluice_tls_reload_errors_total{listener="redis"},
// and new connections keep presenting the last good certificate.
func TestTLSClientCertificateRotation(t *testing.T) {
	ca1 := redistest.NewTLS(t)
	s := redistest.Start(t, redistest.WithTLS(ca1))
	ca1PEM, err := os.ReadFile(ca1.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	cert1, err := os.ReadFile(ca1.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	key1, err := os.ReadFile(ca1.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	ca2 := testcerts.NewCA(t, "second client CA")
	pair2 := ca2.Client(t, "sluice-rotated")

	// One admin connection, opened while the server trusts CA1, kept for
	// the whole test: it changes the CAs the server trusts and kills the
	// client's connections so that the client opens new ones.
	admin := redis.NewClient(&redis.Options{Addr: s.Addr(), TLSConfig: ca1.ClientConfig(), PoolSize: 1, MaxIdleConns: 1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { admin.Close() })
	ctx := context.Background()
	trust := func(pemBlocks ...[]byte) {
		t.Helper()
		p := filepath.Join(t.TempDir(), "trusted.crt")
		testcerts.WriteFile(t, p, bytes.Join(pemBlocks, nil))
		if err := admin.ConfigSet(ctx, "tls-ca-cert-file", p).Err(); err != nil {
			t.Fatalf("CONFIG SET tls-ca-cert-file = %v", err)
		}
	}
	if err := admin.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	kill := func() {
		t.Helper()
		if err := admin.ClientKillByFilter(ctx, "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
			t.Fatalf("CLIENT KILL = %v", err)
		}
	}

	sec := newSecretDir(t, map[string][]byte{"ca.crt": ca1PEM, "tls.crt": cert1, "tls.key": key1})
	reg := prometheus.NewRegistry()
	m, err := tlsconfig.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	var logs testlog.Buffer
	c, err := NewClientWith("rediss://"+s.Addr(), ClientConfig{
		TLS:    TLSFiles{CAFile: sec.path("ca.crt"), CertFile: sec.path("tls.crt"), KeyFile: sec.path("tls.key")},
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), TLSMetrics: m,
	})
	if err != nil {
		t.Fatalf("NewClientWith = %v", err)
	}
	t.Cleanup(func() { c.Close() })
	ping := func() error {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return c.Ping(pctx).Err()
	}
	if err := ping(); err != nil {
		t.Fatalf("PING with the first certificate = %v", err)
	}

	// Rotate: the server trusts both CAs while the files are swapped, then
	// only the new one.
	trust(ca1PEM, ca2.PEM)
	sec.swap(map[string][]byte{"ca.crt": ca1PEM, "tls.crt": pair2.CertPEM, "tls.key": pair2.KeyPEM})
	trust(ca2.PEM)
	old := redis.NewClient(&redis.Options{Addr: s.Addr(), TLSConfig: ca1.ClientConfig(), MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { old.Close() })
	if err := old.Ping(ctx).Err(); err == nil {
		t.Fatal("PING with the first certificate succeeded after the server stopped trusting its CA: the test proves nothing")
	}
	testwait.For(t, 20*time.Second, "a new connection presents the rotated certificate", func() bool {
		kill()
		return ping() == nil
	})
	reloads := tlsCounter(t, reg, "sluice_tls_reloads_total")
	if reloads != 1 {
		t.Fatalf("sluice_tls_reloads_total{listener=redis} = %v, want 1", reloads)
	}

	// A bad set: the new certificate with the old key. It is refused and
	// the rotated certificate stays in use.
	sec.swap(map[string][]byte{"ca.crt": ca1PEM, "tls.crt": pair2.CertPEM, "tls.key": key1})
	testwait.For(t, 20*time.Second, "the mismatched files to be refused", func() bool {
		kill()
		if err := ping(); err != nil {
			t.Errorf("PING after the bad files = %v, want the last good certificate used", err)
		}
		return tlsCounter(t, reg, "sluice_tls_reload_errors_total") == 1
	})
	deadline := time.Now().Add(2 * TLSReloadEvery)
	for time.Now().Before(deadline) {
		kill()
		if err := ping(); err != nil {
			t.Fatalf("PING after the bad files were refused = %v, want the last good certificate used", err)
		}
	}
	if n := tlsCounter(t, reg, "sluice_tls_reload_errors_total"); n != 1 {
		t.Errorf("sluice_tls_reload_errors_total{listener=redis} = %v, want 1 (the same bad files counted once)", n)
	}
	if n := strings.Count(logs.String(), "not reloaded"); n != 1 {
		t.Errorf("log has %d lines of files not reloaded, want 1:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "does not match") {
		t.Errorf("log does not say why the files were refused:\n%s", logs.String())
	}
}
