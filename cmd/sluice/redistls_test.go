package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/internal/testcerts"
	"github.com/sluice-rl/sluice/internal/testwait"
)

// TestServeOnRedisTLS runs `sluice serve` on Redis over TLS in each
// topology, every server started with --tls-port only and requiring a
// client certificate from a CA the test makes: a single server with an ACL
// user, a 3-primary Cluster with tls-cluster yes, and a Sentinel
// deployment whose Sentinels require their own ACL user. A policy put
// through one daemon reaches the other by the store's pub/sub (the policy
// store shares the connection settings), and the two decide a subject's
// checks with source store, together exactly at the limit.
func TestServeOnRedisTLS(t *testing.T) {
	bin := buildSluice(t)
	ca := redistest.NewTLS(t)
	tlsFlags := []string{"--redis-tls-ca", ca.CAFile, "--redis-tls-cert", ca.CertFile, "--redis-tls-key", ca.KeyFile}
	tests := []struct {
		name  string
		start func(t *testing.T) []string // the daemon's store flags
		kind  string
	}{
		{"single", func(t *testing.T) []string {
			s := redistest.Start(t, redistest.WithTLS(ca), redistest.WithAuth("sluice", "data-pw"))
			return []string{"--store", "rediss://sluice:data-pw@" + s.Addr()}
		}, "redis"},
		{"cluster", func(t *testing.T) []string {
			cl := redistest.StartCluster(t, 3, 0, redistest.WithTLS(ca))
			return []string{"--store", "rediss-cluster://" + strings.Join(cl.Addrs(), ",")}
		}, "redis-cluster"},
		{"sentinel", func(t *testing.T) []string {
			sd := redistest.StartSentinel(t, redistest.WithTLS(ca), redistest.WithAuth("sluice", "data-pw"),
				redistest.WithSentinelAuth("watcher", "sentinel-pw"))
			return []string{"--store", "rediss-sentinel://sluice:data-pw@" + redistest.MasterName + "@" + strings.Join(sd.Addrs(), ","),
				"--redis-sentinel-username", "watcher", "--redis-sentinel-password", "sentinel-pw"}
		}, "redis-sentinel"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append(tt.start(t), tlsFlags...)
			// Exact admissions are asserted: a deadline far above the 5 ms
			// default keeps a loaded machine from deciding on the fallback.
			args = append(args, "--policies", writeFile(t, "policies.json", "[]"), "--store-timeout", "250ms")
			a, b := startDaemon(t, bin, args...), startDaemon(t, bin, args...)
			var rd struct{ Status, Store string }
			if r := a.do("GET", "/readyz", ""); json.Unmarshal([]byte(r.body), &rd) != nil || r.status != 200 || rd.Store != tt.kind {
				t.Fatalf("GET /readyz = %d %s, want 200 with store %s", r.status, r.body, tt.kind)
			}
			if r := a.admin("PUT", "/v1/policies/per-user", `{"algorithm":"fixed_window","limit":3,"window":3600,"mode":"enforce"}`); r.status != 201 {
				t.Fatalf("PUT = %d %s", r.status, r.body)
			}
			// The policy reaches b by the store's pub/sub, over TLS too.
			testwait.For(t, 10*time.Second, "daemon b to apply the policy put through a", func() bool {
				return strings.Contains(b.admin("GET", "/v1/policies/per-user/versions", "").body, `"in_force":1`)
			})
			allowed := 0
			for i := range 6 {
				d := []*daemon{a, b}[i%2]
				r := d.do("POST", "/v1/check", `{"user":"alice","route":"/orders"}`)
				var dec struct{ Source string }
				if err := json.Unmarshal([]byte(r.body), &dec); err != nil {
					t.Fatalf("check = %d %s", r.status, r.body)
				}
				// A repeated rejection may come from the deny cache; an
				// admission only from the store.
				switch {
				case r.status == 200 && dec.Source == "store":
					allowed++
				case r.status == 429 && (dec.Source == "store" || dec.Source == "deny_cache"):
				default:
					t.Fatalf("check = %d %s, want 200 or 429 decided by the store", r.status, r.body)
				}
			}
			if allowed != 3 {
				t.Errorf("%d of 6 checks across two daemons allowed over TLS, want exactly the limit 3", allowed)
			}
		})
	}
}

// TestServeOnRedisTLSWrongCA starts a daemon that verifies a TLS-only
// Redis against another CA: it starts, /readyz says the store is
// unreachable and why (the certificate's authority), and checks are
// decided by the fallback, as with any store failure.
func TestServeOnRedisTLSWrongCA(t *testing.T) {
	bin := buildSluice(t)
	ca, other := redistest.NewTLS(t), redistest.NewTLS(t)
	s := redistest.Start(t, redistest.WithTLS(ca))
	d := startDaemon(t, bin, "--store", "rediss://"+s.Addr(), "--redis-tls-ca", other.CAFile,
		"--redis-tls-cert", ca.CertFile, "--redis-tls-key", ca.KeyFile, "--policies", writeFile(t, "policies.json", "[]"))
	r := d.do("GET", "/readyz", "")
	var rd struct{ Status, Reason string }
	if err := json.Unmarshal([]byte(r.body), &rd); err != nil || r.status != 503 || rd.Status != "store_unreachable" ||
		!strings.Contains(rd.Reason, "TLS") || !strings.Contains(rd.Reason, "certificate signed by unknown authority") {
		t.Fatalf("GET /readyz = %d %s, want 503 store_unreachable naming the TLS verification failure", r.status, r.body)
	}
	t.Logf("/readyz: %s", r.body)
	if r := d.admin("PUT", "/v1/policies/per-user", `{"algorithm":"fixed_window","limit":3,"window":3600,"mode":"enforce"}`); r.status >= 500 {
		t.Logf("PUT while the store is unreachable = %d %s", r.status, r.body)
	}
	r = d.do("POST", "/v1/check", `{"user":"alice","route":"/orders"}`)
	var dec struct {
		Source   string
		Degraded bool
	}
	if err := json.Unmarshal([]byte(r.body), &dec); err != nil || r.status != 200 || dec.Source == "store" {
		t.Fatalf("check = %d %s, want 200 decided without the store", r.status, r.body)
	}
}

