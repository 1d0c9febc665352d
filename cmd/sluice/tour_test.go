package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/loopback"
)

// tourBlocks returns the ```sh blocks of a Markdown document, in order.
func tourBlocks(doc string) []string {
	var blocks []string
	var cur []string
	in := false
	for _, line := range strings.Split(doc, "\n") {
		switch {
		case !in && strings.TrimSpace(line) == "```sh":
			in, cur = true, nil
		case in && strings.TrimSpace(line) == "```":
			in = false
			blocks = append(blocks, strings.Join(cur, "\n"))
		case in:
			cur = append(cur, line)
		}
	}
	return blocks
}

func TestTourBlocks(t *testing.T) {
	doc := "intro\n```sh\necho a\n```\n```\nnot shell\n```\n```sh\necho b\necho c\n```\n"
	got := tourBlocks(doc)
	if len(got) != 2 || got[0] != "echo a" || got[1] != "echo b\necho c" {
		t.Errorf("tourBlocks = %q", got)
	}
}

// tourPorts are the loopback ports docs/tour.md uses; the test gives each
// a free one, so that the tour runs beside other tests and daemons.
var tourPorts = []struct {
	port   int
	gossip bool // TCP and UDP
}{
	{8080, false}, {8079, false}, {8090, false}, {8091, false}, {8081, false}, {8082, false}, {8083, false},
	{9080, false}, {9000, false}, {6390, false}, {7946, true}, {7947, true}, {7948, true},
}

// TestTour runs the shell blocks of docs/tour.md in order, in one bash,
// as a reader pastes them: the same commands, with the tour's directory
// and ports replaced by a temporary directory and free ports. It needs
// redis-server, redis-cli, nginx, curl and timeout, and fails without them.
func TestTour(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the tour with real daemons, Redis and nginx; skipped under -short")
	}
	t.Setenv("PATH", os.Getenv("PATH")+":/usr/sbin:/sbin")
	for _, bin := range []string{"bash", "redis-server", "redis-cli", "nginx", "curl", "timeout", "go"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("the tour needs %s (apt-get install redis-server redis-tools nginx curl): %v", bin, err)
		}
	}
	doc, err := os.ReadFile("../../docs/tour.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := tourBlocks(string(doc))
	if len(blocks) < 10 {
		t.Fatalf("docs/tour.md has %d sh blocks; the tour has more", len(blocks))
	}
	script := strings.Join(blocks, "\n")

	dir := t.TempDir()
	// nginx's workers may run as another user: let them reach its files.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	script = strings.ReplaceAll(script, "/tmp/sluice-tour", dir)
	var alts []string
	repl := map[string]string{}
	for _, p := range tourPorts {
		var free int
		if p.gossip {
			free = freeGossipPort(t)
		} else {
			free = freeLoopbackPort(t)
		}
		alts = append(alts, strconv.Itoa(p.port))
		repl[strconv.Itoa(p.port)] = strconv.Itoa(free)
	}
	portRE := regexp.MustCompile(`\b(` + strings.Join(alts, "|") + `)\b`)
	script = portRE.ReplaceAllStringFunc(script, func(s string) string { return repl[s] })

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	out, err := os.Create(filepath.Join(dir, "tour.out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd := exec.CommandContext(ctx, "bash", "-c", "set -eo pipefail\n"+script)
	cmd.Dir = "../.."
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "GOCACHE=" + goEnv(t, "GOCACHE"),
		"GOPATH=" + goEnv(t, "GOPATH"), "GOFLAGS=" + os.Getenv("GOFLAGS"), "GOTOOLCHAIN=local"}
	// A file, not a pipe: the background daemons must not hold Wait up.
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	err = cmd.Run()
	if cmd.Process != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // whatever the tour left running
	}
	log, _ := os.ReadFile(out.Name())
	if err != nil {
		t.Fatalf("the tour failed: %v\n%s", err, log)
	}
	for _, want := range []string{
		"check 6: 429",
		"HTTP/1.1 429 Too Many Requests",
		`Ratelimit-Policy: "per-client";q=5;w=5`,
		"refused, exit 1",
		"200 allowed: subject user:bob, tier anonymous, policy per-client: 19 of 20 remaining",
		"admitted 5 of 10 across two daemons",
		"GET 5: 200",
		"GET 6: 429",
		`RateLimit-Policy: "per-client";q=5;w=5`,
	} {
		if !strings.Contains(string(log), want) {
			t.Errorf("the tour's output lacks %q", want)
		}
	}
	for _, r := range []string{"eu", "us", "ap"} {
		if !regexp.MustCompile(`(?m)^` + r + `\s+true\s+` + r + `-1\s`).Match(log) {
			t.Errorf("sluice regions does not show %s live with node %s-1", r, r)
		}
	}
	if !regexp.MustCompile(`region on :\d+ admitted \d+ of 20`).Match(log) {
		t.Errorf("the tour's output lacks the global policy's admissions")
	}
	if _, err := os.Stat(filepath.Join(dir, "sim", "report.html")); err != nil {
		t.Errorf("the simulation wrote no report: %v", err)
	}
	if t.Failed() || testing.Verbose() {
		t.Logf("tour output:\n%s", log)
	}
}

// freeLoopbackPort is a TCP port free on 127.0.0.1 a moment ago.
func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	return freePort(t, false)
}

// freePort is a loopback port nothing listens on (for UDP as well, if
// udp), below the kernel's ephemeral range (loopback.Port), so that it stays
// free until a daemon binds it.
func freePort(t *testing.T, udp bool) int {
	t.Helper()
	p, err := loopback.Port(udp)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func goEnv(t *testing.T, name string) string {
	t.Helper()
	out, err := exec.Command("go", "env", name).Output()
	if err != nil {
		t.Fatalf("go env %s: %v", name, err)
	}
	return strings.TrimSpace(string(out))
}
