package soak

import (
	"fmt"
	"time"
)

// Loss is what one daemon's sluice_globalshare_region_lost_total said at
// a sample: how many times since it started it found another region out
// of contact (stage silent), and how many times it took that region's
// share back (stage reclaimed).
type Loss struct {
	Daemon    string  `json:"daemon"`
	Region    string  `json:"region"` // the daemon's
	Lost      string  `json:"lost"`   // the region it found out of contact
	Count     float64 `json:"count"`
	Reclaimed float64 `json:"reclaimed,omitempty"`
}

// LossFigure is how many times a daemon found a region out of contact,
// over the run: explained by a partition of either region or by every
// daemon of the lost region down at once, or not explained (each of those
// also a violation).
type LossFigure struct {
	Explained   int `json:"explained"`
	Unexplained int `json:"unexplained"`
	// UnexplainedReclaimed is how many of the unexplained losses lasted
	// long enough for the finder to take the lost region's share back.
	UnexplainedReclaimed int `json:"unexplained_reclaimed"`
}

// FalsePartitions reads the losses the samples counted and returns a
// violation for each that no fault explains: a region found out of
// contact while neither it nor the finder's region was partitioned (slack
// either side of the partition included) and the lost region had a daemon
// up. A region that looks partitioned without being so has its share
// reclaimed by the others while it still enforces it, or cuts its own to
// the safe share: neither is the documented behaviour of a healthy
// region, starved of CPU or not.
func FalsePartitions(samples []Sample, faults []Span, slack time.Duration) ([]Violation, LossFigure) {
	c := checker{faults: faults}
	type key struct{ daemon, lost string }
	type reading struct {
		at               time.Time
		count, reclaimed float64
	}
	last := map[key]reading{}
	var fig LossFigure
	var out []Violation
	for _, s := range samples {
		for _, l := range s.Losses {
			k := key{l.Daemon, l.Lost}
			was, seen := last[k]
			last[k] = reading{s.At, l.Count, l.Reclaimed}
			from, n, nr := was.at, l.Count-was.count, l.Reclaimed-was.reclaimed
			if !seen {
				from = s.At.Add(-time.Minute) // before the first sample: the daemon's start
			}
			if l.Count < was.count || l.Reclaimed < was.reclaimed {
				n, nr = l.Count, l.Reclaimed // a daemon started again counts from zero
			}
			if n <= 0 {
				continue
			}
			cut := c.active(from, s.At, slack, l.Region, Partition)
			cut = append(cut, c.active(from, s.At, slack, l.Lost, Partition)...)
			if len(cut) > 0 || c.allDown(l.Lost, from.Add(-slack), s.At) {
				fig.Explained += int(n)
				continue
			}
			fig.Unexplained += int(n)
			fig.UnexplainedReclaimed += int(max(nr, 0))
			out = append(out, Violation{Rule: RuleFalsePartition, Time: s.At, Key: l.Daemon + ">" + l.Lost,
				Admitted: int(n), Faults: names(c.active(from, s.At, 0, "")),
				Detail: fmt.Sprintf("%s found region %s out of contact %v times (its share taken back %v times) in (%s, %s], with neither region partitioned and a daemon of %s up",
					l.Daemon, l.Lost, n, max(nr, 0), from.UTC().Format("15:04:05"), s.At.UTC().Format("15:04:05"), l.Lost)})
		}
	}
	return out, fig
}

// allDown reports whether two faults that take a daemon away overlapped
// in region during [from, to]: with two daemons a region, the only way all
// of them are down at once.
func (c *checker) allDown(region string, from, to time.Time) bool {
	fs := c.active(from, to, 0, region, daemonFaults...)
	for i, a := range fs {
		for _, b := range fs[i+1:] {
			if a.Start.Before(b.End) && b.Start.Before(a.End) && (a.Daemon != b.Daemon || a.Daemon == "") {
				return true
			}
		}
	}
	return false
}
