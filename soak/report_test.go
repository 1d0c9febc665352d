package soak

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestReportWritesEveryViolation: the JSON round-trips the violations and
// the page is self-contained (inline SVG, no outside reference) and lists
// each one with its faults.
func TestReportWritesEveryViolation(t *testing.T) {
	reqs := admitted(25, "eu", "api", "hot", 0)
	faults := []Span{{Kind: PauseRedis, Region: "us", Start: at(1), End: at(3)}}
	vs, wins := Check(reqs, []PolicyState{policy("api", 20, false, "local")}, faults, Bounds{Latency: time.Second, ChartSubject: "hot"})
	deg := DegradedShares(reqs, faults, Bounds{Settle: time.Second})
	if len(deg) != 1 || deg[0] != (DegradedFigure{Region: "eu", Answers: 25}) {
		t.Errorf("DegradedShares() = %+v, want 25 answers in eu, none degraded", deg)
	}
	r := &Report{Seed: 3, Duration: "10s", Started: t0, Ended: at(10), Faults: faults, Violations: vs, Windows: wins,
		Counts: Counts(reqs), Latency: Latencies(reqs, 10*time.Second), Degraded: deg}
	var j, h bytes.Buffer
	if err := r.WriteJSON(&j); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(j.Bytes(), &back); err != nil || len(back.Violations) != 1 || back.Violations[0].Rule != RuleOverAdmission {
		t.Fatalf("JSON report = %+v, %v; want the one over-admission back", back.Violations, err)
	}
	if err := r.WriteHTML(&h); err != nil {
		t.Fatal(err)
	}
	page := h.String()
	for _, want := range []string{"<svg", "over-admission", "eu/api/hot", "pause-redis us", "violations=1", "degraded_healthy=[eu 0/25]"} {
		if !strings.Contains(page, want) {
			t.Errorf("HTML report lacks %q", want)
		}
	}
	for _, bad := range []string{"<script src", "<link", "<img", "https://"} {
		if strings.Contains(page, bad) {
			t.Errorf("HTML report is not self-contained: has %q", bad)
		}
	}
	if len(wins) != 1 || wins[0].Admitted != 25 || wins[0].Bound != 20 {
		t.Errorf("Check() windows of the chart subject = %+v, want one of 25 against 20", wins)
	}
}
