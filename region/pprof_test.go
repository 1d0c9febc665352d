package region

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// The profiler is on the admin listener only, behind the admin token.
func TestProfilerOnAdminListenerOnly(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.AdminListen = "127.0.0.1:0" })
	admin := httptest.NewServer(h.d.AdminHandler())
	defer admin.Close()
	get := func(base, path, token string) int {
		req, _ := http.NewRequest("GET", base+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	tests := []struct {
		name, base, path, token string
		want                    int
	}{
		{"admin listener with token", admin.URL, "/debug/pprof/", testToken, 200},
		{"admin listener, a profile", admin.URL, "/debug/pprof/cmdline", testToken, 200},
		{"admin listener without token", admin.URL, "/debug/pprof/", "", 401},
		{"admin listener, wrong token", admin.URL, "/debug/pprof/", "nope", 403},
		{"public listener", h.url, "/debug/pprof/", testToken, 404},
	}
	for _, tc := range tests {
		if got := get(tc.base, tc.path, tc.token); got != tc.want {
			t.Errorf("%s: GET %s = %d, want %d", tc.name, tc.path, got, tc.want)
		}
	}
}
