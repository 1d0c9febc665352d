package region

import (
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/sluice-rl/sluice/decide"
	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/region/globalshare"
)

// envoyMethods are the methods the catch-all /v1/authz/{path...} route is
// documented with.
var envoyMethods = []string{"DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT"}

// TestOpenAPIMatchesRoutes checks docs/openapi.json against the route
// table both ways: no route undocumented, no documented route missing, and
// admin routes (only they) declare the bearer security scheme.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	data, err := os.ReadFile("../docs/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.1") {
		t.Errorf("openapi = %q, want 3.1.x", doc.OpenAPI)
	}
	documented := map[string]bool{}
	admin := map[string]bool{}
	for path, ops := range doc.Paths {
		for m, raw := range ops {
			k := strings.ToUpper(m) + " " + path
			documented[k] = true
			var op struct {
				Security []map[string]any `json:"security"`
			}
			json.Unmarshal(raw, &op)
			admin[k] = len(op.Security) > 0
		}
	}
	h := newHarness(t, nil)
	inTable := map[string]bool{}
	for _, rt := range h.d.Routes() {
		path := strings.ReplaceAll(rt.Path, "{path...}", "{path}")
		methods := []string{rt.Method}
		if rt.Method == "" {
			methods = envoyMethods
		}
		for _, m := range methods {
			k := m + " " + path
			inTable[k] = true
			if !documented[k] {
				t.Errorf("route %s is not in docs/openapi.json", k)
			} else if admin[k] != rt.Admin {
				t.Errorf("route %s: documented security %v, admin %v", k, admin[k], rt.Admin)
			}
		}
	}
	var extra []string
	for k := range documented {
		if !inTable[k] {
			extra = append(extra, k)
		}
	}
	sort.Strings(extra)
	for _, k := range extra {
		t.Errorf("docs/openapi.json documents %s, which is not a route", k)
	}
}

// TestOpenAPISchemasMatchTypes checks that the documented properties of
// schemas that mirror a Go type are exactly that type's JSON fields.
func TestOpenAPISchemasMatchTypes(t *testing.T) {
	data, err := os.ReadFile("../docs/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]json.RawMessage `json:"properties"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	same := func(name string, props map[string]json.RawMessage, v any) {
		var want []string
		for f := range reflect.TypeOf(v).Fields() {
			if tag, _, _ := strings.Cut(f.Tag.Get("json"), ","); tag != "" && tag != "-" {
				want = append(want, tag)
			}
		}
		var got []string
		for p := range props {
			got = append(got, p)
		}
		sort.Strings(want)
		sort.Strings(got)
		if !slices.Equal(got, want) {
			t.Errorf("schema %s documents %v, want the fields of %T: %v", name, got, v, want)
		}
	}
	for name, v := range map[string]any{"GlobalQuota": GlobalQuota{}, "QuotaStat": globalshare.QuotaStat{},
		"Override": quota.Override{}, "Decision": Decision{}, "ChargeAnswer": decide.ChargeAnswer{}, "ExemptResult": ExemptResult{}, "Policy": quota.Policy{}} {
		same(name, doc.Components.Schemas[name].Properties, v)
	}
	var match struct {
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if err := json.Unmarshal(doc.Components.Schemas["Policy"].Properties["match"], &match); err != nil {
		t.Fatalf("Policy.match: %v", err)
	}
	same("Policy.match", match.Properties, quota.Match{})
}
