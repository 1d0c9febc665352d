package main

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/soak"
)

func TestParseMetrics(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		g       int64
		lost    map[string]soak.Loss
		wantErr string
	}{
		{"both", "# HELP go_goroutines x\ngo_goroutines 42\n" +
			`sluice_globalshare_region_lost_total{region="cluster",stage="reclaimed"} 1` + "\n" +
			`sluice_globalshare_region_lost_total{region="cluster",stage="silent"} 2` + "\n" +
			`sluice_globalshare_region_lost_total{region="single",stage="silent"} 0` + "\n",
			42, map[string]soak.Loss{"cluster": {Count: 2, Reclaimed: 1}, "single": {}}, ""},
		{"no losses yet", "go_goroutines 7\n", 7, map[string]soak.Loss{}, ""},
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

// redisFigures reads a real primary's keys and memory: the dataset is part
// of the memory, and grows with the keys.
func TestRedisFigures(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	keys, empty, primary := redisFigures(ctx, srv.Addr())
	if !primary || keys != 0 || empty.used <= 0 || empty.dataset < 0 || empty.dataset > empty.used || empty.persistent != 0 {
		t.Fatalf("redisFigures(empty) = %d, %+v, %v, want a primary with no keys and 0 ≤ dataset ≤ used", keys, empty, primary)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer c.Close()
	for i := range 1000 {
		ttl := time.Duration(0) // the first 10 keys never expire
		if i >= 10 {
			ttl = time.Hour
		}
		if err := c.Set(ctx, fmt.Sprintf("k%d", i), strings.Repeat("v", 100), ttl).Err(); err != nil {
			t.Fatal(err)
		}
	}
	keys, full, _ := redisFigures(ctx, srv.Addr())
	if keys != 1000 || full.dataset < empty.dataset+100_000 || full.dataset > full.used || full.persistent != 10 {
		t.Errorf("redisFigures(1000 keys of 100 bytes, 10 without a TTL) = %d, %+v (empty: %+v), want 1000 keys, 100 kB more dataset, 10 persistent", keys, full, empty)
	}
}

// exposition is a daemon's /metrics as the soak reads it every 10 s: a few
// hundred series, two of which it wants.
func exposition() string {
	var b strings.Builder
	for i := range 300 {
		fmt.Fprintf(&b, "# TYPE sluice_series_%d gauge\nsluice_series_%d{shard=\"%d\"} %d\n", i, i, i%4, i)
	}
	b.WriteString("# TYPE go_goroutines gauge\ngo_goroutines 750\n# TYPE sluice_globalshare_region_lost_total counter\n")
	for _, r := range []string{"cluster", "sentinel"} {
		fmt.Fprintf(&b, "sluice_globalshare_region_lost_total{region=%q,stage=\"reclaimed\"} 1\n", r)
		fmt.Fprintf(&b, "sluice_globalshare_region_lost_total{region=%q,stage=\"silent\"} 3\n", r)
	}
	return b.String()
}

// parseMetrics scans for its two metrics; expfmt, the library's parser,
// builds every family first.
func BenchmarkParseMetrics(b *testing.B) {
	in := exposition()
	b.Run("parseMetrics", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := parseMetrics(strings.NewReader(in), "d:1"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("expfmt", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			p := expfmt.NewTextParser(model.UTF8Validation)
			fams, err := p.TextToMetricFamilies(strings.NewReader(in))
			if err != nil || len(fams["sluice_globalshare_region_lost_total"].GetMetric()) != 4 {
				b.Fatal(err)
			}
		}
	})
}
