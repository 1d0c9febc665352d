package decisionlog

import (
	"cmp"
	"slices"
	"time"
)

// Count is one subject's estimated count in a TopK: the true count lies in
// [Count-Overcount, Count].
type Count struct {
	Key       string `json:"subject"`
	Count     uint64 `json:"count"`
	Overcount uint64 `json:"max_overcount"`
}

// TopK is a space-saving sketch (Metwally, Agrawal, El Abbadi 2005): it
// keeps at most k counters, so its memory does not grow with the number of
// keys, and every key whose true count exceeds total/k is in it. A key not
// held takes over the smallest counter and inherits its count as its
// possible overcount. It is not safe for concurrent use.
type TopK struct {
	k     int
	total uint64
	idx   map[string]int
	c     []Count
}

// NewTopK returns a sketch of k counters (at least 1).
func NewTopK(k int) *TopK {
	k = max(k, 1)
	return &TopK{k: k, idx: make(map[string]int, k), c: make([]Count, 0, k)}
}

// Add counts w more for key.
func (t *TopK) Add(key string, w uint64) {
	t.total += w
	if i, ok := t.idx[key]; ok {
		t.c[i].Count += w
		return
	}
	if len(t.c) < t.k {
		t.idx[key] = len(t.c)
		t.c = append(t.c, Count{Key: key, Count: w})
		return
	}
	m := 0
	for i := 1; i < len(t.c); i++ {
		if t.c[i].Count < t.c[m].Count {
			m = i
		}
	}
	delete(t.idx, t.c[m].Key)
	t.idx[key] = m
	t.c[m] = Count{Key: key, Count: t.c[m].Count + w, Overcount: t.c[m].Count}
}

// Total is the sum of every weight added.
func (t *TopK) Total() uint64 { return t.total }

// Top returns the n largest counts, largest first (ties by key).
func (t *TopK) Top(n int) []Count {
	out := slices.Clone(t.c)
	slices.SortFunc(out, func(a, b Count) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return cmp.Compare(a.Key, b.Key)
	})
	if n >= 0 && len(out) > n {
		out = out[:n]
	}
	return out
}

// merge adds o's counters into t, as if o's keys had been added to t with
// their counts; o's overcounts carry over. A space-saving sketch's counts
// sum to its total, so t's total grows by o's.
func (t *TopK) merge(o *TopK) {
	for _, c := range o.c {
		t.Add(c.Key, c.Count)
		t.c[t.idx[c.Key]].Overcount += c.Overcount
	}
}

// windowed is a TopK over a recent window: the current epoch's sketch and
// the previous one's, each Window long, so that Top covers between one and
// two windows of the most recent additions. Time is an argument.
type windowed struct {
	k        int
	window   time.Duration
	epoch    int64 // index of cur's epoch
	cur, old *TopK // old is epoch-1's, or nil
}

func newWindowed(k int, window time.Duration) *windowed {
	return &windowed{k: k, window: window, epoch: -1}
}

func (w *windowed) roll(now time.Time) {
	e := now.UnixNano() / int64(w.window)
	switch {
	case e == w.epoch:
		return
	case e == w.epoch+1:
		w.old = w.cur
	case e < w.epoch:
		return // a clock step back: keep counting into the current epoch
	default:
		w.old = nil
	}
	w.epoch, w.cur = e, NewTopK(w.k)
}

func (w *windowed) add(now time.Time, key string) {
	w.roll(now)
	w.cur.Add(key, 1)
}

// top merges the two epochs' sketches and returns the n largest, with
// the total over both epochs.
func (w *windowed) top(now time.Time, n int) ([]Count, uint64) {
	w.roll(now)
	m := NewTopK(w.k)
	if w.old != nil {
		m.merge(w.old)
	}
	m.merge(w.cur)
	return m.Top(n), m.total
}
