package quota

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/engine"
)

func TestGlobMatch(t *testing.T) {
	tests := []struct {
		glob string
		yes  []string
		no   []string
	}{
		{"/v1/orders", []string{"/v1/orders"}, []string{"/v1/orders/", "/v1/orders/7", "/v1/order", "/v1", "v1/orders", ""}},
		{"/v1/*", []string{"/v1/orders", "/v1/orders/7", "/v1/"}, []string{"/v1", "/v2/orders", "/v10/x"}},
		{"/v1/**", []string{"/v1", "/v1/", "/v1/orders/7/items"}, []string{"/v10", "/v2"}},
		{"/v1/orders/*/items", []string{"/v1/orders/7/items", "/v1/orders//items"}, []string{"/v1/orders/7/8/items", "/v1/orders/7/items/1"}},
		{"/v1/ord*", []string{"/v1/ord", "/v1/orders", "/v1/orders/7"}, []string{"/v1/or", "/v1/x/orders"}},
		{"/v1/*.json/meta", []string{"/v1/a.json/meta", "/v1/.json/meta"}, []string{"/v1/a.jsonx/meta", "/v1/a/b.json/meta"}},
		{"/a*b*c/x", []string{"/abc/x", "/aXbYc/x", "/abbc/x"}, []string{"/acb/x", "/ab/x"}},
		{"/**", []string{"/", "/a", "/a/b/c"}, []string{"", "a"}},
		{"/*", []string{"/", "/a", "/a/b"}, []string{""}},
		{"/", []string{"/"}, []string{"/a"}},
	}
	for _, tt := range tests {
		g, err := compileGlob(tt.glob)
		if err != nil {
			t.Fatalf("compileGlob(%q) = %v", tt.glob, err)
		}
		for _, p := range tt.yes {
			if !g.match(p) {
				t.Errorf("glob %q match(%q) = false, want true", tt.glob, p)
			}
		}
		for _, p := range tt.no {
			if g.match(p) {
				t.Errorf("glob %q match(%q) = true, want false", tt.glob, p)
			}
		}
	}
}

func TestGlobInvalid(t *testing.T) {
	for _, g := range []string{"", "v1", "/v1//x", "/v1/**/x", "/v1/a**", "/v1/?", "/v1/[a]", "/v1/{a,b}", "/v 1", "/v1/\x00", "/" + strings.Repeat("a", maxGlobLen)} {
		if _, err := compileGlob(g); err == nil {
			t.Errorf("compileGlob(%q) = nil error, want an error", g)
		}
	}
}

func TestGlobMayOverlap(t *testing.T) {
	tests := []struct {
		a, b string
		want bool
	}{
		{"/v1/*", "/v1/orders/7", true},
		{"/v1/orders", "/v1/users", false},
		{"/v1/orders", "/v1/orders/7", false},
		{"/v1/**", "/v1", true},
		{"/v1/a*", "/v1/b*", false},
		{"/v1/*.json", "/v1/*.xml", false},
		{"/v1/*/x", "/v1/y/*", true},
		{"/**", "/anything/at/all", true},
		{"/a/b", "/a/*/c", false},
	}
	for _, tt := range tests {
		a, _ := compileGlob(tt.a)
		b, _ := compileGlob(tt.b)
		if got := a.mayOverlap(b); got != tt.want {
			t.Errorf("mayOverlap(%q, %q) = %v, want %v", tt.a, tt.b, got, tt.want)
		}
		if got := b.mayOverlap(a); got != tt.want {
			t.Errorf("mayOverlap(%q, %q) = %v, want %v", tt.b, tt.a, got, tt.want)
		}
	}
}

func TestParsePolicyValid(t *testing.T) {
	doc := `{"id": "pro-default", "version": 7, "match": {"tier": "pro", "routes": ["/v1/*"], "methods": ["GET", "POST"]},
		"algorithm": "token_bucket", "rate_per_sec": 100, "burst": 200, "cost": {"POST /v1/exports": 10},
		"on_store_failure": "open", "mode": "enforce", "class": "quota", "scope": "global", "description": "pro"}`
	p, err := ParsePolicy([]byte(doc))
	if err != nil {
		t.Fatalf("ParsePolicy = %v", err)
	}
	want := engine.Limit{Algorithm: engine.TokenBucket, Rate: 100, Burst: 200}
	if got := p.Limit(); got != want {
		t.Errorf("Limit() = %+v, want %+v", got, want)
	}
	if p.Mode != ModeEnforce || p.Scope != ScopeGlobal || p.Version != 7 {
		t.Errorf("mode, scope, version = %s, %s, %d", p.Mode, p.Scope, p.Version)
	}
}

