package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The real binary: a bad --rls-max-connections,
// --rls-max-connections-per-address, --rls-write-timeout,
// --rls-max-connection-age or --rls-max-connection-age-grace, as a flag
// or as a --config setting, is one line on stderr and exit 1.
func TestServeBadRLSBoundsExit1(t *testing.T) {
	bin := buildSluice(t)
	config := func(body string) string {
		p := filepath.Join(t.TempDir(), "config.json")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"max connections", []string{"--rls-max-connections", "0"}, "sluice: --rls-max-connections: must be positive, got 0"},
		{"write timeout", []string{"--rls-write-timeout", "-1s"}, "sluice: --rls-write-timeout: must be positive, got -1s"},
		{"config", []string{"--config", config(`{"rls-max-connections": -3}`)}, "sluice: --rls-max-connections: must be positive, got -3"},
		{"max connections per address", []string{"--rls-max-connections-per-address", "-1"}, "sluice: --rls-max-connections-per-address: must be 0 (no bound) or positive, got -1"},
		{"max connection age", []string{"--rls-max-connection-age", "-1m"}, "sluice: --rls-max-connection-age: must be 0 (no age) or positive, got -1m0s"},
		{"max connection age grace", []string{"--rls-max-connection-age", "1h", "--rls-max-connection-age-grace", "-1s"}, "sluice: --rls-max-connection-age-grace: must be 0 (wait for the calls) or positive, got -1s"},
		{"grace without age", []string{"--rls-max-connection-age-grace", "1m"}, "sluice: --rls-max-connection-age-grace: needs --rls-max-connection-age, got 1m0s without it"},
		{"config age", []string{"--config", config(`{"rls-max-connection-age": "-2h"}`)}, "sluice: --rls-max-connection-age: must be 0 (no age) or positive, got -2h0m0s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(bin, append([]string{"serve", "--listen", "127.0.0.1:0", "--rls-listen", "127.0.0.1:0"}, tt.args...)...)
			cmd.Env = append(os.Environ(), "SLUICE_ADMIN_TOKEN=t") // no warning of a disabled admin API
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Fatalf("sluice serve %v: %v, want exit status 1; stderr:\n%s", tt.args, err, stderr.String())
			}
			if out := strings.TrimSuffix(stderr.String(), "\n"); out != tt.want {
				t.Errorf("stderr = %q, want %q", stderr.String(), tt.want)
			}
		})
	}
}
