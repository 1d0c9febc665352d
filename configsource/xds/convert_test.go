package xds

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	rlconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/sluice-rl/sluice/configsource"
)

func anyOf(t testing.TB, cs ...*rlconf.RateLimitConfig) []*anypb.Any {
	t.Helper()
	out := make([]*anypb.Any, len(cs))
	for i, c := range cs {
		a, err := anypb.New(c)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = a
	}
	return out
}

func TestConvert(t *testing.T) {
	rl := func(u rlconf.RateLimitUnit, n uint32) *rlconf.RateLimitPolicy {
		return &rlconf.RateLimitPolicy{Unit: u, RequestsPerUnit: n}
	}
	tests := []struct {
		name  string
		in    []*rlconf.RateLimitConfig
		want  string // policies as id:algorithm:limit/window or unlimited
		field string // of the error; "" for none
		file  string
	}{
		{"units and nesting", []*rlconf.RateLimitConfig{{Name: "r", Domain: "d", Descriptors: []*rlconf.RateLimitDescriptor{
			{Key: "a", RateLimit: rl(rlconf.RateLimitUnit_SECOND, 2)},
			{Key: "b", Value: "v", Descriptors: []*rlconf.RateLimitDescriptor{{Key: "c", RateLimit: rl(rlconf.RateLimitUnit_DAY, 5)}}},
		}}}, "d.a:2/1 d.b_v.c:5/86400", "", ""},
		{"unlimited ignores the unit", []*rlconf.RateLimitConfig{{Name: "r", Domain: "d", Descriptors: []*rlconf.RateLimitDescriptor{
			{Key: "a", RateLimit: &rlconf.RateLimitPolicy{Unit: rlconf.RateLimitUnit_HOUR, Unlimited: true}},
		}}}, "d.a:unlimited", "", ""},
		{"shadow mode and replaces", []*rlconf.RateLimitConfig{{Name: "r", Domain: "d", Descriptors: []*rlconf.RateLimitDescriptor{
			{Key: "a", RateLimit: &rlconf.RateLimitPolicy{Unit: rlconf.RateLimitUnit_MINUTE, RequestsPerUnit: 1, Name: "x"}},
			{Key: "b", ShadowMode: true, RateLimit: &rlconf.RateLimitPolicy{Unit: rlconf.RateLimitUnit_MINUTE, RequestsPerUnit: 3, Replaces: []*rlconf.RateLimitReplace{{Name: "x"}}}},
		}}}, "d.a:1/60 d.b:3/60:shadow:replaces=d.a", "", ""},
		{"no unit", []*rlconf.RateLimitConfig{{Name: "r", Domain: "d", Descriptors: []*rlconf.RateLimitDescriptor{{Key: "a", RateLimit: rl(0, 1)}}}}, "", "descriptors[0].rate_limit.unit", "r"},
		{"no domain", []*rlconf.RateLimitConfig{{Name: "r"}}, "", "domain", "r"},
		{"unnamed resource", []*rlconf.RateLimitConfig{{Domain: "d", Descriptors: []*rlconf.RateLimitDescriptor{{Key: ""}}}}, "", "descriptors[0].key", "resources[0]"},
		{"one domain twice", []*rlconf.RateLimitConfig{{Name: "r", Domain: "d"}, {Name: "s", Domain: "d"}}, "", "domain", "s"},
		{"one name twice", []*rlconf.RateLimitConfig{{Name: "r", Domain: "d"}, {Name: "r", Domain: "e"}}, "", "name", "r"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ps, err := Convert(anyOf(t, tt.in...), false)
			if tt.field != "" {
				var e *configsource.Error
				if !errors.As(err, &e) || e.Field != tt.field || e.File != tt.file || e.Line != 0 {
					t.Fatalf("Convert = %v, want an Error of resource %s, field %s, no line", err, tt.file, tt.field)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range ps {
				s := p.ID + ":"
				if p.Unlimited {
					s += "unlimited"
				} else {
					s += fmtF(p.Count) + "/" + fmtF(p.Window)
				}
				if p.Mode == "shadow" {
					s += ":shadow"
				}
				if len(p.Replaces) > 0 {
					s += ":replaces=" + strings.Join(p.Replaces, ",")
				}
				got = append(got, s)
			}
			if g := strings.Join(got, " "); g != tt.want {
				t.Errorf("Convert = %s, want %s", g, tt.want)
			}
		})
	}
}

func fmtF(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// FuzzConvert feeds Convert resources of any bytes: it never panics, and
// what it accepts are valid policies.
func FuzzConvert(f *testing.F) {
	for _, c := range []*rlconf.RateLimitConfig{
		{Name: "r", Domain: "d", Descriptors: []*rlconf.RateLimitDescriptor{{Key: "a", Value: "*x", RateLimit: &rlconf.RateLimitPolicy{Unit: 2, RequestsPerUnit: 9}}}},
		{Domain: "d", Descriptors: []*rlconf.RateLimitDescriptor{{Key: "a", Descriptors: []*rlconf.RateLimitDescriptor{{Key: "b"}}}}},
	} {
		f.Add(anyOf(f, c)[0].Value)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ps, err := Convert([]*anypb.Any{{TypeUrl: TypeURL, Value: data}}, true)
		if err != nil {
			return
		}
		for _, p := range ps {
			if err := p.Validate(); err != nil {
				t.Fatalf("Convert accepted %+v: %v", p, err)
			}
		}
	})
}
