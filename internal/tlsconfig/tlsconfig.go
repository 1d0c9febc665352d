// Package tlsconfig gives a listener TLS whose certificate, key and client
// CA are files that may be replaced while the listener serves: the way
// cert-manager and Kubernetes Secret volumes replace them, by swapping a
// symlink. A Reloader holds the last good set; new handshakes use it,
// established connections keep the one they began with, and a set that
// does not load (a missing file, a key that does not match the
// certificate, an expired certificate) never replaces it.
//
// The core, Reloader.Reload, reads the files through a function and is
// given the time, so that it is tested without a clock or a file system.
package tlsconfig

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// File is one PEM file and the setting it was given by (a flag such as
// --tls-cert-file), which every error about it names.
type File struct {
	Path string
	Flag string
}

// Files are a listener's certificate (chain, leaf first), its private key
// and, for mutual TLS, the CAs a client certificate must chain to. Without
// ClientCA.Path clients are not asked for a certificate; with it, a client
// without a valid one is refused at the handshake.
//
// On the client side (NewClient) CA is the CAs servers are verified
// against (without it, the system's), and Cert and Key an optional client
// certificate; ClientCA is not used.
type Files struct {
	Cert, Key, ClientCA File
	CA                  File
}

// Config is what New needs for one listener.
type Config struct {
	// Listener names the listener in metrics and logs: gateway, admin, rls.
	Listener string
	Files    Files
	// NextProtos are the ALPN protocols offered, in order of preference:
	// "h2" for the gRPC listener, "http/1.1" for HTTP/1.1 servers.
	NextProtos []string
	// ReadFile reads a file; nil is os.ReadFile.
	ReadFile func(path string) ([]byte, error)
	Logger   *slog.Logger
	// Metrics, if set, counts reloads and exposes the certificate's expiry.
	Metrics *Metrics
}

// material is one loaded set of files and the server configuration built
// from it, served as is to every handshake until the next set.
type material struct {
	sum      [sha256.Size]byte
	config   *tls.Config
	notAfter time.Time
}

// Reloader holds the TLS configuration of one listener, reloaded from its
// files by Reload. Its methods are safe for concurrent use.
type Reloader struct {
	cfg Config
	cur atomic.Pointer[material]

	mu     sync.Mutex        // serialises Reload
	badSum [sha256.Size]byte // the contents last refused, reported once
	// client is set by NewClient: the files are a client's, parsed by
	// parseClient.
	client     bool
	serverName string
}

// New loads cfg.Files at now and returns a Reloader serving them, or an
// error naming the setting at fault and why: a file missing or unreadable,
// no certificate in a file, a key that does not match the certificate, a
// certificate expired at now.
func New(now time.Time, cfg Config) (*Reloader, error) {
	if cfg.Files.Cert.Path == "" || cfg.Files.Key.Path == "" {
		return nil, fmt.Errorf("%s and %s must both be set", cfg.Files.Cert.Flag, cfg.Files.Key.Flag)
	}
	if cfg.ReadFile == nil {
		cfg.ReadFile = os.ReadFile
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	r := &Reloader{cfg: cfg}
	m, err := r.load(now)
	if err != nil {
		return nil, err
	}
	r.install(m)
	cfg.Metrics.served(cfg.Listener)
	return r, nil
}

// Listener is the name the Reloader was given.
func (r *Reloader) Listener() string { return r.cfg.Listener }

// NotAfter is when the served certificate expires.
func (r *Reloader) NotAfter() time.Time { return r.cur.Load().notAfter }

// TLSConfig is the configuration for a TLS server: each handshake is given
// the last good set of files.
func (r *Reloader) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: r.cfg.NextProtos,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return r.cur.Load().config, nil
		},
	}
}

// Reload reads the files again and, if their contents changed and load at
// now, serves them from the next handshake on. Contents that do not load
// leave the last good set served; they are logged and counted once, not
// at every call, until the files change again. It reports whether a new
// set is served, and the error of contents refused by this call.
func (r *Reloader) Reload(now time.Time) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sum, raw, err := r.read()
	if sum == r.cur.Load().sum || sum == r.badSum {
		return false, nil
	}
	var m *material
	if err == nil {
		m, err = r.parseAny(now, sum, raw)
	}
	if err != nil {
		r.badSum = sum
		r.cfg.Metrics.reloadFailed(r.cfg.Listener)
		r.cfg.Logger.Error("TLS files not reloaded: the last good certificate is still served",
			"listener", r.cfg.Listener, "err", err)
		return false, err
	}
	r.badSum = [sha256.Size]byte{}
	r.install(m)
	r.cfg.Metrics.reloaded(r.cfg.Listener)
	subject := ""
	if len(m.config.Certificates) > 0 {
		subject = m.config.Certificates[0].Leaf.Subject.String()
	}
	r.cfg.Logger.Info("TLS certificate reloaded", "listener", r.cfg.Listener, "subject", subject, "not_after", m.notAfter)
	return true, nil
}

