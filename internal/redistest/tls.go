package redistest

import (
	"crypto/tls"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testcerts"
)

// TLS is a certificate authority a test made and one certificate it
// signed, for 127.0.0.1 and localhost, good for both servers and clients:
// WithTLS starts servers with it, and clients verify them against CAFile
// and present the same certificate (Redis requires a client certificate
// by default, tls-auth-clients yes).
type TLS struct {
	// CAFile, CertFile and KeyFile are PEM files in the test's temporary
	// directory.
	CAFile, CertFile, KeyFile string
	client                    *tls.Config
}

// NewTLS makes a CA and a certificate it signs, valid for a day, and
// writes them to PEM files in a t.TempDir(). Each call makes a new CA, so
// a second one is a wrong CA for the first one's servers.
func NewTLS(t testing.TB) *TLS {
	t.Helper()
	ca := testcerts.NewCA(t, "redistest CA")
	pair := ca.Server(t, "localhost", time.Now().Add(24*time.Hour))
	dir := t.TempDir()
	c := &TLS{CAFile: ca.WriteCA(t, dir, "ca")}
	c.CertFile, c.KeyFile = pair.Write(t, dir, "server")
	c.client = &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{pair.TLS(t)}, MinVersion: tls.VersionTLS12}
	return c
}

// ClientConfig is a client's TLS configuration for servers started with
// c: c's CA as the only root, c's certificate presented.
func (c *TLS) ClientConfig() *tls.Config { return c.client.Clone() }

// WithTLS starts servers that accept TLS only, with c's certificate, on
// the port Addr names (the plaintext port is off), and that require a
// client certificate from c's CA. Replication, a Cluster's bus and a
// Sentinel's connections to the servers it monitors use TLS too. The
// harness's own probes and the Client methods speak TLS to them.
func WithTLS(c *TLS) Option { return func(cfg *config) { cfg.tls = c } }

// WithAuth makes the data nodes refuse unauthenticated clients: with an
// empty user, by requirepass pass; otherwise by an ACL user of that name
// and password allowed every command, key and channel, with the default
// user off. Replicas authenticate to their primary, and Sentinels to the
// servers they monitor, with the same credentials.
func WithAuth(user, pass string) Option {
	return func(cfg *config) { cfg.user, cfg.pass = user, pass }
}

// WithSentinelAuth makes StartSentinel's Sentinels refuse unauthenticated
// clients, as WithAuth does for data nodes; the Sentinels authenticate to
// each other with the same credentials.
func WithSentinelAuth(user, pass string) Option {
	return func(cfg *config) { cfg.sentinelUser, cfg.sentinelPass = user, pass }
}

// tlsArgs are redis-server's arguments of c's certificate, or none.
func (cfg *config) tlsArgs() []string {
	if cfg.tls == nil {
		return nil
	}
	return []string{"--tls-cert-file", cfg.tls.CertFile, "--tls-key-file", cfg.tls.KeyFile,
		"--tls-ca-cert-file", cfg.tls.CAFile, "--tls-replication", "yes"}
}

// authArgs are the arguments that require user and pass of clients, or
// none.
func authArgs(user, pass string) []string {
	switch {
	case pass == "":
		return nil
	case user == "":
		return []string{"--requirepass", pass}
	}
	return []string{"--user", "default", "off", "--user", user, "on", ">" + pass, "~*", "&*", "+@all"}
}

// dataArgs are a data node's arguments: TLS, credentials (its own and
// those it replicates with), then the caller's own.
func (cfg *config) dataArgs(extra ...string) []string {
	args := cfg.tlsArgs()
	args = append(args, authArgs(cfg.user, cfg.pass)...)
	if cfg.pass != "" {
		if cfg.user != "" {
			args = append(args, "--masteruser", cfg.user)
		}
		args = append(args, "--masterauth", cfg.pass)
	}
	args = append(args, extra...)
	return append(args, cfg.args...)
}

// probeAs makes s a server of cfg's TLS, probed with the data nodes'
// credentials or, when sentinel, the Sentinels'.
func (s *Server) probeAs(cfg *config, sentinel bool) {
	if cfg.tls != nil {
		s.tls, s.tlsPort = cfg.tls.ClientConfig(), true
	}
	user, pass := cfg.user, cfg.pass
	if sentinel {
		user, pass = cfg.sentinelUser, cfg.sentinelPass
	}
	switch {
	case pass == "":
	case user == "":
		s.auth = []string{pass}
	default:
		s.auth = []string{user, pass}
	}
}
