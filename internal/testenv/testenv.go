// Package testenv tells a test what its environment asks of it.
package testenv

import (
	"os"
	"testing"
)

// CI reports whether the tests run in continuous integration: the
// environment variable CI is "true", as CI services set it.
func CI() bool { return os.Getenv("CI") == "true" }

// TooSlow ends a test whose measurement the machine could not make (too
// slow to offer the load, checks answered late): it skips the test, or,
// under CI, fails it, so that CI cannot pass by skipping what it was meant
// to check. The message says what fell short.
func TooSlow(t testing.TB, format string, args ...any) {
	t.Helper()
	if CI() {
		t.Fatalf("CI=true, and the machine was too slow for this test: "+format, args...)
	}
	t.Skipf(format, args...)
}