// parseAny is parse or, for a client, parseClient.
func (r *Reloader) parseAny(now time.Time, sum [sha256.Size]byte, raw [4][]byte) (*material, error) {
	if r.client {
		return r.parseClient(now, sum, raw)
	}
	return r.parse(now, sum, raw)
}

func (r *Reloader) install(m *material) {
	r.cur.Store(m)
	r.cfg.Metrics.loaded(r.cfg.Listener, m.notAfter)
}

// load reads and parses the files.
func (r *Reloader) load(now time.Time) (*material, error) {
	sum, raw, err := r.read()
	if err != nil {
		return nil, err
	}
	return r.parseAny(now, sum, raw)
}

// read returns the contents of the files (those not set empty) and a hash
// of them together. An unreadable file is an error, with a hash of the
// error, so that the same failure is reported once.
func (r *Reloader) read() ([sha256.Size]byte, [4][]byte, error) {
	var raw [4][]byte
	h := sha256.New()
	for i, f := range []File{r.cfg.Files.Cert, r.cfg.Files.Key, r.cfg.Files.ClientCA, r.cfg.Files.CA} {
		if f.Path == "" {
			continue
		}
		b, err := r.cfg.ReadFile(f.Path)
		if err != nil {
			err = fmt.Errorf("%s: %w", f.Flag, err)
			return sha256.Sum256([]byte("unreadable:" + err.Error())), raw, err
		}
		raw[i] = b
		fmt.Fprintf(h, "%d:%d:", i, len(b))
		h.Write(b)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum, raw, nil
}

// parse checks the files' contents at now and builds the server
// configuration that serves them.
func (r *Reloader) parse(now time.Time, sum [sha256.Size]byte, raw [4][]byte) (*material, error) {
	f := r.cfg.Files
	if !hasPEM(raw[0], "CERTIFICATE") {
		return nil, fmt.Errorf("%s %s: no PEM certificate in it", f.Cert.Flag, f.Cert.Path)
	}
	pair, err := tls.X509KeyPair(raw[0], raw[1])
	if err != nil {
		return nil, keyPairError(f, raw[1], err)
	}
	leaf := pair.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return nil, fmt.Errorf("%s %s: %w", f.Cert.Flag, f.Cert.Path, err)
		}
		pair.Leaf = leaf
	}
	if now.After(leaf.NotAfter) {
		return nil, fmt.Errorf("%s %s: the certificate expired at %s", f.Cert.Flag, f.Cert.Path, leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	c := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		NextProtos:   r.cfg.NextProtos,
		Certificates: []tls.Certificate{pair},
	}
	if f.ClientCA.Path != "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(raw[2]) {
			return nil, fmt.Errorf("%s %s: no PEM certificate in it", f.ClientCA.Flag, f.ClientCA.Path)
		}
		c.ClientCAs = pool
		c.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return &material{sum: sum, config: c, notAfter: leaf.NotAfter}, nil
}

// keyPairError says which of the two files tls.X509KeyPair refused.
func keyPairError(f Files, key []byte, err error) error {
	switch {
	case !hasPEM(key, ""):
		return fmt.Errorf("%s %s: no PEM private key in it", f.Key.Flag, f.Key.Path)
	case strings.Contains(err.Error(), "does not match"):
		return fmt.Errorf("%s %s: the key does not match the certificate of %s %s", f.Key.Flag, f.Key.Path, f.Cert.Flag, f.Cert.Path)
	}
	return fmt.Errorf("%s %s, %s %s: %w", f.Cert.Flag, f.Cert.Path, f.Key.Flag, f.Key.Path, err)
}

// hasPEM reports whether b holds a PEM block of type typ (any type if typ
// is empty).
func hasPEM(b []byte, typ string) bool {
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return false
		}
		if typ == "" || blk.Type == typ {
			return true
		}
	}
}
