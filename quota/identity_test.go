package quota

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
)

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

func TestIdentify(t *testing.T) {
	proxies := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	cfg := IdentityConfig{TrustedProxies: proxies, UserHeader: "X-User-Id", TierHeader: "X-Sluice-Tier"}
	key := func(k string) string { return "key:" + KeyID(k) }
	with := func(h string) IdentityConfig { c := cfg; c.ClientIPHeader = h; return c }
	fwd, realIP, none := with(ClientIPForwarded), with(ClientIPXRealIP), with(ClientIPNone)
	tests := []struct {
		name    string
		remote  string
		headers map[string][]string
		cfg     *IdentityConfig
		subject string
		ip      string // IPSubject
		tier    string
	}{
		{"socket ipv4", "192.0.2.7:5555", nil, nil, "ip:192.0.2.7", "ip:192.0.2.7", ""},
		{"socket ipv6 per /64", "[2001:db8:1:2:aaaa::1]:443", nil, nil, "ip6:2001:db8:1:2::/64", "ip6:2001:db8:1:2::/64", ""},
		{"ipv4-mapped ipv6", "[::ffff:192.0.2.9]:1", nil, nil, "ip:192.0.2.9", "ip:192.0.2.9", ""},
		{"bearer key", "192.0.2.7:1", map[string][]string{"Authorization": {"Bearer sk_1"}}, nil, key("sk_1"), "ip:192.0.2.7", ""},
		{"bearer case-insensitive", "192.0.2.7:1", map[string][]string{"Authorization": {"bearer   sk_1 "}}, nil, key("sk_1"), "ip:192.0.2.7", ""},
		{"basic auth skipped, x-api-key used", "192.0.2.7:1", map[string][]string{"Authorization": {"Basic dXNlcjpwdw=="}, "X-Api-Key": {"sk_2"}}, nil, key("sk_2"), "ip:192.0.2.7", ""},
		{"configured key header", "192.0.2.7:1", map[string][]string{"X-Api-Key": {"sk_2"}, "X-Token": {"sk_3"}}, &IdentityConfig{KeyHeaders: []string{"X-Token"}}, key("sk_3"), "ip:192.0.2.7", ""},
		{"no key headers", "192.0.2.7:1", map[string][]string{"X-Api-Key": {"sk_2"}}, &IdentityConfig{KeyHeaders: []string{}}, "ip:192.0.2.7", "ip:192.0.2.7", ""},

		// Untrusted peers: every forwarding, user and tier header is ignored.
		{"spoofed xff ignored", "192.0.2.7:1", map[string][]string{"X-Forwarded-For": {"203.0.113.5"}}, nil, "ip:192.0.2.7", "ip:192.0.2.7", ""},
		{"spoofed forwarded ignored", "192.0.2.7:1", map[string][]string{"Forwarded": {"for=203.0.113.5"}}, nil, "ip:192.0.2.7", "ip:192.0.2.7", ""},
		{"spoofed user and tier ignored", "192.0.2.7:1", map[string][]string{"X-User-Id": {"admin"}, "X-Sluice-Tier": {"pro"}}, nil, "ip:192.0.2.7", "ip:192.0.2.7", ""},
		{"untrusted peer with trusted-looking xff", "192.0.2.7:1", map[string][]string{"X-Forwarded-For": {"10.1.1.1"}}, nil, "ip:192.0.2.7", "ip:192.0.2.7", ""},

		// Trusted peers.
		{"xff from trusted proxy", "10.0.0.1:1", map[string][]string{"X-Forwarded-For": {"203.0.113.5"}}, nil, "ip:203.0.113.5", "ip:203.0.113.5", ""},
		{"xff right to left skipping proxies", "10.0.0.1:1", map[string][]string{"X-Forwarded-For": {"198.51.100.1, 203.0.113.5, 10.2.2.2"}}, nil, "ip:203.0.113.5", "ip:203.0.113.5", ""},
		{"xff client-supplied left part ignored", "10.0.0.1:1", map[string][]string{"X-Forwarded-For": {"1.1.1.1", "203.0.113.5"}}, nil, "ip:203.0.113.5", "ip:203.0.113.5", ""},
		{"xff all trusted", "10.0.0.1:1", map[string][]string{"X-Forwarded-For": {"10.3.3.3, 10.2.2.2"}}, nil, "ip:10.3.3.3", "ip:10.3.3.3", ""},
		{"xff garbage takes last trusted hop", "10.0.0.1:1", map[string][]string{"X-Forwarded-For": {"203.0.113.5, nonsense, 10.2.2.2"}}, nil, "ip:10.2.2.2", "ip:10.2.2.2", ""},
		{"xff with port and ipv6", "10.0.0.1:1", map[string][]string{"X-Forwarded-For": {"[2001:db8:5:6::9]:80"}}, nil, "ip6:2001:db8:5:6::/64", "ip6:2001:db8:5:6::/64", ""},
		{"xff mode ignores forwarded", "10.0.0.1:1", map[string][]string{"Forwarded": {"for=198.51.100.9"}, "X-Forwarded-For": {"203.0.113.5"}}, nil, "ip:203.0.113.5", "ip:203.0.113.5", ""},
		{"xff mode ignores x-real-ip", "10.0.0.1:1", map[string][]string{"X-Real-Ip": {"198.51.100.9"}}, nil, "ip:10.0.0.1", "ip:10.0.0.1", ""},
		{"xff over many hops walks only the right end", "10.0.0.1:1", map[string][]string{"X-Forwarded-For": {strings.Repeat("198.51.100.1, ", 5000) + "203.0.113.5"}}, nil, "ip:203.0.113.5", "ip:203.0.113.5", ""},
		{"forwarded", "10.0.0.1:1", map[string][]string{"Forwarded": {`for="[2001:db8:a:b::1]:4711";proto=https, for=10.9.9.9`}, "X-Forwarded-For": {"198.51.100.1"}}, &fwd, "ip6:2001:db8:a:b::/64", "ip6:2001:db8:a:b::/64", ""},
		{"forwarded quoted comma", "10.0.0.1:1", map[string][]string{"Forwarded": {`for=198.51.100.2;by="a,b"`}}, &fwd, "ip:198.51.100.2", "ip:198.51.100.2", ""},
		{"forwarded unknown takes last trusted hop", "10.0.0.1:1", map[string][]string{"Forwarded": {"for=unknown"}}, &fwd, "ip:10.0.0.1", "ip:10.0.0.1", ""},
		{"forwarded obfuscated", "[fd00::1]:1", map[string][]string{"Forwarded": {`for=203.0.113.1, for="_hidden", for=fd00::2`}}, &fwd, "ip6:fd00::/64", "ip6:fd00::/64", ""},
		{"forwarded mode ignores xff", "10.0.0.1:1", map[string][]string{"X-Forwarded-For": {"203.0.113.5"}}, &fwd, "ip:10.0.0.1", "ip:10.0.0.1", ""},
		{"x-real-ip", "10.0.0.1:1", map[string][]string{"X-Real-Ip": {" 203.0.113.7 "}, "X-Forwarded-For": {"198.51.100.1"}, "Forwarded": {"for=198.51.100.2"}}, &realIP, "ip:203.0.113.7", "ip:203.0.113.7", ""},
		{"x-real-ip twice takes the peer", "10.0.0.1:1", map[string][]string{"X-Real-Ip": {"198.51.100.1", "203.0.113.7"}}, &realIP, "ip:10.0.0.1", "ip:10.0.0.1", ""},
		{"x-real-ip garbage takes the peer", "10.0.0.1:1", map[string][]string{"X-Real-Ip": {"203.0.113.7, 1.1.1.1"}}, &realIP, "ip:10.0.0.1", "ip:10.0.0.1", ""},
		{"none: the peer", "10.0.0.1:1", map[string][]string{"X-Real-Ip": {"203.0.113.7"}, "X-Forwarded-For": {"198.51.100.1"}, "Forwarded": {"for=198.51.100.2"}}, &none, "ip:10.0.0.1", "ip:10.0.0.1", ""},
		{"untrusted peer, x-real-ip mode", "192.0.2.7:1", map[string][]string{"X-Real-Ip": {"203.0.113.7"}}, &realIP, "ip:192.0.2.7", "ip:192.0.2.7", ""},
		{"untrusted peer, forwarded mode", "192.0.2.7:1", map[string][]string{"Forwarded": {"for=203.0.113.7"}}, &fwd, "ip:192.0.2.7", "ip:192.0.2.7", ""},

		// Bad keys are no keys.
		{"900-byte bearer is no key", "192.0.2.7:1", map[string][]string{"Authorization": {"Bearer " + strings.Repeat("j", 900)}}, nil, "ip:192.0.2.7", "ip:192.0.2.7", ""},
		{"bad bearer, good x-api-key", "192.0.2.7:1", map[string][]string{"Authorization": {"Bearer " + strings.Repeat("j", 900)}, "X-Api-Key": {"sk_2"}}, nil, key("sk_2"), "ip:192.0.2.7", ""},
		{"empty bearer is no key", "192.0.2.7:1", map[string][]string{"Authorization": {"Bearer "}}, nil, "ip:192.0.2.7", "ip:192.0.2.7", ""},
		{"control chars are no key", "192.0.2.7:1", map[string][]string{"X-Api-Key": {"a\x01b"}}, nil, "ip:192.0.2.7", "ip:192.0.2.7", ""},
		{"trusted user and tier", "10.0.0.1:1", map[string][]string{"X-User-Id": {"42"}, "X-Sluice-Tier": {"pro"}, "X-Forwarded-For": {"203.0.113.5"}}, nil, "user:42", "ip:203.0.113.5", "pro"},
		{"key beats user", "10.0.0.1:1", map[string][]string{"X-User-Id": {"42"}, "X-Api-Key": {"k"}}, nil, key("k"), "ip:10.0.0.1", ""},
		{"unix socket peer with key", "@", map[string][]string{"X-Api-Key": {"k"}}, nil, key("k"), "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = tt.remote
			for k, vs := range tt.headers {
				for _, v := range vs {
					r.Header.Add(k, v)
				}
			}
			c := cfg
			if tt.cfg != nil {
				c = *tt.cfg
			}
			id, err := Identify(r, c)
			if err != nil {
				t.Fatalf("Identify = %v", err)
			}
			if id.Subject() != tt.subject || id.IPSubject() != tt.ip || id.Tier != tt.tier {
				t.Errorf("Identify = subject %q ip %q tier %q, want %q %q %q", id.Subject(), id.IPSubject(), id.Tier, tt.subject, tt.ip, tt.tier)
			}
		})
	}
}

