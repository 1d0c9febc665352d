package soak

import (
	"fmt"
	"time"
)

// Sample is one reading of the deployment's resources, summed over its
// daemons (RSS, goroutines, open file descriptors) and its Redis
// primaries (keys, memory).
type Sample struct {
	At          time.Time `json:"at"`
	RSSBytes    int64     `json:"rss_bytes"`
	Goroutines  int64     `json:"goroutines"`
	FDs         int64     `json:"fds"`
	RedisKeys   int64     `json:"redis_keys"`
	RedisMemory int64     `json:"redis_memory_bytes"`
	// RedisDataset is the primaries' used_memory_dataset: their memory
	// but the overhead (replication backlogs, client buffers, scripts).
	RedisDataset int64 `json:"redis_dataset_bytes"`
	Daemons      int   `json:"daemons"` // daemons that answered
	// ActiveKeys is how many (store, policy, subject) the clients asked
	// for within the policy's window and a second before At: the keys
	// Redis should hold if TTLs work (CountActive fills it in).
	ActiveKeys int64 `json:"active_keys"`
	// Losses is, per daemon and other region, how many times the daemon
	// has found that region out of contact (FalsePartitions reads them).
	Losses []Loss `json:"losses,omitempty"`
}

// CountActive fills in each sample's ActiveKeys from the requests: a
// regional policy's key lives in its region's store, a global one's in
// every region's it was asked in; a key lives for its window plus a
// second (docs/algorithms.md, "idle state expires").
func CountActive(samples []Sample, reqs []Request, policies []PolicyState) {
	window := map[string]time.Duration{}
	for _, p := range policies {
		if p.Window > 0 {
			window[p.ID] = time.Duration(p.Window*float64(time.Second)) + time.Second
		}
	}
	for i := range samples {
		at := samples[i].At
		seen := map[[3]string]bool{}
		for _, r := range reqs {
			w, ok := window[r.Policy]
			if !ok || r.Start.After(at) || r.Start.Before(at.Add(-w)) || r.Err != "" {
				continue
			}
			seen[[3]string{r.Region, r.Policy, r.Subject}] = true
		}
		samples[i].ActiveKeys = int64(len(seen))
	}
}

// LeakFigure is one resource's level before the faults and after them.
type LeakFigure struct {
	Name   string  `json:"name"`
	Before float64 `json:"before"`
	After  float64 `json:"after"`
	Ratio  float64 `json:"ratio"`
	OK     bool    `json:"ok"`
}

// LeakTolerance is how far above its level before the faults a resource
// may stay after them: 10%.
const LeakTolerance = 1.10

// Leaks compares the mean of the samples taken from settle after the
// start to the first fault (from) with the mean of those taken settle
// after the last one ended (to). Redis keys are compared per active key,
// since the traffic before and after differs, and so is the primaries'
// dataset memory: the memory the data takes is bounded by the active keys. A resource whose level after is above LeakTolerance times
// its level before is not OK; shrinking is fine. Only samples in which
// every daemon answered count, so a daemon down does not read as
// recovery. With no sample on either side there is no figure.
func Leaks(samples []Sample, start, from, to time.Time, settle time.Duration, daemons int) []LeakFigure {
	var before, after []Sample
	for _, s := range samples {
		if s.Daemons < daemons {
			continue
		}
		switch {
		case s.At.Before(from) && !s.At.Before(start.Add(settle)):
			before = append(before, s)
		case s.At.After(to.Add(settle)):
			after = append(after, s)
		}
	}
	if len(before) == 0 || len(after) == 0 {
		return nil
	}
	get := []struct {
		name string
		f    func(Sample) int64
	}{
		{"rss_bytes", func(s Sample) int64 { return s.RSSBytes }},
		{"goroutines", func(s Sample) int64 { return s.Goroutines }},
		{"fds", func(s Sample) int64 { return s.FDs }},
		{"redis_keys_per_1000_active", func(s Sample) int64 { return 1000 * s.RedisKeys / max(s.ActiveKeys, 1) }},
		{"redis_dataset_bytes_per_active", func(s Sample) int64 { return s.RedisDataset / max(s.ActiveKeys, 1) }},
	}
	var out []LeakFigure
	for _, g := range get {
		b, a := mean(before, g.f), mean(after, g.f)
		r := a / max(b, 1)
		out = append(out, LeakFigure{Name: g.name, Before: b, After: a, Ratio: r, OK: a <= b*LeakTolerance})
	}
	return out
}

func mean(ss []Sample, f func(Sample) int64) float64 {
	sum := 0.0
	for _, s := range ss {
		sum += float64(f(s))
	}
	return sum / float64(len(ss))
}

// LeakViolations turns the figures that are not OK into violations.
func LeakViolations(figs []LeakFigure, at time.Time) []Violation {
	var out []Violation
	for _, f := range figs {
		if !f.OK {
			out = append(out, Violation{Rule: RuleLeak, Time: at, Key: f.Name, Faults: []string{},
				Detail: fmt.Sprintf("%s %.0f before the faults, %.0f after (x%.2f, tolerance x%.2f)", f.Name, f.Before, f.After, f.Ratio, LeakTolerance)})
		}
	}
	return out
}
