package redisstore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/redistest"
)

func TestClientConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		url     string
		cc      ClientConfig
		setting string // of the *SettingError; "" for none
	}{
		{"plain url, no settings", "redis://h:1", ClientConfig{}, ""},
		{"rediss with a CA", "rediss://h:1", ClientConfig{TLS: TLSFiles{CAFile: "ca.pem"}}, ""},
		{"cluster over TLS with a client pair", "rediss-cluster://h:1,h:2", ClientConfig{TLS: TLSFiles{CertFile: "c", KeyFile: "k"}}, ""},
		{"sentinel over TLS with sentinel auth", "rediss-sentinel://m@h:1", ClientConfig{TLS: TLSFiles{ServerName: "redis"}, SentinelUsername: "u", SentinelPassword: "p"}, ""},
		{"sentinel password alone", "redis-sentinel://m@h:1", ClientConfig{SentinelPassword: "p"}, ""},
		{"CA on a plaintext url", "redis://h:1", ClientConfig{TLS: TLSFiles{CAFile: "ca.pem"}}, "url"},
		{"server name on a plaintext cluster", "redis-cluster://h:1", ClientConfig{TLS: TLSFiles{ServerName: "x"}}, "url"},
		{"cert without key", "rediss://h:1", ClientConfig{TLS: TLSFiles{CertFile: "c"}}, "tls-key"},
		{"key without cert", "rediss://h:1", ClientConfig{TLS: TLSFiles{KeyFile: "k"}}, "tls-cert"},
		{"sentinel credentials without a sentinel", "rediss://h:1", ClientConfig{SentinelUsername: "u", SentinelPassword: "p"}, "url"},
		{"sentinel user without password", "redis-sentinel://m@h:1", ClientConfig{SentinelUsername: "u"}, "sentinel-password"},
		{"skip_verify beside a CA", "rediss://h:1/?skip_verify=true", ClientConfig{TLS: TLSFiles{CAFile: "ca.pem"}}, "url"},
		{"skip_verify alone", "rediss://h:1/?skip_verify=true", ClientConfig{}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cc.Validate(tt.url)
			var se *SettingError
			switch {
			case tt.setting == "" && err != nil:
				t.Fatalf("Validate(%q) = %v, want nil", tt.url, err)
			case tt.setting != "" && (!errors.As(err, &se) || se.Setting != tt.setting):
				t.Fatalf("Validate(%q) = %v, want a SettingError of %q", tt.url, err, tt.setting)
			}
		})
	}
}

func TestTLSFilesConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	notPEM := write("not.pem", "hello\n")
	tests := []struct {
		name    string
		url     string
		f       TLSFiles
		setting string // of the error; "" for none
		nilConf bool
	}{
		{"plaintext", "redis://h:1", TLSFiles{}, "", true},
		{"rediss without settings: go-redis's own", "rediss://h:1", TLSFiles{}, "", true},
		{"cluster over TLS without settings: system CAs", "rediss-cluster://h:1", TLSFiles{}, "", false},
		{"missing CA", "rediss://h:1", TLSFiles{CAFile: filepath.Join(dir, "none.pem")}, "tls-ca", false},
		{"CA without a certificate", "rediss://h:1", TLSFiles{CAFile: notPEM}, "tls-ca", false},
		{"missing cert", "rediss://h:1", TLSFiles{CertFile: filepath.Join(dir, "none.pem"), KeyFile: notPEM}, "tls-cert", false},
		{"missing key", "rediss://h:1", TLSFiles{CertFile: notPEM, KeyFile: filepath.Join(dir, "none.pem")}, "tls-key", false},
		{"pair that is not PEM", "rediss://h:1", TLSFiles{CertFile: notPEM, KeyFile: notPEM}, "tls-cert", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := tt.f.config(tt.url)
			var se *SettingError
			switch {
			case tt.setting == "" && err != nil:
				t.Fatalf("config = %v, want nil", err)
			case tt.setting != "" && (!errors.As(err, &se) || se.Setting != tt.setting):
				t.Fatalf("config = %v, want a SettingError of %q", err, tt.setting)
			case tt.setting == "" && (c == nil) != tt.nilConf:
				t.Fatalf("config = %v, want nil %v", c, tt.nilConf)
			case err != nil && strings.Contains(err.Error(), "\n"):
				t.Errorf("error %q is not one line", err)
			}
		})
	}
}

// NewClientWith reaches a TLS-only server with the right CA, client
// certificate and server name, and fails at the handshake with any of
// them wrong or missing.
func TestNewClientWithTLS(t *testing.T) {
	ca, other := redistest.NewTLS(t), redistest.NewTLS(t)
	s := redistest.Start(t, redistest.WithTLS(ca))
	good := TLSFiles{CAFile: ca.CAFile, CertFile: ca.CertFile, KeyFile: ca.KeyFile}
	tests := []struct {
		name string
		url  string
		f    TLSFiles
		want string // in the error; "" for none
	}{
		{"all right", "rediss://" + s.Addr(), good, ""},
		{"server name it carries", "rediss://" + s.Addr(), TLSFiles{CAFile: ca.CAFile, CertFile: ca.CertFile, KeyFile: ca.KeyFile, ServerName: "localhost"}, ""},
		{"server name it does not carry", "rediss://" + s.Addr(), TLSFiles{CAFile: ca.CAFile, CertFile: ca.CertFile, KeyFile: ca.KeyFile, ServerName: "redis.example"}, "redis.example"},
		{"wrong CA", "rediss://" + s.Addr(), TLSFiles{CAFile: other.CAFile, CertFile: ca.CertFile, KeyFile: ca.KeyFile}, "unknown authority"},
		{"system CAs", "rediss://" + s.Addr(), TLSFiles{CertFile: ca.CertFile, KeyFile: ca.KeyFile}, "unknown authority"},
		{"no client certificate", "rediss://" + s.Addr(), TLSFiles{CAFile: ca.CAFile}, "certificate"},
		{"plaintext to a TLS port", "redis://" + s.Addr(), TLSFiles{}, "EOF"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := NewClientWith(tt.url, ClientConfig{TLS: tt.f})
			if err != nil {
				t.Fatalf("NewClientWith = %v", err)
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err = c.Ping(ctx).Err()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("PING = %v, want PONG", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("PING = %v, want an error with %q", err, tt.want)
			}
		})
	}
}

// A key prefix that could move a key's hash tag, or that logs cannot show
// plainly, is refused as the key-prefix setting.
func TestKeyPrefixValidate(t *testing.T) {
	for _, tt := range []struct {
		prefix string
		ok     bool
	}{
		{"", true}, {"prod:", true}, {"team-a/eu_1.v2:", true},
		{"a{b", false}, {"}", false}, {"a b", false}, {"a\nb", false}, {"é", false}, {strings.Repeat("a", MaxKeyPrefixBytes+1), false},
	} {
		err := ClientConfig{KeyPrefix: tt.prefix}.Validate("redis://127.0.0.1:6379")
		var se *SettingError
		switch {
		case tt.ok && err != nil:
			t.Errorf("Validate(prefix %q) = %v, want nil", tt.prefix, err)
		case !tt.ok && (!errors.As(err, &se) || se.Setting != "key-prefix"):
			t.Errorf("Validate(prefix %q) = %v, want a key-prefix SettingError", tt.prefix, err)
		}
	}
}
