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
	Daemons     int       `json:"daemons"` // daemons that answered
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

// Leaks compares the mean of the samples taken before the first fault
// began (from) with the mean of those taken settle after the last one
// ended (to). A resource whose level after is above LeakTolerance times
// its level before is not OK; shrinking is fine. Only samples in which
// every daemon answered count, so a daemon down does not read as
// recovery. With no sample on either side there is no figure.
func Leaks(samples []Sample, from, to time.Time, settle time.Duration, daemons int) []LeakFigure {
	var before, after []Sample
	for _, s := range samples {
		if s.Daemons < daemons {
			continue
		}
		switch {
		case s.At.Before(from):
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
		{"redis_keys", func(s Sample) int64 { return s.RedisKeys }},
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
