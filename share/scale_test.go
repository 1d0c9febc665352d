package share

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

func TestScale(t *testing.T) {
	for _, tt := range []struct {
		in, want float64
	}{
		{0.25, 0.25}, {1, 1}, {0, MinShare}, {-0.5, MinShare}, {math.NaN(), MinShare},
		{1.0000000000000002, 1}, {math.Inf(1), 1}, {math.Inf(-1), MinShare}, {1e-12, MinShare},
	} {
		if got := Scale(tt.in); got != tt.want {
			t.Errorf("Scale(%v) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestQuotaScale(t *testing.T) {
	for _, tt := range []struct {
		count  float64
		others uint64
		units  float64 // whole units the scaled window admits
	}{
		{100, 0, 100}, {100, 40, 60}, {100, 99, 1}, {100, 100, 0}, {100, 1000, 0}, {3, 1, 2},
	} {
		s := QuotaScale(tt.count, tt.others)
		if !(s > 0 && s <= 1) {
			t.Errorf("QuotaScale(%v, %d) = %v outside (0, 1]", tt.count, tt.others, s)
		}
		if got := math.Floor(tt.count * s); got != tt.units {
			t.Errorf("QuotaScale(%v, %d) = %v: %v units, want %v", tt.count, tt.others, s, got, tt.units)
		}
	}
}

// TestTableShareInRange: loans above the whole limit, and below nothing,
// still give a scale in [MinShare, 1].
func TestTableShareInRange(t *testing.T) {
	k := Key{Policy: "p", Subject: "s"}
	for _, tt := range []struct {
		base, loan, want float64
	}{
		{0.6, 0.5, 1}, {0.2, -0.3, MinShare}, {0, 0, MinShare}, {0.3, 0.1, 0.4},
	} {
		tab := &Table{shares: map[Key]float64{k: tt.base}, def: 0.5, loans: map[Key]float64{k: tt.loan}}
		if got := tab.Share(k.Policy, k.Subject); math.Abs(got-tt.want) > 1e-15 {
			t.Errorf("Share(base %v, loan %v) = %v, want %v", tt.base, tt.loan, got, tt.want)
		}
	}
}

// TestAllocateValidWhateverTheSlots feeds Allocate garbage (NaN, ±Inf,
// negative and huge figures, held shares above 1): every share stays in
// [0, 1] and they sum to at most 1 + 1e-9.
func TestAllocateValidWhateverTheSlots(t *testing.T) {
	cfg := DefaultConfig()
	rng := rand.New(rand.NewPCG(1, 2))
	odd := []float64{math.NaN(), math.Inf(1), math.Inf(-1), -1, 0, 1e300, 5, 0.3, 1e-300}
	pick := func() float64 {
		if rng.IntN(2) == 0 {
			return odd[rng.IntN(len(odd))]
		}
		return rng.Float64() * 2
	}
	for i := range 20000 {
		n := 1 + rng.IntN(6)
		slots := make([]Slot, n)
		for j := range slots {
			slots[j] = Slot{State: SlotState(rng.IntN(3)), Demand: pick(), Recent: pick(), RecentHigh: pick(), Last: pick()}
		}
		out := make([]float64, n)
		Allocate(cfg, slots, out)
		sum := 0.0
		for j, v := range out {
			if !(v >= 0 && v <= 1) {
				t.Fatalf("case %d: share %d = %v outside [0, 1] for %+v", i, j, v, slots)
			}
			sum += v
		}
		if sum > 1+1e-9 {
			t.Fatalf("case %d: Σ shares = %v > 1 for %+v", i, sum, slots)
		}
	}
}

// TestRebalanceValidWhateverTheReports: reports with non-finite or
// negative figures never yield a published share outside [MinShare, 1] or
// a share vector summing above 1.
func TestRebalanceValidWhateverTheReports(t *testing.T) {
	cfg := DefaultConfig()
	regions := []string{"a", "b", "c"}
	a, err := NewAllocator(cfg, "a", regions, 10)
	if err != nil {
		t.Fatal(err)
	}
	k := Key{Policy: "p", Subject: "s"}
	now := time.Unix(1000, 0)
	for e, v := range []float64{math.NaN(), math.Inf(1), -5, 1e308, 0, 100} {
		epoch := uint64(11 + e)
		a.Report(epoch, []Usage{{Key: k, Limit: 100, Offered: 90, Recent: 90, Admitted: 50}})
		bad := Report{Version: ReportVersion, Region: "b", Epoch: epoch,
			Keys: []KeyReport{{Key: k, Limit: 100, Offered: v, Recent: v, Demand: v, Admitted: v, Share: v}}}
		a.Rebalance(now, epoch, []Report{bad})
		now = now.Add(cfg.Interval)
		if s := a.Table(now).Share(k.Policy, k.Subject); !(s >= MinShare && s <= 1) {
			t.Errorf("figure %v: published share %v outside [MinShare, 1]", v, s)
		}
		sum := 0.0
		for _, s := range a.Shares(k) {
			if !(s >= 0 && s <= 1) {
				t.Errorf("figure %v: share vector %v has a share outside [0, 1]", v, a.Shares(k))
			}
			sum += s
		}
		if sum > 1+1e-9 {
			t.Errorf("figure %v: Σ shares = %v > 1", v, sum)
		}
	}
}
