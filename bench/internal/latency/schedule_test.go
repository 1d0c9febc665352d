package latency

import (
	"testing"
	"time"
)

func TestScheduleAt(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		rate float64
		i    int64
		want time.Duration
	}{
		{1000, 0, 0},
		{1000, 1, time.Millisecond},
		{1000, 2500, 2500 * time.Millisecond},
		{3, 1, 333333333}, // rounded down to the nanosecond
		{3, 3, time.Second},
		{0.5, 1, 2 * time.Second},
		{20000, 1_000_000, 50 * time.Second},
	}
	for _, tt := range tests {
		s := Schedule{Start: start, Rate: tt.rate}
		if got := s.At(tt.i).Sub(start); got != tt.want {
			t.Errorf("Schedule{Rate: %v}.At(%d) = start+%v, want start+%v", tt.rate, tt.i, got, tt.want)
		}
	}
}

func TestScheduleDoesNotDrift(t *testing.T) {
	// Due times come from the index, not from adding an interval, so a
	// rate whose interval is not a whole number of nanoseconds lands on
	// whole seconds exactly.
	s := Schedule{Rate: 7}
	for sec := int64(1); sec <= 10000; sec++ {
		if got := s.Offset(7 * sec); got != time.Duration(sec)*time.Second {
			t.Fatalf("Offset(%d) = %v, want %ds", 7*sec, got, sec)
		}
	}
}

func TestScheduleDue(t *testing.T) {
	tests := []struct {
		rate float64
		d    time.Duration
		want int64
	}{
		{1000, time.Second, 1000},     // 0 .. 999 ms; the 1000th is due at 1 s, not before
		{1000, time.Second + 1, 1001}, // one nanosecond later it is
		{1000, 0, 0},
		{3, time.Second, 3},
		{7, 10 * time.Second, 70},
		{20000, 10 * time.Second, 200000},
		{0.5, 3 * time.Second, 2}, // at 0 s and 2 s
	}
	for _, tt := range tests {
		s := Schedule{Rate: tt.rate}
		got := s.Due(tt.d)
		if got != tt.want {
			t.Errorf("Schedule{Rate: %v}.Due(%v) = %d, want %d", tt.rate, tt.d, got, tt.want)
		}
		// Due is exact: the last counted request is before d, the next is not.
		if got > 0 && s.Offset(got-1) >= tt.d || s.Offset(got) < tt.d {
			t.Errorf("Schedule{Rate: %v}.Due(%v) = %d: Offset(%d) = %v, Offset(%d) = %v", tt.rate, tt.d, got, got-1, s.Offset(got-1), got, s.Offset(got))
		}
	}
}
