package region

import (
	"net/http"
	"testing"
)

// The header keys the hot paths look up directly must be what
// Header.Values would look up.
func TestHeaderKeysCanonical(t *testing.T) {
	for _, p := range []authzHeaders{forwardAuthHeaders(ForwardAuthOriginal), forwardAuthHeaders(ForwardAuthForwarded)} {
		for _, k := range [][2]string{{p.method, p.methodKey}, {p.uri, p.uriKey}} {
			if got := http.CanonicalHeaderKey(k[0]); got != k[1] {
				t.Errorf("key of %s = %s, want %s", k[0], k[1], got)
			}
		}
	}
	for _, keys := range [][]string{nil, {"x-api-key", "Authorization"}} {
		cfg := DefaultConfig()
		cfg.KeyHeaders = keys
		for _, k := range cfg.identityConfig().KeyHeaders {
			if got := http.CanonicalHeaderKey(k); got != k {
				t.Errorf("identityConfig().KeyHeaders holds %s, want %s", k, got)
			}
		}
	}
	cfg := DefaultConfig()
	cfg.KeyHeaders = []string{}
	if got := cfg.identityConfig().KeyHeaders; got == nil || len(got) != 0 {
		t.Errorf("identityConfig().KeyHeaders = %#v for no key headers, want empty, not nil", got)
	}
}
