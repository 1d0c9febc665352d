package simulator

import (
	"slices"
	"time"
)

func sec(s float64) Duration { return Duration(time.Duration(s * float64(time.Second))) }
func ptr(v float64) *float64 { return &v }
func atMost(metric string, v float64, note string) Target {
	return Target{Metric: metric, Max: ptr(v), Note: note}
}
func atLeast(metric string, v float64, note string) Target {
	return Target{Metric: metric, Min: ptr(v), Note: note}
}

// Builtins returns the built-in scenarios, in a stable order: the
// accuracy scenarios with their targets, the transient and fault
// scenarios beyond them, and
// steady-uneven (the scenario the live simulation is compared against).
func Builtins() []Scenario {
	l := LimitSpec{Rate: 1000}
	return []Scenario{
		{Name: "single-region-2x", Description: "one region offered 2L", Regions: 1, Duration: sec(300), Limit: l,
			Traffic: Traffic{Rate: 2, Poisson: true}, Targets: []Target{atMost("global_error_p99_pct", 2, "E₁₀ ±2%")}},
		{Name: "three-even", Description: "three regions at 0.5L each", Regions: 3, Duration: sec(300), Limit: l,
			Traffic: Traffic{Rate: 1.5, Poisson: true},
			Targets: []Target{atMost("global_error_p99_pct", 2, "E₁₀ p99 ±2%"), atLeast("jain", 0.99, "Jain ≥ 0.99")}},
		{Name: "skewed-five", Description: "five regions 90/5/5/0/0 at 2L", Regions: 5, Duration: sec(300), Limit: l,
			Traffic: Traffic{Rate: 2, Split: []float64{90, 5, 5, 0, 0}, Poisson: true},
			Targets: []Target{atLeast("mean_error_pct", -3, "mean E ≥ −3%"), atMost("mean_error_pct", 1, "mean E ≤ +1%")}},
		{Name: "shift", Description: "100% of 2L moves from r0 to r1 mid-interval", Regions: 3, Duration: sec(300), Limit: l,
			Traffic: Traffic{Rate: 2, Split: []float64{1, 0, 0}, Poisson: true,
				Steps: []TrafficStep{{At: sec(125), Split: []float64{0, 1, 0}}}},
			ChangeAt: sec(125),
			Targets:  []Target{atMost("convergence_s", 20, "±5% by the 2nd window (≤20 s)"), atMost("overshoot_max_pct", 1, "overshoot ≤1%")}},
		{Name: "follow-the-sun", Description: "2L rotating between three regions over 30 min", Regions: 3, Duration: sec(1800), Limit: l,
			Traffic: Traffic{Rate: 2, Poisson: true, Diurnal: &Diurnal{Period: sec(1800), Depth: 1}},
			Targets: []Target{atMost("global_error_p99_pct", 3, "E₁₀ ±3% in 99% of windows")}},
		{Name: "under-limit-shifting", Description: "total 0.6L rotating between regions", Regions: 3, Duration: sec(600), Limit: l,
			Traffic: Traffic{Rate: 0.6, Poisson: true, Diurnal: &Diurnal{Period: sec(300), Depth: 1}},
			Targets: []Target{atMost("false_rejection_pct", 0.1, "false rejections ≤0.1%")}},
		{Name: "idle-wakes", Description: "r0 at 1.5L; idle r2 wakes to 0.5L", Regions: 3, Duration: sec(300), Limit: l,
			Traffic: Traffic{Rate: 1.5, Split: []float64{1, 0, 0}, Poisson: true,
				Steps: []TrafficStep{{At: sec(125), Rate: 2, Split: []float64{1.5, 0, 0.5}}}},
			ChangeAt: sec(125),
			Targets:  []Target{atMost("region_vs_oracle_after_change_max_pct", 5, "its error vs oracle ≤5% after 1 window")}},
		{Name: "bursts", Description: "2 s bursts of 3L every 30 s over 0.6L", Regions: 3, Duration: sec(300), Limit: l,
			Traffic: Traffic{Rate: 0.6, Poisson: true, Bursts: &Bursts{Every: sec(30), Length: sec(2), Rate: 3}},
			Targets: []Target{atMost("overshoot_max_pct", 3, "E₁₀ overshoot ≤3%")}},
		{Name: "partition", Description: "one of five regions partitioned for 120 s, then healed", Regions: 5, Duration: sec(360), Limit: l,
			Traffic:  Traffic{Rate: 2, Poisson: true},
			Gossip:   Gossip{Partitions: []Partition{{Start: sec(60), End: sec(180), Regions: []int{4}}}},
			ChangeAt: sec(180),
			Targets:  []Target{atMost("overshoot_max_pct", 1, "overshoot ≤1%"), atMost("convergence_s", 20, "±5% ≤2 windows after healing")}},
		{Name: "crash", Description: "one of five regions crashes; its clients fail over", Regions: 5, Duration: sec(360), Limit: l,
			Traffic:  Traffic{Rate: 2, Poisson: true},
			Gossip:   Gossip{Crashes: []Crash{{Region: 4, At: sec(60)}}},
			ChangeAt: sec(60),
			Targets:  []Target{atMost("overshoot_max_pct", 1, "overshoot ≤1%"), atMost("convergence_s", 50, "±5% within 4T+10 s")}},
		{Name: "lossy-ten", Description: "ten regions, 20% report loss, +2 s delay", Regions: 10, Duration: sec(300), Limit: l,
			Traffic: Traffic{Rate: 2, Poisson: true, Split: []float64{30, 20, 15, 10, 8, 6, 5, 3, 2, 1}},
			Gossip:  Gossip{Loss: 0.2, Delay: sec(2)},
			Targets: []Target{atMost("global_error_p99_pct", 5, "E₁₀ p99 ±5%")}},
		{Name: "zipf-keys", Description: "100 000 keys, Zipf 1.1, 20 units/s per key", Regions: 3, Duration: sec(120),
			Limit: LimitSpec{Rate: 20}, Keys: 100_000, Zipf: 1.1,
			Traffic: Traffic{Rate: 1000, Split: []float64{50, 30, 20}},
			Targets: []Target{atMost("key_error_p99_pct", 5, "per-key p99 ≤5%"), atMost("report_bytes_per_s_per_region", 65536, "≤64 KB/s/node")}},
		{Name: "limit-halved", Description: "L halved mid-run, ±500 ms clock skew", Regions: 3, Duration: sec(300), Limit: l,
			Traffic:    Traffic{Rate: 2, Poisson: true, Split: []float64{50, 30, 20}},
			Gossip:     Gossip{Skew: sec(0.5)},
			LimitSteps: []LimitStep{{At: sec(125), Factor: 0.5}},
			ChangeAt:   sec(125),
			Targets:    []Target{atMost("error_after_change_max_pct", 5, "E ≤5% within 1 window")}},
		{Name: "steady-uneven", Description: "three regions offered 2L split 70/20/10 (compared with the live run)", Regions: 3, Duration: sec(300), Limit: l,
			Traffic: Traffic{Rate: 2, Poisson: true, Split: []float64{70, 20, 10}},
			Targets: []Target{atMost("global_error_p99_pct", 5, "p99 within 5%, as the accuracy scenarios")}},
		{Name: "flash-crowd", Description: "r1 jumps from 0.1L to 3L for 60 s", Regions: 3, Duration: sec(300), Limit: l,
			Traffic: Traffic{Rate: 0.3, Poisson: true,
				Steps: []TrafficStep{{At: sec(95), Rate: 3.2, Split: []float64{0.1, 3, 0.1}}, {At: sec(155), Rate: 0.3, Split: []float64{1, 1, 1}}}},
			ChangeAt: sec(95),
			Targets:  []Target{atMost("overshoot_max_pct", 3, "overshoot ≤3%, as in bursts")}},
		{Name: "global-daily-quota", Description: "a global quota of 100 000 per (compressed) 1 h window across 3 regions", Regions: 3,
			Duration: sec(7200), Limit: LimitSpec{Rate: 100}, Quota: &QuotaSpec{Limit: 100_000, Window: sec(3600)},
			Traffic: Traffic{Rate: 1, Split: []float64{50, 30, 20}},
			Targets: []Target{atLeast("admitted_vs_oracle_pct", 99, "admitted within −1%…+2% of the quota"), atMost("admitted_vs_oracle_pct", 102, "")}},
		{Name: "global-token-budget-charged", Description: "a global budget of 150 000 tokens per (compressed) 1 h window across 3 regions, each request's 1–19 tokens charged after it is served", Regions: 3,
			Duration: sec(7200), Limit: LimitSpec{Rate: 10}, Quota: &QuotaSpec{Limit: 150_000, Window: sec(3600)}, Charge: &ChargeSpec{MaxCost: 19},
			Traffic: Traffic{Rate: 1, Split: []float64{70, 20, 10}},
			Targets: []Target{atLeast("charged_vs_oracle_pct", 98, "tokens charged within 2% of the oracle's"), atMost("charged_vs_oracle_pct", 102, "")}},
		{Name: "global-token-rate-charged", Description: "a global rate of 60 000 tokens a minute (1 000/s) divided by shares across 3 regions offered 2L split 70/20/10, each request checked at 10 tokens and settled 2 s later with its 1–19", Regions: 3,
			Duration: sec(300), Limit: l, Charge: &ChargeSpec{MaxCost: 19, Estimate: 10, Latency: sec(2)},
			Traffic: Traffic{Rate: 0.2, Poisson: true, Split: []float64{70, 20, 10}},
			Targets: []Target{atMost("overshoot_max_pct", 3, "tokens per 10 s window at most 3% of L·W over the oracle's"), atMost("global_error_60s_p99_pct", 3, "tokens per minute within 3% of L·60 s of the oracle's")}},
	}
}

// Builtin returns the built-in scenario called name.
func Builtin(name string) (Scenario, bool) {
	all := Builtins()
	i := slices.IndexFunc(all, func(s Scenario) bool { return s.Name == name })
	if i < 0 {
		return Scenario{}, false
	}
	return all[i], true
}
