package region

import (
	"testing"
	"time"
)

func TestHeaderFormatting(t *testing.T) {
	items := []headerItem{{Name: "burst", Quota: 100, Window: 1, Available: 50, T: 30}, {Name: "daily", Quota: 1000, Window: 86400, Available: 999, T: 0}}
	if got, want := formatPolicyHeader(items), `"burst";q=100;w=1, "daily";q=1000;w=86400`; got != want {
		t.Errorf("formatPolicyHeader = %s, want %s", got, want)
	}
	if got, want := formatRateLimitHeader(items), `"burst";r=50;t=30, "daily";r=999;t=0`; got != want {
		t.Errorf("formatRateLimitHeader = %s, want %s", got, want)
	}
	for _, tc := range []struct {
		d    time.Duration
		want int64
	}{{0, 0}, {time.Nanosecond, 1}, {10 * time.Millisecond, 1}, {time.Second, 1}, {time.Second + time.Millisecond, 2}} {
		if got := ceilSeconds(tc.d); got != tc.want {
			t.Errorf("ceilSeconds(%v) = %d, want %d", tc.d, got, tc.want)
		}
	}
	for _, tc := range []struct {
		windowed    bool
		window      time.Duration
		rate, burst float64
		want        int64
	}{{false, 0, 100, 100, 1}, {false, 0, 10, 200, 20}, {false, 0, 3, 10, 4}, {true, time.Minute, 0, 0, 60}, {true, 500 * time.Millisecond, 0, 0, 1}} {
		if got := windowSeconds(tc.windowed, tc.window, tc.rate, tc.burst); got != tc.want {
			t.Errorf("windowSeconds(%v, %v, %v, %v) = %d, want %d", tc.windowed, tc.window, tc.rate, tc.burst, got, tc.want)
		}
	}
	got, err := ParseRateLimitList(`"peruser";q=65535;qu="content-bytes";w=10, "default";r=50;t=30`)
	if err != nil || len(got) != 2 || got[0].Params["qu"] != "content-bytes" || got[1].Params["r"] != "50" {
		t.Errorf("ParseRateLimitList = %+v, %v", got, err)
	}
	for _, bad := range []string{`burst;q=1`, `"a";q=1,`, `"a";Q=1`, `"a" "b"`} {
		if _, err := ParseRateLimitList(bad); err == nil {
			t.Errorf("ParseRateLimitList(%q) accepted", bad)
		}
	}
}
