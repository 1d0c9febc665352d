package soak

import (
	"strconv"
	"testing"
	"time"
)

func TestFailoverWatch(t *testing.T) {
	w := FailoverWatch{Lead: 2 * time.Second}
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	steps := []struct {
		sec     int
		primary map[int]bool
		want    []int // ports promoted
	}{
		{0, map[int]bool{1: true, 2: false}, nil},          // the first reading finds nothing
		{1, map[int]bool{1: true, 2: false}, nil},          // unchanged
		{2, map[int]bool{2: false}, nil},                   // 1 did not answer (paused)
		{3, map[int]bool{1: false, 2: true}, []int{2}},     // 2 took over, 1 demoted
		{4, map[int]bool{1: false, 2: true, 3: true}, nil}, // 3 never read before: not a promotion
		{5, map[int]bool{1: true, 2: false, 3: true}, []int{1}},
	}
	for _, s := range steps {
		got := w.Step("cluster", at(s.sec), s.primary)
		if len(got) != len(s.want) {
			t.Fatalf("at %ds: %v, want promotions of %v", s.sec, got, s.want)
		}
		for i, sp := range got {
			if sp.Kind != Failover || sp.Region != "cluster" || sp.End != at(s.sec) || sp.Start != at(s.sec-1).Add(-2*time.Second) {
				t.Errorf("at %ds: span %+v, want a failover of cluster from %v to %v", s.sec, sp, at(s.sec-1).Add(-2*time.Second), at(s.sec))
			}
			if want := "127.0.0.1:" + strconv.Itoa(s.want[i]) + " promoted"; sp.Detail != want {
				t.Errorf("at %ds: detail %q, want %q", s.sec, sp.Detail, want)
			}
		}
	}
	// Regions are apart: a first reading of another region finds nothing.
	if got := w.Step("sentinel", at(6), map[int]bool{7: true}); len(got) != 0 {
		t.Errorf("first reading of sentinel: %v, want nothing", got)
	}
}

func TestSpontaneous(t *testing.T) {
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	f := Span{Kind: Failover, Region: "cluster", Start: at(100), End: at(103)}
	tests := []struct {
		name   string
		faults []Span
		kept   bool
	}{
		{"nothing injected", nil, true},
		{"a killed primary of the region", []Span{{Kind: KillPrimary, Region: "cluster", Start: at(95), End: at(99)}}, false},
		{"a paused primary just after", []Span{{Kind: PauseRedis, Region: "cluster", Start: at(107), End: at(110)}}, false},
		{"a killed primary of another region", []Span{{Kind: KillPrimary, Region: "sentinel", Start: at(100), End: at(103)}}, true},
		{"a killed primary long before", []Span{{Kind: KillPrimary, Region: "cluster", Start: at(50), End: at(60)}}, true},
		{"a fault that takes no store away", []Span{{Kind: Starve, Region: "cluster", Start: at(100), End: at(103)}}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Spontaneous([]Span{f}, tc.faults, 6*time.Second)
			if kept := len(got) == 1; kept != tc.kept {
				t.Errorf("Spontaneous = %v, want kept %v", got, tc.kept)
			}
		})
	}
}
