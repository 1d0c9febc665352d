package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testlog"
)

// TestInterruptStopsEverything runs the soak binary, interrupts it with
// SIGINT once its deployment is up, and checks what an operator pressing
// Ctrl-C is promised: exit status 130, a report of what ran that says it
// was interrupted, and no process of the deployment (Redis, daemons,
// nginx) left running.
func TestInterruptStopsEverything(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "soak")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out := filepath.Join(t.TempDir(), "out")
	cmd := exec.Command(bin, "-duration", "2m", "-faults", "none", "-out", out, "-repo", "../../..")
	var stdout strings.Builder
	cmd.Stdout = &stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	up := make(chan struct{})
	var log testlog.Buffer
	go func() {
		sc := bufio.NewScanner(stderr)
		seen := false
		for sc.Scan() {
			_, _ = log.Write([]byte(sc.Text() + "\n"))
			if !seen && strings.Contains(sc.Text(), `msg="daemons up"`) {
				seen = true
				close(up)
			}
		}
	}()
	select {
	case <-up:
	case <-time.After(3 * time.Minute):
		t.Fatalf("the deployment did not come up within 3 minutes; the soak's log:\n%s", log.String())
	}
	// A little traffic, so that the report has something to say.
	time.Sleep(3 * time.Second)
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("the soak did not exit within 2 minutes of SIGINT")
	}
	b, rerr := os.ReadFile(filepath.Join(out, "report.json"))
	if rerr != nil {
		t.Fatalf("no report after SIGINT: %v", rerr)
	}
	var rep struct {
		Interrupted bool           `json:"interrupted"`
		Counts      map[string]int `json:"counts"`
		Violations  []any          `json:"violations"`
	}
	if err := json.Unmarshal(b, &rep); err != nil || !rep.Interrupted || len(rep.Counts) == 0 {
		t.Errorf("report after SIGINT: interrupted %v, counts %v, %v; want an interrupted report with its counts", rep.Interrupted, rep.Counts, err)
	}
	// An interrupted run exits 130, unless what ran broke a bound (on a
	// loaded machine a 2-minute run may well be too slow), which is 1.
	want := 130
	if len(rep.Violations) > 0 {
		want = 1
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != want {
		t.Errorf("exit after SIGINT = %v, want status %d\n%s%s", err, want, stdout.String(), log.String())
	}
	if _, err := os.Stat(filepath.Join(out, "report.html")); err != nil {
		t.Errorf("no HTML report after SIGINT: %v", err)
	}
	if left := processesUnder(out); len(left) > 0 {
		t.Errorf("processes of the deployment still running after the soak exited: %v", left)
	}
}

// processesUnder lists the processes whose command line names dir or
// whose working directory is in it.
func processesUnder(dir string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid := e.Name()
		if pid[0] < '0' || pid[0] > '9' {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", pid, "cmdline"))
		cwd, _ := os.Readlink(filepath.Join("/proc", pid, "cwd"))
		if strings.Contains(string(cmdline), dir) || strings.HasPrefix(cwd, dir) {
			out = append(out, pid+" "+strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
	return out
}
