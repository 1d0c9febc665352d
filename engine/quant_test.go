package engine

import (
	"math"
	"testing"
	"time"
)

// quantEdges are the numbers the quantisers must get right, and agree on
// with redis.lua's q29 (TestRedisQuantisersAgree).
var quantEdges = []float64{
	0, math.Copysign(0, -1), 1, 2, 3, 100, 1e12,
	1<<29 - 1, 1 << 29, 1<<29 + 1, 1<<53 - 1,
	1.0 / 3, 0.1, 99.99999, 1e12 + 0.5, -1.0 / 3, -(1<<29 + 1),
	(1<<29 - 1) / 1024.0, (1<<29 - 1) * 1024.0, // exactly 29 significant bits
	(1<<30 - 1) / 1024.0,   // 30 significant bits
	1e-300, 1e-310, 5e-324, // tiny; the last two subnormal
	0x1p-1022, 0x1p-1022 - 0x1p-1074, 0x1p-1050, 0x1p-1050 + 0x1p-1074,
	1e300, math.MaxFloat64, -math.MaxFloat64,
	math.Inf(1), math.Inf(-1), math.NaN(),
}

func TestQuantisers(t *testing.T) {
	for _, x := range quantEdges {
		down, up := quantDown(x), quantUp(x)
		if math.IsNaN(x) {
			if !math.IsNaN(down) || !math.IsNaN(up) {
				t.Errorf("quantDown(NaN), quantUp(NaN) = %v, %v; want NaN", down, up)
			}
			continue
		}
		for _, q := range []float64{down, up} {
			if b := math.Float64bits(q); b&quantLowBits != 0 && !math.IsInf(q, 0) {
				t.Errorf("quantising %v gave %v (%#016x): low 24 bits not zero, 5 bytes cannot hold it", x, q, b)
			}
		}
		if !(down <= x && x <= up) {
			t.Errorf("quantDown(%v), quantUp(%v) = %v, %v; want them around %v", x, x, down, up, x)
		}
		// Nothing on the grid lies strictly between a rounding and x.
		if down != x && math.Float64frombits(math.Float64bits(math.Abs(down))+quantLowBits+1) != math.Abs(up) && x > 0 {
			t.Errorf("quantDown(%v), quantUp(%v) = %v, %v; want neighbours on the grid", x, x, down, up)
		}
		// Integers below 2^29 and numbers of 29 significant bits stay.
		exact := x == math.Trunc(x) && math.Abs(x) <= 1<<29 || x == 1e12 || math.IsInf(x, 0) ||
			x == (1<<29-1)/1024.0 || x == (1<<29-1)*1024.0 || x == 0x1p-1022 || x == 0x1p-1050
		if exact && (down != x || up != x || math.Signbit(down) != math.Signbit(x) || math.Signbit(up) != math.Signbit(x)) {
			t.Errorf("quantDown(%v), quantUp(%v) = %v, %v; want it unchanged", x, x, down, up)
		}
		if !exact && down == up {
			t.Errorf("quantDown(%v) = quantUp(%v) = %v; want %v rounded two ways", x, x, down, x)
		}
	}
	if got := quantUp(math.MaxFloat64); !math.IsInf(got, 1) {
		t.Errorf("quantUp(MaxFloat64) = %v, want +Inf", got)
	}
	if got := quantDown(-math.MaxFloat64); !math.IsInf(got, -1) {
		t.Errorf("quantDown(-MaxFloat64) = %v, want -Inf", got)
	}
	if got, want := quantUp(0x1p-1022-0x1p-1074), 0x1p-1022; got != want {
		t.Errorf("quantUp(largest subnormal) = %v, want %v", got, want)
	}
	// Below 2^-1022 the quantum is 2^-1050: the smallest subnormal
	// rounds to 0 or to 2^-1050.
	if down, up := quantDown(5e-324), quantUp(5e-324); down != 0 || math.Signbit(down) || up != 0x1p-1050 {
		t.Errorf("quantDown(5e-324), quantUp(5e-324) = %v, %v; want 0, 2^-1050", down, up)
	}
	if got, want := quantDown(1e-310), math.Float64frombits(math.Float64bits(1e-310)&^quantLowBits); got != want {
		t.Errorf("quantDown(1e-310) = %v, want %v (quantum 2^-1050)", got, want)
	}
}

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
		{Limit{Algorithm: TokenBucket, Rate: 1, Burst: 10 - 1.0/3}, State{}, quantDown(9 - 1.0/3), 8},
		{Limit{Algorithm: TokenBucket, Rate: 1, Burst: 10}, State{A: 3, T: now.UnixMicro()}, 2, 2},
		// Level 1 + 0.1: stored rounded up.
		{Limit{Algorithm: LeakyBucket, Rate: 1, Burst: 10}, State{A: 0.1, T: now.UnixMicro()}, quantUp(1.1), 8},
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
	burst := quantDown(10-1.0/3) + 0x1p-25*0.75
	l := Limit{Algorithm: LeakyBucket, Rate: 1, Burst: burst}
	// A level that, plus 5, lands half way between the same two numbers.
	start := State{A: quantDown(burst) + 0x1p-26 - 5, T: now.UnixMicro()}
	st, r := Decide(now, start, l, 5)
	if !r.Allowed || st.A != quantDown(burst) {
		t.Fatalf("Decide(level %v, cost 5) = allowed %v, level %v; want allowed, level %v (rounded down, not past the burst)",
			start.A, r.Allowed, st.A, quantDown(burst))
	}
	if _, r := Decide(now, st, l, 0); !r.Allowed {
		t.Errorf("Decide(full, cost 0) = %+v, want allowed", r)
	}
	if _, r := Decide(now, st, l, 1); r.Allowed {
		t.Errorf("Decide(full, cost 1) = %+v, want rejected", r)
	}
}

