package testtools

import (
	"os"
	"path/filepath"
	"testing"
)

func TestDirFollowsSluiceTools(t *testing.T) {
	d := t.TempDir()
	t.Setenv("SLUICE_TOOLS", d)
	if got := Dir(t); got != d {
		t.Errorf("Dir = %q with SLUICE_TOOLS=%q", got, d)
	}
	t.Setenv("SLUICE_TOOLS", "")
	home, _ := os.UserHomeDir()
	if got, want := Dir(t), filepath.Join(home, ".cache", "sluice-tools"); got != want {
		t.Errorf("Dir = %q without SLUICE_TOOLS, want %q", got, want)
	}
}

// An installed program is returned as it is: go install does not run.
func TestInstallKeepsWhatIsBuilt(t *testing.T) {
	d := t.TempDir()
	t.Setenv("SLUICE_TOOLS", d)
	p := filepath.Join(d, "x@v1", "x")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", "") // a go install would fail: no go on PATH
	got, err := Install(t, "x@v1", "example.com/x", "v1", "x")
	if err != nil || got != p {
		t.Errorf("Install = %q, %v, want %q", got, err, p)
	}
	if _, err := Install(t, "y@v1", "example.com/y", "v1", "y"); err == nil {
		t.Error("Install of a program that is not built, without go on PATH, succeeded")
	}
}