// TestServeBadRedisTLSFlagsExit1: a TLS file that cannot be used, or a
// setting that conflicts with --store, is one line naming the flag and
// exit 1 at start.
func TestServeBadRedisTLSFlagsExit1(t *testing.T) {
	bin := buildSluice(t)
	a, b := redistest.NewTLS(t), redistest.NewTLS(t)
	dir := t.TempDir()
	noCert := writeFile(t, "empty.pem", "not a certificate\n")
	unreadable := writeFile(t, "unreadable.pem", "")
	expiredCert, expiredKey := testcerts.NewCA(t, "expired client CA").Server(t, "expired", time.Now().Add(-time.Minute)).Write(t, dir, "expired")
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--store", "rediss://127.0.0.1:1", "--redis-tls-ca", dir + "/missing.pem"}, "sluice: --redis-tls-ca: open " + dir + "/missing.pem: no such file or directory"},
		{[]string{"--store", "rediss://127.0.0.1:1", "--redis-tls-ca", dir}, "sluice: --redis-tls-ca: read " + dir + ": is a directory"},
		{[]string{"--store", "rediss://127.0.0.1:1", "--redis-tls-ca", noCert}, "sluice: --redis-tls-ca: " + noCert + " holds no PEM certificate"},
		{[]string{"--store", "rediss://127.0.0.1:1", "--redis-tls-ca", unreadable}, "sluice: --redis-tls-ca: " + unreadable + " holds no PEM certificate"},
		{[]string{"--store", "rediss-cluster://127.0.0.1:1", "--redis-tls-cert", dir + "/missing.pem", "--redis-tls-key", a.KeyFile}, "sluice: --redis-tls-cert: stat " + dir + "/missing.pem: no such file or directory"},
		{[]string{"--store", "rediss-cluster://127.0.0.1:1", "--redis-tls-cert", a.CertFile, "--redis-tls-key", dir + "/missing.pem"}, "sluice: --redis-tls-key: stat " + dir + "/missing.pem: no such file or directory"},
		{[]string{"--store", "rediss://127.0.0.1:1", "--redis-tls-cert", a.CertFile, "--redis-tls-key", b.KeyFile}, "sluice: --redis-tls-cert: " + a.CertFile + " and " + b.KeyFile + ": tls: private key does not match public key"},
		{[]string{"--store", "rediss://127.0.0.1:1", "--redis-tls-cert", a.CAFile, "--redis-tls-key", a.CAFile}, "sluice: --redis-tls-cert: " + a.CAFile + " and " + a.CAFile + ": tls: found a certificate rather than a key"},
		{[]string{"--store", "rediss://127.0.0.1:1", "--redis-tls-cert", a.CertFile}, "sluice: --redis-tls-key: a client certificate is given without its key"},
		{[]string{"--store", "rediss://127.0.0.1:1", "--redis-tls-cert", expiredCert, "--redis-tls-key", expiredKey}, "sluice: --redis-tls-cert: " + expiredCert + ": the certificate expired at "},
		{[]string{"--store", "redis://127.0.0.1:1", "--redis-tls-ca", a.CAFile}, "sluice: --store: TLS settings are given but the store URL is plaintext"},
		{[]string{"--store", "rediss://127.0.0.1:1/?skip_verify=true", "--redis-tls-ca", a.CAFile}, "sluice: --store: skip_verify in the store URL conflicts with a CA or server name"},
		{[]string{"--store", "rediss://127.0.0.1:1", "--redis-sentinel-password", "x"}, "sluice: --store: Sentinel credentials are given but the store URL names no Sentinel"},
		{[]string{"--redis-tls-ca", a.CAFile}, "sluice: --store: memory takes no --redis-* settings"},
		{[]string{"--store", "redis://127.0.0.1:1", "--redis-key-prefix", "a{b}:"}, `sluice: --redis-key-prefix: "a{b}:" has '{' at byte 1`},
		{[]string{"--store", "redis-cluster://127.0.0.1:1", "--redis-key-prefix", "prod deploy:"}, `sluice: --redis-key-prefix: "prod deploy:" has ' ' at byte 4`},
		{[]string{"--redis-key-prefix", "prod:"}, "sluice: --store: memory takes no --redis-* settings"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			cmd := exec.Command(bin, append([]string{"serve", "--listen", "127.0.0.1:0"}, tt.args...)...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Fatalf("sluice serve %v: %v, want exit status 1; stderr:\n%s", tt.args, err, stderr.String())
			}
			var lines []string
			for _, l := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
				if !strings.HasPrefix(l, "{") { // the log's JSON lines are not the error
					lines = append(lines, l)
				}
			}
			if len(lines) != 1 || !strings.HasPrefix(lines[0], tt.want) {
				t.Errorf("stderr = %q, want one line starting %q", stderr.String(), tt.want)
			}
		})
	}
}