func TestQuantUpTo(t *testing.T) {
	offGrid := quantDown(10-1.0/3) + 0x1p-25*0.75 // between two 29-bit numbers
	tests := []struct{ x, most, want float64 }{
		{3, 10, 3},
		{0.1, 10, quantUp(0.1)},
		{quantDown(offGrid) + 0x1p-26, offGrid, quantDown(offGrid)}, // up would pass most
		{quantDown(offGrid) + 0x1p-26, 100, quantUp(offGrid)},
		// Near 3e9 the 29-bit numbers are 8 apart: where rounding down
		// would give back a unit or more, round up even past most.
		{3e9 + 1, 3e9 + 1.5, 3e9 + 8},
		{3e9 + 0.25, 3e9 + 0.5, 3e9},
	}
	for _, tt := range tests {
		if got := quantUpTo(tt.x, tt.most); got != tt.want {
			t.Errorf("quantUpTo(%v, %v) = %v, want %v", tt.x, tt.most, got, tt.want)
		}
	}
}

// countEdges are the numbers storedCount must get right, and agree on with
// redis.lua's stored_count (TestRedisStoredCountAgrees), with what both
// must keep. Only whole numbers from 0 to 1e12 occur with valid limits.
var countEdges = []struct{ x, want float64 }{
	{0, 0}, {1, 1}, {2, 2}, {1<<29 - 1, 1<<29 - 1}, {1 << 29, 1 << 29}, {1<<29 + 1, 1<<29 + 1},
	{6e8 + 1, 6e8 + 1}, {1<<30 + 3, 1<<30 + 3}, {1<<32 + 1, 1<<32 + 1},
	{1e12 - 1, 1e12 - 1}, {1e12, 1e12}, {1<<40 - 2, 1<<40 - 2},
	// Never occur: held to what '<I5' holds, in the limiter's favour.
	{math.Copysign(0, -1), 0}, {0.25, 1}, {6e8 + 0.5, 6e8 + 1}, {1e12 + 0.5, 1e12 + 1}, {-1, 0},
	{1<<40 - 1, 1<<40 - 1}, {1<<40 - 1.5, 1<<40 - 1}, {1 << 40, 1<<40 - 1}, {1<<41 + 3, 1<<40 - 1},
	{math.MaxFloat64, 1<<40 - 1}, {math.Inf(1), 1<<40 - 1}, {math.Inf(-1), 0}, {math.NaN(), 1<<40 - 1},
}

func TestStoredCount(t *testing.T) {
	for _, tt := range countEdges {
		got := storedCount(tt.x)
		if got != tt.want || math.Signbit(got) {
			t.Errorf("storedCount(%v) = %v, want %v", tt.x, got, tt.want)
		}
	}
}
