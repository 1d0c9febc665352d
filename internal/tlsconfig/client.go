package tlsconfig

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"time"
)

// NewClient loads the client side of cfg.Files at now: the CAs servers
// are verified against (Files.CA; without it, the system's) and an
// optional client certificate (Files.Cert and Files.Key, both or neither),
// for connections to a server such as Redis. serverName, if set, is the
// name every server's certificate must carry; empty leaves it to the
// dialler (the host dialled). Reload and Run re-read the files as for a
// listener; ClientConfig gives the last good set to each new connection.
// cfg.Listener names the client in metrics and logs.
func NewClient(now time.Time, cfg Config, serverName string) (*Reloader, error) {
	if (cfg.Files.Cert.Path == "") != (cfg.Files.Key.Path == "") {
		return nil, fmt.Errorf("%s and %s must both be set, or neither", cfg.Files.Cert.Flag, cfg.Files.Key.Flag)
	}
	if cfg.ReadFile == nil {
		cfg.ReadFile = os.ReadFile
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.Files.ClientCA = File{}
	r := &Reloader{cfg: cfg, client: true, serverName: serverName}
	m, err := r.load(now)
	if err != nil {
		return nil, err
	}
	r.install(m)
	return r, nil
}

// ClientConfig is the configuration for a new client connection, from the
// last good set of files; it is shared, and must not be changed (Clone it
// to set a field).
func (r *Reloader) ClientConfig() *tls.Config { return r.cur.Load().config }

// parseClient checks a client's files at now and builds the client
// configuration that uses them. Its notAfter is the client certificate's,
// zero without one.
func (r *Reloader) parseClient(now time.Time, sum [sha256.Size]byte, raw [4][]byte) (*material, error) {
	f := r.cfg.Files
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: r.serverName, NextProtos: r.cfg.NextProtos}
	if f.CA.Path == "" {
		pool, err := x509.SystemCertPool()
		if err != nil {
			return nil, fmt.Errorf("no CA file is given and the system's CAs cannot be read: %w", err)
		}
		c.RootCAs = pool
	} else {
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(raw[3]) {
			return nil, fmt.Errorf("%s %s: no PEM certificate in it", f.CA.Flag, f.CA.Path)
		}
	}
	m := &material{sum: sum, config: c}
	if f.Cert.Path == "" {
		return m, nil
	}
	if !hasPEM(raw[0], "CERTIFICATE") {
		return nil, fmt.Errorf("%s %s: no PEM certificate in it", f.Cert.Flag, f.Cert.Path)
	}
	pair, err := tls.X509KeyPair(raw[0], raw[1])
	if err != nil {
		return nil, keyPairError(f, raw[1], err)
	}
	if pair.Leaf == nil {
		if pair.Leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return nil, fmt.Errorf("%s %s: %w", f.Cert.Flag, f.Cert.Path, err)
		}
	}
	if now.After(pair.Leaf.NotAfter) {
		return nil, fmt.Errorf("%s %s: the certificate expired at %s", f.Cert.Flag, f.Cert.Path, pair.Leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	c.Certificates = []tls.Certificate{pair}
	m.notAfter = pair.Leaf.NotAfter
	return m, nil
}
