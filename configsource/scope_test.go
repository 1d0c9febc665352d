package configsource

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-rl/sluice/quota"
)

// A watched envoyproxy/ratelimit file whose rate_limit gives an unknown
// scope is refused on reload: the last good policy (scope: global) stays
// in force, and one log line names the file, line and field.
func TestEnvoyReloadRefusesUnknownScope(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	file := filepath.Join(dir, "rl.yaml")
	doc := func(scope string) string {
		return "domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: second\n      requests_per_unit: 100\n      algorithm: token_bucket\n      scope: " + scope + "\n"
	}
	write(t, file, doc("global"))
	c := FileConfig{Source: "envoy-config", Paths: []string{dir}, Exts: EnvoyExts, MaxBytes: 1 << 20, Parse: EnvoyParser(false)}
	files, ps, err := Load(c)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 1 || ps[0].Scope != quota.ScopeGlobal {
		t.Fatalf("loaded %+v, want one global policy", ps)
	}
	reg := quota.NewRegistry(quota.RegistryConfig{})
	must(t, reg.Seed(ctx, "system", ps))
	a := NewApplier(reg)
	must(t, a.Claim("envoy-config", ps))
	var logs bytes.Buffer
	w, err := NewWatcher(c, files, a, NewReporter(slog.New(slog.NewJSONHandler(&logs, nil)), prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	write(t, file, doc("planet"))
	for range 3 {
		w.Poll(ctx)
	}
	if p, ok := reg.Get(ps[0].ID); !ok || p.Scope != quota.ScopeGlobal {
		t.Errorf("policy after a bad reload = %+v, %v, want the last good, global", p, ok)
	}
	if n := testutil.ToFloat64(w.report.errs.WithLabelValues("envoy-config")); n != 1 {
		t.Errorf("reload errors = %v, want 1", n)
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	var m struct {
		Msg, File, Field string
		Line             int
	}
	if len(lines) != 1 || json.Unmarshal([]byte(lines[0]), &m) != nil {
		t.Fatalf("log = %q, want one JSON line", logs.String())
	}
	if m.File != file || m.Line != 8 || m.Field != "descriptors[0].rate_limit.scope" {
		t.Errorf("logged %+v, want file %s, line 8, field descriptors[0].rate_limit.scope", m, file)
	}
}
