package main

import (
	"bytes"
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// The real binary: a bad decision-log setting is one line on stderr and
// exit 1 before anything listens, never a daemon that drops its events.
func TestServeBadDecisionLogFlagsExit1(t *testing.T) {
	bin := buildSluice(t)
	dir := t.TempDir()
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--decision-log-reject-rate", "1.5"}, "sluice: --decision-log-reject-rate: must be in [0, 1], got 1.5"},
		{[]string{"--decision-log-allow-rate", "-0.1"}, "sluice: --decision-log-allow-rate: must be in [0, 1], got -0.1"},
		{[]string{"--decision-log-allow-rate", "NaN"}, "sluice: --decision-log-allow-rate: must be in [0, 1], got NaN"},
		{[]string{"--decision-log", dir}, "sluice: decision log: open " + dir + ": is a directory"},
		{[]string{"--decision-log", dir + "/missing/events.jsonl"}, "sluice: decision log: open " + dir + "/missing/events.jsonl: no such file or directory"},
		{[]string{"--decision-log-hash-key-file", dir + "/nokey"}, "sluice: --decision-log-hash-key-file: open "},
		{[]string{"--top-window", "0s"}, "sluice: --top-window: must be positive"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			cmd := exec.Command(bin, append([]string{"serve", "--listen", "127.0.0.1:0"}, tt.args...)...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Fatalf("sluice serve %v: %v, want exit status 1; stderr:\n%s", tt.args, err, stderr.String())
			}
			// The log's JSON lines (the no-admin-token warning) are not the error.
			var last string
			for _, l := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
				if !strings.HasPrefix(l, "{") {
					last = l
				}
			}
			if !strings.HasPrefix(last, tt.want) {
				t.Errorf("stderr = %q, want a line starting %q", stderr.String(), tt.want)
			}
		})
	}
}
