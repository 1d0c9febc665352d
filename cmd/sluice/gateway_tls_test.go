package main

import (
	"crypto/tls"
	"net"
	"testing"
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
