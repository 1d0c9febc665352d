// Package latency holds what the load generators (bench/loadgen over
// HTTP, bench/rlsload over gRPC) share: the open-loop send plan whose due
// times latency is measured from, and the histogram it is recorded in.
package latency

import (
	"math"
	"math/bits"
	"time"
)

// Histogram counts durations in log-linear buckets, the way HdrHistogram
// does with two significant decimal digits: values below 2^subBits
// nanoseconds have a bucket each; above that, every power of two is split
// into 2^(subBits-1) equal buckets, so a bucket's width is at most 1/64 of
// its lower bound (a relative error under 1.6%). Recording is a few
// integer operations and no allocation; the zero value is ready to use.
type Histogram struct {
	counts [numBuckets]uint64
	total  uint64
	min    int64
	max    int64
}

const (
	subBits    = 7
	subCount   = 1 << subBits            // 128 exact buckets for 0..127 ns
	halfCount  = subCount / 2            // buckets per power of two above that
	numBuckets = subCount + 56*halfCount // shifts 1..56 cover every int64
)

// bucketOf maps a non-negative value to its bucket index.
func bucketOf(v int64) int {
	if v < subCount {
		return int(v)
	}
	shift := bits.Len64(uint64(v)) - subBits // >= 1
	top := int(v >> uint(shift))             // in [halfCount, subCount)
	return subCount + (shift-1)*halfCount + (top - halfCount)
}

// bucketBounds is the smallest and largest value that bucketOf maps to i.
func bucketBounds(i int) (lo, hi int64) {
	if i < subCount {
		return int64(i), int64(i)
	}
	shift := (i-subCount)/halfCount + 1
	top := int64((i-subCount)%halfCount + halfCount)
	lo = top << uint(shift)
	if shift == 63-subBits && top == subCount-1 { // (top+1)<<shift would overflow
		return lo, math.MaxInt64
	}
	return lo, (top+1)<<uint(shift) - 1
}

// Record counts one duration; negative durations count as zero.
func (h *Histogram) Record(d time.Duration) {
	v := int64(d)
	if v < 0 {
		v = 0
	}
	h.counts[bucketOf(v)]++
	if h.total == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.total++
}

// Merge adds o's counts to h.
func (h *Histogram) Merge(o *Histogram) {
	if o.total == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.total == 0 || o.min < h.min {
		h.min = o.min
	}
	if o.max > h.max {
		h.max = o.max
	}
	h.total += o.total
}

// Count is the number of recorded values.
func (h *Histogram) Count() uint64 { return h.total }

// Max is the largest recorded value, exactly.
func (h *Histogram) Max() time.Duration { return time.Duration(h.max) }

// Quantile returns the value at or below which a fraction q (0..1) of the
// recorded values lie: the upper bound of the bucket holding the
// ceil(q*n)-th smallest value, capped at the exact maximum, so that it never
// understates a latency by more than one bucket's width and never exceeds
// what was seen. Zero when nothing was recorded.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.total)))
	if rank < 1 {
		rank = 1
	}
	if rank > h.total {
		rank = h.total
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			_, hi := bucketBounds(i)
			return time.Duration(min(max(hi, h.min), h.max))
		}
	}
	return time.Duration(h.max)
}