func TestIdentifyErrors(t *testing.T) {
	cfg := IdentityConfig{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, UserHeader: "X-User-Id", TierHeader: "X-Sluice-Tier", MaxHeaderBytes: 256}
	tests := []struct {
		name    string
		remote  string
		headers map[string]string
		header  string // the header the error names; "" for ErrNoSubject
	}{
		{"huge user", "10.0.0.1:1", map[string]string{"X-User-Id": strings.Repeat("u", 300)}, "X-User-Id"},
		{"bad user", "10.0.0.1:1", map[string]string{"X-User-Id": "a b{c}"}, "X-User-Id"},
		{"bad tier", "10.0.0.1:1", map[string]string{"X-Sluice-Tier": "Gold!"}, "X-Sluice-Tier"},
		{"nothing", "not-an-address", nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = tt.remote
			for k, v := range tt.headers {
				r.Header.Set(k, v)
			}
			_, err := Identify(r, cfg)
			var ie *IdentityError
			switch {
			case tt.header == "" && !errors.Is(err, ErrNoSubject):
				t.Errorf("Identify = %v, want ErrNoSubject", err)
			case tt.header != "" && (!errors.As(err, &ie) || ie.Header != tt.header):
				t.Errorf("Identify = %v, want an IdentityError on %s", err, tt.header)
			}
		})
	}
}

