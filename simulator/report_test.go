package simulator

import (
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteOutputs(t *testing.T) {
	sc, _ := Builtin("shift")
	sc.Duration = sec(60)
	r, err := Run(context.Background(), sc, Options{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files, err := WriteOutputs(dir, r)
	if err != nil {
		t.Fatalf("WriteOutputs = %v", err)
	}
	want := []string{"shift.json", "global.svg", "region-r0.svg", "region-r1.svg", "region-r2.svg", "shares.svg", "report.html"}
	if strings.Join(files, ",") != strings.Join(want, ",") {
		t.Errorf("WriteOutputs files = %v, want %v", files, want)
	}
	page, err := os.ReadFile(filepath.Join(dir, "report.html"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range want[1 : len(want)-1] {
		svg, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(svg), "<svg") {
			t.Errorf("%s is not SVG", f)
		}
		// Self-contained: the page embeds each chart's bytes, naming the file.
		if !strings.Contains(string(page), `data-file="`+f+`"`) ||
			!strings.Contains(string(page), base64.StdEncoding.EncodeToString(svg)) {
			t.Errorf("report.html does not embed %s", f)
		}
	}
	if strings.Contains(string(page), `src="http`) || strings.Contains(string(page), `href="http`) {
		t.Error("report.html refers to outside resources")
	}
}
