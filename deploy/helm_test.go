package deploy

import (
	"bytes"
	"debug/elf"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/loopback"
	"github.com/sluice-rl/sluice/internal/testenv"

	"github.com/sluice-rl/sluice/internal/testtools"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-rl/sluice/quota"
)

// helmVersion is the helm the tests build when none is installed.
const helmVersion = "v3.19.0"

const chart = "helm/sluice"

// helmBin returns a helm binary: on PATH, in the tools directory, or built
// there with go install from the Go module proxy. It skips only when helm
// cannot be built here, saying why, and fails then under CI=true.
func helmBin(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("runs helm; skipped under -short")
	}
	if p, err := exec.LookPath("helm"); err == nil {
		return p
	}
	p, err := testtools.Install(t, "bin", "helm.sh/helm/v3/cmd/helm", helmVersion, "helm")
	if err != nil && testenv.CI() {
		t.Fatalf("helm cannot be built here, and CI=true asks every test to run: %v", err)
	} else if err != nil {
		t.Skipf("helm cannot be built here: %v", err)
	}
	return p
}

func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helmBin(t), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// helm lint passes on the defaults and on a region's values, and fails,
// naming the value, on each value of the wrong type or a missing secret.
func TestHelmLint(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string // "" passes; else a substring of the failure
	}{
		{"defaults", nil, ""},
		{"region values", []string{"-f", chart + "/ci/region-values.yaml"}, ""},
		{"replicas as a string", []string{"--set", "replicaCount=two"}, "/replicaCount"},
		{"store not a store", []string{"--set", "store=mysql://db"}, "/store"},
		{"rate above one", []string{"--set", "decisionLog.rejectRate=2"}, "/decisionLog/rejectRate"},
		{"pdb as a list", []string{"--set", "podDisruptionBudget.enabled[0]=true"}, "/podDisruptionBudget/enabled"},
		{"region without a gossip key", []string{"--set", "region.name=eu"}, "/secrets"},
		{"unknown preset", []string{"--set", "region.gossipPreset=galactic"}, "/region/gossipPreset"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := helm(t, append([]string{"lint", chart}, tc.args...)...)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("helm lint %v: %v\n%s", tc.args, err, out)
			case tc.want != "" && (err == nil || !strings.Contains(out, tc.want)):
				t.Errorf("helm lint %v = %v, want a failure naming %q:\n%s", tc.args, err, tc.want, out)
			}
		})
	}
}

// object is one rendered manifest.
type object = map[string]any

func kindOf(o object) string { return str(o["kind"]) }

func nameOf(o object) string { return str(at(o, "metadata", "name")) }

func str(v any) string { s, _ := v.(string); return s }

// at walks maps by key and lists by index.
func at(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func render(t *testing.T, args ...string) []object {
	t.Helper()
	out, err := helm(t, append([]string{"template", "r", chart}, args...)...)
	if err != nil {
		t.Fatalf("helm template %v: %v\n%s", args, err, out)
	}
	var objs []object
	dec := yaml.NewDecoder(strings.NewReader(out))
	for {
		var o object
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("rendered YAML: %v\n%s", err, out)
		}
		if o != nil {
			objs = append(objs, o)
		}
	}
	return objs
}

func byKind(objs []object, kind string) []object {
	var out []object
	for _, o := range objs {
		if kindOf(o) == kind {
			out = append(out, o)
		}
	}
	return out
}

