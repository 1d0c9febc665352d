package region

import (
	"net"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
)

// fastRoute routes a request to a route core only where the data-plane mux
// (authzPrefixed, then the route table) would, with the pattern the mux
// would set and the input stdData reads of the converted request.
func TestFastRouteAsTheMux(t *testing.T) {
	d := newLoginDaemon(t, prometheus.NewRegistry())
	mux := http.NewServeMux()
	for _, rt := range d.Routes() {
		if !rt.Admin {
			mux.HandleFunc(strings.TrimSpace(rt.Method+" "+rt.Path), func(http.ResponseWriter, *http.Request) {})
		}
	}
	cores := map[string]bool{"POST " + checkPath: true, "POST " + batchPath: true, "GET " + authzPath: true,
		"POST " + authzPath: true, authzPrefix + "{path...}": true}
	tests := []struct {
		method, target string
		direct         bool // fastRoute must find it
	}{
		{"POST", "/v1/check", true},
		{"POST", "/v1/check?x=1", true},
		{"POST", "/v1/check?", true},
		{"POST", "/v1/check/batch", true},
		{"GET", "/v1/authz", true},
		{"HEAD", "/v1/authz", true},
		{"POST", "/v1/authz?deny_status=403", true},
		{"GET", "/v1/authz/login", true},
		{"DELETE", "/v1/authz/x/..%2Flogin?deny_status=403", true},
		{"POST", "/v1/authz/a%22b", true},
		{"GET", "/v1/check", false},
		{"PUT", "/v1/authz", false},
		{"post", "/v1/check", false},
		{"POST", "/v1/%63heck", false},
		{"GET", "/v1/%61uthz/x", false},
		{"POST", "//v1/check", false},
		{"POST", "/v1/./check", false},
		{"POST", "/v1/check#x", false},
		{"POST", "http://sluice/v1/check", false},
		{"GET", "/v1/authz%2Fx", false},
		{"GET", "/healthz", false},
	}
	for _, tt := range tests {
		req := new(fasthttp.Request)
		req.Header.SetMethod(tt.method)
		req.SetRequestURI(tt.target)
		req.Header.SetHost("sluice")
		req.Header.SetContentType("application/json")
		req.Header.Set("X-Original-Method", "POST")
		req.Header.Set("X-Original-URI", "/login")
		req.SetBodyString(`{"user":"alice"}`)
		var ctx fasthttp.RequestCtx
		ctx.Init(req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}, nil)
		var got dataRequest
		route := fastRoute(&ctx, &got)
		if tt.direct && route == noRoute {
			t.Errorf("%s %s: fastRoute found no route", tt.method, tt.target)
		}
		if route == noRoute {
			continue
		}
		r, err := stdRequest(&ctx)
		if err != nil {
			t.Errorf("%s %s: fastRoute routed a target stdRequest refuses: %v", tt.method, tt.target, err)
			continue
		}
		pattern := authzPrefix + "{path...}"
		if !strings.HasPrefix(r.URL.EscapedPath(), authzPrefix) {
			_, pattern = mux.Handler(r)
		}
		if !cores[pattern] {
			t.Errorf("%s %s: fastRoute found a route, the mux %q", tt.method, tt.target, pattern)
			continue
		}
		r.Pattern = pattern
		want := stdData(r)
		if route == routeAuthz {
			want.ctype = "" // read only by the cores with a body
		} else {
			want.header, want.remote = nil, ""
		}
		want.body, want.std, got.body = nil, nil, nil
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s %s: fastRoute = %+v, stdData %+v", tt.method, tt.target, got, want)
		}
	}
}
