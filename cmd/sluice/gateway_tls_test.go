package main

import (
	"crypto/tls"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/sluice-rl/sluice/internal/testcerts"
)

// TestGatewayTLSAttackSuite runs the attack suite through the TLS variants
// of the shipped gateway configurations: the gateway asks Sluice over TLS,
// verifying its certificate with a CA the test makes and showing its own
// client certificate to a daemon that requires one (mutual TLS).
func TestGatewayTLSAttackSuite(t *testing.T) {
	s := newTLSSetup(t)
	sluiceFlags := map[string]string{"--tls-cert-file": s.certFile, "--tls-key-file": s.keyFile, "--tls-client-ca-file": s.caFile}
	daemonTLS := &tls.Config{Certificates: []tls.Certificate{s.server.TLS(t)}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: s.ca.Pool()}
	gateways := []gatewayUnderTest{
		{
			name:   "nginx",
			config: "../../deploy/nginx/sluice-tls.conf",
			placeholders: func(listen, daemon, backend string) [][2]string {
				return [][2]string{{"127.0.0.1:8443", daemon}, {"listen 80;", "listen " + listen + ";"}, {"http://backend", backend},
					{"sluice.internal", "localhost"}, {"/etc/nginx/sluice/ca.crt", s.caFile},
					{"/etc/nginx/sluice/client.crt", s.clientCert}, {"/etc/nginx/sluice/client.key", s.clientKeyFile}}
			},
			start:      startNginx,
			flagValues: sluiceFlags,
			daemonTLS:  daemonTLS,
		},
		{
			name:   "caddy",
			config: "../../deploy/caddy/Caddyfile-tls",
			placeholders: func(listen, daemon, backend string) [][2]string {
				_, port, _ := net.SplitHostPort(listen)
				return [][2]string{{"127.0.0.1:8443", daemon}, {"\n:80 {", "\n:" + port + " {"}, {"http://backend", backend},
					{"sluice.internal", "localhost"}, {"/etc/caddy/sluice/ca.crt", s.caFile},
					{"/etc/caddy/sluice/client.crt", s.clientCert}, {"/etc/caddy/sluice/client.key", s.clientKeyFile}}
			},
			start:      startCaddy,
			flagValues: sluiceFlags,
			daemonTLS:  daemonTLS,
		},
	}
	bin := buildSluice(t)
	for _, gw := range gateways {
		t.Run(gw.name, func(t *testing.T) { runAttackSuite(t, bin, gw) })
	}
}

// TestGatewayTLSVerifiesSluice: a gateway of the TLS configurations told
// to trust another CA refuses Sluice's certificate (and fails open, as with
// a Sluice that is down: the API answers without the RateLimit headers a
// decision of Sluice's carries, as the attack suite shows): the
// configurations verify the certificate, not only encrypt.
func TestGatewayTLSVerifiesSluice(t *testing.T) {
	bin := buildSluice(t)
	s := newTLSSetup(t)
	wrongCA := testcerts.NewCA(t, "another CA").WriteCA(t, t.TempDir(), "wrong")
	for _, gw := range []struct {
		name, config, ca string
		start            func(t *testing.T, conf, listen string)
		site             func(listen string) [2]string
	}{
		{"nginx", "../../deploy/nginx/sluice-tls.conf", "/etc/nginx/sluice/", startNginx,
			func(listen string) [2]string { return [2]string{"listen 80;", "listen " + listen + ";"} }},
		{"caddy", "../../deploy/caddy/Caddyfile-tls", "/etc/caddy/sluice/", startCaddy,
			func(listen string) [2]string {
				_, port, _ := net.SplitHostPort(listen)
				return [2]string{"\n:80 {", "\n:" + port + " {"}
			}},
	} {
		t.Run(gw.name, func(t *testing.T) {
			d := startDaemon(t, bin, "--tls-cert-file", s.certFile, "--tls-key-file", s.keyFile, "--tls-client-ca-file", s.caFile)
			api := startAttackBackend(t)
			raw, err := os.ReadFile(gw.config)
			if err != nil {
				t.Fatal(err)
			}
			listen := freeLoopbackAddr(t)
			site := gw.site(listen)
			conf := strings.NewReplacer("127.0.0.1:8443", d.addr, site[0], site[1], "http://backend", api.url,
				"sluice.internal", "localhost", gw.ca+"ca.crt", wrongCA,
				gw.ca+"client.crt", s.clientCert, gw.ca+"client.key", s.clientKeyFile).Replace(string(raw))
			gw.start(t, conf, listen)
			res, err := http.Get("http://" + listen + "/orders")
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != 200 || res.Header.Get("RateLimit-Policy") != "" {
				t.Errorf("GET /orders with Sluice's certificate unverifiable = %d (RateLimit-Policy %q), want 200 without Sluice's headers (fail open)", res.StatusCode, res.Header.Get("RateLimit-Policy"))
			}
		})
	}
}
