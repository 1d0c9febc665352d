package main

import (
	"maps"
	"strings"
	"testing"
)

func TestParseMetrics(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		g       int64
		lost    map[string]float64
		wantErr string
	}{
		{"both", "# HELP go_goroutines x\ngo_goroutines 42\n" +
			`sluice_globalshare_region_lost_total{region="cluster",stage="reclaimed"} 1` + "\n" +
			`sluice_globalshare_region_lost_total{region="cluster",stage="silent"} 2` + "\n" +
			`sluice_globalshare_region_lost_total{region="single",stage="silent"} 0` + "\n",
			42, map[string]float64{"cluster": 2, "single": 0}, ""},
		{"no losses yet", "go_goroutines 7\n", 7, map[string]float64{}, ""},
		{"no goroutines", `sluice_globalshare_region_lost_total{region="a",stage="silent"} 1`, 0, nil, "no go_goroutines"},
		{"bad goroutines", "go_goroutines many\n", 0, nil, "go_goroutines"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g, lost, err := parseMetrics(strings.NewReader(tc.in), "d:1")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("parseMetrics = %v, want an error with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || g != tc.g || !maps.Equal(lost, tc.lost) {
				t.Errorf("parseMetrics = %d, %v, %v, want %d, %v", g, lost, err, tc.g, tc.lost)
			}
		})
	}
}
