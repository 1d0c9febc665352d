package main

import (
	"bufio"
	"fmt"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testwait"
)

// scrape reads one series from d's /metrics, given as it is written there
// (name and labels, e.g. `sluice_gossip_report_age_seconds{region="b"}`);
// false if d does not export it.
func (d *daemon) scrape(series string) (float64, bool) {
	d.t.Helper()
	r := d.do("GET", "/metrics", "")
	if r.status != 200 {
		d.t.Fatalf("GET /metrics = %d", r.status)
	}
	sc := bufio.NewScanner(strings.NewReader(r.body))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				d.t.Fatalf("%s = %q, not a number", series, v)
			}
			return f, true
		}
	}
	return 0, false
}

// TestMultiRegionMetrics runs a pair of regions and reads their metrics as
// they start with different policy sets, agree after a change, and one
// of them crashes: sluice_build_info, sluice_policy_set_skewed_regions and
// sluice_gossip_report_age_seconds.
func TestMultiRegionMetrics(t *testing.T) {
	bin := buildSluice(t)
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatalf("sluice version: %v", err)
	}
	version := strings.TrimPrefix(strings.TrimSpace(string(out)), "sluice ")
	policy := func(rate int) string {
		return fmt.Sprintf(`[{"id":"g","algorithm":"token_bucket","rate_per_sec":%d,"burst":10,"mode":"enforce","scope":"global"}]`, rate)
	}
	start := func(region, policies, join string) (*daemon, string) {
		gossip := "127.0.0.1:" + strconv.Itoa(freeGossipPort(t))
		args := []string{"--policies", policies, "--region", region, "--node", region + "1", "--gossip-listen", gossip,
			"--gossip-interval", "1s", "--gossip-preset", "local", "--dev"}
		if join != "" {
			args = append(args, "--join", join)
		}
		return startDaemon(t, bin, args...), gossip
	}
	// Two regions seeded with different policy sets, as after a
	// deployment that gave them different files.
	a, seed := start("a", writeFile(t, "a.json", policy(10)), "")
	b, _ := start("b", writeFile(t, "b.json", policy(20)), seed)

	info := fmt.Sprintf(`sluice_build_info{goversion=%q,version=%q}`, runtime.Version(), version)
	for name, d := range map[string]*daemon{"a": a, "b": b} {
		if v, ok := d.scrape(info); !ok || v != 1 {
			t.Errorf("%s: %s = %v, %v; want 1", name, info, v, ok)
		}
	}
	testwait.For(t, 20*time.Second, "both regions to see both", func() bool {
		va, _ := a.regions()
		vb, _ := b.regions()
		return len(va.Regions) == 2 && len(vb.Regions) == 2
	})
	skewed := func(d *daemon) float64 {
		v, ok := d.scrape("sluice_policy_set_skewed_regions")
		if !ok {
			t.Fatal("no sluice_policy_set_skewed_regions")
		}
		return v
	}
	testwait.For(t, 10*time.Second, "each region to count the other as skewed", func() bool { return skewed(a) == 1 && skewed(b) == 1 })

	// A change in a carries a's whole set to b: one set everywhere.
	if r := a.admin("PUT", "/v1/policies/g", `{"algorithm":"token_bucket","rate_per_sec":30,"burst":10,"mode":"enforce","scope":"global"}`); r.status != 200 {
		t.Fatalf("PUT /v1/policies/g = %d %s", r.status, r.body)
	}
	testwait.For(t, 10*time.Second, "no skew once b applied a's set", func() bool { return skewed(a) == 0 && skewed(b) == 0 })

	// Reports every second keep each region's age of the other small;
	// neither lists its own.
	age := func(d *daemon, region string) (float64, bool) {
		return d.scrape(fmt.Sprintf(`sluice_gossip_report_age_seconds{region=%q}`, region))
	}
	testwait.For(t, 10*time.Second, "fresh reports both ways", func() bool {
		x, okA := age(a, "b")
		y, okB := age(b, "a")
		return okA && okB && x < 2 && y < 2
	})
	if _, ok := age(a, "a"); ok {
		t.Error("a lists a report age of its own region")
	}

	// b crashes: a keeps b's series, aging.
	if err := b.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 20*time.Second, "a's age of b to pass 3 s", func() bool { x, _ := age(a, "b"); return x > 3 })
	was, _ := age(a, "b")
	testwait.For(t, 10*time.Second, "a's age of b to keep growing", func() bool { x, ok := age(a, "b"); return ok && x > was+1 })
}
