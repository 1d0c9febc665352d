package simulator

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/racedetector"
)

// shortened compresses a scenario into about length of virtual time for
// property tests: every moment of the script (steps, bursts, partitions,
// crashes, limit steps, the quota window) scales with the duration, the
// global limit is at most 100 units/s and there are at most 100 keys, so
// one run takes milliseconds. The share interval stays as it is.
func shortened(sc Scenario, length time.Duration) Scenario {
	f := float64(length) / float64(sc.Duration.D())
	scale := func(d Duration) Duration {
		return Duration(time.Duration(float64(d) * f).Round(10 * time.Millisecond))
	}
	sc.Duration = Duration(length)
	sc.ChangeAt = scale(sc.ChangeAt)
	sc.Targets = nil
	if sc.Keys > 100 {
		sc.Keys = 100
		sc.Traffic.Rate = min(sc.Traffic.Rate, 10)
	}
	rate := min(sc.Limit.Rate, 100)
	if sc.Quota != nil {
		q := *sc.Quota
		q.Window = scale(q.Window)
		q.Limit = max(1, uint64(float64(q.Limit)*f*rate/sc.Limit.Rate))
		sc.Quota = &q
	}
	sc.Limit.Burst *= rate / sc.Limit.Rate
	sc.Limit.Rate = rate
	tr := sc.Traffic
	tr.Steps = append([]TrafficStep(nil), tr.Steps...)
	for i := range tr.Steps {
		tr.Steps[i].At = scale(tr.Steps[i].At)
	}
	if tr.Bursts != nil {
		b := *tr.Bursts
		b.Every, b.Length = max(scale(b.Every), Duration(time.Second)), max(scale(b.Length), Duration(100*time.Millisecond))
		tr.Bursts = &b
	}
	if tr.Diurnal != nil {
		d := *tr.Diurnal
		d.Period = scale(d.Period)
		tr.Diurnal = &d
	}
	sc.Traffic = tr
	g := sc.Gossip
	g.Partitions = append([]Partition(nil), g.Partitions...)
	for i := range g.Partitions {
		g.Partitions[i].Start, g.Partitions[i].End = scale(g.Partitions[i].Start), scale(g.Partitions[i].End)
	}
	g.Crashes = append([]Crash(nil), g.Crashes...)
	for i := range g.Crashes {
		g.Crashes[i].At, g.Crashes[i].Restart = scale(g.Crashes[i].At), scale(g.Crashes[i].Restart)
	}
	sc.Gossip = g
	sc.LimitSteps = append([]LimitStep(nil), sc.LimitSteps...)
	for i := range sc.LimitSteps {
		sc.LimitSteps[i].At = scale(sc.LimitSteps[i].At)
	}
	return sc
}

// propertyScenarios are the built-in scenarios shortened, plus a crash with
// a restart (the built-in crash never restarts).
func propertyScenarios(length time.Duration) []Scenario {
	var out []Scenario
	for _, sc := range Builtins() {
		out = append(out, shortened(sc, length))
	}
	restart, _ := Builtin("crash")
	restart.Name = "crash-restart"
	restart.Gossip.Crashes = []Crash{{Region: 4, At: sec(60), Restart: sec(150)}}
	return append(out, shortened(restart, length))
}

// propertySeeds is how many seeds TestPropertySharesValid runs: make test's
// 250 keep its first pass short on a shared 2-core machine, make property
// runs 1000.
var propertySeeds = flag.Int("property-seeds", 250, "seeds of each scenario TestPropertySharesValid runs")

// TestPropertySharesValid runs every built-in scenario (shortened to 60 s of
// virtual time) for -property-seeds seeds (50 with -short, and under the race
// detector, which looks for races, not for seeds; a charged token rate a
// tenth of them): no run panics or fails,
// at every tick every live region enforces a share in [MinShare, 1] and
// its view of a key's shares over the regions sums to at most 1 + 1e-9
// (Options.CheckShares), and a second run of every tenth seed gives the
// same JSON byte for byte.
func TestPropertySharesValid(t *testing.T) {
	seeds := *propertySeeds
	if testing.Short() || racedetector.Enabled {
		seeds = 50
	}
	scenarios := propertyScenarios(60 * time.Second)
	type job struct {
		sc   Scenario
		seed uint64
	}
	jobs := make(chan job)
	var (
		mu       sync.Mutex
		failures []string
		wg       sync.WaitGroup
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(failures) < 20 {
			failures = append(failures, fmt.Sprintf(format, args...))
		}
	}
	run := func(sc Scenario, seed uint64) (b []byte, err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panic: %v", p)
			}
		}()
		r, err := Run(context.Background(), sc, Options{Seed: seed, CheckShares: true})
		if err != nil {
			return nil, err
		}
		r.WallTime = 0
		var buf bytes.Buffer
		if err := WriteJSON(&buf, r); err != nil {
			return nil, err
		}
		return buf.Bytes(), nil
	}
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for j := range jobs {
				a, err := run(j.sc, j.seed)
				if err != nil {
					fail("%s seed %d: %v", j.sc.Name, j.seed, err)
					continue
				}
				if j.seed%10 != 0 {
					continue
				}
				if b, err := run(j.sc, j.seed); err != nil || !bytes.Equal(a, b) {
					fail("%s seed %d: a second run differs (err %v)", j.sc.Name, j.seed, err)
				}
			}
		})
	}
	for seed := range uint64(seeds) {
		for _, sc := range scenarios {
			// A charged token rate runs every tenth seed: its share
			// rules are the other scenarios', and its runs cost as
			// much as theirs.
			if sc.chargesRate() && seed%10 != 0 {
				continue
			}
			jobs <- job{sc, seed}
		}
	}
	close(jobs)
	wg.Wait()
	for _, f := range failures {
		t.Error(f)
	}
}
