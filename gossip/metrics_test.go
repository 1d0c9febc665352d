package gossip

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluice-rl/sluice/internal/testwait"
)

func TestReportAgesAndSkew(t *testing.T) {
	t0 := time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)
	c := &clusterCollector{n: &Node{cfg: Config{Region: "eu"}}, lastReport: map[string]time.Time{
		"us": t0.Add(-2 * time.Second),
		"ap": t0.Add(-time.Second), // its nodes left
	}}
	m := func(node, region string, state State, hash string, since time.Duration) member {
		return member{Member: Member{Node: node, Region: region, State: state, PolicyHash: hash}, since: t0.Add(-since)}
	}
	tests := []struct {
		name    string
		members []member
		own     string
		ages    map[string]time.Duration
		skewed  int
	}{
		{"alone", []member{m("eu1", "eu", StateAlive, "h1", time.Hour)}, "h1", map[string]time.Duration{}, 0},
		{"in agreement", []member{m("eu1", "eu", StateAlive, "h1", time.Hour), m("us1", "us", StateAlive, "h1", time.Minute)}, "h1",
			map[string]time.Duration{"us": 2 * time.Second}, 0},
		{"a region that never reported is as old as its first node", []member{m("eu1", "eu", StateAlive, "h1", time.Hour),
			m("jp1", "jp", StateAlive, "h1", 5*time.Second), m("jp2", "jp", StateSuspect, "h1", 9*time.Second)}, "h1",
			map[string]time.Duration{"jp": 9 * time.Second}, 0},
		{"a region that left is not listed, a crashed one is", []member{m("eu1", "eu", StateAlive, "h1", time.Hour),
			m("ap1", "ap", StateLeft, "h0", time.Minute), m("us1", "us", StateDead, "h0", time.Minute)}, "h1",
			map[string]time.Duration{"us": 2 * time.Second}, 0},
		{"another region skewed", []member{m("eu1", "eu", StateAlive, "h1", time.Hour), m("us1", "us", StateAlive, "h1", time.Minute),
			m("us2", "us", StateAlive, "h2", time.Minute)}, "h1", map[string]time.Duration{"us": 2 * time.Second}, 1},
		{"a sibling skewed too", []member{m("eu1", "eu", StateAlive, "h1", time.Hour), m("eu2", "eu", StateSuspect, "", time.Hour),
			m("us1", "us", StateAlive, "h2", time.Minute)}, "h1", map[string]time.Duration{"us": 2 * time.Second}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ages := c.reportAges(tt.members, t0)
			if len(ages) != len(tt.ages) {
				t.Errorf("reportAges = %v, want %v", ages, tt.ages)
			}
			for r, want := range tt.ages {
				if got, ok := ages[r]; !ok || got != want {
					t.Errorf("reportAges[%s] = %v, %v; want %v", r, got, ok, want)
				}
			}
			if got := skewedRegions(tt.members, tt.own); got != tt.skewed {
				t.Errorf("skewedRegions = %d, want %d", got, tt.skewed)
			}
		})
	}
}

// gauge reads one series of reg: the gauge name with label region (""
// for a series without labels); false if reg has no such series.
func gauge(t *testing.T, reg prometheus.Gatherer, name, region string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			got := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "region" {
					got = l.GetValue()
				}
			}
			if got == region {
				return m.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

// TestClusterMetrics runs two regions on loopback and reads eu's report
// age of us and its policy-set skew as us reports, changes its policy set
// and leaves.
func TestClusterMetrics(t *testing.T) {
	t.Parallel()
	eu := startNode(t, "m-eu1", "eu", keyA)
	us := startNode(t, "m-us1", "us", keyA, eu.Addr())
	testwait.For(t, 30*time.Second, "2 nodes to see each other", func() bool { return eu.NumLive() == 2 && us.NumLive() == 2 })
	age := func() (float64, bool) { return gauge(t, eu.reg, "sluice_gossip_report_age_seconds", "us") }
	skew := func() float64 { v, _ := gauge(t, eu.reg, "sluice_policy_set_skewed_regions", ""); return v }

	if _, ok := gauge(t, eu.reg, "sluice_gossip_report_age_seconds", "eu"); ok {
		t.Error("eu lists a report age of its own region")
	}
	// No report yet: the age counts from us's join.
	testwait.For(t, 30*time.Second, "the age of us to pass 0.5 s without a report", func() bool { a, ok := age(); return ok && a > 0.5 })
	before, _ := age()
	if err := us.BroadcastReport(context.Background(), testReport("us", 100, 1)); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 30*time.Second, "a report to reset the age of us", func() bool { a, _ := age(); return a < before })

	eu.SetPolicyVersion(1, "h1")
	us.SetPolicyVersion(1, "h1")
	testwait.For(t, 30*time.Second, "no skew on one set", func() bool { return skew() == 0 })
	us.SetPolicyVersion(2, "h2")
	testwait.For(t, 30*time.Second, "skew when us holds another set", func() bool { return skew() == 1 })
	eu.SetPolicyVersion(2, "h2")
	testwait.For(t, 30*time.Second, "no skew once eu holds it too", func() bool { return skew() == 0 })

	us.close()
	testwait.For(t, 30*time.Second, "us to be seen as left and its age no longer listed", func() bool { _, ok := age(); return !ok })
}
