package tlsconfig

import (
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testcerts"
)

// benchListener is an echo server on a TLS listener of NewListener (or a
// plain one, with tlsOn false).
func benchListener(b *testing.B, tlsOn bool) (addr string, client *tls.Config) {
	b.Helper()
	ca := testcerts.NewCA(b, "ca")
	p := ca.Server(b, "srv", time.Now().Add(time.Hour))
	m := &memFS{files: map[string][]byte{"/c.crt": p.CertPEM, "/c.key": p.KeyPEM}}
	f := files
	f.ClientCA = File{}
	r, err := New(time.Now(), Config{Files: f, ReadFile: m.ReadFile, NextProtos: []string{"http/1.1"}})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	if tlsOn {
		ln = NewListener(ln, r)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().String(), &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost"}
}

// BenchmarkConnect is the cost of a new connection with and without TLS
// (TLS 1.3, ECDSA P-256, no resumption): connect, handshake, one
// round trip of 64 bytes.
func BenchmarkConnect(b *testing.B) {
	for _, tc := range []struct {
		name  string
		tlsOn bool
	}{{"plain", false}, {"tls", true}} {
		b.Run(tc.name, func(b *testing.B) {
			addr, cc := benchListener(b, tc.tlsOn)
			msg, buf := make([]byte, 64), make([]byte, 64)
			for b.Loop() {
				var c net.Conn
				var err error
				if tc.tlsOn {
					c, err = tls.Dial("tcp", addr, cc)
				} else {
					c, err = net.Dial("tcp", addr)
				}
				if err != nil {
					b.Fatal(err)
				}
				c.Write(msg)
				if _, err := io.ReadFull(c, buf); err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
		})
	}
}

// BenchmarkRoundTrip is the cost of one 512-byte exchange on an open
// connection with and without TLS: what TLS adds to a check on a
// kept-alive gateway connection.
func BenchmarkRoundTrip(b *testing.B) {
	for _, tc := range []struct {
		name  string
		tlsOn bool
	}{{"plain", false}, {"tls", true}} {
		b.Run(tc.name, func(b *testing.B) {
			addr, cc := benchListener(b, tc.tlsOn)
			var c net.Conn
			var err error
			if tc.tlsOn {
				c, err = tls.Dial("tcp", addr, cc)
			} else {
				c, err = net.Dial("tcp", addr)
			}
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			msg, buf := make([]byte, 512), make([]byte, 512)
			for b.Loop() {
				c.Write(msg)
				if _, err := io.ReadFull(c, buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
