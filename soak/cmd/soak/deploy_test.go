package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
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

// TestWaitReadyNamesTheLog: a daemon that never answers is reported with
// the end of its log, where one that could not bind its address says so.
func TestWaitReadyNamesTheLog(t *testing.T) {
	addr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(t.TempDir(), "d.log")
	line := `{"level":"ERROR","msg":"listen tcp ` + addr + `: bind: address already in use"}`
	if err := os.WriteFile(logPath, []byte(strings.Repeat("x", 4096)+"\n"+line+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := &daemon{name: "single-0", addr: addr, logPath: logPath}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	err = d.waitReady(ctx)
	if err == nil || !strings.Contains(err.Error(), line) {
		t.Fatalf("waitReady = %v, want the log's last line %s", err, line)
	}
	if strings.Contains(err.Error(), strings.Repeat("x", 2048)) {
		t.Fatalf("waitReady quotes more than the log's end: %d bytes", len(err.Error()))
	}
}
