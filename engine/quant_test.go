package engine

import (
	"testing"
	"time"

	"github.com/sluice-rl/sluice/engine/internal/quant"
)

// Decide returns a bucket's state rounded in the limiter's favour, window
// counts exact, and the result computed on the exact numbers.
func TestDecideQuantisesState(t *testing.T) {
	now := time.Unix(1e9, 0)
	tests := []struct {
		l        Limit
		st       State
		wantA    float64
		wantLeft int64
	}{
		// 10 - 1/3 tokens: stored rounded down, 9 still remaining.
		{Limit{Algorithm: TokenBucket, Rate: 1, Burst: 10 - 1.0/3}, State{}, quant.Down(9 - 1.0/3), 8},
		{Limit{Algorithm: TokenBucket, Rate: 1, Burst: 10}, State{A: 3, T: now.UnixMicro()}, 2, 2},
		// Level 1 + 0.1: stored rounded up.
		{Limit{Algorithm: LeakyBucket, Rate: 1, Burst: 10}, State{A: 0.1, T: now.UnixMicro()}, quant.Up(1.1), 8},
		// A window count above 2^29 (where 29-bit numbers are 2 apart):
		// stored exactly.
		{Limit{Algorithm: FixedWindow, Count: 1e12, Window: time.Hour}, State{A: 1<<29 + 2, T: now.UnixMicro() - now.UnixMicro()%3.6e9}, 1<<29 + 3, 1e12 - 1<<29 - 3},
		{Limit{Algorithm: SlidingWindowCounter, Count: 1e12, Window: time.Hour}, State{A: 1<<30 + 2, T: now.UnixMicro() - now.UnixMicro()%3.6e9}, 1<<30 + 3, 1e12 - 1<<30 - 3},
	}
	for _, tt := range tests {
		st, r := Decide(now, tt.st, tt.l, 1)
		if !r.Allowed || st.A != tt.wantA || r.Remaining != tt.wantLeft {
			t.Errorf("Decide(%v, %+v) = A %v, allowed %v, remaining %d; want A %v, allowed, remaining %d",
				tt.l.Algorithm, tt.st, st.A, r.Allowed, r.Remaining, tt.wantA, tt.wantLeft)
		}
	}
}

// A leaky bucket filled to a burst that is not a 29-bit number, as a
// scaled burst often is, stays under it: a cost-zero check at the same
// instant is still allowed, and a cost-one check is not.
func TestLeakyBucketStaysUnderOffGridBurst(t *testing.T) {
	now := time.Unix(1e9, 0)
	// 0x4023555555c00000: three quarters of the way between two 29-bit
	// numbers.
	burst := quant.Down(10-1.0/3) + 0x1p-25*0.75
	l := Limit{Algorithm: LeakyBucket, Rate: 1, Burst: burst}
	// A level that, plus 5, lands half way between the same two numbers.
	start := State{A: quant.Down(burst) + 0x1p-26 - 5, T: now.UnixMicro()}
	st, r := Decide(now, start, l, 5)
	if !r.Allowed || st.A != quant.Down(burst) {
		t.Fatalf("Decide(level %v, cost 5) = allowed %v, level %v; want allowed, level %v (rounded down, not past the burst)",
			start.A, r.Allowed, st.A, quant.Down(burst))
	}
	if _, r := Decide(now, st, l, 0); !r.Allowed {
		t.Errorf("Decide(full, cost 0) = %+v, want allowed", r)
	}
	if _, r := Decide(now, st, l, 1); r.Allowed {
		t.Errorf("Decide(full, cost 1) = %+v, want rejected", r)
	}
}
