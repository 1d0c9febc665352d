package quota

import (
	"encoding/json"
	"net/http/httptest"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"
)

// FuzzParsePolicy: decoding and validation never panic, and an accepted
// document re-encodes to one that decodes to the same policy.
func FuzzParsePolicy(f *testing.F) {
	f.Add([]byte(`{"id":"pro-default","version":7,"match":{"tier":"pro","routes":["/v1/*"]},"algorithm":"token_bucket","rate_per_sec":100,"burst":200,"cost":{"POST /v1/exports":10},"on_store_failure":"open","mode":"enforce"}`))
	f.Add([]byte(`{"id":"login","match":{"routes":["/login"],"methods":["POST"]},"algorithm":"sliding_window_counter","limit":5,"window":900,"class":"security"}`))
	f.Add([]byte(`{"id":"w","algorithm":"fixed_window","limit":3,"window":0.5,"scope":"global"}`))
	f.Add([]byte(`{"id":"x","algorithm":"token_bucket","rate_per_sec":1e400}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"id":"per-ip","match":{"domain":"edge","descriptors":[{"key":"remote_address"},{"key":"path","value":"/api/*/x"}]},"algorithm":"fixed_window","limit":0,"window":1,"replaces":["other"]}`))
	f.Add([]byte(`{"id":"partner","algorithm":"token_bucket","rate_per_sec":50000,"burst":5000,"lease":{"max_slice":1000}}`))
	f.Add([]byte(`{"id":"partner","algorithm":"token_bucket","rate_per_sec":50000,"burst":5000,"lease":{}}`))
	f.Add([]byte(`{"id":"free","unlimited":true,"match":{"domain":"internal","descriptors":[{"key":"ldap"}]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParsePolicy(data)
		if err != nil {
			if _, ok := err.(*ValidationError); !ok {
				t.Fatalf("ParsePolicy error %T %v, want *ValidationError", err, err)
			}
			return
		}
		enc, err := json.Marshal(p)
		if err != nil {
			t.Fatalf("Marshal(%+v) = %v", p, err)
		}
		q, err := ParsePolicy(enc)
		if err != nil {
			t.Fatalf("re-parse of %s = %v", enc, err)
		}
		if !reflect.DeepEqual(p, q) {
			t.Fatalf("round trip %+v != %+v", p, q)
		}
		_ = p.CostFor("POST", "/v1/exports")
		_ = p.Limit()
		if n := p.LeaseSize(); n < 0 || (n > 0 && float64(n) > p.Burst) {
			t.Fatalf("LeaseSize() = %d for a valid policy of burst %v", n, p.Burst)
		}
		// A valid descriptor policy can be matched against its own
		// entries: it is in force in a registry and the tree leads to it.
		if p.IsDescriptorPolicy() {
			r := NewRegistry(RegistryConfig{})
			if err := r.Seed(t.Context(), "fuzz", []Policy{p}); err != nil {
				t.Fatalf("Seed(%+v) = %v", p, err)
			}
			var entries []DescriptorEntry
			for _, e := range p.Match.Descriptors {
				if strings.Contains(e.Value, "*") {
					e.Value = strings.ReplaceAll(e.Value, "*", "")
				} else if e.Value == "" {
					e.Value = "any"
				}
				entries = append(entries, e)
			}
			if got := r.AppendMatchDescriptor(nil, p.Match.Domain, entries); len(got) != 1 || got[0].Policy.ID != p.ID {
				t.Fatalf("AppendMatchDescriptor(%v) = %d policies, want %s", entries, len(got), p.ID)
			}
		}
	})
}

// FuzzParseOverride: decoding and validation never panic, every error is
// a *ValidationError, an accepted override round-trips, an exemption
// (unlimited) never carries a limit parameter and is never accepted for a
// class security policy.
func FuzzParseOverride(f *testing.F) {
	f.Add([]byte(`{"id":"vip","subject":"user:42","policy":"free","rate_per_sec":50,"burst":100,"expires_at":"2999-01-01T00:00:00Z"}`))
	f.Add([]byte(`{"id":"svc","subject":"key:0123456789abcdef","policy":"free","unlimited":true,"expires_at":"2999-01-01T00:00:00Z"}`))
	f.Add([]byte(`{"id":"svc","subject":"user:1","policy":"login","unlimited":true,"limit":5,"expires_at":"2999-01-01T00:00:00Z"}`))
	f.Add([]byte(`{"id":"x","subject":"ip:192.0.2.1","policy":"daily","limit":10,"window":60,"unlimited":false,"expires_at":"2999-01-01T00:00:00+02:00"}`))
	f.Add([]byte(`{"id":"x","subject":"u","policy":"p","unlimited":1}`))
	now := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	policies := []Policy{
		Policy{ID: "free", Algorithm: "token_bucket", RatePerSec: 10, Burst: 20}.Normalize(),
		Policy{ID: "login", Algorithm: "sliding_window_counter", Count: 5, Window: 900, Class: ClassSecurity}.Normalize(),
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		o, err := ParseOverride(data)
		if err != nil {
			if _, ok := err.(*ValidationError); !ok {
				t.Fatalf("ParseOverride error %T %v, want *ValidationError", err, err)
			}
			return
		}
		if o.Unlimited && (o.RatePerSec != 0 || o.Burst != 0 || o.Count != 0 || o.Window != 0) {
			t.Fatalf("accepted an exemption with a limit parameter: %+v", o)
		}
		enc, err := json.Marshal(o)
		if err != nil {
			t.Fatalf("Marshal(%+v) = %v", o, err)
		}
		q, err := ParseOverride(enc)
		if err != nil {
			t.Fatalf("re-parse of %s = %v", enc, err)
		}
		if !q.ExpiresAt.Equal(o.ExpiresAt) {
			t.Fatalf("round trip expiry %s != %s", q.ExpiresAt, o.ExpiresAt)
		}
		q.ExpiresAt = o.ExpiresAt
		if q != o {
			t.Fatalf("round trip %+v != %+v", o, q)
		}
		for _, p := range policies {
			err := o.validateFor(p, now)
			if err != nil {
				if _, ok := err.(*ValidationError); !ok {
					t.Fatalf("validateFor error %T %v, want *ValidationError", err, err)
				}
			} else if o.Unlimited && p.Class == ClassSecurity {
				t.Fatalf("exemption %+v accepted for security policy %s", o, p.ID)
			}
		}
	})
}

// FuzzIdentify: any headers and peer address give an identity or an error,
// never a panic; headers from an untrusted peer never change the address.
func FuzzIdentify(f *testing.F) {
	f.Add("10.0.0.1:1", "Bearer k", "", "203.0.113.5, 10.0.0.2", "")
	f.Add("10.0.0.1:1", "", "key", "", `for="[2001:db8::1]:80";by=x, for=unknown`)
	f.Add("192.0.2.1:9", "Basic x", "", "1.2.3.4", "for=5.6.7.8")
	f.Add("[fd00::1]:1", "", "", `"`, `for="\"`)
	cfg := IdentityConfig{
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")},
		UserHeader:     "X-User-Id", TierHeader: "X-Tier", MaxHeaderBytes: 1024,
	}
	f.Fuzz(func(t *testing.T, remote, auth, apiKey, xff, fwd string) {
		cfg := cfg
		cfg.ClientIPHeader = []string{"", ClientIPForwarded, ClientIPXRealIP, ClientIPNone}[len(remote)%4]
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = remote
		for k, v := range map[string]string{"Authorization": auth, "X-API-Key": apiKey, "X-Forwarded-For": xff, "X-Real-IP": xff, "Forwarded": fwd, "X-User-Id": xff, "X-Tier": fwd} {
			if v != "" {
				r.Header.Set(k, v)
			}
		}
		id, err := Identify(r, cfg)
		if err != nil {
			return
		}
		if id.Subject() == "" && !id.KeyInvalid {
			t.Fatal("Identify succeeded with an empty subject")
		}
		peer := parsePeer(remote)
		if !isTrusted(peer, cfg.TrustedProxies) {
			if id.IP != peer || id.User != "" || id.Tier != "" {
				t.Fatalf("untrusted peer %q: identity %+v took headers", remote, id)
			}
		}
		if id.KeyID != "" && id.Subject() != "key:"+id.KeyID {
			t.Fatalf("subject %q, key id %q", id.Subject(), id.KeyID)
		}
	})
}
