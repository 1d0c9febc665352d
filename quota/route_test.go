package quota

import (
	"strings"
	"testing"
)

func TestNormalizeRoute(t *testing.T) {
	tests := []struct{ in, want string }{
		{"/login", "/login"},
		{"/", "/"},
		{"", "/"},
		{"login", "/login"},
		// The forms a server serves as /login.
		{"/%6Cogin", "/login"},
		{"/%6cOGIN", "/lOGIN"},
		{"//login", "/login"},
		{"/login/", "/login"},
		{"/login//", "/login"},
		{"/./login", "/login"},
		{"/x/../login", "/login"},
		{"/%2E/login", "/login"},
		{"/x/%2e%2E/login", "/login"},
		{"/x/..%2Flogin", "/login"},
		{"/login?next=/admin", "/login"},
		{"/login#top", "/login"},
		{"/login/.", "/login"},
		{"/login/x/..", "/login"},
		// Above the root stays at the root.
		{"/..", "/"},
		{"/../../login", "/login"},
		{"/%2e%2e/login", "/login"},
		// %2F is a slash.
		{"/a%2Fb", "/a/b"},
		{"/a%2fb/", "/a/b"},
		// Other escapes stay, upper-cased; %25 is never decoded.
		{"/a%3fb", "/a%3Fb"},
		{"/a%252Fb", "/a%252Fb"},
		{"/caf%c3%a9", "/caf%C3%A9"},
		// Raw bytes a path may not hold are encoded, like their escapes.
		{"/café", "/caf%C3%A9"},
		{"/a b", "/a%20b"},
		{`/a\b`, "/a%5Cb"},
		// A '%' that starts no escape is "%25".
		{"/100%", "/100%25"},
		{"/%zz", "/%25zz"},
		{"/%%34%31", "/%2541"},
		// Sub-delimiters, ':' and '@' are kept raw.
		{"/v1/users/@me;v=1:x*", "/v1/users/@me;v=1:x*"},
		// Case is significant.
		{"/Login", "/Login"},
	}
	for _, tt := range tests {
		if got := NormalizeRoute(tt.in); got != tt.want {
			t.Errorf("NormalizeRoute(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// Policies match the canonical route segment by segment, so the forms of
// /login match the login policy's glob, and neighbours do not.
func TestGlobMatchesNormalizedRoutes(t *testing.T) {
	tests := []struct {
		glob string
		yes  []string
		no   []string
	}{
		{"/login", []string{"/login", "/%6Cogin", "//login", "/login/", "/./login", "/x/../login", "/login?x=1"}, []string{"/loginx", "/login/x", "/logi", "/x/login", "/Login"}},
		{"/login/", []string{"/login", "/login/"}, []string{"/loginx", "/login/x"}},
		{"/v1/*", []string{"/v1/orders", "/v1//orders/", "/v1/orders/7"}, []string{"/v1", "/v1/", "/v2/x", "/v1/../v2/x"}},
		{"/v1/**", []string{"/v1", "/v1/", "/v1/a/b"}, []string{"/v10", "/v1/../v2"}},
		{"/a/b", []string{"/a%2Fb", "/a/./b/"}, []string{"/a%252Fb"}},
	}
	for _, tt := range tests {
		g, err := compileGlob(tt.glob)
		if err != nil {
			t.Fatalf("compileGlob(%q) = %v", tt.glob, err)
		}
		for _, p := range tt.yes {
			if !g.match(NormalizeRoute(p)) {
				t.Errorf("glob %q match(NormalizeRoute(%q) = %q) = false, want true", tt.glob, p, NormalizeRoute(p))
			}
		}
		for _, p := range tt.no {
			if g.match(NormalizeRoute(p)) {
				t.Errorf("glob %q match(NormalizeRoute(%q) = %q) = true, want false", tt.glob, p, NormalizeRoute(p))
			}
		}
	}
}

func TestNormalizeRouteCanonicalDoesNotAllocate(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { NormalizeRoute("/v1/orders/7/items") }); n != 0 {
		t.Errorf("NormalizeRoute of a canonical route allocates %v times, want 0", n)
	}
}

// FuzzNormalizeRoute: never a panic; the result starts with "/", is its
// own normal form, has no empty, "." or ".." segment and no query.
func FuzzNormalizeRoute(f *testing.F) {
	for _, s := range []string{"/login", "/%6Cogin", "//login/", "/./x/../login", "/a%2Fb", "/%%34%31", "/café?x#y", "/..", "", "%", "/%2", "/a/%2e%2E%2F..%2f"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got := NormalizeRoute(in)
		if !strings.HasPrefix(got, "/") {
			t.Fatalf("NormalizeRoute(%q) = %q, does not start with /", in, got)
		}
		if again := NormalizeRoute(got); again != got {
			t.Fatalf("NormalizeRoute(%q) = %q, but NormalizeRoute(%q) = %q", in, got, got, again)
		}
		if p, _, _ := strings.Cut(in, "?"); isCanonicalRoute(p) && !strings.Contains(p, "#") && normalizePath(p) != p {
			t.Fatalf("isCanonicalRoute(%q), but normalizePath gives %q", p, normalizePath(p))
		}
		if !isCanonicalRoute(got) {
			t.Fatalf("NormalizeRoute(%q) = %q, which isCanonicalRoute rejects", in, got)
		}
		if strings.ContainsAny(got, "?# ") || strings.Contains(got, "//") || strings.Contains(got, "/./") || strings.Contains(got, "/../") {
			t.Fatalf("NormalizeRoute(%q) = %q", in, got)
		}
	})
}
