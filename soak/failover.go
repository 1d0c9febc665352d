package soak

import (
	"fmt"
	"slices"
	"time"
)

// FailoverWatch finds the promotions of a region's Redis replicas from
// repeated readings of which nodes are primaries. It is a pure machine:
// Step takes one reading and the time it was taken.
type FailoverWatch struct {
	// Lead is how long before the reading that first shows a promotion
	// its span starts: the old primary may have taken writes it never
	// replicated for up to about twice the failure-detection timeout
	// before the replica took over.
	Lead  time.Duration
	known map[string]map[int]bool // region -> node port -> primary at its last reading
	last  map[string]time.Time    // region -> time of its last reading
}

// Step reads one region's roles at now: for each node port that answered,
// whether it is a primary (nodes that did not answer, a paused or killed
// one, are left out and keep what they were). It returns a Failover span
// for every node that was a replica at its last reading and is a primary
// now.
func (w *FailoverWatch) Step(region string, now time.Time, primary map[int]bool) []Span {
	if w.known == nil {
		w.known, w.last = map[string]map[int]bool{}, map[string]time.Time{}
	}
	k := w.known[region]
	if k == nil {
		k = map[int]bool{}
		w.known[region] = k
	}
	prev, seen := w.last[region]
	w.last[region] = now
	var out []Span
	ports := make([]int, 0, len(primary))
	for p := range primary {
		ports = append(ports, p)
	}
	slices.Sort(ports)
	for _, port := range ports {
		was, ok := k[port]
		is := primary[port]
		k[port] = is
		if ok && seen && !was && is {
			out = append(out, Span{Kind: Failover, Region: region, Detail: fmt.Sprintf("127.0.0.1:%d promoted", port),
				Start: prev.Add(-w.Lead), End: now})
		}
	}
	return out
}

// Spontaneous keeps the failovers of found that no fault of faults that
// takes a store away (a killed or paused primary, in the same region,
// within settle of it) explains: those the machine's load caused.
func Spontaneous(found, faults []Span, settle time.Duration) []Span {
	var out []Span
	for _, f := range found {
		explained := slices.ContainsFunc(faults, func(g Span) bool {
			return g.Region == f.Region && (g.Kind == KillPrimary || g.Kind == PauseRedis) &&
				!g.Start.After(f.End.Add(settle)) && !g.End.Add(settle).Before(f.Start)
		})
		if !explained {
			out = append(out, f)
		}
	}
	return out
}