func TestParsePolicyDefaults(t *testing.T) {
	tests := []struct {
		doc                  string
		failure, mode, scope string
		window               time.Duration
	}{
		{`{"id":"a","algorithm":"token_bucket","rate_per_sec":1,"burst":1}`, FailOpen, ModeShadow, ScopeRegion, 0},
		{`{"id":"a","algorithm":"fixed_window","limit":5,"window":0.5,"class":"security"}`, FailClosed, ModeShadow, ScopeRegion, 500 * time.Millisecond},
		{`{"id":"a","algorithm":"sliding_window_counter","limit":5,"window":900,"class":"security","on_store_failure":"local"}`, FailLocal, ModeShadow, ScopeRegion, 15 * time.Minute},
		{`{"id":"a","algorithm":"leaky_bucket","rate_per_sec":0.5,"burst":3,"mode":"enforce","class":"capacity"}`, FailOpen, ModeEnforce, ScopeRegion, 0},
	}
	for _, tt := range tests {
		p, err := ParsePolicy([]byte(tt.doc))
		if err != nil {
			t.Fatalf("ParsePolicy(%s) = %v", tt.doc, err)
		}
		if p.OnStoreFailure != tt.failure || p.Mode != tt.mode || p.Scope != tt.scope || p.Limit().Window != tt.window {
			t.Errorf("ParsePolicy(%s) = failure %s mode %s scope %s window %v, want %s %s %s %v",
				tt.doc, p.OnStoreFailure, p.Mode, p.Scope, p.Limit().Window, tt.failure, tt.mode, tt.scope, tt.window)
		}
	}
}

func TestParsePolicyInvalid(t *testing.T) {
	tests := []struct {
		name   string
		doc    string
		fields []string // every field that must be named
	}{
		{"malformed", `{"id":`, []string{""}},
		{"trailing", `{"id":"a","algorithm":"token_bucket","rate_per_sec":1,"burst":1} {}`, []string{""}},
		{"unknown field", `{"id":"a","algorithm":"token_bucket","rate_per_sec":1,"burst":1,"burts":2}`, []string{"burts"}},
		{"unknown match field", `{"id":"a","match":{"tiers":"x"},"algorithm":"token_bucket","rate_per_sec":1,"burst":1}`, []string{"tiers"}},
		{"wrong type", `{"id":"a","algorithm":"token_bucket","rate_per_sec":"fast","burst":1}`, []string{"rate_per_sec"}},
		{"fractional cost", `{"id":"a","algorithm":"token_bucket","rate_per_sec":1,"burst":9,"cost":{"POST /x":1.5}}`, []string{"cost"}},
		{"bad id", `{"id":"Bad ID","algorithm":"token_bucket","rate_per_sec":1,"burst":1}`, []string{"id"}},
		{"unknown algorithm", `{"id":"a","algorithm":"magic","rate_per_sec":1,"burst":1}`, []string{"algorithm"}},
		{"rate and burst", `{"id":"a","algorithm":"token_bucket","rate_per_sec":-1,"burst":0.5}`, []string{"rate_per_sec", "burst"}},
		{"window params on bucket", `{"id":"a","algorithm":"token_bucket","rate_per_sec":1,"burst":1,"limit":5,"window":1}`, []string{"limit", "window"}},
		{"window too short", `{"id":"a","algorithm":"fixed_window","limit":5,"window":0.0001}`, []string{"window"}},
		{"window fraction of ms", `{"id":"a","algorithm":"fixed_window","limit":5,"window":0.0015}`, []string{"window"}},
		{"limit missing", `{"id":"a","algorithm":"fixed_window","window":1}`, []string{"limit"}},
		{"log too big", `{"id":"a","algorithm":"sliding_window_log","limit":100000,"window":1}`, []string{"limit"}},
		{"globs", `{"id":"a","match":{"routes":["/ok","bad","/x/**/y","/ok"]},"algorithm":"token_bucket","rate_per_sec":1,"burst":1}`,
			[]string{"match.routes[1]", "match.routes[2]", "match.routes[3]"}},
		{"methods", `{"id":"a","match":{"methods":["GET","post","GET"]},"algorithm":"token_bucket","rate_per_sec":1,"burst":1}`,
			[]string{"match.methods[1]", "match.methods[2]"}},
		{"tier", `{"id":"a","match":{"tier":"Pro Tier"},"algorithm":"token_bucket","rate_per_sec":1,"burst":1}`, []string{"match.tier"}},
		{"costs", `{"id":"a","algorithm":"token_bucket","rate_per_sec":1,"burst":10,"cost":{"POST /x":0,"GET /y":11,"nospace":1,"post /z":1,"PUT x":1,"DELETE /d":-3}}`,
			[]string{`cost["POST /x"]`, `cost["GET /y"]`, `cost["nospace"]`, `cost["post /z"]`, `cost["PUT x"]`, `cost["DELETE /d"]`}},
		{"enums", `{"id":"a","algorithm":"token_bucket","rate_per_sec":1,"burst":1,"mode":"dry","class":"vip","scope":"world","on_store_failure":"maybe"}`,
			[]string{"mode", "class", "scope", "on_store_failure"}},
		{"negative version", `{"id":"a","version":-1,"algorithm":"token_bucket","rate_per_sec":1,"burst":1}`, []string{"version"}},
		{"not an object", `[1]`, []string{""}},
		{"empty", ``, []string{""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParsePolicy([]byte(tt.doc))
			var ve *ValidationError
			if !errors.As(err, &ve) || !errors.Is(err, ErrInvalidPolicy) {
				t.Fatalf("ParsePolicy = %v, want a *ValidationError", err)
			}
			var got []string
			for _, p := range ve.Problems {
				got = append(got, p.Field)
				if p.Reason == "" {
					t.Errorf("problem %q has no reason", p.Field)
				}
			}
			for _, f := range tt.fields {
				if !slices.Contains(got, f) {
					t.Errorf("ParsePolicy fields = %q, want %q among them (%v)", got, f, err)
				}
			}
		})
	}
}

