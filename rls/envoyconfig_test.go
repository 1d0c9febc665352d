package rls

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-rl/sluice/quota"
)

func TestLoadEnvoyReadmeExamples(t *testing.T) {
	ps, err := LoadEnvoyConfigs([]string{"testdata/envoy/readme"}, false)
	if err != nil {
		t.Fatalf("LoadEnvoyConfigs(readme) = %v", err)
	}
	byID := map[string]quota.Policy{}
	for _, p := range ps {
		byID[p.ID] = p
	}
	tests := []struct {
		id        string
		algorithm string
		limit     float64
		window    float64
		mode      string
		unlimited bool
		replaces  []string
	}{
		{id: "mongo_cps.database_users", algorithm: "fixed_window", limit: 500, window: 1, mode: "enforce"},
		{id: "messaging.message_type_marketing.to_number", algorithm: "fixed_window", limit: 5, window: 86400, mode: "enforce"},
		{id: "messaging.to_number", algorithm: "fixed_window", limit: 100, window: 86400, mode: "enforce"},
		{id: "edge_proxy_per_ip.remote_address_50.0.0.5", algorithm: "fixed_window", limit: 0, window: 1, mode: "enforce"},
		{id: "internal.ldap", unlimited: true, mode: "enforce"},
		{id: "example6.service.user_user-a", algorithm: "fixed_window", limit: 10, window: 1, mode: "shadow"},
		{id: "example7.key_2_value_2.user_bkthomps", algorithm: "fixed_window", limit: 10, window: 1, mode: "enforce", replaces: []string{"example7.key_1_value_1.user_bkthomps"}},
		{id: "example9.path_-api---action", algorithm: "fixed_window", limit: 20, window: 60, mode: "enforce"},
	}
	for _, tt := range tests {
		p, ok := byID[tt.id]
		if !ok {
			t.Errorf("no policy %s among %d", tt.id, len(ps))
			continue
		}
		if p.Algorithm != tt.algorithm || p.Count != tt.limit || p.Window != tt.window || p.Mode != tt.mode || p.Unlimited != tt.unlimited || strings.Join(p.Replaces, ",") != strings.Join(tt.replaces, ",") {
			t.Errorf("policy %s = %+v, want algorithm %q limit %v window %v mode %s unlimited %v replaces %v", tt.id, p, tt.algorithm, tt.limit, tt.window, tt.mode, tt.unlimited, tt.replaces)
		}
	}
}

func TestParseEnvoyConfigErrors(t *testing.T) {
	tests := []struct {
		name, yaml, want string
	}{
		{"unknown field", "domain: d\ndescriptors:\n  - key: k\n    rate_limt:\n      unit: second\n", "f.yaml:4: descriptors[0].rate_limt: unknown field"},
		{"unknown unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n", `f.yaml:5: descriptors[0].rate_limit.unit: unknown unit "fortnight"`},
		{"no unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      requests_per_unit: 1\n", "descriptors[0].rate_limit.unit: required"},
		{"unlimited with unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      unit: second\n", "descriptors[0].rate_limit.unit: must not be given with unlimited"},
		{"empty domain", "descriptors: []\n", "f.yaml:1: domain: required"},
		{"unit_multiplier 0", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      unit_multiplier: 0\n      requests_per_unit: 1\n", "f.yaml:6: descriptors[0].rate_limit.unit_multiplier: want a whole number from 1"},
		{"absurd unit_multiplier", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: year\n      unit_multiplier: 11\n      requests_per_unit: 1\n", "descriptors[0].rate_limit.unit_multiplier: the window"},
		{"quoted yes is no boolean", "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: 'yes'\n", "f.yaml:4: descriptors[0].shadow_mode: want true or false"},
		{"empty key", "domain: d\ndescriptors:\n  - value: v\n", "descriptors[0].key: required"},
		{"negative", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: -1\n", "descriptors[0].rate_limit.requests_per_unit: want a whole number"},
		{"duplicate", "domain: d\ndescriptors:\n  - key: k\n  - key: k\n", `descriptors[1]: duplicate descriptor key "k"`},
		{"quota mode", "domain: d\ndescriptors:\n  - key: k\n    quota_mode: true\n", "descriptors[0].quota_mode: not supported"},
		{"metadata", "domain: d\ndescriptors:\n  - key: k\n    metadata: {a: b}\n", "descriptors[0].metadata: not supported"},
		{"nested unknown", "domain: d\ndescriptors:\n  - key: k\n    descriptors:\n      - key: j\n        rate_limit: {unit: second, requests_per_unit: 1, burst: 3}\n", "descriptors[0].descriptors[0].rate_limit.burst: unknown field"},
		{"bad algorithm", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: magic}\n", "descriptors[0].rate_limit.algorithm"},
		{"unknown wildcard precedence", "domain: d\nwildcard_precedence: shortest\ndescriptors: []\n", `f.yaml:2: wildcard_precedence: "shortest" is neither first nor longest`},
		{"not a mapping", "- 1\n", "want a mapping"},
		{"not yaml", "domain: [\n", "not YAML"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := ParseEnvoyConfig("f.yaml", []byte(tt.yaml))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ParseEnvoyConfig = %v, want an error containing %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q is more than one line", err)
			}
		})
	}
	_, err := LoadEnvoyConfigs([]string{"testdata/envoy/other/example11-share-threshold.yaml"}, false)
	if err == nil || !strings.Contains(err.Error(), "example11-share-threshold.yaml:") || !strings.Contains(err.Error(), "share_threshold: not supported") {
		t.Errorf("LoadEnvoyConfigs(share_threshold) = %v, want the file and field named", err)
	}
	dir := t.TempDir()
	for _, f := range []string{"a.yaml", "b.yml"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("domain: same\ndescriptors: []\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := LoadEnvoyConfigs([]string{dir}, false); err == nil || !strings.Contains(err.Error(), `domain "same" is also configured by`) {
		t.Errorf("LoadEnvoyConfigs(two files, one domain) = %v, want a duplicate domain error", err)
	}
}

func TestEnvoyAlgorithmField(t *testing.T) {
	_, ps, err := ParseEnvoyConfig("f.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 120, algorithm: token_bucket}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p := ps[0]; p.Algorithm != "token_bucket" || p.RatePerSec != 2 || p.Burst != 120 {
		t.Errorf("policy = %+v, want token_bucket rate 2/s burst 120", p)
	}
}

func FuzzParseEnvoyConfig(f *testing.F) {
	src := ratelimitSource(f) // envoyproxy/ratelimit's own fixtures
	for _, dir := range []string{"testdata/envoy/readme", "testdata/envoy/other", "testdata/envoy/differential",
		filepath.Join(src, "test/config"), filepath.Join(src, "test/integration/runtime/current/ratelimit/config")} {
		fs, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
		for _, p := range fs {
			b, err := os.ReadFile(p)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b)
		}
	}
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 0}\n"))
	f.Add([]byte("domain: d\nwildcard_precedence: longest\ndescriptors:\n  - key: k\n    value: a*b\n  - key: k\n    value: a*\n    rate_limit: {unit: second, requests_per_unit: 1}\n"))
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    shadow_mode: yes\n    rate_limit: {unit: minute, unit_multiplier: 3, requests_per_unit: 2}\n"))
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 9, algorithm: token_bucket, scope: global}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1<<16 {
			return
		}
		_, ps, err := ParseEnvoyConfig("f.yaml", data)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q is more than one line", err)
			}
			return
		}
		ids := map[string]bool{}
		for _, p := range ps {
			if err := p.Validate(); err != nil {
				t.Fatalf("policy %s from a loaded file is invalid: %v", p.ID, err)
			}
			if ids[p.ID] {
				t.Fatalf("policy id %s made twice", p.ID)
			}
			ids[p.ID] = true
		}
		r := quota.NewRegistry(quota.RegistryConfig{})
		if err := r.Seed(t.Context(), "fuzz", ps); err != nil {
			t.Fatalf("Seed(loaded policies) = %v", err)
		}
	})
}

