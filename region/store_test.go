package region

import (
	"context"
	"strings"
	"testing"
)

// TestConfigStore checks which store URLs Validate accepts and how /readyz
// names their kind.
func TestConfigStore(t *testing.T) {
	for _, tc := range []struct {
		store, kind string // kind "" means Validate rejects it
	}{
		{"memory", "memory"},
		{"redis://127.0.0.1:6379/2", "redis"},
		{"rediss://u:p@redis.internal:6380", "redis"},
		{"redis-cluster://h1:7000,h2:7001", "redis-cluster"},
		{"redis-sentinel://mymaster@s1:26379,s2:26379/1", "redis-sentinel"},
		{"", ""},
		{"Memory", ""},
		{"127.0.0.1:6379", ""},
		{"http://redis:6379", ""},
		{"redis-sentinels://m@s1:26379", ""},
		{"sentinel://m@s1:26379", ""},
	} {
		t.Run(tc.store, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Store = tc.store
			err := cfg.Validate()
			if (err == nil) != (tc.kind != "") {
				t.Fatalf("Validate() with store %q = %v, want error %v", tc.store, err, tc.kind == "")
			}
			if err != nil && !strings.Contains(err.Error(), "redis-sentinel://MASTER@") {
				t.Errorf("Validate() with store %q = %q, want it to list redis-sentinel:// among the forms", tc.store, err)
			}
			if got := storeKind(tc.store); got != tc.kind {
				t.Errorf("storeKind(%q) = %q, want %q", tc.store, got, tc.kind)
			}
		})
	}
}

// TestNewBadSentinelURL shows that a malformed redis-sentinel:// URL stops
// New with one line that names what is wrong, before any connection.
func TestNewBadSentinelURL(t *testing.T) {
	for _, tc := range []struct{ store, want string }{
		{"redis-sentinel://s1:26379", "names no master"},
		{"redis-sentinel://m@", "names no sentinel"},
		{"redis-sentinel://m@s1", `sentinel address "s1" is not HOST:PORT`},
		{"redis-sentinel://m@s1:26379/db", `database "db"`},
	} {
		cfg := DefaultConfig()
		cfg.Store = tc.store
		d, err := New(context.Background(), cfg, nil, nil, nil)
		if err == nil {
			d.close()
			t.Errorf("New with store %q = nil error, want one containing %q", tc.store, tc.want)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, tc.want) || strings.Contains(msg, "\n") {
			t.Errorf("New with store %q = %q, want one line containing %q", tc.store, msg, tc.want)
		}
	}
}
