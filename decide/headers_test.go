package decide

import (
	"math"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestHeaderFormatting(t *testing.T) {
	items := []HeaderItem{{Name: "burst", Quota: 100, Window: 1, Available: 50, T: 30}, {Name: "daily", Quota: 1000, Window: 86400, Available: 999, T: 0}}
	if got, want := FormatPolicyHeader(items), `"burst";q=100;w=1, "daily";q=1000;w=86400`; got != want {
		t.Errorf("FormatPolicyHeader = %s, want %s", got, want)
	}
	if got, want := FormatRateLimitHeader(items), `"burst";r=50;t=30, "daily";r=999;t=0`; got != want {
		t.Errorf("FormatRateLimitHeader = %s, want %s", got, want)
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

func TestFormatHeaderAllocatesOnce(t *testing.T) {
	items := []HeaderItem{{Name: "burst", Quota: 100, Window: 1, Available: 50, T: 30}, {Name: `we"ird\`, Quota: -5, Window: 0, Available: math.MinInt64, T: math.MaxInt64}}
	for name, f := range map[string]func([]HeaderItem) string{"RateLimit-Policy": FormatPolicyHeader, "RateLimit": FormatRateLimitHeader} {
		if n := testing.AllocsPerRun(100, func() { f(items) }); n != 1 {
			t.Errorf("%s: %v allocations, want 1 (the value sized in advance)", name, n)
		}
	}
	if got, want := FormatRateLimitHeader(items), `"burst";r=50;t=30, "we\"ird\\";r=0;t=9223372036854775807`; got != want {
		t.Errorf("FormatRateLimitHeader = %s, want %s", got, want)
	}
}

func TestDecimalLen(t *testing.T) {
	for _, v := range []int64{0, 1, 9, 10, 99, 100, -1, -9, -10, 123456789, math.MaxInt64, math.MinInt64, math.MinInt64 + 1} {
		if got, want := decimalLen(v), len(strconv.FormatInt(v, 10)); got != want {
			t.Errorf("decimalLen(%d) = %d, want %d", v, got, want)
		}
	}
}

func TestSetRateLimitFields(t *testing.T) {
	items := []HeaderItem{{Name: "burst", Quota: 100, Window: 1, Available: 50, T: 30}, {Name: "daily", Quota: 1000, Window: 86400, Available: 999}}
	h := http.Header{}
	SetRateLimitFields(h, items)
	if got, want := h.Get("RateLimit-Policy"), FormatPolicyHeader(items); got != want {
		t.Errorf("RateLimit-Policy = %q, want %q", got, want)
	}
	if got, want := h.Get("RateLimit"), FormatRateLimitHeader(items); got != want {
		t.Errorf("RateLimit = %q, want %q", got, want)
	}
	// Adding to one field must not touch the other (they share a slice).
	h.Add("RateLimit-Policy", "x")
	if got := h.Values("RateLimit"); len(got) != 1 {
		t.Errorf("RateLimit after adding to RateLimit-Policy = %q, want one value", got)
	}
	if n := testing.AllocsPerRun(100, func() { SetRateLimitFields(http.Header{}, items[:1]) }); n > 3 {
		t.Errorf("%v allocations, want at most 3 (the header map, one string, one slice)", n)
	}
	empty := http.Header{}
	SetRateLimitFields(empty, nil)
	if len(empty) != 0 {
		t.Errorf("no items set %v, want nothing", empty)
	}
}

// methodPattern is what ValidMethod accepts, as a regular expression.
var methodPattern = regexp.MustCompile(`^[A-Za-z]{1,32}$`)

// FuzzValidMethod holds ValidMethod to methodPattern.
func FuzzValidMethod(f *testing.F) {
	for _, m := range []string{"GET", "post", "M-SEARCH", "", "@", "[", "`", "{", "Zz", strings.Repeat("A", 32), strings.Repeat("a", 33), "GET\x00", "Gét"} {
		f.Add(m)
	}
	f.Fuzz(func(t *testing.T, m string) {
		if got, want := ValidMethod(m), methodPattern.MatchString(m); got != want {
			t.Fatalf("ValidMethod(%q) = %v, want %v", m, got, want)
		}
	})
}
