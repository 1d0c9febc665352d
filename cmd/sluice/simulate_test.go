package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-rl/sluice/internal/racedetector"
	"github.com/sluice-rl/sluice/simulator"
)

func runSimulate(t *testing.T, args ...string) string {
	t.Helper()
	cmd := newSimulateCmd()
	var out, errb bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errb)
	cmd.SetArgs(args)
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		t.Fatalf("simulate %v = %v (stderr %q)", args, err, errb.String())
	}
	return out.String()
}

func TestSimulateList(t *testing.T) {
	out := runSimulate(t, "--list")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	all := simulator.Builtins()
	if len(lines) != len(all) {
		t.Fatalf("--list printed %d lines, want %d", len(lines), len(all))
	}
	for i, sc := range all {
		if name, _, _ := strings.Cut(lines[i], "\t"); name != sc.Name {
			t.Errorf("--list line %d starts with %q, want %q", i, name, sc.Name)
		}
	}
}

func TestSimulateJSON(t *testing.T) {
	out := runSimulate(t, "--scenario", "single-region-2x", "--json")
	var res struct {
		Scenario string                     `json:"scenario"`
		Summary  map[string]json.RawMessage `json:"summary"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("--json output does not parse: %v", err)
	}
	if res.Scenario != "single-region-2x" {
		t.Errorf("scenario = %q, want single-region-2x", res.Scenario)
	}
	for _, f := range []string{"global_error_p99_pct", "global_error_max_pct", "regional_error_p99_pct", "overshoot_max_pct",
		"convergence_s", "false_rejection_pct", "report_bytes_per_s_per_region", "nfr02_pass", "targets_pass"} {
		if _, ok := res.Summary[f]; !ok {
			t.Errorf("summary lacks %s", f)
		}
	}
	if string(res.Summary["nfr02_pass"]) != "true" {
		t.Errorf("nfr02_pass = %s, want true", res.Summary["nfr02_pass"])
	}
}

func TestSimulateOut(t *testing.T) {
	dir := t.TempDir()
	runSimulate(t, "--scenario", "single-region-2x", "--out", dir)
	page, err := os.ReadFile(filepath.Join(dir, "report.html"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"single-region-2x.json", "global.svg", "region-r0.svg", "shares.svg"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("--out did not write %s: %v", f, err)
		}
		if strings.HasSuffix(f, ".svg") && !strings.Contains(string(page), `data-file="`+f+`"`) {
			t.Errorf("report.html does not embed %s", f)
		}
	}
}

func TestSimulateUnknownScenario(t *testing.T) {
	cmd := newSimulateCmd()
	cmd.SetOut(new(bytes.Buffer))
	cmd.SetErr(new(bytes.Buffer))
	cmd.SetArgs([]string{"--scenario", "nope"})
	if err := cmd.ExecuteContext(context.Background()); err == nil || !strings.Contains(err.Error(), "unknown scenario") {
		t.Errorf("simulate --scenario nope = %v, want unknown scenario", err)
	}
}

func TestSimulateLiveNeedsScenario(t *testing.T) {
	for _, args := range [][]string{{"--live"}, {"--live", "--file", "x.json"}} {
		cmd := newSimulateCmd()
		var out, errb bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&errb)
		cmd.SetArgs(args)
		err := cmd.ExecuteContext(context.Background())
		if want := "--live runs a built-in scenario: give --scenario NAME"; err == nil || err.Error() != want {
			t.Errorf("simulate %v = %v, want %q", args, err, want)
		}
	}
}

// TestSimulateLiveOut runs a scenario against real daemons on loopback and
// requires --out to write what a virtual-time run writes.
func TestSimulateLiveOut(t *testing.T) {
	if testing.Short() {
		t.Skip("live simulation runs daemons for about half a minute; skipped under -short")
	}
	if racedetector.Enabled {
		t.Skip("load test: under the race detector the machine cannot drive the scenario's load")
	}
	dir := t.TempDir()
	runSimulate(t, "--live", "--scenario", "steady-uneven", "--out", dir)
	for _, f := range []string{"steady-uneven.json", "global.svg", "report.html"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("--live --out did not write %s: %v", f, err)
		}
	}
	js, err := os.ReadFile(filepath.Join(dir, "steady-uneven.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(js), `"nfr02_pass"`) {
		t.Errorf("steady-uneven.json has no summary: %.200s", js)
	}
}
