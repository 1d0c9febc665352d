package soak

import (
	"fmt"
	"time"
)

// Sample is one reading of the deployment's resources, summed over its
// daemons (RSS, goroutines, open file descriptors) and its Redis
// primaries (keys, memory).
type Sample struct {
	At         time.Time `json:"at"`
	RSSBytes   int64     `json:"rss_bytes"`
	Goroutines int64     `json:"goroutines"`
	FDs        int64     `json:"fds"`
	// FDKinds splits FDs by kind: "redis" (connections to the
	// deployment's Redis servers and Sentinels), "listen", "tcp" (other
	// TCP), "udp", "other" (files, pipes, epoll, Unix sockets).
	FDKinds     map[string]int64 `json:"fd_kinds,omitempty"`
	RedisKeys   int64            `json:"redis_keys"`
	RedisMemory int64            `json:"redis_memory_bytes"`
	// RedisDataset is the primaries' used_memory_dataset: their memory
	// but the overhead (replication backlogs, client buffers, scripts).
	RedisDataset int64 `json:"redis_dataset_bytes"`
	// RedisPersistent is how many of the primaries' keys have no TTL:
	// what Sluice keeps for good (the policies), which traffic must not
	// make grow.
	RedisPersistent int64 `json:"redis_keys_without_ttl"`
	Daemons         int   `json:"daemons"` // daemons that answered
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
	// Mark, when set, is a level the level after may reach whatever the
	// level before (redis_conns: the pool's high-water mark during the
	// faults; redis_keys_per_1000_active: one key per active key).
	Mark float64 `json:"mark,omitempty"`
	OK   bool    `json:"ok"`
}

// LeakTolerance is how far above its level before the faults a resource
// may stay after them: 10%.
const LeakTolerance = 1.10

// Leaks compares the mean of the samples taken from settle after the
// start to the first fault (from) with the mean of those taken settle
// after the last one ended (to). Redis keys are compared per active key,
// since the traffic before and after differs. A resource whose level
// after is above LeakTolerance times its level before (or its mark, if
// higher) is not OK; shrinking is fine.
//
// The primaries' dataset memory may grow with the traffic: its mark is
// its level before times the active keys after over those before. It is
// not compared per active key: most of it does not grow with them (the
// policies and what else Sluice keeps for good), so its share per active
// key moves against the traffic: in a five-minute run whose active keys
// swung between 205 and 552, it read as a leak (6383 bytes before the
// faults, 9898 after) while the dataset stayed within 2.3 to 3.0 MB.
//
// Descriptors are two figures. "fds" is every descriptor but the
// connections to Redis. "redis_conns" is those: a daemon's Redis client
// keeps the connections a burst opened (a paused Redis leaves batches
// waiting while new ones go out on new connections) idle in its pool, up
// to the pool's size, and never closes them, so their level after the
// faults is the pool's high-water mark, not the level before. It is not
// OK above LeakTolerance times the highest level the samples up to the
// last fault's end reached (or the level before, if higher): a pool
// stays at its mark, a leak grows past it once the faults are over.
//
// Redis keys are two figures too. Keys per active key may reach 1000
// (its mark): an active key's state lives at most its window and a
// second, so a store whose TTLs work holds about one key per active key
// at most, and fewer when the traffic uses buckets lightly (a bucket
// expires once refilled, long before its window), so the level before
// the faults depends on the traffic then and may lie well below it. A
// key left without a TTL grows "redis_keys_without_ttl", which counts
// only those and is held to the tolerance of its level before: what
// Sluice keeps for good (the policies) does not grow with traffic.
//
// Only samples in which every daemon answered count, so a daemon down
// does not read as recovery. With no sample on either side there is no
// figure.
func Leaks(samples []Sample, start, from, to time.Time, settle time.Duration, daemons int) []LeakFigure {
	var before, after []Sample
	peakRedis := int64(0)
	for _, s := range samples {
		if s.Daemons < daemons {
			continue
		}
		if !s.At.After(to) {
			peakRedis = max(peakRedis, s.FDKinds["redis"])
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
	active := func(s Sample) int64 { return s.ActiveKeys }
	dataset := func(s Sample) int64 { return s.RedisDataset }
	get := []struct {
		name string
		f    func(Sample) int64
		mark float64 // the level after may reach this
	}{
		{"rss_bytes", func(s Sample) int64 { return s.RSSBytes }, 0},
		{"goroutines", func(s Sample) int64 { return s.Goroutines }, 0},
		{"fds", func(s Sample) int64 { return s.FDs - s.FDKinds["redis"] }, 0},
		{"redis_conns", func(s Sample) int64 { return s.FDKinds["redis"] }, float64(peakRedis)},
		{"redis_keys_per_1000_active", func(s Sample) int64 { return 1000 * s.RedisKeys / max(s.ActiveKeys, 1) }, 1000},
		{"redis_keys_without_ttl", func(s Sample) int64 { return s.RedisPersistent }, 0},
		{"redis_dataset_bytes", dataset, mean(before, dataset) * mean(after, active) / max(mean(before, active), 1)},
	}
	var out []LeakFigure
	for _, g := range get {
		b, a := mean(before, g.f), mean(after, g.f)
		r := a / max(b, 1)
		out = append(out, LeakFigure{Name: g.name, Before: b, After: a, Ratio: r, Mark: g.mark, OK: a <= max(b, g.mark)*LeakTolerance})
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
			detail := fmt.Sprintf("%s %.0f before the faults, %.0f after (x%.2f, tolerance x%.2f)", f.Name, f.Before, f.After, f.Ratio, LeakTolerance)
			if f.Mark > 0 {
				detail += fmt.Sprintf(", above %.0f, its mark", f.Mark)
			}
			out = append(out, Violation{Rule: RuleLeak, Time: at, Key: f.Name, Faults: []string{}, Detail: detail})
		}
	}
	return out
}
