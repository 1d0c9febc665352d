package main

import (
	"slices"
	"testing"
)

// TestSeeds: every daemon joins the other daemons of its region and the
// first daemon of every other region, as the Helm chart seeds a daemon,
// never itself.
func TestSeeds(t *testing.T) {
	var all []*daemon
	for _, r := range []string{"single", "sentinel", "cluster"} {
		for _, i := range []string{"0", "1"} {
			all = append(all, &daemon{name: r + "-" + i, region: r, advertise: r + "-" + i + ":7946"})
		}
	}
	want := map[string][]string{
		"single-0":   {"single-1:7946", "sentinel-0:7946", "cluster-0:7946"},
		"single-1":   {"single-0:7946", "sentinel-0:7946", "cluster-0:7946"},
		"sentinel-0": {"single-0:7946", "sentinel-1:7946", "cluster-0:7946"},
		"sentinel-1": {"single-0:7946", "sentinel-0:7946", "cluster-0:7946"},
		"cluster-0":  {"single-0:7946", "sentinel-0:7946", "cluster-1:7946"},
		"cluster-1":  {"single-0:7946", "sentinel-0:7946", "cluster-0:7946"},
	}
	for _, d := range all {
		if got := seeds(all, d); !slices.Equal(got, want[d.name]) {
			t.Errorf("seeds(%s) = %v, want %v", d.name, got, want[d.name])
		}
	}
}
