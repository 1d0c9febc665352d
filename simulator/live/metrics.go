package live

import (
	"cmp"
	"context"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/sluice-rl/sluice/simulator"
)

// recorder collects what a live run's figures are computed from: the
// answers to its checks, which come back out of order from many goroutines,
// each region's share of key 0 sampled once per scenario second, and the
// regions' report sizes. result replays them in scenario-time order into a
// simulator.Recorder, so that live and virtual-time runs report the same
// figures by the same code.
type recorder struct {
	sc     simulator.Scenario
	f      float64     // live seconds per scenario second
	limits []limitRate // L over time, first at 0
	nsecs  int         // scenario seconds, the last one maybe partial

	mu         sync.Mutex
	answers    []answer
	shares     [][]float64 // [second][region]; nil: not sampled
	errs       int64
	late       []time.Duration // per answered check, after its instant
	firstErr   error
	drops      int64
	reportSize []float64 // per region, last report bytes seen
	checks     int64
}

// answer is one arrival with the daemon's and the oracle's decisions.
type answer struct {
	arrival
	admitted, oracle bool
}

// limitRate is L from scenario time at on, in live units per scenario
// second.
type limitRate struct {
	at   time.Duration
	lsec float64
}

func newRecorder(sc simulator.Scenario, f float64, limits []limitRate) *recorder {
	secs := int(math.Ceil(sc.Duration.D().Seconds()))
	return &recorder{sc: sc, f: f, limits: limits, nsecs: secs,
		shares: make([][]float64, secs), reportSize: make([]float64, sc.Regions)}
}

func (m *recorder) dropped() {
	m.mu.Lock()
	m.drops++
	m.mu.Unlock()
}

// arrival records one answered check (err: the check failed; it counts as
// offered and not admitted).
func (m *recorder) arrival(a arrival, oracle, admitted bool, err error, late time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.late = append(m.late, late)
	m.checks += 2 // the daemon's and the oracle's
	if err != nil {
		if m.errs == 0 {
			m.firstErr = err
		}
		m.errs++
		admitted = false
	}
	m.answers = append(m.answers, answer{arrival: a, admitted: admitted, oracle: oracle})
}

// lateness returns the median and 99th percentile of how late checks were
// answered. Called with m.mu held.
func (m *recorder) lateness() (p50, p99 time.Duration) {
	if len(m.late) == 0 {
		return 0, 0
	}
	s := slices.Clone(m.late)
	slices.Sort(s)
	at := func(q float64) time.Duration { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return at(0.5), at(0.99)
}

// sampleShares records each region's share of key 0 once per scenario
// second (from its first daemon's coordinator) and the regions' last report
// sizes, until the returned stop is called.
func (m *recorder) sampleShares(ctx context.Context, cl *cluster, start time.Time, subject string) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	step := time.Duration(float64(time.Second) * m.f)
	go func() {
		defer close(done)
		for {
			now := time.Now()
			s := int(math.Floor(now.Sub(start).Seconds() / m.f))
			if s >= 0 && s < m.nsecs {
				row := make([]float64, m.sc.Regions)
				for r := range row {
					n := cl.node(r, 0)
					if cl.crashed[r].Load() || n == nil {
						continue
					}
					c := n.d.Coordinator()
					row[r] = c.Share(policyID, subject)
					for _, ri := range c.Status().Regions {
						if ri.Region == regionName(r) && ri.LastReportBytes > 0 {
							m.mu.Lock()
							m.reportSize[r] = float64(ri.LastReportBytes)
							m.mu.Unlock()
						}
					}
				}
				m.mu.Lock()
				if m.shares[s] == nil {
					m.shares[s] = row
				}
				m.mu.Unlock()
			}
			next := start.Add(time.Duration(float64(s+1)*m.f*float64(time.Second)) + step/10)
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Until(next)):
			}
		}
	}()
	return func() { cancel(); <-done }
}

// result computes the simulator's Result from what was recorded: second by
// second, the share sample (held over unsampled seconds; zero before the
// first) and then that second's answers in the order they were scheduled.
// A limit step inside a second splits it there, so that L changes at the
// step's time, as in the simulator.
func (m *recorder) result() simulator.Result {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec := simulator.NewRecorder(m.sc)
	slices.SortStableFunc(m.answers, func(a, b answer) int { return cmp.Compare(a.at, b.at) })
	// Breakpoints: every whole second and every limit step.
	var bps []time.Duration
	for s := range m.nsecs {
		bps = append(bps, time.Duration(s)*time.Second)
	}
	for _, l := range m.limits[1:] {
		if l.at < m.sc.Duration.D() {
			bps = append(bps, l.at)
		}
	}
	slices.Sort(bps)
	bps = slices.Compact(bps)
	row := make([]float64, m.sc.Regions)
	i, li := 0, 0
	for j, bp := range bps {
		if s := int(bp / time.Second); bp%time.Second == 0 && m.shares[s] != nil {
			row = m.shares[s]
		}
		for li+1 < len(m.limits) && m.limits[li+1].at <= bp {
			li++
		}
		rec.Shares(bp, m.limits[li].lsec, row)
		last := j == len(bps)-1
		for ; i < len(m.answers) && (last || m.answers[i].at < bps[j+1]); i++ {
			a := m.answers[i]
			rec.Arrival(a.region, a.key, a.admitted, a.oracle)
		}
	}
	// Each region sends one report per interval, of the last size seen.
	var bytes float64
	for _, b := range m.reportSize {
		bytes += b
	}
	rec.Sent(int(math.Round(bytes * m.sc.Duration.D().Seconds() / m.sc.Share.Interval.D().Seconds())))
	res := rec.Result()
	res.Checks = m.checks
	return res
}
