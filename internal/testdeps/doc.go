// Package testdeps holds no code: its test checks .ci/test-deps, the
// script `make test` runs first to install (as root) or name (otherwise)
// the Debian packages the tests start.
package testdeps