func TestParseEnvoyConfigMultiplierAndYAML11Booleans(t *testing.T) {
	_, ps, err := ParseEnvoyConfig("f.yaml", []byte(`domain: d
descriptors:
  - key: k
    shadow_mode: yes
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 7}
  - key: j
    shadow_mode: Off
    rate_limit: {unit: second, requests_per_unit: 3, algorithm: token_bucket, unit_multiplier: 2}
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 2 {
		t.Fatalf("%d policies, want 2", len(ps))
	}
	if p := ps[0]; p.Mode != quota.ModeShadow || p.Count != 7 || p.Window != 300 {
		t.Errorf("k = %+v, want shadow, 7 per 300 s", p)
	}
	if p := ps[1]; p.Mode != quota.ModeEnforce || p.RatePerSec != 1.5 || p.Burst != 3 {
		t.Errorf("j = %+v, want enforce, 1.5/s burst 3", p)
	}
}

// A file's value patterns are tried in file order (match.order 1, 2, ...)
// unless wildcard_precedence is longest; a descriptor with neither
// rate_limit nor children is an unlimited shadow policy, an explicit
// unlimited one enforced whatever its shadow_mode.
func TestParseEnvoyConfigPrecedenceAndOpen(t *testing.T) {
	const body = `descriptors:
  - key: path
    value: /a*
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: path
    value: /api/*
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: open
  - key: vip
    shadow_mode: true
    rate_limit: {unlimited: true}
`
	for _, tt := range []struct {
		head string
		want []int
	}{
		{"domain: d\n", []int{1, 2, 3, 4}},
		{"domain: d\nwildcard_precedence: first\n", []int{1, 2, 3, 4}},
		{"domain: d\nwildcard_precedence: longest\n", []int{0, 0, 0, 0}},
	} {
		_, ps, err := ParseEnvoyConfig("f.yaml", []byte(tt.head+body))
		if err != nil {
			t.Fatal(err)
		}
		var got []int
		for _, p := range ps {
			got = append(got, p.Match.Order)
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("%q: orders %v, want %v", tt.head, got, tt.want)
		}
		r := quota.NewRegistry(quota.RegistryConfig{})
		if err := r.Seed(t.Context(), "test", ps); err != nil {
			t.Fatal(err)
		}
		m := r.AppendMatchDescriptor(nil, "d", []quota.DescriptorEntry{{Key: "path", Value: "/api/x"}})
		wantID := "d.path_-a-"
		if tt.want[0] == 0 {
			wantID = "d.path_-api--"
		}
		if len(m) != 1 || m[0].Policy.ID != wantID {
			t.Errorf("%q: path=/api/x matches %v, want %s", tt.head, m, wantID)
		}
		if p := ps[2]; !p.Unlimited || p.Mode != quota.ModeShadow {
			t.Errorf("open = %+v, want an unlimited shadow policy", p)
		}
		if p := ps[3]; !p.Unlimited || p.Mode != quota.ModeEnforce {
			t.Errorf("vip = %+v, want an unlimited enforced policy", p)
		}
	}
}
