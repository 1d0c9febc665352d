package simulator

import (
	"bytes"
	"context"
	"math"
	"strings"
	"testing"
)

// nfr02Misses are built-in scenarios that miss NFR-02 today, each for a
// documented reason (docs/simulator.md). The test fails if one of them
// starts passing, so the list cannot go stale, and fails for any other
// scenario that misses.
var nfr02Misses = map[string]string{}

func TestBuiltinScenariosNFR02(t *testing.T) {
	for _, sc := range Builtins() {
		t.Run(sc.Name, func(t *testing.T) {
			t.Parallel()
			r, err := Run(context.Background(), sc, Options{Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			why, known := nfr02Misses[sc.Name]
			switch {
			case !r.Summary.NFR02Pass && !known:
				t.Errorf("NFR-02 fails: global p99 %v%%, regional p99 %v%%", r.Summary.GlobalErrorP99Pct, r.Summary.RegionalErrorP99)
			case r.Summary.NFR02Pass && known:
				t.Errorf("NFR-02 now passes; remove %q from nfr02Misses", sc.Name)
			case known:
				t.Logf("known NFR-02 miss: %s (global p99 %v%%)", why, r.Summary.GlobalErrorP99Pct)
			}
			if r.Checks == 0 {
				t.Error("no engine checks made")
			}
		})
	}
}

func TestSameSeedSameJSON(t *testing.T) {
	for _, name := range []string{"steady-uneven", "lossy-ten", "global-daily-quota"} {
		sc, _ := Builtin(name)
		var a, b bytes.Buffer
		for _, buf := range []*bytes.Buffer{&a, &b} {
			r, err := Run(context.Background(), sc, Options{Seed: 42})
			if err != nil {
				t.Fatal(err)
			}
			if err := WriteJSON(buf, r); err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(a.Bytes(), b.Bytes()) {
			t.Errorf("%s: two runs with seed 42 differ", name)
		}
		for _, field := range []string{"global_error_p99_pct", "global_error_max_pct", "regional_error_p99_pct",
			"overshoot_max_pct", "convergence_s", "false_rejection_pct", "report_bytes_per_s_per_region", "nfr02_pass", "targets_pass"} {
			if !bytes.Contains(a.Bytes(), []byte(`"`+field+`"`)) {
				t.Errorf("JSON lacks summary field %s", field)
			}
		}
	}
}

func TestParseScenarioRoundTrip(t *testing.T) {
	sc, _ := Builtin("partition")
	var buf bytes.Buffer
	if err := WriteJSON(&buf, Result{}); err != nil {
		t.Fatal(err)
	}
	b := []byte(`{"name":"x","regions":2,"duration":"60s","limit":{"rate":100},
		"traffic":{"rate":2,"split":[3,1],"poisson":true},
		"gossip":{"delay":"200ms","loss":0.1,"partitions":[{"start":"10s","end":"30s","regions":[1]}]},
		"targets":[{"metric":"global_error_p99_pct","max":5}]}`)
	got, err := ParseScenario(b)
	if err != nil {
		t.Fatalf("ParseScenario = %v", err)
	}
	if got.Regions != 2 || got.Gossip.Partitions[0].End.D().Seconds() != 30 {
		t.Errorf("ParseScenario = %+v", got)
	}
	if _, err := ParseScenario([]byte(`{"name":"x","regions":2,"bogus":1}`)); err == nil {
		t.Error("ParseScenario accepted an unknown field")
	}
	if _, err := Run(context.Background(), got, Options{Seed: 1}); err != nil {
		t.Errorf("Run(file scenario) = %v", err)
	}
	_ = sc
}

// BenchmarkSimulator reports engine checks per second of wall time on the
// token bucket (make bench prints it as BENCH sim_checks_per_s).
func BenchmarkSimulator(b *testing.B) {
	sc, _ := Builtin("steady-uneven")
	var checks int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r, err := Run(context.Background(), sc, Options{Seed: uint64(i)})
		if err != nil {
			b.Fatal(err)
		}
		checks += r.Checks
	}
	b.ReportMetric(float64(checks)/b.Elapsed().Seconds(), "checks/s")
}

// TestShiftSeedsKeepScaleInRange runs the shift scenario with the seeds
// whose loans once pushed a region's scale above 1 (the engine rejected
// it and the run panicked), checking the shares at every tick.
func TestShiftSeedsKeepScaleInRange(t *testing.T) {
	if testing.Short() {
		t.Skip("two full 300 s scenarios")
	}
	sc, _ := Builtin("shift")
	for _, seed := range []uint64{7, 13} {
		if _, err := Run(context.Background(), sc, Options{Seed: seed, CheckShares: true}); err != nil {
			t.Errorf("shift seed %d: %v", seed, err)
		}
	}
}

// TestPartitionTimedByContact plays the partition with membership's
// verdicts as memberlist reaches them, the cut-off side four times later
// than the majority: timed by the pings, the cut-off region cuts before
// the majority reclaims and the run stays within 1% of overshoot; timed by
// the verdicts alone (no_contact), the majority reclaims while the cut-off
// region still admits, and it overshoots.
func TestPartitionTimedByContact(t *testing.T) {
	for _, c := range []struct {
		noContact bool
		over      func(float64) bool
		want      string
	}{
		{false, func(v float64) bool { return v <= 1 }, "≤ 1%"},
		{true, func(v float64) bool { return v > 1 }, "> 1% (the verdicts come 15 s apart)"},
	} {
		sc, _ := Builtin("partition")
		sc.Duration = Duration(120e9)
		sc.Gossip.Partitions[0].Start, sc.Gossip.Partitions[0].End = Duration(40e9), Duration(100e9)
		sc.ChangeAt = Duration(100e9)
		sc.Gossip.NoContact = c.noContact
		r, err := Run(context.Background(), sc, Options{Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("no_contact %v: overshoot_max_pct %v, global_error_p99_pct %v", c.noContact, r.Summary.OvershootMaxPct, r.Summary.GlobalErrorP99Pct)
		if got := r.Summary.OvershootMaxPct; !c.over(got) {
			t.Errorf("no_contact %v: overshoot_max_pct = %v, want %s", c.noContact, got, c.want)
		}
	}
}

// TestCrashReclaimedWithinHold: the survivors of a crash hold its share
// about Hold (1.95 s) after it, so the window of the crash loses about
// 0.2 × 1.9 s of L·10 s, not the 12% that waiting for membership's
// verdict (5 s) and RaiseDelay cost.
func TestCrashReclaimedWithinHold(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		sc, _ := Builtin("crash")
		sc.Duration = Duration(120e9)
		r, err := Run(context.Background(), sc, Options{Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Summary.GlobalErrorP99Pct; got > 5 || r.Summary.OvershootMaxPct > 1 {
			t.Errorf("seed %d: global_error_p99_pct %v, overshoot_max_pct %v; want ≤ 5 and ≤ 1", seed, got, r.Summary.OvershootMaxPct)
		}
	}
}

// TestChargedTokenRateCountsTokens runs the charged token rate (shortened
// to 120 s, settled at once so that every admitted request is charged by
// the end) and checks that its windows count tokens, not requests: the
// offered tokens are 2·L·W (the requests alone would be a tenth of that),
// the oracle admits L·W tokens a minute once its first burst is spent,
// and the tokens the windows count as admitted are those charged.
func TestChargedTokenRateCountsTokens(t *testing.T) {
	sc, ok := Builtin("global-token-rate-charged")
	if !ok {
		t.Fatal("no global-token-rate-charged scenario")
	}
	sc.Duration = sec(120)
	ch := *sc.Charge
	ch.Latency = 0
	sc.Charge = &ch
	r, err := Run(context.Background(), sc, Options{Seed: 1, CheckShares: true})
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range r.Windows {
		if x := float64(w.Offered) / w.Limit; x < 1.8 || x > 2.2 {
			t.Errorf("10 s window %d: offered %d tokens against L·W = %v (%.2f×), want about 2×", i, w.Offered, w.Limit, x)
		}
	}
	for i, w := range r.Windows60[1:] {
		if x := float64(w.Oracle) / w.Limit; x < 0.98 || x > 1.02 {
			t.Errorf("60 s window %d: the oracle admitted %d tokens against L·60 s = %v, want within 2%%", i+1, w.Oracle, w.Limit)
		}
	}
	s := r.Summary
	if s.ChargedVsOracle == 0 || math.Abs(s.AdmittedVsOracle-s.ChargedVsOracle) > 1e-3 {
		t.Errorf("admitted vs oracle %v%% by the windows, %v%% by the charges: want the same tokens", s.AdmittedVsOracle, s.ChargedVsOracle)
	}
}

// TestChargeScenarioValidation: a charged token rate needs an estimate
// within its costs; a quota takes neither an estimate nor a latency.
func TestChargeScenarioValidation(t *testing.T) {
	rate, _ := Builtin("global-token-rate-charged")
	budget, _ := Builtin("global-token-budget-charged")
	for _, tc := range []struct {
		name  string
		sc    Scenario
		c     ChargeSpec
		field string
	}{
		{"no estimate", rate, ChargeSpec{MaxCost: 19}, "charge.estimate"},
		{"estimate over max", rate, ChargeSpec{MaxCost: 19, Estimate: 20}, "charge.estimate"},
		{"negative latency", rate, ChargeSpec{MaxCost: 19, Estimate: 10, Latency: -1}, "charge.latency"},
		{"latency over a minute", rate, ChargeSpec{MaxCost: 19, Estimate: 10, Latency: sec(61)}, "charge.latency"},
		{"max cost 0", rate, ChargeSpec{Estimate: 1}, "charge.max_cost"},
		{"quota with estimate", budget, ChargeSpec{MaxCost: 19, Estimate: 10}, "charge.estimate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := tc.sc
			sc.Charge = &tc.c
			if err := sc.Validate(); err == nil || !strings.Contains(err.Error(), tc.field) {
				t.Errorf("Validate(%+v) = %v, want an error naming %s", tc.c, err, tc.field)
			}
		})
	}
	if err := rate.Validate(); err != nil {
		t.Errorf("Validate(%s) = %v", rate.Name, err)
	}
}
