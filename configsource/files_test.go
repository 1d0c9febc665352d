package configsource

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-rl/sluice/quota"
)

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func names(root string, fs Files) []string {
	var out []string
	for _, f := range fs {
		rel, _ := filepath.Rel(root, f.Path)
		out = append(out, rel)
	}
	return out
}

// TestReadFilesConfigMap reads a directory in the layout of a Kubernetes
// ConfigMap volume (files linked through ..data to a hidden directory),
// with a subdirectory, files of other names and a dangling link.
func TestReadFilesConfigMap(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "..2026_01_01", "a.yaml"), "a")
	must(t, os.Symlink("..2026_01_01", filepath.Join(dir, "..data")))
	must(t, os.Symlink(filepath.Join("..data", "a.yaml"), filepath.Join(dir, "a.yaml")))
	write(t, filepath.Join(dir, "sub", "deeper", "b.yml"), "b")
	write(t, filepath.Join(dir, "notes.txt"), "x")
	write(t, filepath.Join(dir, ".hidden.yaml"), "h")
	must(t, os.Symlink("nowhere.yaml", filepath.Join(dir, "dangling.yaml")))
	fs, err := ReadFiles([]string{dir}, EnvoyExts, 1<<10, true)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(names(dir, fs), " "); got != "a.yaml sub/deeper/b.yml" {
		t.Errorf("ReadFiles = %s, want a.yaml sub/deeper/b.yml", got)
	}
	if string(fs[0].Data) != "a" {
		t.Errorf("a.yaml read as %q, want its target's bytes", fs[0].Data)
	}
	if _, err := ReadFiles([]string{filepath.Join(dir, "gone.yaml")}, EnvoyExts, 1<<10, true); err == nil {
		t.Error("strict ReadFiles of a missing file: no error")
	}
	if fs, err := ReadFiles([]string{filepath.Join(dir, "gone.yaml")}, EnvoyExts, 1<<10, false); err != nil || len(fs) != 0 {
		t.Errorf("ReadFiles of a missing file on reload = %v, %v, want no files", fs, err)
	}
	if _, err := ReadFiles([]string{filepath.Join(dir, "sub")}, PolicyExts, 1<<10, true); err == nil || !strings.Contains(err.Error(), "no *.json file") {
		t.Errorf("strict ReadFiles of a directory without a file = %v, want an error naming *.json", err)
	}
	write(t, filepath.Join(dir, "big.yaml"), strings.Repeat("x", 2<<10))
	var e *Error
	if _, err := ReadFiles([]string{dir}, EnvoyExts, 1<<10, false); !errors.As(err, &e) || !strings.HasSuffix(e.File, "big.yaml") {
		t.Errorf("ReadFiles with a file over the bound = %v, want an Error naming it", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestEnvoyParserMerge(t *testing.T) {
	a := File{Path: "a.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: x\n    rate_limit: {unit: second, requests_per_unit: 1}\n")}
	b := File{Path: "b.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: y\n    rate_limit: {unit: second, requests_per_unit: 2}\n")}
	dupX := File{Path: "c.yaml", Data: a.Data}
	tests := []struct {
		name  string
		merge bool
		files Files
		n     int
		err   string // substring; "" for none
		field string
	}{
		{"one file", false, Files{a}, 1, "", ""},
		{"two files, one domain, merge off", false, Files{a, b}, 0, `domain "d" is also configured by a.yaml`, "domain"},
		{"two files, one domain, merged", true, Files{a, b}, 2, "", ""},
		{"one descriptor in two merged files", true, Files{a, dupX}, 0, "also configured by a.yaml", "descriptors"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ps, err := EnvoyParser(tt.merge)(tt.files)
			if tt.err == "" {
				if err != nil || len(ps) != tt.n {
					t.Fatalf("parse = %d policies, %v; want %d", len(ps), err, tt.n)
				}
				return
			}
			var e *Error
			if !errors.As(err, &e) || !strings.Contains(e.Error(), tt.err) || e.Field != tt.field {
				t.Fatalf("parse = %v, want an Error with field %s and %q", err, tt.field, tt.err)
			}
		})
	}
}

// TestWatcher drives a Watcher by Poll on a real registry: a change is
// applied after two equal reads, a bad file is refused and counted, the
// last good set stays, and removing the file removes its policies.
func TestWatcher(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	file := filepath.Join(dir, "p.json")
	doc := func(burst string) string {
		return `[{"id":"p","algorithm":"token_bucket","rate_per_sec":1,"burst":` + burst + `,"mode":"enforce"}]`
	}
	write(t, file, doc("2"))
	c := FileConfig{Source: "policies", Paths: []string{dir}, Exts: PolicyExts, MaxBytes: 1 << 20, Parse: PolicyParser}
	files, ps, err := Load(c)
	if err != nil {
		t.Fatal(err)
	}
	reg := quota.NewRegistry(quota.RegistryConfig{})
	must(t, reg.Seed(ctx, "system", ps))
	a := NewApplier(reg)
	must(t, a.Claim("policies", ps))
	prom := prometheus.NewRegistry()
	w, err := NewWatcher(c, files, a, NewReporter(nil, prom))
	if err != nil {
		t.Fatal(err)
	}
	burst := func() float64 { p, _ := reg.Get("p"); return p.Burst }
	write(t, file, doc("5"))
	w.Poll(ctx)
	if burst() != 2 {
		t.Fatal("applied after one read")
	}
	w.Poll(ctx)
	if burst() != 5 {
		t.Fatalf("burst %v after two equal reads, want 5", burst())
	}
	write(t, file, doc("-1"))
	w.Poll(ctx)
	w.Poll(ctx)
	w.Poll(ctx)
	if burst() != 5 {
		t.Errorf("burst %v after a bad file, want the last good 5", burst())
	}
	if n := testutil.ToFloat64(w.report.errs.WithLabelValues("policies")); n != 1 {
		t.Errorf("reload errors = %v, want 1 (counted once)", n)
	}
	must(t, os.Remove(file))
	w.Poll(ctx)
	w.Poll(ctx)
	if _, ok := reg.Get("p"); ok {
		t.Error("the policy of a deleted file is still in force")
	}
}