// The check API body and the headers name the same subject.
func TestSubjectFieldsMatchIdentify(t *testing.T) {
	cfg := IdentityConfig{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, UserHeader: "X-User-Id"}
	tests := []struct {
		fields  SubjectFields
		remote  string
		headers http.Header
	}{
		{SubjectFields{APIKey: "sk_9"}, "192.0.2.1:1", http.Header{"Authorization": {"Bearer sk_9"}}},
		{SubjectFields{User: "alice"}, "10.0.0.1:1", http.Header{"X-User-Id": {"alice"}}},
		{SubjectFields{IP: "192.0.2.44"}, "192.0.2.44:1", nil},
		{SubjectFields{IP: "2001:db8:1:2:3:4:5:6"}, "[2001:db8:1:2::99]:1", nil},
		{SubjectFields{IP: "::ffff:192.0.2.44"}, "192.0.2.44:1", nil},
	}
	for _, tt := range tests {
		fromBody, err := tt.fields.Identity()
		if err != nil {
			t.Fatalf("%+v.Identity() = %v", tt.fields, err)
		}
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr, r.Header = tt.remote, tt.headers
		if r.Header == nil {
			r.Header = http.Header{}
		}
		fromHeaders, err := Identify(r, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if fromBody.Subject() != fromHeaders.Subject() {
			t.Errorf("body %+v subject %q, headers subject %q", tt.fields, fromBody.Subject(), fromHeaders.Subject())
		}
	}
	if id, err := (SubjectFields{Subject: "tenant:7"}).Identity(); err != nil || id.Subject() != "tenant:7" {
		t.Errorf("explicit subject = %q, %v", id.Subject(), err)
	}
	for _, f := range []SubjectFields{{}, {APIKey: "a", User: "b"}, {IP: "nope"}, {Subject: "has space"}, {User: "{x}"}, {IP: "192.0.2.1", Subject: "s"}, {IP: "192.0.2.1", APIKey: "k", User: "u"}} {
		if _, err := f.Identity(); !errors.Is(err, ErrInvalidPolicy) && err == nil {
			t.Errorf("%+v.Identity() = nil error", f)
		}
	}
}

func TestIdentityConfigValidate(t *testing.T) {
	if err := DefaultIdentityConfig().Validate(); err != nil {
		t.Errorf("DefaultIdentityConfig().Validate() = %v", err)
	}
	bad := []IdentityConfig{
		{KeyHeaders: []string{"X Key"}},
		{UserHeader: "X-User:"},
		{MaxHeaderBytes: -1},
		{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("::ffff:10.0.0.0/104")}},
		{TrustedProxies: []netip.Prefix{{}}},
		{ClientIPHeader: "X-Client-IP"},
		{ClientIPHeader: "True-Client-IP"},
	}
	for _, c := range bad {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v.Validate() = nil, want an error", c)
		}
	}
}

