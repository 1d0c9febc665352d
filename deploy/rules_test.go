package deploy

import (
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// promtool runs promtool (Debian package prometheus, which .ci/test-deps
// installs); it is a failure, not a skip, when it is missing.
func promtool(t *testing.T, args ...string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("runs promtool; skipped under -short")
	}
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: install the Debian package prometheus (make test-deps does)")
	}
	out, err := exec.Command(p, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %v: %v\n%s", args, err, out)
	}
	return string(out)
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Record      string            `yaml:"record"`
			Expr        string            `yaml:"expr"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

type ruleTests struct {
	Tests []struct {
		Name      string `yaml:"name"`
		AlertTest []struct {
			Alertname string `yaml:"alertname"`
			ExpAlerts []any  `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func alertNames(t *testing.T) []string {
	var rf ruleFile
	readYAML(t, "prometheus/alerts.yml", &rf)
	var names []string
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				names = append(names, r.Alert)
			}
		}
	}
	return names
}

// promtool accepts the rules and passes their unit tests; every alert has
// a unit test in which it fires, and a runbook entry its runbook_url names.
func TestAlertRules(t *testing.T) {
	out := promtool(t, "check", "rules", "prometheus/alerts.yml")
	if !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool check rules:\n%s", out)
	}
	out = promtool(t, "test", "rules", "prometheus/alerts_test.yml")
	if !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool test rules:\n%s", out)
	}

	var tests ruleTests
	readYAML(t, "prometheus/alerts_test.yml", &tests)
	fires := map[string]bool{}
	for _, tc := range tests.Tests {
		for _, at := range tc.AlertTest {
			if len(at.ExpAlerts) > 0 {
				fires[at.Alertname] = true
			}
		}
	}
	runbook, err := os.ReadFile("../docs/runbook.md")
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	readYAML(t, "prometheus/alerts.yml", &rf)
	names := alertNames(t)
	if len(names) < 11 {
		t.Fatalf("%d alerts, want at least the 11 of docs/runbook.md", len(names))
	}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			if !fires[r.Alert] {
				t.Errorf("alert %s: no unit test in alerts_test.yml expects it to fire", r.Alert)
			}
			if want := "docs/runbook.md#" + strings.ToLower(r.Alert); r.Annotations["runbook_url"] != want {
				t.Errorf("alert %s: runbook_url %q, want %q", r.Alert, r.Annotations["runbook_url"], want)
			}
			if !regexp.MustCompile(`(?m)^### ` + r.Alert + `$`).Match(runbook) {
				t.Errorf("alert %s: docs/runbook.md has no \"### %s\" section", r.Alert, r.Alert)
			}
		}
	}
}

// dashboard is the part of a Grafana dashboard the test reads.
type dashboard struct {
	Title  string `json:"title"`
	UID    string `json:"uid"`
	Panels []struct {
		Type    string `json:"type"`
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// The dashboard parses, every panel but a row has a query, and each
// query's metrics are Sluice's (checked against a running daemon's
// /metrics by cmd/sluice's TestOpsMetricsExported).
func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile("grafana/sluice.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("grafana/sluice.json: %v", err)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("dashboard uid %q title %q, want both", d.UID, d.Title)
	}
	metric := regexp.MustCompile(`\bsluice_[a-z0-9_]+`)
	n := 0
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if !metric.MatchString(tg.Expr) {
				t.Errorf("panel %q: query %q uses no sluice metric", p.Title, tg.Expr)
			}
			n++
		}
	}
	if n < 20 {
		t.Errorf("%d queries, want the dashboard's 20 or more", n)
	}
	// Every alert's metric is on the dashboard too, so that an alert can
	// be looked at where it fired.
	var rf ruleFile
	readYAML(t, "prometheus/alerts.yml", &rf)
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			for _, m := range metric.FindAllString(r.Expr, -1) {
				base := strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_count")
				if !slices.ContainsFunc(metric.FindAllString(string(b), -1), func(s string) bool { return strings.HasPrefix(s, base) }) {
					t.Errorf("alert %s queries %s, which no dashboard panel shows", r.Alert, m)
				}
			}
		}
	}
}
