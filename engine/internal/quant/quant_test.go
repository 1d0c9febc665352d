package quant

import (
	"math"
	"testing"
)

func TestQuantisers(t *testing.T) {
	for _, x := range Edges {
		down, up := Down(x), Up(x)
		if math.IsNaN(x) {
			if !math.IsNaN(down) || !math.IsNaN(up) {
				t.Errorf("Down(NaN), Up(NaN) = %v, %v; want NaN", down, up)
			}
			continue
		}
		for _, q := range []float64{down, up} {
			if b := math.Float64bits(q); b&lowBits != 0 && !math.IsInf(q, 0) {
				t.Errorf("quantising %v gave %v (%#016x): low 24 bits not zero, 5 bytes cannot hold it", x, q, b)
			}
		}
		if !(down <= x && x <= up) {
			t.Errorf("Down(%v), Up(%v) = %v, %v; want them around %v", x, x, down, up, x)
		}
		// Nothing on the grid lies strictly between a rounding and x.
		if down != x && math.Float64frombits(math.Float64bits(math.Abs(down))+lowBits+1) != math.Abs(up) && x > 0 {
			t.Errorf("Down(%v), Up(%v) = %v, %v; want neighbours on the grid", x, x, down, up)
		}
		// Integers below 2^29 and numbers of 29 significant bits stay.
		exact := x == math.Trunc(x) && math.Abs(x) <= 1<<29 || x == 1e12 || math.IsInf(x, 0) ||
			x == (1<<29-1)/1024.0 || x == (1<<29-1)*1024.0 || x == 0x1p-1022 || x == 0x1p-1050
		if exact && (down != x || up != x || math.Signbit(down) != math.Signbit(x) || math.Signbit(up) != math.Signbit(x)) {
			t.Errorf("Down(%v), Up(%v) = %v, %v; want it unchanged", x, x, down, up)
		}
		if !exact && down == up {
			t.Errorf("Down(%v) = Up(%v) = %v; want %v rounded two ways", x, x, down, x)
		}
	}
	if got := Up(math.MaxFloat64); !math.IsInf(got, 1) {
		t.Errorf("Up(MaxFloat64) = %v, want +Inf", got)
	}
	if got := Down(-math.MaxFloat64); !math.IsInf(got, -1) {
		t.Errorf("Down(-MaxFloat64) = %v, want -Inf", got)
	}
	if got, want := Up(0x1p-1022-0x1p-1074), 0x1p-1022; got != want {
		t.Errorf("Up(largest subnormal) = %v, want %v", got, want)
	}
	// Below 2^-1022 the quantum is 2^-1050: the smallest subnormal
	// rounds to 0 or to 2^-1050.
	if down, up := Down(5e-324), Up(5e-324); down != 0 || math.Signbit(down) || up != 0x1p-1050 {
		t.Errorf("Down(5e-324), Up(5e-324) = %v, %v; want 0, 2^-1050", down, up)
	}
	if got, want := Down(1e-310), math.Float64frombits(math.Float64bits(1e-310)&^lowBits); got != want {
		t.Errorf("Down(1e-310) = %v, want %v (quantum 2^-1050)", got, want)
	}
}

func TestQuantUpTo(t *testing.T) {
	offGrid := Down(10-1.0/3) + 0x1p-25*0.75 // between two 29-bit numbers
	tests := []struct{ x, most, want float64 }{
		{3, 10, 3},
		{0.1, 10, Up(0.1)},
		{Down(offGrid) + 0x1p-26, offGrid, Down(offGrid)}, // up would pass most
		{Down(offGrid) + 0x1p-26, 100, Up(offGrid)},
		// Near 3e9 the 29-bit numbers are 8 apart: where rounding down
		// would give back a unit or more, round up even past most.
		{3e9 + 1, 3e9 + 1.5, 3e9 + 8},
		{3e9 + 0.25, 3e9 + 0.5, 3e9},
	}
	for _, tt := range tests {
		if got := UpTo(tt.x, tt.most); got != tt.want {
			t.Errorf("UpTo(%v, %v) = %v, want %v", tt.x, tt.most, got, tt.want)
		}
	}
}

func TestStoredCount(t *testing.T) {
	for _, tt := range CountEdges {
		got := StoredCount(tt.X)
		if got != tt.Want || math.Signbit(got) {
			t.Errorf("StoredCount(%v) = %v, want %v", tt.X, got, tt.Want)
		}
	}
}

func TestUnits(t *testing.T) {
	for _, c := range []struct {
		v        float64
		down, up int64
	}{
		{0, 0, 0}, {-1.5, 0, 0}, {math.NaN(), 0, 0},
		{0.25, 0, 1}, {1, 1, 1}, {2.5, 2, 3}, {1e12, 1e12, 1e12},
	} {
		if got := Units(c.v); got != c.down {
			t.Errorf("Units(%v) = %d, want %d", c.v, got, c.down)
		}
		if got := UnitsUp(c.v); got != c.up {
			t.Errorf("UnitsUp(%v) = %d, want %d", c.v, got, c.up)
		}
	}
}
