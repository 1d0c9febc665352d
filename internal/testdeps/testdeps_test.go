package testdeps

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// allPackages is what a machine with none of the tools needs, in the
// order the script lists them.
const allPackages = "redis-server redis-tools nginx caddy curl prometheus"

// tools are the programs the script looks for.
var tools = []string{"redis-server", "redis-cli", "redis-benchmark", "nginx", "caddy", "curl", "promtool"}

// run runs .ci/test-deps with a PATH holding only fake id, apt-get and
// service (each logging its arguments) plus the named tools, and an empty
// system root, so that it sees exactly the machine the case describes.
func run(t *testing.T, uid string, aptGet bool, present []string) (code int, stderr, log string) {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	logFile := filepath.Join(dir, "log")
	fake := func(name, body string) {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	fake("id", "echo "+uid)
	if aptGet {
		fake("apt-get", `echo "apt-get $*" >> `+logFile)
	}
	fake("service", `echo "service $*" >> `+logFile)
	for _, p := range present {
		fake(p, "exit 0")
	}
	script, err := filepath.Abs("../../.ci/test-deps")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/bash", script)
	cmd.Env = []string{"PATH=" + bin, "TEST_DEPS_SYSROOT=" + filepath.Join(dir, "root")}
	var errb strings.Builder
	cmd.Stderr = &errb
	err = cmd.Run()
	code = cmd.ProcessState.ExitCode()
	if err != nil && code <= 0 {
		t.Fatalf("running %s: %v", script, err)
	}
	b, _ := os.ReadFile(logFile)
	return code, errb.String(), string(b)
}

func TestTestDeps(t *testing.T) {
	tests := []struct {
		name     string
		uid      string
		aptGet   bool
		present  []string
		code     int
		stderr   string // a substring; "" means stderr is empty
		wantLog  []string
		emptyLog bool
	}{
		{
			name: "non-root stops before installing and names the command",
			uid:  "1000", aptGet: true,
			code:     1,
			stderr:   "install them with: sudo apt-get update && sudo apt-get install -y " + allPackages + "\n",
			emptyLog: true,
		},
		{
			name: "root installs every missing package",
			uid:  "0", aptGet: true,
			code:    0,
			stderr:  "make test: installing " + allPackages,
			wantLog: []string{"apt-get update -qq", "apt-get install -y -qq --no-install-recommends " + allPackages, "service redis-server stop", "service nginx stop"},
		},
		{
			name: "root installs only what is missing",
			uid:  "0", aptGet: true,
			present: []string{"redis-server", "redis-cli", "redis-benchmark", "caddy", "curl", "promtool"},
			code:    0,
			stderr:  "make test: installing nginx\n",
			wantLog: []string{"apt-get install -y -qq --no-install-recommends nginx\n"},
		},
		{
			name: "root without apt-get names the command",
			uid:  "0", aptGet: false,
			present:  []string{"redis-server", "redis-cli", "redis-benchmark", "nginx", "caddy", "curl"},
			code:     1,
			stderr:   "sudo apt-get install -y prometheus\n",
			emptyLog: true,
		},
		{
			name: "nothing missing does nothing",
			uid:  "1000", aptGet: true,
			present:  tools,
			code:     0,
			emptyLog: true,
		},
		{
			name: "redis-cli without redis-benchmark needs redis-tools",
			uid:  "1000", aptGet: true,
			present:  []string{"redis-server", "redis-cli", "nginx", "caddy", "curl", "promtool"},
			code:     1,
			stderr:   "sudo apt-get install -y redis-tools\n",
			emptyLog: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, stderr, log := run(t, tc.uid, tc.aptGet, tc.present)
			if code != tc.code {
				t.Errorf("exit %d, want %d; stderr %q", code, tc.code, stderr)
			}
			if tc.stderr == "" && stderr != "" || !strings.Contains(stderr, tc.stderr) {
				t.Errorf("stderr %q, want it to contain %q", stderr, tc.stderr)
			}
			if tc.code != 0 && strings.Count(stderr, "\n") != 1 {
				t.Errorf("stderr is %d lines, want one: %q", strings.Count(stderr, "\n"), stderr)
			}
			if tc.emptyLog && log != "" {
				t.Errorf("ran %q, want nothing installed or stopped", log)
			}
			for _, w := range tc.wantLog {
				if !strings.Contains(log, w) {
					t.Errorf("log %q lacks %q", log, w)
				}
			}
		})
	}
}
