package share

import (
	"math"
	"math/rand/v2"
	"testing"
)

// poissonCount draws a Poisson(mean) count (Knuth; means here are small).
func poissonCount(r *rand.Rand, mean float64) int {
	l, k, p := math.Exp(-mean), 0, 1.0
	for {
		p *= r.Float64()
		if p <= l {
			return k
		}
		k++
	}
}

// noisySteps runs a cluster of three regions offered a steady 10/6/4 units/s
// of a key whose L is 20/s, each interval's and recent window's rates
// counted from Poisson arrivals, and returns the largest |share − true
// proportion| of any region after the first few epochs.
func noisySteps(t *testing.T, cfg Config) float64 {
	t.Helper()
	c := newCluster(t, 3)
	c.limit = 20
	c.cfg = cfg
	for _, name := range c.names {
		a, err := NewAllocator(cfg, name, c.names, c.epoch)
		if err != nil {
			t.Fatal(err)
		}
		c.allocs[name] = a
	}
	rates := []float64{10, 6, 4}
	r := rand.New(rand.NewPCG(7, 7))
	ts, rs := cfg.Interval.Seconds(), cfg.Recent.Seconds()
	var worst float64
	for e := range 60 {
		c.epoch++
		reports := map[string]Report{}
		for i, name := range c.names {
			recent := poissonCount(r, rates[i]*rs)
			older := poissonCount(r, rates[i]*(ts-rs))
			reports[name] = c.allocs[name].Report(c.epoch, []Usage{{Key: c.key, Limit: c.limit,
				Offered: float64(recent+older) / ts, Recent: float64(recent) / rs}})
		}
		now := c.cfg.EpochStart(c.epoch).Add(c.cfg.Settle)
		for _, to := range c.names {
			var in []Report
			for _, from := range c.names {
				in = append(in, reports[from])
			}
			c.allocs[to].Rebalance(now, c.epoch, in)
		}
		if e < 5 {
			continue
		}
		for i, s := range c.shares("r0") {
			worst = max(worst, math.Abs(s-rates[i]/20))
		}
	}
	return worst
}

// A steady key with few arrivals per region keeps its shares near the demand
// proportions: counting noise in the 2 s recent window neither lifts the
// demand nor caps a region below it.
func TestNoisyLowRateKeyKeepsShares(t *testing.T) {
	naive := DefaultConfig()
	naive.NoiseZ, naive.NoiseSmoothing = 0, 0
	before, after := noisySteps(t, naive), noisySteps(t, DefaultConfig())
	t.Logf("max |share − proportion|: NoiseZ 0: %.3f, default: %.3f", before, after)
	if after > 0.08 || after >= before {
		t.Errorf("max |share − proportion| = %.3f (NoiseZ 0: %.3f), want ≤ 0.08 and below", after, before)
	}
}

// A rise beyond the noise is still followed at once.
func TestRecentRiseBeyondNoiseJumps(t *testing.T) {
	cfg := DefaultConfig()
	tests := []struct {
		offered, recent float64
		want            bool
	}{
		{offered: 5, recent: 8, want: false},       // 16 vs 10 expected arrivals: noise
		{offered: 5, recent: 20, want: true},       // 40 vs 10
		{offered: 1000, recent: 1100, want: true},  // 2200 vs 2000 arrivals, 4.5σ
		{offered: 1000, recent: 1050, want: false}, // 2.2σ
		{offered: 0, recent: 2, want: true},
		{offered: 3, recent: 2, want: false},
	}
	for _, tt := range tests {
		if got := cfg.risen(tt.offered, tt.recent); got != tt.want {
			t.Errorf("risen(%v, %v) = %v, want %v", tt.offered, tt.recent, got, tt.want)
		}
	}
	zero := cfg
	zero.NoiseZ = 0
	if !zero.risen(5, 5.1) || zero.recentHigh(3) != 3 {
		t.Errorf("NoiseZ 0 must trust every measurement: risen(5, 5.1) = %v, recentHigh(3) = %v", zero.risen(5, 5.1), zero.recentHigh(3))
	}
}
