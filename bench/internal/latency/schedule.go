package latency

import (
	"math"
	"time"
)

// Schedule is an open-loop send plan: request i is due at Start + i/Rate,
// whatever happened to the requests before it. Latency is measured from a
// request's due time, not from when a busy connection got round to sending
// it, so a server that stalls is charged for every request that should have
// been sent during the stall (no coordinated omission).
type Schedule struct {
	Start time.Time
	// Rate is the offered load in requests per second; positive.
	Rate float64
}

// At is the due time of request i (0-based).
func (s Schedule) At(i int64) time.Time {
	return s.Start.Add(s.Offset(i))
}

// Offset is the due time of request i after Start, rounded down to the
// nanosecond.
func (s Schedule) Offset(i int64) time.Duration {
	return time.Duration(math.Floor(float64(i) * float64(time.Second) / s.Rate))
}

// Due is how many requests are due strictly before Start + d: the
// requests a run of length d offers.
func (s Schedule) Due(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	n := int64(math.Ceil(d.Seconds() * s.Rate))
	// Guard the float rounding at the boundary both ways.
	for n > 0 && s.Offset(n-1) >= d {
		n--
	}
	for s.Offset(n) < d {
		n++
	}
	return n
}
