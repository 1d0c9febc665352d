package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/redistest"
)

// opsMetricNames are the sluice_* series the alert rules and the Grafana
// dashboard query.
func opsMetricNames(t *testing.T) map[string][]string {
	t.Helper()
	names := map[string][]string{} // name -> files using it
	re := regexp.MustCompile(`\bsluice_[a-z0-9_]+`)
	for _, f := range []string{"../../deploy/prometheus/alerts.yml", "../../deploy/grafana/sluice.json"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range re.FindAllString(string(b), -1) {
			if f := filepath.Base(f); !strings.HasPrefix(n, "sluice_region") && !slices.Contains(names[n], f) { // sluice_region: the target label
				names[n] = append(names[n], f)
			}
		}
	}
	return names
}

// exported reads the series names of a daemon's /metrics.
func exported(d *daemon) map[string]bool {
	r := d.do("GET", "/metrics", "")
	out := map[string]bool{}
	for _, l := range strings.Split(r.body, "\n") {
		if l == "" || l[0] == '#' {
			continue
		}
		if i := strings.IndexAny(l, "{ "); i > 0 {
			out[l[:i]] = true
		}
	}
	return out
}

// Every metric an alert or a dashboard panel queries is exported by a
// running daemon: two regions, one on Redis and one on the memory store
// serving the rate limit service too, after checks that allow, reject,
// would reject under a shadow policy and spend a global quota.
func TestOpsMetricsExported(t *testing.T) {
	bin := buildSluice(t)
	policies := writeFile(t, "policies.json", `[
	 {"id":"tight","algorithm":"fixed_window","limit":1,"window":3600,"mode":"enforce","match":{"routes":["/t"]}},
	 {"id":"preview","algorithm":"fixed_window","limit":1,"window":3600,"match":{"routes":["/s"]}},
	 {"id":"daily","algorithm":"fixed_window","limit":100,"window":86400,"mode":"enforce","scope":"global","match":{"routes":["/g"]}}]`)
	key := writeFile(t, "gossip.key", "c2x1aWNlLXRlc3QtZ29zc2lwLWtleS0zMi1ieXRlcyE=")
	events := filepath.Join(t.TempDir(), "events.jsonl")
	seedPort := freeGossipPort(t)
	common := []string{"--policies", policies, "--gossip-preset", "local", "--gossip-interval", "1s", "--gossip-key-file", key}
	eu := startDaemon(t, bin, append(common, "--region", "eu", "--node", "eu-1", "--store", "redis://"+redistest.Start(t).Addr(),
		"--store-timeout", "200ms", "--gossip-listen", "127.0.0.1:"+strconv.Itoa(seedPort), "--decision-log", events)...)
	us := startDaemon(t, bin, append(common, "--region", "us", "--node", "us-1", "--rls-listen", "127.0.0.1:0",
		"--gossip-listen", "127.0.0.1:"+strconv.Itoa(freeGossipPort(t)), "--join", "127.0.0.1:"+strconv.Itoa(seedPort))...)
	for _, d := range []*daemon{eu, us} {
		for _, route := range []string{"/t", "/t", "/s", "/s", "/g"} {
			if r := d.do("POST", "/v1/check", fmt.Sprintf(`{"user":"u1","route":%q}`, route)); r.status != 200 && r.status != 429 {
				t.Fatalf("check %s = %d %s", route, r.status, r.body)
			}
		}
		if r := d.do("POST", "/v1/check", `{"route":"/t"}`); r.status != 400 {
			t.Fatalf("check without a subject = %d, want 400", r.status)
		}
	}

	names := opsMetricNames(t)
	if len(names) < 20 {
		t.Fatalf("%d metric names in the rules and dashboard, want 20 or more", len(names))
	}
	missing := func() []string {
		have := exported(eu)
		for n := range exported(us) {
			have[n] = true
		}
		var out []string
		for n := range names {
			// Exported only with TLS on a listener: TestServeTLS checks them.
			if !have[n] && !strings.HasPrefix(n, "sluice_tls_") {
				out = append(out, n)
			}
		}
		sort.Strings(out)
		return out
	}
	deadline := time.Now().Add(30 * time.Second)
	for m := missing(); len(m) > 0; m = missing() {
		if time.Now().After(deadline) {
			for _, n := range m {
				t.Errorf("%s (queried by %s) is not exported by a running daemon", n, strings.Join(names[n], ", "))
			}
			return
		}
		<-time.After(200 * time.Millisecond)
	}
}
