package tlsconfig

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testcerts"
)

// TestNewClientRefuses: each client set that cannot be used is an error
// naming the setting and the reason.
func TestNewClientRefuses(t *testing.T) {
	ca := testcerts.NewCA(t, "client test CA")
	good, other := ca.Client(t, "good"), ca.Client(t, "other")
	files := Files{CA: File{"/ca.crt", "tls-ca"}, Cert: File{"/c.crt", "tls-cert"}, Key: File{"/c.key", "tls-key"}}
	tests := []struct {
		name  string
		files map[string][]byte
		at    time.Time
		want  string // in the error; "" for none
	}{
		{"all right", map[string][]byte{"/ca.crt": ca.PEM, "/c.crt": good.CertPEM, "/c.key": good.KeyPEM}, time.Now(), ""},
		{"CA with no certificate", map[string][]byte{"/ca.crt": []byte("nothing"), "/c.crt": good.CertPEM, "/c.key": good.KeyPEM}, time.Now(), "tls-ca /ca.crt: no PEM certificate in it"},
		{"missing CA", map[string][]byte{"/c.crt": good.CertPEM, "/c.key": good.KeyPEM}, time.Now(), "tls-ca: open /ca.crt"},
		{"key of another certificate", map[string][]byte{"/ca.crt": ca.PEM, "/c.crt": good.CertPEM, "/c.key": other.KeyPEM}, time.Now(), "tls-key /c.key: the key does not match"},
		{"expired", map[string][]byte{"/ca.crt": ca.PEM, "/c.crt": good.CertPEM, "/c.key": good.KeyPEM}, time.Now().Add(48 * time.Hour), "tls-cert /c.crt: the certificate expired"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := &memFS{files: tt.files}
			r, err := NewClient(tt.at, Config{Listener: "redis", Files: files, ReadFile: fs.ReadFile}, "")
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("NewClient = %v, want no error", err)
			case tt.want == "" && len(r.ClientConfig().Certificates) != 1:
				t.Fatalf("NewClient's configuration has %d certificates, want 1", len(r.ClientConfig().Certificates))
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("NewClient = %v, want an error with %q", err, tt.want)
			}
		})
	}
	if _, err := NewClient(time.Now(), Config{Files: Files{Cert: File{"/c.crt", "tls-cert"}, Key: File{Flag: "tls-key"}}}, ""); err == nil ||
		!strings.Contains(err.Error(), "tls-cert and tls-key must both be set") {
		t.Errorf("NewClient with a certificate and no key = %v, want an error naming both", err)
	}
}

// TestClientReloadKeepsLastGood: a changed set that loads is served from
// then on; one that does not leaves the last good set, and is reported
// once.
func TestClientReloadKeepsLastGood(t *testing.T) {
	ca := testcerts.NewCA(t, "client test CA")
	first, second := ca.Client(t, "first"), ca.Client(t, "second")
	fs := &memFS{files: map[string][]byte{"/ca.crt": ca.PEM, "/c.crt": first.CertPEM, "/c.key": first.KeyPEM}}
	files := Files{CA: File{"/ca.crt", "tls-ca"}, Cert: File{"/c.crt", "tls-cert"}, Key: File{"/c.key", "tls-key"}}
	r, err := NewClient(time.Now(), Config{Listener: "redis", Files: files, ReadFile: fs.ReadFile}, "redis.example")
	if err != nil {
		t.Fatal(err)
	}
	cn := func() string { return r.ClientConfig().Certificates[0].Leaf.Subject.CommonName }
	if got := r.ClientConfig().ServerName; got != "redis.example" {
		t.Errorf("ServerName = %q, want redis.example", got)
	}
	fs.set("/c.crt", second.CertPEM, "/c.key", second.KeyPEM)
	if ok, err := r.Reload(time.Now()); !ok || err != nil || cn() != "second" {
		t.Fatalf("Reload = %v, %v, serving %s; want true, nil, second", ok, err, cn())
	}
	fs.set("/c.key", first.KeyPEM)
	if ok, err := r.Reload(time.Now()); ok || err == nil || cn() != "second" {
		t.Fatalf("Reload of a mismatched pair = %v, %v, serving %s; want false, an error, second", ok, err, cn())
	}
	if ok, err := r.Reload(time.Now()); ok || err != nil {
		t.Fatalf("Reload of the same bad pair again = %v, %v; want false, nil (reported once)", ok, err)
	}
}
