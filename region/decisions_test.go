package region

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluice-rl/sluice/decisionlog"
)

// A shadow policy's would-rejects appear in the decision stream (subject
// hashed) and in its top list, so that it can be judged before it is
// enforced; an enforced policy's rejections in its own.
func TestShadowWouldRejectsInStreamAndTopList(t *testing.T) {
	path := filepath.Join(t.TempDir(), "events.jsonl")
	h := newHarness(t, func(c *Config) {
		c.DecisionLog.Path = path
		c.DecisionLog.AllowRate = 0
	})
	h.putPolicy("strict", `{"algorithm":"fixed_window","limit":1,"window":3600,"match":{"routes":["/x"]}}`) // shadow
	h.putPolicy("gate", `{"algorithm":"fixed_window","limit":2,"window":3600,"mode":"enforce","match":{"routes":["/y"]}}`)
	for i := range 4 {
		h.do("POST", "/v1/check", `{"user":"heavy","route":"/x"}`)
		h.do("POST", "/v1/check", fmt.Sprintf(`{"user":"light%d","route":"/x"}`, i))
	}
	h.do("POST", "/v1/check", `{"user":"light0","route":"/x"}`)
	for range 3 {
		h.do("POST", "/v1/check", `{"user":"heavy","route":"/y"}`)
	}

	r := h.admin("GET", "/v1/decisions/top?policy=strict&limit=2", "")
	if r.status != 200 {
		t.Fatalf("top = %d %s", r.status, r.body)
	}
	var top TopLimited
	if err := json.Unmarshal(r.body, &top); err != nil {
		t.Fatal(err)
	}
	want := `[{strict would_reject 4 [{user:heavy 3} {user:light0 1}]}]`
	if got := topString(top.Lists); got != want || top.WindowSeconds != 300 {
		t.Errorf("top of strict = %s over %v s, want %s over 300 s", got, top.WindowSeconds, want)
	}
	r = h.admin("GET", "/v1/decisions/top", "")
	json.Unmarshal(r.body, &top)
	if got, want := topString(top.Lists), `[{gate rejected 1 [{user:heavy 1}]} {strict would_reject 4 [{user:heavy 3} {user:light0 1}]}]`; got != want {
		t.Errorf("top = %s, want %s", got, want)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- h.d.events.Run(ctx) }()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var shadow, rejected int
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var e decisionlog.Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("event %q: %v", sc.Text(), err)
		}
		if e.Subject != "" || len(e.SubjectHash) != 16 {
			t.Errorf("event %s: want the subject hashed", sc.Text())
		}
		switch {
		case e.Decision == "allowed" && len(e.WouldReject) == 1 && e.WouldReject[0] == "strict" && e.Route == "/x":
			shadow++
		case e.Decision == "rejected" && len(e.Violated) == 1 && e.Violated[0] == "gate":
			rejected++
		default:
			t.Errorf("unexpected event %s (allowed ones are sampled at 0)", sc.Text())
		}
	}
	if shadow != 4 || rejected != 1 {
		t.Errorf("stream has %d would-rejects and %d rejections, want 4 and 1", shadow, rejected)
	}
}

func topString(ls []decisionlog.PolicyTop) string {
	var b strings.Builder
	b.WriteString("[")
	for i, l := range ls {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "{%s %s %d [", l.Policy, l.Kind, l.Total)
		for j, s := range l.Subjects {
			if j > 0 {
				b.WriteString(" ")
			}
			fmt.Fprintf(&b, "{%s %d}", s.Subject, s.Count)
		}
		b.WriteString("]}")
	}
	b.WriteString("]")
	return b.String()
}

func TestTopLimitedBadInput(t *testing.T) {
	h := newHarness(t, nil)
	tests := []struct {
		query  string
		status int
		field  string
	}{
		{"?limit=0", 400, "limit"},
		{"?limit=abc", 400, "limit"},
		{"?limit=1001", 400, "limit"},
		{"?sort=count", 400, "sort"},
		{"?policy=nope", 404, ""},
	}
	for _, tc := range tests {
		r := h.admin("GET", "/v1/decisions/top"+tc.query, "")
		if r.status != tc.status || tc.field != "" && !strings.Contains(string(r.body), `"field":"`+tc.field+`"`) {
			t.Errorf("GET /v1/decisions/top%s = %d %s, want %d naming %q", tc.query, r.status, r.body, tc.status, tc.field)
		}
	}
}

