package latency

import (
	"math"
	"testing"
	"time"
)

func TestBucketBoundsContainTheirValues(t *testing.T) {
	values := []int64{0, 1, 63, 127, 128, 129, 255, 256, 1000, 1023, 1024, 12345, 999_999, 1 << 40, math.MaxInt64 - 1, math.MaxInt64}
	for _, v := range values {
		i := bucketOf(v)
		if i < 0 || i >= numBuckets {
			t.Fatalf("bucketOf(%d) = %d, want in [0, %d)", v, i, numBuckets)
		}
		lo, hi := bucketBounds(i)
		if v < lo || v > hi {
			t.Errorf("bucketOf(%d) = %d with bounds [%d, %d], want the value inside", v, i, lo, hi)
		}
	}
}

func TestBucketsTileTheRange(t *testing.T) {
	// Each bucket starts right after the previous one ends, and both its
	// bounds map back to it: no value falls between buckets or into two.
	prevHi := int64(-1)
	for i := 0; i < numBuckets; i++ {
		lo, hi := bucketBounds(i)
		if lo != prevHi+1 {
			t.Fatalf("bucket %d starts at %d, want %d", i, lo, prevHi+1)
		}
		if bucketOf(lo) != i || bucketOf(hi) != i {
			t.Fatalf("bucket %d = [%d, %d] maps back to %d and %d", i, lo, hi, bucketOf(lo), bucketOf(hi))
		}
		// Relative width at most 1/64 above the exact range.
		if lo >= subCount && float64(hi-lo+1) > float64(lo)/halfCount+0.5 {
			t.Fatalf("bucket %d = [%d, %d] is wider than 1/%d of its start", i, lo, hi, halfCount)
		}
		prevHi = hi
		if hi == math.MaxInt64 {
			if i != numBuckets-1 {
				t.Fatalf("bucket %d reaches MaxInt64 but is not the last of %d", i, numBuckets)
			}
			return
		}
	}
	t.Fatalf("the last bucket ends at %d, want MaxInt64", prevHi)
}

func TestQuantile(t *testing.T) {
	// 1..1000 µs, once each.
	var h Histogram
	for v := 1; v <= 1000; v++ {
		h.Record(time.Duration(v) * time.Microsecond)
	}
	tests := []struct {
		q    float64
		want time.Duration // exact order statistic
	}{
		{0, 1 * time.Microsecond},
		{0.5, 500 * time.Microsecond},
		{0.9, 900 * time.Microsecond},
		{0.99, 990 * time.Microsecond},
		{0.999, 999 * time.Microsecond},
		{1, 1000 * time.Microsecond},
	}
	for _, tt := range tests {
		got := h.Quantile(tt.q)
		// The upper bound of the bucket: never below the true value, at
		// most one bucket width (1/64) above it, never above the max.
		if got < tt.want || float64(got) > float64(tt.want)*(1+1.0/halfCount) || got > h.Max() {
			t.Errorf("Quantile(%v) = %v, want in [%v, %v·(1+1/64)] and at most max %v", tt.q, got, tt.want, tt.want, h.Max())
		}
	}
	if h.Count() != 1000 || h.Max() != time.Millisecond {
		t.Errorf("Count, Max = %d, %v, want 1000, 1ms", h.Count(), h.Max())
	}
}

func TestQuantileOfOneValueIsThatValue(t *testing.T) {
	var h Histogram
	h.Record(123456 * time.Nanosecond)
	for _, q := range []float64{0, 0.5, 0.999, 1} {
		if got := h.Quantile(q); got != 123456 {
			t.Errorf("Quantile(%v) = %v, want 123.456µs (min and max cap the bucket)", q, got)
		}
	}
}

func TestEmptyAndNegative(t *testing.T) {
	var h Histogram
	if got := h.Quantile(0.99); got != 0 {
		t.Errorf("empty Quantile = %v, want 0", got)
	}
	h.Record(-time.Second)
	if got := h.Quantile(0.5); got != 0 || h.Count() != 1 {
		t.Errorf("after a negative record: Quantile = %v, Count = %d, want 0, 1", got, h.Count())
	}
}

func TestMergeEqualsRecordingTogether(t *testing.T) {
	var a, b, both Histogram
	for v := 1; v <= 500; v++ {
		d := time.Duration(v*v) * time.Microsecond
		if v%3 == 0 {
			a.Record(d)
		} else {
			b.Record(d)
		}
		both.Record(d)
	}
	var m Histogram
	m.Merge(&a)
	m.Merge(&b)
	m.Merge(&Histogram{})
	if m != both {
		t.Fatalf("merge of the parts differs from one histogram of everything: count %d max %v, want %d %v", m.Count(), m.Max(), both.Count(), both.Max())
	}
}