// ip accompanies api_key or user; a bad api_key is dropped, not refused.
func TestSubjectFieldsCombinations(t *testing.T) {
	long := strings.Repeat("j", 900)
	tests := []struct {
		f       SubjectFields
		subject string
		ip      string
		invalid bool
	}{
		{SubjectFields{APIKey: "k", IP: "192.0.2.1"}, "key:" + KeyID("k"), "ip:192.0.2.1", false},
		{SubjectFields{User: "u", IP: "2001:db8:1:2::5"}, "user:u", "ip6:2001:db8:1:2::/64", false},
		{SubjectFields{APIKey: long, IP: "192.0.2.1"}, "ip:192.0.2.1", "ip:192.0.2.1", true},
		{SubjectFields{APIKey: "a b"}, "", "", true},
	}
	for _, tt := range tests {
		id, err := tt.f.Identity()
		if err != nil {
			t.Fatalf("%+v.Identity() = %v", tt.f, err)
		}
		if id.Subject() != tt.subject || id.IPSubject() != tt.ip || id.KeyInvalid != tt.invalid {
			t.Errorf("%+v.Identity() = subject %q ip %q invalid %v, want %q %q %v", tt.f, id.Subject(), id.IPSubject(), id.KeyInvalid, tt.subject, tt.ip, tt.invalid)
		}
	}
}
