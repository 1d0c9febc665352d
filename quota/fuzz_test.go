package quota

import (
	"encoding/json"
	"net/http/httptest"
	"net/netip"
	"reflect"
	"testing"
)

// FuzzParsePolicy: decoding and validation never panic, and an accepted
// document re-encodes to one that decodes to the same policy.
func FuzzParsePolicy(f *testing.F) {
	f.Add([]byte(`{"id":"pro-default","version":7,"match":{"tier":"pro","routes":["/v1/*"]},"algorithm":"token_bucket","rate_per_sec":100,"burst":200,"cost":{"POST /v1/exports":10},"on_store_failure":"open","mode":"enforce"}`))
	f.Add([]byte(`{"id":"login","match":{"routes":["/login"],"methods":["POST"]},"algorithm":"sliding_window_counter","limit":5,"window":900,"class":"security"}`))
	f.Add([]byte(`{"id":"w","algorithm":"fixed_window","limit":3,"window":0.5,"scope":"global"}`))
	f.Add([]byte(`{"id":"x","algorithm":"token_bucket","rate_per_sec":1e400}`))
	f.Add([]byte(`[]`))
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
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = remote
		for k, v := range map[string]string{"Authorization": auth, "X-API-Key": apiKey, "X-Forwarded-For": xff, "Forwarded": fwd, "X-User-Id": xff, "X-Tier": fwd} {
			if v != "" {
				r.Header.Set(k, v)
			}
		}
		id, err := Identify(r, cfg)
		if err != nil {
			return
		}
		if id.Subject() == "" {
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
