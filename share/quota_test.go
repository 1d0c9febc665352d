package share

import (
	"math"
	"math/rand/v2"
	"testing"
	"testing/quick"
	"time"
)

func randomCounter(r *rand.Rand) QuotaCounter {
	q := QuotaCounter{Key: Key{Policy: "daily", Subject: "acme"}}
	w := int64(r.IntN(3))
	for range r.IntN(6) {
		q.Add(w, []string{"eu", "us", "ap"}[r.IntN(3)], uint64(r.IntN(100)))
	}
	return q
}

func equalCounters(a, b QuotaCounter) bool {
	if a.Window != b.Window || len(a.Counts) != len(b.Counts) {
		return a.Total() == 0 && b.Total() == 0 && a.Window == b.Window
	}
	for i := range a.Counts {
		if a.Counts[i] != b.Counts[i] {
			return false
		}
	}
	return true
}

// Merge is commutative, associative and idempotent, so reports may arrive
// in any order, twice, or through a third region.
func TestQuotaCounterMergeIsALattice(t *testing.T) {
	prop := func(seed uint64) bool {
		r := rand.New(rand.NewPCG(seed, 3))
		a, b, c := randomCounter(r), randomCounter(r), randomCounter(r)
		ab := a.Clone()
		ab.Merge(b)
		ba := b.Clone()
		ba.Merge(a)
		abc := ab.Clone()
		abc.Merge(c)
		bc := b.Clone()
		bc.Merge(c)
		a_bc := a.Clone()
		a_bc.Merge(bc)
		aa := a.Clone()
		aa.Merge(a)
		return equalCounters(ab, ba) && equalCounters(abc, a_bc) && equalCounters(aa, a)
	}
	if err := quick.Check(prop, &quick.Config{MaxCount: 2000}); err != nil {
		t.Fatal(err)
	}
}

func TestQuotaCounterAllow(t *testing.T) {
	var q QuotaCounter
	q.Add(7, "eu", 60)
	var other QuotaCounter
	other.Add(7, "us", 30)
	q.Merge(other)
	tests := []struct {
		w           int64
		limit, cost uint64
		want        bool
	}{
		{7, 100, 10, true},
		{7, 100, 11, false},
		{8, 100, 100, true}, // a new window starts empty
		{6, 100, 1, false},  // an old window is closed
	}
	for _, tt := range tests {
		if got := q.Allow(tt.w, tt.limit, tt.cost); got != tt.want {
			t.Errorf("Allow(%d, %d, %d) = %v, want %v", tt.w, tt.limit, tt.cost, got, tt.want)
		}
	}
	if got := q.Get("us"); got != 30 {
		t.Errorf("Get(us) = %d, want 30", got)
	}
}

func TestWindowIndex(t *testing.T) {
	day := 24 * time.Hour
	if got := WindowIndex(time.Unix(86400*3+5, 0), day); got != 3 {
		t.Errorf("WindowIndex = %d, want 3", got)
	}
	if got := WindowIndex(time.Unix(-1, 0), day); got != -1 {
		t.Errorf("WindowIndex(-1s) = %d, want -1", got)
	}
}

// Components that would wrap a uint64 when summed count as an exhausted
// quota, never as a small count that admits again.
func TestQuotaCounterSaturates(t *testing.T) {
	const half = uint64(1) << 63
	var q QuotaCounter
	q.Add(7, "eu", half)
	var other QuotaCounter
	other.Add(7, "us", half)
	q.Merge(other)
	if got := q.Total(); got != math.MaxUint64 {
		t.Errorf("Total() of 2^63 + 2^63 = %d, want %d", got, uint64(math.MaxUint64))
	}
	if q.Allow(7, 1000, 1) {
		t.Error("Allow(7, 1000, 1) = true on a saturated counter, want false")
	}
	q.Add(7, "eu", math.MaxUint64)
	if got := q.Get("eu"); got != math.MaxUint64 {
		t.Errorf("Get(eu) after adding past the top = %d, want %d", got, uint64(math.MaxUint64))
	}
	for _, tt := range []struct{ a, b, want uint64 }{
		{1, 2, 3},
		{math.MaxUint64, 0, math.MaxUint64},
		{math.MaxUint64, 1, math.MaxUint64},
		{half, half - 1, math.MaxUint64},
		{half, half, math.MaxUint64},
	} {
		if got := SatAdd(tt.a, tt.b); got != tt.want {
			t.Errorf("SatAdd(%d, %d) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
	}
}
