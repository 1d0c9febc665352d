package main

import (
	"crypto/tls"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-rl/sluice/internal/testcerts"
	"go.yaml.in/yaml/v3"
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

// TestEnvoyTLSConfigStructure checks the TLS variants of the Envoy
// configurations without an Envoy binary (none can be installed here): each
// is its plaintext configuration but for a TLS transport socket on the
// cluster of Sluice, which verifies Sluice's certificate against a CA and a
// name, shows Envoy's client certificate, requires TLS 1.2 or later and
// offers the protocol Sluice serves there by ALPN (h2 for the rate limit
// service); and its prescribed command is the plaintext one with the TLS
// flags. Envoy's own schema (protobuf) is not checked.
func TestEnvoyTLSConfigStructure(t *testing.T) {
	for _, tc := range []struct{ tls, plain, cluster, alpn string }{
		{"../../deploy/envoy/envoy-tls.yaml", "../../deploy/envoy/envoy.yaml", "sluice", "http/1.1"},
		{"../../deploy/envoy/envoy-ratelimit-tls.yaml", "../../deploy/envoy/envoy-ratelimit.yaml", "sluice_rls", "h2"},
	} {
		t.Run(filepath.Base(tc.tls), func(t *testing.T) {
			docs := make([]map[string]any, 2)
			raws := make([]string, 2)
			for i, name := range []string{tc.tls, tc.plain} {
				raw, err := os.ReadFile(name)
				if err != nil {
					t.Fatal(err)
				}
				raws[i] = string(raw)
				if err := yaml.Unmarshal(raw, &docs[i]); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
			}
			var cluster map[string]any
			for _, c := range yamlAt(t, docs[0], "static_resources", "clusters").([]any) {
				if yamlAt(t, c, "name") == tc.cluster {
					cluster = c.(map[string]any)
				}
			}
			if cluster == nil {
				t.Fatalf("no cluster %s", tc.cluster)
			}
			ts := cluster["transport_socket"]
			if got := yamlAt(t, ts, "name"); got != "envoy.transport_sockets.tls" {
				t.Errorf("transport_socket.name = %v", got)
			}
			tctx := yamlAt(t, ts, "typed_config")
			if got := yamlAt(t, tctx, "@type"); got != "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext" {
				t.Errorf("transport_socket @type = %v", got)
			}
			ctx := yamlAt(t, tctx, "common_tls_context")
			vc := yamlAt(t, ctx, "validation_context")
			for _, c := range []struct {
				what string
				got  any
				want any
			}{
				{"sni", yamlAt(t, tctx, "sni"), "sluice.internal"},
				{"alpn_protocols", yamlAt(t, ctx, "alpn_protocols"), []any{tc.alpn}},
				{"tls_minimum_protocol_version", yamlAt(t, ctx, "tls_params", "tls_minimum_protocol_version"), "TLSv1_2"},
				{"trusted_ca", yamlAt(t, vc, "trusted_ca", "filename"), "/etc/envoy/sluice/ca.crt"},
				{"SAN type", yamlAt(t, vc, "match_typed_subject_alt_names", 0, "san_type"), "DNS"},
				{"SAN", yamlAt(t, vc, "match_typed_subject_alt_names", 0, "matcher", "exact"), "sluice.internal"},
				{"client certificate", yamlAt(t, ctx, "tls_certificates", 0, "certificate_chain", "filename"), "/etc/envoy/sluice/client.crt"},
				{"client key", yamlAt(t, ctx, "tls_certificates", 0, "private_key", "filename"), "/etc/envoy/sluice/client.key"},
			} {
				if !reflect.DeepEqual(c.got, c.want) {
					t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
				}
			}
			delete(cluster, "transport_socket")
			if tc.cluster == "sluice" {
				for _, d := range docs {
					hs := yamlAt(t, d, "static_resources", "listeners", 0, "filter_chains", 0, "filters", 0, "typed_config", "http_filters", 0, "typed_config", "http_service", "server_uri").(map[string]any)
					delete(hs, "uri") // names the scheme only
				}
			}
			if !reflect.DeepEqual(docs[0], docs[1]) {
				t.Errorf("%s is not %s with a TLS transport socket on cluster %s", tc.tls, tc.plain, tc.cluster)
			}
			tlsFlags := prescribedFlags(t, tc.tls, raws[0], "127.0.0.1:8080")
			want := append(prescribedFlags(t, tc.plain, raws[1], "127.0.0.1:8080"), "--tls-cert-file", "/etc/sluice/tls/tls.crt",
				"--tls-key-file", "/etc/sluice/tls/tls.key", "--tls-client-ca-file", "/etc/sluice/tls/ca.crt")
			if !slices.Equal(tlsFlags, want) {
				t.Errorf("prescribed flags = %v, want %v", tlsFlags, want)
			}
		})
	}
}
