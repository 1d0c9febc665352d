package soak

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"time"
)

// Traffic is the shape of a soak's load, a pure function of its seed: a
// steady base rate per region that shifts every Segment (each region's
// multiplier drawn anew, so load moves between regions), bursts of
// BurstFactor for BurstLength in some segments, and subjects drawn from a
// hot one, a pool of cold ones and new ones never seen before.
type Traffic struct {
	Seed        uint64
	Base        float64 // requests per second per region and client kind
	Segment     time.Duration
	BurstLength time.Duration
	BurstFactor float64
	ColdPool    int
}

// DefaultTraffic is the load make soak runs: modest, for a shared machine.
func DefaultTraffic(seed uint64) Traffic {
	return Traffic{Seed: seed, Base: 12, Segment: 30 * time.Second, BurstLength: 5 * time.Second, BurstFactor: 4, ColdPool: 300}
}

// draw returns a number in [0, 1) fixed by the seed and the labels.
func (tr Traffic) draw(labels ...any) float64 {
	h := fnv.New64a()
	fmt.Fprint(h, tr.Seed, labels)
	return rand.New(rand.NewPCG(h.Sum64(), tr.Seed)).Float64()
}

var shifts = []float64{0.5, 1, 1, 1.5, 2}

// Rate is the offered rate, per second, of client kind in region at
// offset t of the run.
func (tr Traffic) Rate(region, kind string, t time.Duration) float64 {
	seg := int64(t / tr.Segment)
	r := tr.Base * shifts[int(tr.draw(region, kind, seg)*float64(len(shifts)))]
	if tr.draw("burst", region, seg) < 0.3 {
		start := time.Duration(tr.draw("burst-at", region, seg) * float64(tr.Segment-tr.BurstLength))
		if in := t - time.Duration(seg)*tr.Segment; in >= start && in < start+tr.BurstLength {
			r *= tr.BurstFactor
		}
	}
	return r
}

// Subjects picks the subjects of one client's requests.
type Subjects struct {
	rng  *rand.Rand
	pool int
	next int
	name string
}

// Subjects returns the subject picker of the client named name.
func (tr Traffic) Subjects(name string) *Subjects {
	h := fnv.New64a()
	fmt.Fprint(h, name)
	return &Subjects{rng: rand.New(rand.NewPCG(tr.Seed, h.Sum64())), pool: tr.ColdPool, name: name}
}

// HotSubject is the one subject every client sends a third of its
// requests for.
const HotSubject = "hot"

// Next returns the next subject: the hot one (30%), a cold one of the
// pool (50%) or a new one (20%), and a number in [0, 1) for the caller's
// other choices.
func (s *Subjects) Next() (string, float64) {
	p, q := s.rng.Float64(), s.rng.Float64()
	switch {
	case p < 0.3:
		return HotSubject, q
	case p < 0.8:
		return fmt.Sprintf("c%d", s.rng.IntN(s.pool)), q
	}
	s.next++
	return fmt.Sprintf("n-%s-%d", s.name, s.next), q
}
