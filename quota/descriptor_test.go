package quota

import (
	"context"
	"slices"
	"strings"
	"testing"
)

func dp(id, domain string, entries ...string) Policy {
	p := Policy{ID: id, Mode: ModeEnforce, Algorithm: "fixed_window", Count: 10, Window: 1, Match: Match{Domain: domain}}
	for _, e := range entries {
		k, v, _ := strings.Cut(e, "=")
		p.Match.Descriptors = append(p.Match.Descriptors, DescriptorEntry{Key: k, Value: v})
	}
	return p
}

func entries(s ...string) []DescriptorEntry {
	var out []DescriptorEntry
	for _, e := range s {
		k, v, _ := strings.Cut(e, "=")
		out = append(out, DescriptorEntry{Key: k, Value: v})
	}
	return out
}

func TestMatchDescriptor(t *testing.T) {
	r := NewRegistry(RegistryConfig{})
	ps := []Policy{
		dp("ip", "edge", "remote_address"),
		dp("ip-blocked", "edge", "remote_address=50.0.0.5"),
		dp("marketing", "messaging", "message_type=marketing", "to_number"),
		dp("to-number", "messaging", "to_number"),
		dp("to-number-hour", "messaging", "to_number"),
		dp("api-star", "wild", "path=/api/*/action"),
		dp("api-v", "wild", "path=/api/v*"),
		dp("nested-only", "deep", "a=1", "b"),
		{ID: "ldap", Mode: ModeEnforce, Unlimited: true, Match: Match{Domain: "internal", Descriptors: entries("ldap")}},
	}
	if err := r.Seed(context.Background(), "test", ps); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		domain string
		in     []DescriptorEntry
		want   []string
	}{
		{"edge", entries("remote_address=1.2.3.4"), []string{"ip"}},
		{"edge", entries("remote_address=50.0.0.5"), []string{"ip-blocked"}},
		{"edge", entries("remote_address=1.2.3.4", "path=/"), nil}, // deeper than the tree
		{"messaging", entries("message_type=marketing", "to_number=2061111111"), []string{"marketing"}},
		{"messaging", entries("to_number=2061111111"), []string{"to-number", "to-number-hour"}},
		{"messaging", entries("message_type=marketing"), nil}, // a placeholder level
		{"wild", entries("path=/api/7/action"), []string{"api-star"}},
		{"wild", entries("path=/api/v2"), []string{"api-v"}},
		{"wild", entries("path=/api/v2/action"), []string{"api-star"}}, // more literal characters first
		{"wild", entries("path=/other"), nil},
		{"deep", entries("a=1"), nil},
		{"deep", entries("a=1", "b=2"), []string{"nested-only"}},
		{"deep", entries("a=2", "b=2"), nil},
		{"internal", entries("ldap=x"), []string{"ldap"}},
		{"nowhere", entries("remote_address=1.2.3.4"), nil},
	}
	for _, tt := range tests {
		var got []string
		for _, m := range r.AppendMatchDescriptor(nil, tt.domain, tt.in) {
			got = append(got, m.Policy.ID)
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("AppendMatchDescriptor(%s, %v) = %v, want %v", tt.domain, tt.in, got, tt.want)
		}
	}
	// Descriptor policies never apply to an HTTP check, however wide.
	if got := r.Match(Query{Method: "GET", Route: "/"}); len(got) != 0 {
		t.Errorf("Match(GET /) = %v, want no descriptor policy", ids(got))
	}
	if !r.HasDomain("edge") || r.HasDomain("nowhere") {
		t.Errorf("HasDomain(edge, nowhere) = %v, %v, want true, false", r.HasDomain("edge"), r.HasDomain("nowhere"))
	}
}