func TestCostFor(t *testing.T) {
	p := Policy{Cost: map[string]int64{
		"POST /v1/exports":   10,
		"POST /v1/*":         3,
		"POST /v1/exports/*": 5,
		"GET /v1/**":         2,
		"GET /v1/reports/*":  4,
	}}
	tests := []struct {
		method, route string
		want          int64
	}{
		{"POST", "/v1/exports", 10},
		{"POST", "/v1/exports/7", 5},
		{"POST", "/v1/orders", 3},
		{"GET", "/v1/exports", 2},
		{"GET", "/v1/reports/1", 4},
		{"GET", "/v2/x", 1},
		{"PUT", "/v1/exports", 1},
	}
	for _, tt := range tests {
		if got := p.CostFor(tt.method, tt.route); got != tt.want {
			t.Errorf("CostFor(%s, %s) = %d, want %d", tt.method, tt.route, got, tt.want)
		}
	}
}

func TestParsePolicies(t *testing.T) {
	ps, err := ParsePolicies([]byte(`[]`))
	if err != nil || len(ps) != 0 {
		t.Fatalf("ParsePolicies([]) = %v, %v; want none", ps, err)
	}
	for _, doc := range []string{`null`, `{}`, `[1]`} {
		if _, err := ParsePolicies([]byte(doc)); err == nil {
			t.Errorf("ParsePolicies(%s) = nil error", doc)
		}
	}
	_, err = ParsePolicies([]byte(`[{"id":"a","algorithm":"token_bucket","rate_per_sec":1,"burst":1},
		{"id":"b","algorithm":"token_bucket","rate_per_sec":1,"burst":0},
		{"id":"a","algorithm":"token_bucket","rate_per_sec":1,"burst":1}]`))
	var ve *ValidationError
	if !errors.As(err, &ve) || len(ve.Problems) != 2 || ve.Problems[0].Field != "[1].burst" || ve.Problems[1].Field != "[2].id" {
		t.Errorf("ParsePolicies = %v, want problems at [1].burst and [2].id", err)
	}
}

func TestDefaultPolicies(t *testing.T) {
	ps := DefaultPolicies()
	data, err := json.Marshal(ps)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParsePolicies(data)
	if err != nil {
		t.Fatalf("DefaultPolicies do not parse back: %v", err)
	}
	if !reflect.DeepEqual(back, ps) {
		t.Errorf("DefaultPolicies round trip = %+v, want %+v", back, ps)
	}
	r := NewRegistry(RegistryConfig{})
	if err := r.Seed(t.Context(), "system", ps); err != nil {
		t.Fatalf("Seed(DefaultPolicies) = %v", err)
	}
	for _, p := range ps {
		if p.Mode != ModeEnforce {
			t.Errorf("default policy %s mode = %s, want enforce", p.ID, p.Mode)
		}
	}
	login, _ := r.Get("login")
	if login.Class != ClassSecurity || login.OnStoreFailure != FailClosed {
		t.Errorf("login = class %s failure %s, want security closed", login.Class, login.OnStoreFailure)
	}
}
