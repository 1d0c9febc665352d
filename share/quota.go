package share

import (
	"math"
	"slices"
	"strings"
	"time"
)

// RegionCount is one region's component of a QuotaCounter.
type RegionCount struct {
	Region string `msgpack:"r" json:"region"`
	Count  uint64 `msgpack:"c" json:"count"`
}

// QuotaCounter is a grow-only counter (G-counter) of the units one key has
// spent in one fixed window (e.g. a UTC day), with one monotone component
// per region. Each region increments only its own component and merges the
// others' from reports; merging takes the larger value of each component,
// so merges commute, repeat safely and arrive in any order. A newer window
// replaces an older one. Counts is sorted by region.
type QuotaCounter struct {
	Key
	// Window is the window index: WindowIndex(now, length).
	Window int64         `msgpack:"w" json:"window"`
	Counts []RegionCount `msgpack:"n" json:"counts"`
}

// WindowIndex returns the fixed window containing now: windows are aligned
// to the Unix epoch, so a 24 h window is a UTC day.
func WindowIndex(now time.Time, length time.Duration) int64 {
	ns := now.UnixNano()
	w := ns / int64(length)
	if ns < 0 && ns%int64(length) != 0 {
		w--
	}
	return w
}

func (q *QuotaCounter) find(region string) (int, bool) {
	return slices.BinarySearchFunc(q.Counts, region, func(c RegionCount, r string) int {
		return strings.Compare(c.Region, r)
	})
}

// Roll moves the counter to window w, clearing the counts if w is newer.
// Older windows are ignored.
func (q *QuotaCounter) Roll(w int64) {
	if w > q.Window {
		q.Window = w
		q.Counts = q.Counts[:0]
	}
}

// Add adds n units to region's component in window w (rolling first).
func (q *QuotaCounter) Add(w int64, region string, n uint64) {
	q.Roll(w)
	if w < q.Window {
		return
	}
	i, ok := q.find(region)
	if !ok {
		q.Counts = slices.Insert(q.Counts, i, RegionCount{Region: region})
	}
	q.Counts[i].Count = SatAdd(q.Counts[i].Count, n)
}

// Get returns region's component.
func (q QuotaCounter) Get(region string) uint64 {
	if i, ok := q.find(region); ok {
		return q.Counts[i].Count
	}
	return 0
}

// Total returns the global count: the sum of the components, saturating
// at the largest uint64 so that no set of components, however received,
// wraps around to a small count that would admit again.
func (q QuotaCounter) Total() uint64 {
	var t uint64
	for _, c := range q.Counts {
		t = SatAdd(t, c.Count)
	}
	return t
}

// SatAdd returns a + b, or the largest uint64 where the sum would wrap.
func SatAdd(a, b uint64) uint64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxUint64
}

// Merge folds o into q: a newer window replaces q, the same window takes
// the maximum of each component, an older one is ignored.
func (q *QuotaCounter) Merge(o QuotaCounter) {
	if o.Window < q.Window {
		return
	}
	if o.Window > q.Window {
		q.Window = o.Window
		q.Counts = q.Counts[:0]
	}
	for _, c := range o.Counts {
		i, ok := q.find(c.Region)
		if !ok {
			q.Counts = slices.Insert(q.Counts, i, c)
			continue
		}
		q.Counts[i].Count = max(q.Counts[i].Count, c.Count)
	}
}

// Allow reports whether region may spend cost more units in window w under
// limit: its own count plus the last known counts of the others plus cost
// stay within limit. It does not record the spend; call Add when allowed.
func (q QuotaCounter) Allow(w int64, limit, cost uint64) bool {
	if w > q.Window {
		return cost <= limit
	}
	if w < q.Window {
		return false
	}
	t := q.Total()
	return t <= limit && cost <= limit-t
}

// Clone returns a deep copy, for putting into a Report.
func (q QuotaCounter) Clone() QuotaCounter {
	q.Counts = slices.Clone(q.Counts)
	return q
}
