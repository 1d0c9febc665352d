package soak

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func testPlan(seed uint64, d time.Duration) []Fault {
	return Plan(PlanConfig{Seed: seed, Duration: d, Kinds: Kinds,
		Regions: []string{"single", "sentinel", "cluster"}, Daemons: 2})
}

func TestPlanIsAFunctionOfSeedAndDuration(t *testing.T) {
	for _, d := range []time.Duration{3 * time.Minute, 5 * time.Minute, 60 * time.Minute} {
		a, b := testPlan(7, d), testPlan(7, d)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("Plan(7, %v) differs between two calls", d)
		}
		if reflect.DeepEqual(a, testPlan(8, d)) {
			t.Errorf("Plan(7, %v) = Plan(8, %v); want the seed to matter", d, d)
		}
	}
}

func TestPlanCoversEveryKindInsideTheWindowAndOverlaps(t *testing.T) {
	tests := []struct {
		d       time.Duration
		atLeast int
	}{
		{3 * time.Minute, len(Kinds)},
		{5 * time.Minute, 10},
		{60 * time.Minute, 130},
	}
	for _, tc := range tests {
		for seed := uint64(1); seed <= 20; seed++ {
			plan := testPlan(seed, tc.d)
			from, to := Window(tc.d)
			if len(plan) < tc.atLeast {
				t.Errorf("Plan(%d, %v) has %d faults, want at least %d", seed, tc.d, len(plan), tc.atLeast)
			}
			seen := map[Kind]bool{}
			for i, f := range plan {
				seen[f.Kind] = true
				if f.At < from || f.At+f.For > to {
					t.Errorf("Plan(%d, %v)[%d] = %v, outside [%v, %v]", seed, tc.d, i, f, from, to)
				}
				if i > 0 && plan[i-1].At > f.At {
					t.Errorf("Plan(%d, %v) not sorted at %d", seed, tc.d, i)
				}
				if f.Kind == PolicyChange && !slices.Contains(actions, f.Action) {
					t.Errorf("Plan(%d, %v)[%d] = %v: no action", seed, tc.d, i, f)
				}
			}
			if len(seen) != len(Kinds) {
				t.Errorf("Plan(%d, %v) has kinds %v, want all %d", seed, tc.d, seen, len(Kinds))
			}
			if !anyOverlap(plan) {
				t.Errorf("Plan(%d, %v): no two faults overlap", seed, tc.d)
			}
		}
	}
}

func TestParseKinds(t *testing.T) {
	tests := []struct {
		in      string
		want    []Kind
		wantErr string
	}{
		{"all", Kinds, ""},
		{"none", nil, ""},
		{"kill-daemon,partition", []Kind{KillDaemon, Partition}, ""},
		{" pause-redis , pause-redis", []Kind{PauseRedis}, ""},
		{"kill-daemon,meteor", nil, `unknown fault "meteor"`},
	}
	for _, tc := range tests {
		got, err := ParseKinds(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || strings.Contains(err.Error(), "\n") {
				t.Errorf("ParseKinds(%q) error = %v, want one line with %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseKinds(%q) = %v, %v, want %v", tc.in, got, err, tc.want)
		}
	}
}
