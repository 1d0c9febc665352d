package region

import (
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/sluice-rl/sluice/decide"
	"github.com/sluice-rl/sluice/quota"
)

// FuzzCheckRequest feeds arbitrary bodies to the check decoder and
// validator: never a panic, and every failure a 4xx problem.
func FuzzCheckRequest(f *testing.F) {
	for _, s := range []string{`{"user":"u","route":"/"}`, `{"api_key":"k","route":"/a","cost":3,"tier":"pro","method":"post"}`,
		`{"ip":"::1","route":"/x?y"}`, `{"checks":[{"user":"u","route":"/"}]}`, `{"cost":-1}`, `[]`, `{"route":"/\u0000"}`,
		`{"ip":"192.0.2.1","api_key":"k","route":"/x/..%2F%6Cogin/"}`, `{"user":"u","ip":"::1","subject":"s","route":"//a"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var in CheckRequest
		if p := decodeBytes(body, &in); p != nil {
			if p.Status < 400 || p.Status > 499 {
				t.Fatalf("decode problem status %d", p.Status)
			}
			return
		}
		tg, p := in.Target("")
		if p != nil && (p.Status != 400 || len(p.Errors) == 0) {
			t.Fatalf("target problem %+v", p)
		}
		if p == nil && quota.NormalizeRoute(tg.Route) != tg.Route {
			t.Fatalf("target route %q is not canonical", tg.Route)
		}
		var b BatchRequest
		_ = decodeBytes(body, &b)
	})
}

// methodPattern is what decide.ValidMethod accepts, as a regular
// expression.
var methodPattern = regexp.MustCompile(`^[A-Za-z]{1,32}$`)

// FuzzForwardedTarget fuzzes the forward-auth header parsing: never a
// panic, every failure a 400, every accepted route canonical.
func FuzzForwardedTarget(f *testing.F) {
	f.Add("GET", "/v1/x?y=1", "", "/a/b", false, false)
	f.Add("", "https://h/p", "POST", "", true, true)
	f.Add("g e t", "%zz", "", "", false, false)
	f.Add("POST", "/x/..%2F%2e%2E/%6Cogin/", "POST", "//a/./b", false, true)
	f.Fuzz(func(t *testing.T, method, uri, origMethod, path string, prefixed, forwarded bool) {
		mode := ForwardAuthOriginal
		if forwarded {
			mode = ForwardAuthForwarded
		}
		pair := forwardAuthHeaders(mode)
		h := http.Header{}
		h.Set(pair.method, method)
		h.Set(pair.uri, uri)
		m, route, p := forwardedTarget(h, pair, origMethod, path, prefixed)
		if p != nil {
			if p.Status != 400 || len(p.Errors) == 0 {
				t.Fatalf("problem %+v", p)
			}
			return
		}
		if !methodPattern.MatchString(m) || decide.ValidRoute(route) != nil || strings.ContainsAny(route, "?#") || quota.NormalizeRoute(route) != route {
			t.Fatalf("accepted method %q route %q", m, route)
		}
	})
}

// FuzzRateLimitHeaders checks that formatted fields always parse back, and
// that parsing arbitrary field values never panics.
func FuzzRateLimitHeaders(f *testing.F) {
	f.Add("burst", int64(100), int64(1), int64(0), int64(1), `"a";r=1;t=2, "b";q=3;w=4;qu="x"`)
	f.Add("we\"ird\\", int64(-1), int64(0), int64(5), int64(0), `"x`)
	f.Fuzz(func(t *testing.T, name string, q, w, r, tt int64, raw string) {
		_, _ = decide.ParseRateLimitList(raw)
		_, _ = ParseIfMatch(http.Header{"If-Match": {raw}})
		items := []decide.HeaderItem{{Name: name, Quota: q, Window: w, Available: r, T: tt}, {Name: "second", Quota: 1, Window: 1}}
		for _, v := range []string{decide.FormatPolicyHeader(items), decide.FormatRateLimitHeader(items)} {
			got, err := decide.ParseRateLimitList(v)
			if err != nil || len(got) != 2 {
				t.Fatalf("decide.ParseRateLimitList(%q) = %v, %v", v, got, err)
			}
		}
	})
}