// The rendered region: probes on /readyz and /healthz, a non-root,
// read-only, capability-less container, the secrets mounted where the
// flags read them, the policies a valid policy file, every flag one that
// sluice serve knows, and the selectors of the Service, PDB and
// ServiceMonitor matching the pods.
func TestHelmTemplateRegion(t *testing.T) {
	objs := render(t, "-f", chart+"/ci/region-values.yaml")
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[kindOf(o)]++
	}
	for k, n := range map[string]int{"Deployment": 1, "Service": 2, "ServiceMonitor": 1, "PodDisruptionBudget": 1, "ConfigMap": 1, "Secret": 1} {
		if kinds[k] != n {
			t.Errorf("%d %s objects, want %d (all: %v)", kinds[k], k, n, kinds)
		}
	}
	dep := byKind(objs, "Deployment")[0]
	pod := at(dep, "spec", "template", "spec")
	c := at(pod, "containers", 0)
	for _, tc := range []struct {
		path []any
		want any
	}{
		{[]any{"readinessProbe", "httpGet", "path"}, "/readyz"},
		{[]any{"readinessProbe", "httpGet", "port"}, "http"},
		{[]any{"livenessProbe", "httpGet", "path"}, "/healthz"},
		{[]any{"securityContext", "runAsNonRoot"}, true},
		{[]any{"securityContext", "runAsUser"}, 65532},
		{[]any{"securityContext", "allowPrivilegeEscalation"}, false},
		{[]any{"securityContext", "readOnlyRootFilesystem"}, true},
		{[]any{"securityContext", "capabilities", "drop", 0}, "ALL"},
		{[]any{"lifecycle", "preStop", "sleep", "seconds"}, 5},
	} {
		if got := at(c, tc.path...); got != tc.want {
			t.Errorf("container %v = %v, want %v", tc.path, got, tc.want)
		}
	}
	if got := at(pod, "securityContext", "runAsNonRoot"); got != true {
		t.Errorf("pod securityContext.runAsNonRoot = %v, want true", got)
	}
	if got, _ := at(pod, "terminationGracePeriodSeconds").(int); got < 30+5 {
		t.Errorf("terminationGracePeriodSeconds = %d, want more than the shutdown timeout and the preStop sleep (35)", got)
	}
	if got := at(dep, "spec", "replicas"); got != 3 {
		t.Errorf("replicas = %v, want 3", got)
	}

	var args []string
	for _, a := range at(c, "args").([]any) {
		args = append(args, a.(string))
	}
	flag := func(name string) string {
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
				return v
			}
		}
		return ""
	}
	if args[0] != "serve" {
		t.Fatalf("args = %v, want serve first", args)
	}
	for _, f := range []struct{ name, want string }{
		{"admin-token-file", "/etc/sluice/secret/admin-token"},
		{"gossip-key-file", "/etc/sluice/secret/gossip-key"},
		{"region", "eu-west"},
		{"node", "$(POD_NAME)"},
		{"join", "r-sluice-gossip:7946,sluice-gossip.us-east.example.net:7946"},
		{"store", "redis://redis.sluice-eu:6379"},
		{"trusted-proxies", "10.0.0.0/8"},
		{"policies", "/etc/sluice/policies/policies.json"},
		{"decision-log-reject-rate", "0.5"},
	} {
		if got := flag(f.name); got != f.want {
			t.Errorf("--%s = %q, want %q (args %v)", f.name, got, f.want, args)
		}
	}
	known := serveFlags(t)
	for _, a := range args[1:] {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") || !known[name] {
			t.Errorf("argument %q is not a flag of sluice serve", a)
		}
	}

	mounts := map[string]string{} // volume -> mount path
	for _, m := range at(c, "volumeMounts").([]any) {
		mounts[str(at(m, "name"))] = str(at(m, "mountPath"))
	}
	secret := byKind(objs, "Secret")[0]
	for _, v := range at(pod, "volumes").([]any) {
		if s := str(at(v, "secret", "secretName")); s != "" && (s != nameOf(secret) || mounts[str(at(v, "name"))] != "/etc/sluice/secret") {
			t.Errorf("secret volume %v: want Secret %s at /etc/sluice/secret", v, nameOf(secret))
		}
	}
	for key, want := range map[string]string{"admin-token": "test-admin-token", "gossip-key": "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="} {
		b, err := base64.StdEncoding.DecodeString(str(at(secret, "data", key)))
		if err != nil || string(b) != want {
			t.Errorf("Secret %s = %q (%v), want %q", key, b, err, want)
		}
	}

	cm := byKind(objs, "ConfigMap")[0]
	ps, err := quota.ParsePolicies([]byte(str(at(cm, "data", "policies.json"))))
	if err != nil || len(ps) != 2 || ps[1].Mode == quota.ModeEnforce {
		t.Errorf("policies.json: %d policies, %v; want orders and a shadow orders-strict", len(ps), err)
	}

	podLabels := at(dep, "spec", "template", "metadata", "labels").(map[string]any)
	matches := func(sel any) bool {
		m, ok := sel.(map[string]any)
		if !ok || len(m) == 0 {
			return false
		}
		for k, v := range m {
			if podLabels[k] != v {
				return false
			}
		}
		return true
	}
	for _, s := range byKind(objs, "Service") {
		if !matches(at(s, "spec", "selector")) {
			t.Errorf("Service %s selector %v does not match the pods' labels %v", nameOf(s), at(s, "spec", "selector"), podLabels)
		}
	}
	if pdb := byKind(objs, "PodDisruptionBudget")[0]; !matches(at(pdb, "spec", "selector", "matchLabels")) {
		t.Errorf("PDB selector does not match the pods")
	}
	sm := byKind(objs, "ServiceMonitor")[0]
	svcLabels := at(byKind(objs, "Service")[0], "metadata", "labels").(map[string]any)
	for k, v := range at(sm, "spec", "selector", "matchLabels").(map[string]any) {
		if svcLabels[k] != v {
			t.Errorf("ServiceMonitor selects %s=%v, the Service has %v", k, v, svcLabels[k])
		}
	}
	if at(sm, "spec", "endpoints", 0, "path") != "/metrics" || at(sm, "spec", "endpoints", 0, "port") != "http" {
		t.Errorf("ServiceMonitor endpoint = %v, want port http path /metrics", at(sm, "spec", "endpoints", 0))
	}
}

