package share

import (
	"math"
	"math/rand/v2"
	"testing"
	"testing/quick"
)

func sum(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x
	}
	return s
}

func randomSlots(r *rand.Rand, n int) []Slot {
	slots := make([]Slot, n)
	for i := range slots {
		switch r.IntN(5) {
		case 0:
			slots[i] = Slot{State: Held, Last: r.Float64() * 0.7}
		case 1:
			slots[i] = Slot{State: Down}
		default:
			d := r.Float64() * 3
			if r.IntN(4) == 0 {
				d = 0
			}
			slots[i] = Slot{State: Reported, Demand: d, Recent: d * (0.5 + r.Float64())}
		}
	}
	return slots
}

// Σ shares = 1 and every reporting region gets at least its floor, whatever
// the reports.
func TestAllocateSumAndFloorProperty(t *testing.T) {
	cfg := DefaultConfig()
	prop := func(seed uint64, n8 uint8) bool {
		n := int(n8%12) + 1
		r := rand.New(rand.NewPCG(seed, 1))
		slots := randomSlots(r, n)
		out := make([]float64, n)
		Allocate(cfg, slots, out)
		if got := sum(out); math.Abs(got-1) > 1e-9 {
			t.Errorf("Allocate(%v) sums to %v, want 1", slots, got)
			return false
		}
		for i, s := range slots {
			if out[i] < 0 {
				t.Errorf("Allocate(%v)[%d] = %v, want ≥ 0", slots, i, out[i])
				return false
			}
			if s.State == Reported && out[i] < cfg.floor(n)-1e-12 {
				t.Errorf("Allocate(%v)[%d] = %v, want ≥ floor %v", slots, i, out[i], cfg.floor(n))
				return false
			}
		}
		return true
	}
	if err := quick.Check(prop, &quick.Config{MaxCount: 5000}); err != nil {
		t.Fatal(err)
	}
}

func TestAllocateTable(t *testing.T) {
	cfg := DefaultConfig()
	f3 := cfg.floor(3)
	tests := []struct {
		name  string
		slots []Slot
		want  []float64
	}{
		{"proportional over-demand", []Slot{{Demand: 1.4, Recent: 1.4}, {Demand: 0.4, Recent: 0.4}, {Demand: 0.2, Recent: 0.2}},
			[]float64{f3 + (1-3*f3)*0.7, f3 + (1-3*f3)*0.2, f3 + (1-3*f3)*0.1}},
		{"no demand splits evenly", []Slot{{}, {}, {}}, []float64{1.0 / 3, 1.0 / 3, 1.0 / 3}},
		{"held keeps last", []Slot{{State: Held, Last: 0.5}, {Demand: 1, Recent: 1}, {Demand: 1, Recent: 1}},
			[]float64{0.5, 0.25, 0.25}},
		{"cap binds on recent rate", []Slot{{Demand: 1, Recent: 0.1}, {Demand: 2, Recent: 2}},
			// region 0 capped at 0.12; region 1 takes the rest.
			[]float64{0.12, 0.88}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := make([]float64, len(tt.slots))
			Allocate(cfg, tt.slots, got)
			for i := range got {
				if math.Abs(got[i]-tt.want[i]) > 1e-9 {
					t.Fatalf("Allocate(%v) = %v, want %v", tt.slots, got, tt.want)
				}
			}
		})
	}
}
