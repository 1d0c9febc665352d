package main

import (
	"bytes"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/region"
)

func TestIdentityFlags(t *testing.T) {
	tests := []struct {
		name     string
		mutate   func(*region.Config)
		trusted  []string
		wantErr  string // prefix of the one-line error; "" for none
		clientIP string // the canonical --client-ip-header when accepted
	}{
		{"defaults", nil, nil, "", "X-Forwarded-For"},
		{"trusted cidr and address", nil, []string{"10.0.0.0/8", " 192.0.2.1 ", "fd00::/8", ""}, "", "X-Forwarded-For"},
		{"x-real-ip any case", func(c *region.Config) { c.ClientIPHeader = "x-real-ip" }, nil, "", "X-Real-IP"},
		{"forwarded", func(c *region.Config) { c.ClientIPHeader = "Forwarded" }, nil, "", "Forwarded"},
		{"none", func(c *region.Config) { c.ClientIPHeader = "none" }, nil, "", "none"},
		{"forwarded pair", func(c *region.Config) { c.ForwardAuthHeaders = "forwarded" }, nil, "", "X-Forwarded-For"},

		{"unknown client ip header", func(c *region.Config) { c.ClientIPHeader = "X-Client-IP" }, nil, "--client-ip-header: must be", ""},
		{"empty client ip header", func(c *region.Config) { c.ClientIPHeader = "" }, nil, "--client-ip-header: must be", ""},
		{"unknown forward-auth pair", func(c *region.Config) { c.ForwardAuthHeaders = "traefik" }, nil, "--forward-auth-headers: must be original or forwarded", ""},
		{"ipv4-mapped prefix", nil, []string{"::ffff:10.0.0.0/104"}, `--trusted-proxies: "::ffff:10.0.0.0/104" is IPv4-mapped`, ""},
		{"ipv4-mapped address", nil, []string{"::ffff:10.0.0.1"}, `--trusted-proxies: "::ffff:10.0.0.1" is IPv4-mapped`, ""},
		{"zoned address", nil, []string{"fe80::1%eth0"}, `--trusted-proxies: "fe80::1%eth0" has a zone`, ""},
		{"zoned prefix", nil, []string{"fe80::%eth0/64"}, `--trusted-proxies: "fe80::%eth0/64" has a zone`, ""},
		{"not a cidr", nil, []string{"10.0.0.0/33"}, `--trusted-proxies: "10.0.0.0/33" is not a CIDR`, ""},
		{"bad tier header", func(c *region.Config) { c.TierHeader = "X Tier" }, nil, `--tier-header: "X Tier" is not a valid header name`, ""},
		{"bad user header", func(c *region.Config) { c.UserHeader = "X-User:" }, nil, `--user-header: "X-User:" is not a valid header name`, ""},
		{"bad key header", func(c *region.Config) { c.KeyHeaders = []string{"X-API-Key", "a\nb"} }, nil, `--key-headers: "a\nb" is not a valid header name`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := region.DefaultConfig()
			cfg.ClientIPHeader, cfg.ForwardAuthHeaders = quota.ClientIPXForwardedFor, region.ForwardAuthOriginal
			if tt.mutate != nil {
				tt.mutate(&cfg)
			}
			err := identityFlags(&cfg, tt.trusted)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("identityFlags = %v, want nil", err)
				}
				if cfg.ClientIPHeader != tt.clientIP {
					t.Errorf("ClientIPHeader = %q, want %q", cfg.ClientIPHeader, tt.clientIP)
				}
				if err := cfg.Validate(); err != nil {
					t.Errorf("accepted flags, but Config.Validate = %v", err)
				}
				return
			}
			if err == nil || !strings.HasPrefix(err.Error(), tt.wantErr) || strings.Contains(err.Error(), "\n") {
				t.Errorf("identityFlags = %v, want one line starting %q", err, tt.wantErr)
			}
		})
	}
}

// The real binary: a bad identity flag is one line on stderr and exit 1,
// before anything listens.
func TestServeBadIdentityFlagsExit1(t *testing.T) {
	bin := buildSluice(t)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--client-ip-header", "True-Client-IP"}, "sluice: --client-ip-header: must be X-Forwarded-For, X-Real-IP, Forwarded or none"},
		{[]string{"--forward-auth-headers", "envoy"}, "sluice: --forward-auth-headers: must be original or forwarded"},
		{[]string{"--trusted-proxies", "10.0.0.0/8,::ffff:10.0.0.0/104"}, `sluice: --trusted-proxies: "::ffff:10.0.0.0/104" is IPv4-mapped`},
		{[]string{"--tier-header", "X-Tier:"}, `sluice: --tier-header: "X-Tier:" is not a valid header name`},
	}
	for _, tt := range tests {
		t.Run(tt.args[0], func(t *testing.T) {
			cmd := exec.Command(bin, append([]string{"serve", "--listen", "127.0.0.1:0"}, tt.args...)...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Fatalf("sluice serve %v: %v, want exit status 1; stderr:\n%s", tt.args, err, stderr.String())
			}
			out := strings.TrimSuffix(stderr.String(), "\n")
			if strings.Contains(out, "\n") || !strings.HasPrefix(out, tt.want) {
				t.Errorf("stderr = %q, want one line starting %q", stderr.String(), tt.want)
			}
		})
	}
}