// Without values the chart renders one single-region daemon set with a
// generated admin token and no gossip; settings that could never work fail
// the render with a message that says why.
func TestHelmTemplateDefaultsAndRefusals(t *testing.T) {
	objs := render(t)
	sec := byKind(objs, "Secret")
	if len(sec) != 1 || len(str(at(sec[0], "data", "admin-token"))) < 40 || at(sec[0], "data", "gossip-key") != nil {
		t.Errorf("default Secret = %v, want a generated admin token and no gossip key", sec)
	}
	if n := len(byKind(objs, "Service")); n != 1 {
		t.Errorf("%d Services single-region, want 1 (no gossip Service)", n)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--set", "store=memory"}, "store: memory keeps each daemon's state apart"},
		{[]string{"--set", "region.name=eu", "--set", "secrets.existingSecret="}, "secrets"},
	} {
		out, err := helm(t, append([]string{"template", "r", chart}, tc.args...)...)
		if err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("helm template %v = %v, want a failure with %q:\n%s", tc.args, err, tc.want, out)
		}
	}
}

// serveFlags are the long flags `sluice serve --help` lists.
func serveFlags(t *testing.T) map[string]bool {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "sluice")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/sluice").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "serve", "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("sluice serve --help: %v\n%s", err, out)
	}
	known := map[string]bool{}
	for _, m := range regexp.MustCompile(`--([a-z][a-z0-9-]+)`).FindAllStringSubmatch(string(out), -1) {
		known[m[1]] = true
	}
	return known
}

// The image's binary is built as `make static` builds it and is static:
// no interpreter, no shared library. The Dockerfile copies that path into
// an empty image and runs it as a non-root user.
func TestStaticBinaryAndDockerfile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary; skipped under -short")
	}
	bin := filepath.Join(t.TempDir(), "sluice")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "../cmd/sluice")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("binary has a %v program header: not static", p.Type)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("binary needs shared libraries %v", libs)
	}

	t.Run("runs alone as 65532", func(t *testing.T) { runInEmptyRoot(t, bin) })

	df, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(df), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	for _, want := range []string{"FROM scratch", "COPY bin/linux-${TARGETARCH}/sluice /sluice", "USER 65532:65532", `ENTRYPOINT ["/sluice"]`} {
		if !slices.Contains(lines, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	mk, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(mk), "CGO_ENABLED=0 GOOS=linux GOARCH=$(GOARCH_IMAGE)") || !strings.Contains(string(mk), "-o bin/linux-$(GOARCH_IMAGE)/sluice") {
		t.Errorf("make static no longer builds bin/linux-$(GOARCH_IMAGE)/sluice without cgo, where the Dockerfile copies it from")
	}
}

// runInEmptyRoot does what the image does without a container runtime:
// the binary alone in an otherwise empty root directory, run as UID and
// GID 65532 (chroot --userspec, as root), must serve /healthz.
func runInEmptyRoot(t *testing.T, bin string) {
	if os.Geteuid() != 0 {
		t.Skip("chroot needs root")
	}
	chroot, err := exec.LookPath("chroot")
	if err != nil {
		t.Skip("no chroot here")
	}
	root := t.TempDir()
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "sluice"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	addr, err := loopback.Addr(false)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(chroot, "--userspec=65532:65532", root, "/sluice", "serve", "--listen", addr)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		cmd.Process.Kill()
		<-done
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode != 200 {
				t.Fatalf("/healthz = %d", res.StatusCode)
			}
			return
		}
		select {
		case err := <-done:
			done <- err
			t.Fatalf("sluice in an empty root exited: %v\n%s", err, logs.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("sluice in an empty root did not serve /healthz: %v\n%s", err, logs.String())
		}
	}
}