func TestDecisionLogConfigErrorsAtStart(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"rate above one", func(c *Config) { c.DecisionLog.RejectRate = 2 }, "reject rate must be in [0, 1]"},
		{"unwritable file", func(c *Config) { c.DecisionLog.Path = t.TempDir() }, "decision log: "},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Policies = nil
			tc.mutate(&cfg)
			_, err := New(context.Background(), cfg, nil, nil, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New = %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// Each policy a check matched counts under its own decision and the
// check's tier; tiers past the bound count as other.
func TestPolicyChecksMetric(t *testing.T) {
	h := newHarness(t, nil)
	h.putPolicy("strict", `{"algorithm":"fixed_window","limit":1,"window":3600,"match":{"routes":["/x"]}}`)
	h.putPolicy("gate", `{"algorithm":"fixed_window","limit":1,"window":3600,"mode":"enforce","match":{"routes":["/x"]}}`)
	h.do("POST", "/v1/check", `{"user":"u","route":"/x","tier":"gold"}`)
	h.do("POST", "/v1/check", `{"user":"u","route":"/x","tier":"gold"}`)
	h.do("POST", "/v1/check", `{"user":"v","route":"/x","tier":"gold"}`)
	h.do("POST", "/v1/check", `{"user":"v","route":"/x","tier":"gold"}`)
	for _, tc := range []struct {
		labels [4]string
		want   float64
	}{
		{[4]string{"gate", "gold", "allowed", "store"}, 2},
		{[4]string{"gate", "gold", "rejected", "store"}, 2},
		{[4]string{"strict", "gold", "allowed", "store"}, 2},
		{[4]string{"strict", "gold", "not_evaluated", "none"}, 2},
	} {
		if got := counterOf(t, h.d.m.policyChecks, tc.labels[:]...); got != tc.want {
			t.Errorf("sluice_policy_checks_total%v = %v, want %v", tc.labels, got, tc.want)
		}
	}
	for i := range maxTierLabels + 5 {
		h.do("POST", "/v1/check", fmt.Sprintf(`{"user":"w%d","route":"/x","tier":"t%d"}`, i, i))
	}
	tiers := map[string]bool{}
	ch := make(chan prometheus.Metric, 1000)
	h.d.m.policyChecks.Collect(ch)
	close(ch)
	for m := range ch {
		var pb dto.Metric
		m.Write(&pb)
		for _, l := range pb.GetLabel() {
			if l.GetName() == "tier" {
				tiers[l.GetValue()] = true
			}
		}
	}
	if len(tiers) != maxTierLabels+1 || !tiers[otherLabel] {
		t.Errorf("%d tier label values, want %d and other among them", len(tiers), maxTierLabels+1)
	}
}

func counterOf(t *testing.T, vec *prometheus.CounterVec, labels ...string) float64 {
	t.Helper()
	var m dto.Metric
	if err := vec.WithLabelValues(labels...).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// Each check of an enforced global policy observes the fraction of the
// limit it left, so that an alert can see a global limit nearly spent.
func TestGlobalRemainingRatio(t *testing.T) {
	h := newHarness(t, nil)
	h.putPolicy("daily", `{"algorithm":"fixed_window","limit":10,"window":86400,"scope":"global","mode":"enforce","match":{"routes":["/q"]}}`)
	for range 10 {
		h.do("POST", "/v1/check", `{"user":"u","route":"/q"}`)
	}
	var m dto.Metric
	if err := h.d.m.globalLeft.WithLabelValues("daily").(prometheus.Histogram).Write(&m); err != nil {
		t.Fatal(err)
	}
	hist := m.GetHistogram()
	if hist.GetSampleCount() != 10 {
		t.Fatalf("%d observations, want 10", hist.GetSampleCount())
	}
	// Remaining 9, 8, ..., 0 of 10: 0.0 once, at most 0.1 twice.
	for _, b := range hist.GetBucket() {
		want := map[float64]uint64{0: 1, 0.05: 1, 0.1: 2, 0.25: 3, 0.5: 6, 0.75: 8, 1: 10}[b.GetUpperBound()]
		if b.GetCumulativeCount() != want {
			t.Errorf("bucket le=%v = %d, want %d", b.GetUpperBound(), b.GetCumulativeCount(), want)
		}
	}
}