func TestDescriptorPolicyValidation(t *testing.T) {
	tests := []struct {
		name, doc, field string
	}{
		{"descriptors without domain", `{"id":"a","algorithm":"fixed_window","limit":1,"window":1,"match":{"descriptors":[{"key":"k"}]}}`, "match.descriptors"},
		{"domain without descriptors", `{"id":"a","algorithm":"fixed_window","limit":1,"window":1,"match":{"domain":"d"}}`, "match.descriptors"},
		{"empty key", `{"id":"a","algorithm":"fixed_window","limit":1,"window":1,"match":{"domain":"d","descriptors":[{"value":"v"}]}}`, "match.descriptors[0].key"},
		{"control character", `{"id":"a","algorithm":"fixed_window","limit":1,"window":1,"match":{"domain":"d","descriptors":[{"key":"k","value":"a\u0001"}]}}`, "match.descriptors[0].value"},
		{"routes too", `{"id":"a","algorithm":"fixed_window","limit":1,"window":1,"match":{"domain":"d","routes":["/x"],"descriptors":[{"key":"k"}]}}`, "match"},
		{"global unlimited", `{"id":"a","unlimited":true,"scope":"global","match":{"domain":"d","descriptors":[{"key":"k"}]}}`, "scope"},
		{"unknown scope", `{"id":"a","algorithm":"fixed_window","limit":1,"window":1,"scope":"planet","match":{"domain":"d","descriptors":[{"key":"k"}]}}`, "scope"},
		{"unlimited with a limit", `{"id":"a","unlimited":true,"algorithm":"fixed_window","limit":1,"window":1,"match":{"domain":"d","descriptors":[{"key":"k"}]}}`, "unlimited"},
		{"unlimited http policy", `{"id":"a","unlimited":true,"match":{}}`, "unlimited"},
		{"replaces itself", `{"id":"a","algorithm":"fixed_window","limit":1,"window":1,"replaces":["a"],"match":{"domain":"d","descriptors":[{"key":"k"}]}}`, "replaces[0]"},
		{"too many entries", `{"id":"a","algorithm":"fixed_window","limit":1,"window":1,"match":{"domain":"d","descriptors":[{"key":"1"},{"key":"2"},{"key":"3"},{"key":"4"},{"key":"5"},{"key":"6"},{"key":"7"},{"key":"8"},{"key":"9"}]}}`, "match.descriptors"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParsePolicy([]byte(tt.doc))
			ve, ok := err.(*ValidationError)
			if !ok {
				t.Fatalf("ParsePolicy = %v, want a *ValidationError", err)
			}
			if !slices.ContainsFunc(ve.Problems, func(p FieldError) bool { return p.Field == tt.field }) {
				t.Errorf("ParsePolicy problems = %v, want one on %s", ve.Problems, tt.field)
			}
		})
	}
	ok := []string{
		`{"id":"deny","algorithm":"fixed_window","limit":0,"window":1,"match":{"domain":"d","descriptors":[{"key":"k","value":"v"}]}}`,
		`{"id":"free","unlimited":true,"match":{"domain":"d","descriptors":[{"key":"k"}]}}`,
		`{"id":"shared","algorithm":"token_bucket","rate_per_sec":100,"burst":10,"scope":"global","match":{"domain":"d","descriptors":[{"key":"k"}]}}`,
		`{"id":"daily","algorithm":"fixed_window","limit":1000,"window":86400,"scope":"global","match":{"domain":"d","descriptors":[{"key":"k"}]}}`,
	}
	for _, doc := range ok {
		p, err := ParsePolicy([]byte(doc))
		if err != nil {
			t.Errorf("ParsePolicy(%s) = %v, want valid", doc, err)
		}
		if p.ID == "deny" && !p.DeniesAll() {
			t.Errorf("DeniesAll(%s) = false, want true", doc)
		}
	}
	if _, err := ParsePolicy([]byte(`{"id":"a","algorithm":"fixed_window","limit":0,"window":1}`)); err == nil {
		t.Error("ParsePolicy(limit 0 without a domain) = nil, want an error")
	}
}

// Match.Order ranks value patterns at one level: the pattern a policy of
// the lowest Order passes through is tried first, whatever its literal
// length; patterns without an Order come after, the longest literal first.
func TestMatchDescriptorOrder(t *testing.T) {
	ordered := func(p Policy, order int) Policy { p.Match.Order = order; return p }
	tests := []struct {
		name string
		ps   []Policy
		in   []DescriptorEntry
		want []string
	}{
		{"longest literal without orders", []Policy{dp("short", "w", "path=/a*"), dp("long", "w", "path=/api/*")}, entries("path=/api/x"), []string{"long"}},
		{"lowest order first", []Policy{ordered(dp("short", "w", "path=/a*"), 1), ordered(dp("long", "w", "path=/api/*"), 2)}, entries("path=/api/x"), []string{"short"}},
		{"order over none", []Policy{ordered(dp("short", "w", "path=/a*"), 5), dp("long", "w", "path=/api/*")}, entries("path=/api/x"), []string{"short"}},
		{"a pattern ranks by its lowest policy", []Policy{
			ordered(dp("deep-first", "w", "path=/a*", "m=GET"), 1), ordered(dp("long", "w", "path=/api/*"), 2), ordered(dp("short", "w", "path=/a*"), 3),
		}, entries("path=/api/x"), []string{"short"}},
		{"an exact value still before any pattern", []Policy{ordered(dp("star", "w", "path=/a*"), 1), ordered(dp("exact", "w", "path=/api"), 2)}, entries("path=/api"), []string{"exact"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewRegistry(RegistryConfig{})
			if err := r.Seed(context.Background(), "test", tt.ps); err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, m := range r.AppendMatchDescriptor(nil, "w", tt.in) {
				got = append(got, m.Policy.ID)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("AppendMatchDescriptor(w, %v) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
	bad := dp("bad", "w", "path=/a*")
	bad.Match.Order = -1
	if err := bad.Normalize().Validate(); err == nil || !strings.Contains(err.Error(), "match.order") {
		t.Errorf("Validate(order -1) = %v, want an error naming match.order", err)
	}
	http := Policy{ID: "h", Mode: ModeEnforce, Algorithm: "fixed_window", Count: 1, Window: 1, Match: Match{Order: 1}}
	if err := http.Normalize().Validate(); err == nil || !strings.Contains(err.Error(), "match.order") {
		t.Errorf("Validate(order without domain) = %v, want an error naming match.order", err)
	}
}

func TestPolicyOfState(t *testing.T) {
	tests := []struct{ state, want string }{
		{"per-ip", "per-ip"},
		{"per-ip\x1fip\x1e192.0.2.7", "per-ip"},
		{"a\x1fk\x1ev\x1fk2\x1e", "a"},
		{"", ""},
	}
	for _, tt := range tests {
		if got := PolicyOfState(tt.state); got != tt.want {
			t.Errorf("PolicyOfState(%q) = %q, want %q", tt.state, got, tt.want)
		}
	}
}
