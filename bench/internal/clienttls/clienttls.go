// Package clienttls gives the load generators (bench/loadgen,
// bench/rlsload) the client side of TLS: a CA file the server is verified
// against, an optional client certificate for a server that requires one,
// and the name the server's certificate must carry.
package clienttls

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
)

// Flags are the -tls-* flags of a load generator.
type Flags struct {
	CA, Cert, Key, ServerName string
}

// Register adds -tls-ca, -tls-cert, -tls-key and -tls-server-name to fs.
func (f *Flags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.CA, "tls-ca", "", "PEM CA certificates the server is verified against (default: the system's)")
	fs.StringVar(&f.Cert, "tls-cert", "", "PEM client certificate, for a server that requires one (with -tls-key)")
	fs.StringVar(&f.Key, "tls-key", "", "PEM key of -tls-cert")
	fs.StringVar(&f.ServerName, "tls-server-name", "", "name the server's certificate must carry (default: the host dialled)")
}

// Set reports whether any -tls-* flag was given.
func (f Flags) Set() bool { return f.CA != "" || f.Cert != "" || f.Key != "" || f.ServerName != "" }

// Config is the client configuration of the flags for a server dialled at
// host, offering the ALPN protocols next; each error names its flag.
func (f Flags) Config(host string, next ...string) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.ServerName, NextProtos: next}
	if c.ServerName == "" {
		c.ServerName = host
	}
	if f.CA != "" {
		b, err := os.ReadFile(f.CA)
		if err != nil {
			return nil, fmt.Errorf("-tls-ca: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("-tls-ca %s: no PEM certificate in it", f.CA)
		}
	}
	if (f.Cert == "") != (f.Key == "") {
		return nil, errors.New("-tls-cert and -tls-key must be set together")
	}
	if f.Cert != "" {
		pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return nil, fmt.Errorf("-tls-cert, -tls-key: %w", err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	return c, nil
}
