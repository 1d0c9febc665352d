package soak

import (
	"strings"
	"testing"
	"time"
)

func TestTrafficShiftsBurstsAndIsSeeded(t *testing.T) {
	tr := DefaultTraffic(5)
	rates := map[float64]bool{}
	burst := false
	for s := 0; s < 600; s++ {
		r := tr.Rate("eu", "check", time.Duration(s)*time.Second)
		rates[r] = true
		if r >= tr.Base*tr.BurstFactor*0.5 {
			burst = true
		}
		if r != DefaultTraffic(5).Rate("eu", "check", time.Duration(s)*time.Second) {
			t.Fatalf("Rate at %ds differs between two Traffics of one seed", s)
		}
	}
	if len(rates) < 3 || !burst {
		t.Errorf("Rate over 10 min took %d values (burst %v), want shifts and a burst", len(rates), burst)
	}
	subj := tr.Subjects("eu-check")
	kinds := map[string]int{}
	for i := 0; i < 1000; i++ {
		s, _ := subj.Next()
		switch {
		case s == HotSubject:
			kinds["hot"]++
		case strings.HasPrefix(s, "n-"):
			kinds["new"]++
		default:
			kinds["cold"]++
		}
	}
	if kinds["hot"] < 200 || kinds["new"] < 100 || kinds["cold"] < 400 {
		t.Errorf("Subjects.Next() over 1000 = %v, want about 30%% hot, 20%% new, 50%% cold", kinds)
	}
}
