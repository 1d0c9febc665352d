package region

import (
	"net/http"
	"testing"
)

func TestForwardedTarget(t *testing.T) {
	orig, fwd := forwardAuthHeaders(ForwardAuthOriginal), forwardAuthHeaders(ForwardAuthForwarded)
	tests := []struct {
		name     string
		pair     authzHeaders
		h        http.Header
		method   string // of the call
		path     string // after /v1/authz
		prefixed bool
		want     string // "METHOD route", or "400 field"
	}{
		{"nginx pair", orig, http.Header{"X-Original-Method": {"post"}, "X-Original-Uri": {"/x/../login/?a=1"}}, "GET", "", false, "POST /login"},
		{"forwarded pair", fwd, http.Header{"X-Forwarded-Method": {"DELETE"}, "X-Forwarded-Uri": {"//v1/%6Frders/7"}}, "GET", "", false, "DELETE /v1/orders/7"},
		{"absolute url", orig, http.Header{"X-Original-Method": {"GET"}, "X-Original-Uri": {"https://api.example:8443/a%2Fb?q"}}, "GET", "", false, "GET /a/b"},
		{"absolute url without path", orig, http.Header{"X-Original-Method": {"GET"}, "X-Original-Uri": {"https://api.example"}}, "GET", "", false, "GET /"},
		{"envoy form ignores every header", orig, http.Header{"X-Original-Method": {"GET"}, "X-Original-Uri": {"/elsewhere"}, "X-Forwarded-Uri": {"/elsewhere"}}, "POST", "/./login", true, "POST /login"},
		{"nginx mode ignores the forwarded pair", orig, http.Header{"X-Forwarded-Method": {"GET"}, "X-Forwarded-Uri": {"/x"}}, "GET", "", false, "400 X-Original-Method"},
		{"forwarded mode ignores the nginx pair", fwd, http.Header{"X-Original-Method": {"GET"}, "X-Original-Uri": {"/x"}}, "GET", "", false, "400 X-Forwarded-Method"},
		{"missing uri", orig, http.Header{"X-Original-Method": {"GET"}}, "GET", "", false, "400 X-Original-URI"},
		{"empty method", orig, http.Header{"X-Original-Method": {" "}, "X-Original-Uri": {"/x"}}, "GET", "", false, "400 X-Original-Method"},
		{"repeated uri", orig, http.Header{"X-Original-Method": {"GET"}, "X-Original-Uri": {"/elsewhere", "/login"}}, "GET", "", false, "400 X-Original-URI"},
		{"repeated method", fwd, http.Header{"X-Forwarded-Method": {"GET", "POST"}, "X-Forwarded-Uri": {"/login"}}, "GET", "", false, "400 X-Forwarded-Method"},
		{"bad method", orig, http.Header{"X-Original-Method": {"G E T"}, "X-Original-Uri": {"/x"}}, "GET", "", false, "400 X-Original-Method"},
		{"relative uri", orig, http.Header{"X-Original-Method": {"GET"}, "X-Original-Uri": {"login"}}, "GET", "", false, "400 X-Original-URI"},
		{"control character", orig, http.Header{"X-Original-Method": {"GET"}, "X-Original-Uri": {"/a\x01"}}, "GET", "", false, "400 X-Original-URI"},
		{"envoy bad method", orig, nil, "M-SEARCH", "/x", true, "400 method"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, route, p := forwardedTarget(tt.h, tt.pair, tt.method, tt.path, tt.prefixed)
			got := m + " " + route
			if p != nil {
				got = "400 "
				if p.Status != 400 || len(p.Errors) == 0 {
					t.Fatalf("problem %+v, want a 400 naming a field", p)
				}
				got += p.Errors[0].Field
			}
			if got != tt.want {
				t.Errorf("forwardedTarget = %q, want %q", got, tt.want)
			}
		})
	}
}
