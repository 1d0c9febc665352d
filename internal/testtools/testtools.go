// Package testtools builds the programs that tests run beside Sluice
// (envoyproxy/ratelimit, h2spec, helm) once, with go install from the Go
// module proxy, into a cache directory shared with make bench-peers.
package testtools

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Dir is where the tools are kept: $SLUICE_TOOLS, else
// ~/.cache/sluice-tools.
func Dir(t testing.TB) string {
	t.Helper()
	if d := os.Getenv("SLUICE_TOOLS"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(home, ".cache", "sluice-tools")
}

// Install returns the path of the program bin that `go install
// pkg@version` builds, into Dir's subdirectory sub, building it only when
// it is not there yet. env is added to go install's environment.
func Install(t testing.TB, sub, pkg, version, bin string, env ...string) (string, error) {
	t.Helper()
	dir := filepath.Join(Dir(t), sub)
	p := filepath.Join(dir, bin)
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	t.Logf("building %s@%s into %s (go install)", pkg, version, dir)
	cmd := exec.Command("go", "install", pkg+"@"+version)
	cmd.Env = append(append(os.Environ(), "GOBIN="+dir), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go install %s@%s: %w\n%s", pkg, version, err, out)
	}
	return p, nil
}
