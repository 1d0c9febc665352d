package deploy

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// freeDemoBase finds a first port from which the demo's ports (base to
// base+29, and base+100) are free on loopback.
func freeDemoBase(t *testing.T) int {
	t.Helper()
	free := func(p int) bool {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			return false
		}
		l.Close()
		return true
	}
outer:
	for base := 21000; base < 40000; base += 137 {
		for _, off := range []int{0, 1, 2, 5, 6, 8, 9, 10, 11, 12, 15, 16, 18, 19, 20, 21, 22, 25, 26, 28, 29, 100} {
			if !free(base + off) {
				continue outer
			}
		}
		return base
	}
	t.Fatal("no free range of ports for the demo")
	return 0
}

// The demo starts three regions (redis-server, two daemons and nginx each)
// and Prometheus, takes traffic through eu's nginx, and Prometheus sees
// its rejections; then it stops everything it started.
func TestDemoSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server, nginx and prometheus; skipped under -short")
	}
	bin := filepath.Join(t.TempDir(), "sluice")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/sluice").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	work := t.TempDir()
	cmd := exec.Command("bash", "demo/demo.sh")
	cmd.Env = append(os.Environ(), "DEMO_SMOKE=1", "SLUICE_BIN="+bin, "DEMO_DIR="+work, fmt.Sprintf("DEMO_PORT=%d", freeDemoBase(t)))
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "DEMO OK") {
		t.Fatalf("demo.sh: %v\n%s", err, out)
	}
	t.Logf("%s", out[strings.LastIndex(string(out), "demo smoke:"):])
}

// The compose setup's nginx configurations are the shipped one rendered
// by demo.sh, and its daemons run flags sluice serve knows.
func TestComposeMatchesDemo(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("bash", "demo/demo.sh", "render-compose", dir).CombinedOutput(); err != nil {
		t.Fatalf("render-compose: %v\n%s", err, out)
	}
	for _, r := range []string{"eu", "us", "ap"} {
		want, err := os.ReadFile(filepath.Join(dir, "nginx-"+r+".conf"))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile("demo/compose/nginx-" + r + ".conf")
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("demo/compose/nginx-%s.conf differs from deploy/nginx/sluice.conf rendered: run bash deploy/demo/demo.sh render-compose deploy/demo/compose", r)
		}
	}

	var compose struct {
		Services map[string]struct {
			Command []string `yaml:"command"`
			Ports   []string `yaml:"ports"`
		} `yaml:"services"`
	}
	b, err := os.ReadFile("demo/compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &compose); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	if testing.Short() {
		return
	}
	known := serveFlags(t)
	daemons := 0
	ports := map[string]string{}
	for name, s := range compose.Services {
		for _, p := range s.Ports {
			host, _, _ := strings.Cut(p, ":")
			if other, dup := ports[host]; dup {
				t.Errorf("port %s published by %s and %s", host, name, other)
			}
			ports[host] = name
		}
		if !strings.HasPrefix(name, "sluice-") {
			continue
		}
		daemons++
		if len(s.Command) == 0 || s.Command[0] != "serve" {
			t.Errorf("%s: command %v, want serve", name, s.Command)
			continue
		}
		for _, a := range s.Command[1:] {
			if strings.HasPrefix(a, "--") && !known[strings.TrimPrefix(a, "--")] {
				t.Errorf("%s: %s is not a flag of sluice serve", name, a)
			}
		}
	}
	if daemons != 6 {
		t.Errorf("%d sluice services, want 2 in each of 3 regions", daemons)
	}
}
