package live

import (
	"context"
	"encoding/json"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/sluice-rl/sluice/simulator"
)

// The simulator's metric code is unexported, so the recorder below computes
// the same figures, by the same definitions (simulator/metrics.go and
// result.go), from live arrivals. If the simulator exported a recorder
// (arrival(region, key, at, admitted, oracle), shares(at, []share) and
// Result(scenario)), live would call it instead.

const windowLen = 10 * time.Second // E₁₀ windows, in scenario time

// Thresholds of NFR-02, as in the simulator.
const (
	nfr02Regional = 5.0
	nfr02Global   = 15.0
)

type recorder struct {
	sc    simulator.Scenario
	f     float64 // live seconds per scenario second
	lsec  float64 // L in units per scenario second (live units)
	nwin  int
	nsecs int

	mu         sync.Mutex
	off, adm   []int64 // per window
	orc        []int64
	off0, orc0 []int64
	regOff0    [][]int64 // [window][region], key 0
	regAdm0    [][]int64
	regOffAll  []int64 // per region
	regAdmAll  []int64
	secOff0    [][]int64          // [second][region], key 0
	keyOff     []map[int][3]int64 // per window: key → offered, admitted, oracle
	secKey     []map[int][2]int64 // per second: key → offered, rejected
	shares     [][]float64        // [second][region], sampled
	sampled    []bool
	errs       int64
	drops      int64
	reportSize []float64 // per region, last report bytes seen
	checks     int64
}

func newRecorder(sc simulator.Scenario, f, limit float64) *recorder {
	secs := int(math.Ceil(sc.Duration.D().Seconds()))
	nwin := int(math.Ceil(sc.Duration.D().Seconds() / windowLen.Seconds()))
	m := &recorder{sc: sc, f: f, lsec: limit * f, nwin: nwin, nsecs: secs,
		off: make([]int64, nwin), adm: make([]int64, nwin), orc: make([]int64, nwin),
		off0: make([]int64, nwin), orc0: make([]int64, nwin),
		regOffAll: make([]int64, sc.Regions), regAdmAll: make([]int64, sc.Regions),
		shares: make([][]float64, secs), sampled: make([]bool, secs), reportSize: make([]float64, sc.Regions)}
	for range nwin {
		m.regOff0 = append(m.regOff0, make([]int64, sc.Regions))
		m.regAdm0 = append(m.regAdm0, make([]int64, sc.Regions))
		m.keyOff = append(m.keyOff, map[int][3]int64{})
	}
	for range secs {
		m.secOff0 = append(m.secOff0, make([]int64, sc.Regions))
		m.secKey = append(m.secKey, map[int][2]int64{})
	}
	return m
}

func (m *recorder) dropped() {
	m.mu.Lock()
	m.drops++
	m.mu.Unlock()
}

// arrival records one answered check (err: the check failed; it counts as
// offered and not admitted).
func (m *recorder) arrival(a arrival, oracle, admitted bool, err error) {
	w := min(int(a.at/windowLen), m.nwin-1)
	s := min(int(a.at/time.Second), m.nsecs-1)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.checks += 2 // the daemon's and the oracle's
	if err != nil {
		m.errs++
		admitted = false
	}
	m.off[w]++
	m.regOffAll[a.region]++
	if admitted {
		m.adm[w]++
		m.regAdmAll[a.region]++
	}
	if oracle {
		m.orc[w]++
	}
	if a.key == 0 {
		m.off0[w]++
		m.regOff0[w][a.region]++
		m.secOff0[s][a.region]++
		if admitted {
			m.regAdm0[w][a.region]++
		}
		if oracle {
			m.orc0[w]++
		}
	}
	ko := m.keyOff[w][a.key]
	ko[0]++
	if admitted {
		ko[1]++
	}
	if oracle {
		ko[2]++
	}
	m.keyOff[w][a.key] = ko
	ks := m.secKey[s][a.key]
	ks[0]++
	if !admitted {
		ks[1]++
	}
	m.secKey[s][a.key] = ks
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
				row := make([]float64, len(cl.nodes))
				for r, ns := range cl.nodes {
					if cl.crashed[r].Load() || len(ns) == 0 {
						continue
					}
					c := ns[0].d.Coordinator()
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
				if !m.sampled[s] {
					m.shares[s], m.sampled[s] = row, true
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

func percentile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

func round(v float64) float64 { return math.Round(v*1e4) / 1e4 }

// result computes the simulator's Result from what was recorded.
func (m *recorder) result(cl *cluster) simulator.Result {
	m.mu.Lock()
	defer m.mu.Unlock()
	sc := m.sc
	n := sc.Regions
	// Fill unsampled seconds with the last sample.
	var last []float64
	for s := range m.shares {
		if m.sampled[s] {
			last = m.shares[s]
		} else {
			m.shares[s] = last
		}
	}
	res := simulator.Result{Scenario: sc.Name, Description: sc.Description, Regions: n, Limit: sc.Limit.Rate,
		DurationS: sc.Duration.D().Seconds(), Checks: m.checks}
	wsecs := int(windowLen / time.Second)
	var keyErrs []float64
	for w := 0; w < m.nwin; w++ {
		secs := min(wsecs, m.nsecs-w*wsecs)
		lint := m.lsec * float64(secs)
		win := simulator.Window{StartS: float64(w * wsecs), Limit: lint, Offered: m.off[w], Admitted: m.adm[w], Oracle: m.orc[w]}
		denom := lint
		if sc.Keys > 1 {
			hot := 0
			for _, ko := range m.keyOff[w] {
				if float64(ko[0]) > 0.5*lint {
					hot++
				}
				if ko[0] > ko[1] || ko[0] > ko[2] {
					keyErrs = append(keyErrs, math.Abs(float64(ko[1]-ko[2]))/lint*100)
				}
			}
			win.HotKeys = hot
			denom *= float64(max(1, hot))
		}
		win.ErrorPct = float64(m.adm[w]-m.orc[w]) / denom * 100
		ratio := 1.0
		if m.off0[w] > 0 {
			ratio = float64(m.orc0[w]) / float64(m.off0[w])
		}
		for r := 0; r < n; r++ {
			var allowed, shareSum, expected float64
			for s := w * wsecs; s < w*wsecs+secs; s++ {
				sh := 0.0
				if m.shares[s] != nil {
					sh = m.shares[s][r]
				}
				shareSum += sh
				al := sh * m.lsec
				allowed += al
				expected += math.Min(float64(m.secOff0[s][r]), al)
			}
			rw := simulator.RegionWindow{Offered: m.regOff0[w][r], Admitted: m.regAdm0[w][r], Allowed: allowed, Share: shareSum / float64(max(1, secs))}
			rw.ErrorPct = (float64(rw.Admitted) - expected) / lint * 100
			rw.OracleErrorPct = (float64(rw.Admitted) - float64(rw.Offered)*ratio) / lint * 100
			win.Regions = append(win.Regions, rw)
		}
		if secs*2 >= wsecs {
			res.Windows = append(res.Windows, win)
		}
	}

	warm := sc.Warmup.D().Seconds()
	var sm simulator.Summary
	var errs, abs, regs []float64
	var sum float64
	var totAdm, totOrc int64
	regOff := make([]int64, n)
	regAdm := make([]int64, n)
	for _, w := range res.Windows {
		totAdm += w.Admitted
		totOrc += w.Oracle
		if w.StartS < warm {
			continue
		}
		errs = append(errs, w.ErrorPct)
		abs = append(abs, math.Abs(w.ErrorPct))
		sum += w.ErrorPct
		for i, r := range w.Regions {
			regs = append(regs, math.Abs(r.ErrorPct))
			regOff[i] += r.Offered
			regAdm[i] += r.Admitted
		}
	}
	sm.GlobalErrorP50Pct = percentile(abs, 0.5)
	sm.GlobalErrorP99Pct = percentile(abs, 0.99)
	sm.GlobalErrorMaxPct = percentile(abs, 1)
	if len(errs) > 0 {
		sm.MeanErrorPct = sum / float64(len(errs))
	}
	for _, e := range errs {
		sm.OvershootMaxPct = math.Max(sm.OvershootMaxPct, e)
	}
	sm.RegionalErrorP99 = percentile(regs, 0.99)
	for i := 0; i+6 <= len(res.Windows); i += 6 {
		w := simulator.Window{StartS: res.Windows[i].StartS}
		for _, x := range res.Windows[i : i+6] {
			w.Limit += x.Limit
			w.Offered += x.Offered
			w.Admitted += x.Admitted
			w.Oracle += x.Oracle
			w.HotKeys = max(w.HotKeys, x.HotKeys)
		}
		w.ErrorPct = float64(w.Admitted-w.Oracle) / (w.Limit * float64(max(1, w.HotKeys))) * 100
		res.Windows60 = append(res.Windows60, w)
	}
	var abs60 []float64
	for _, w := range res.Windows60 {
		if w.StartS >= warm {
			abs60 = append(abs60, math.Abs(w.ErrorPct))
		}
	}
	sm.GlobalError60P99 = percentile(abs60, 0.99)
	change := sc.ChangeAt.D().Seconds()
	wl := windowLen.Seconds()
	sm.ConvergenceS = -1
	for i := range res.Windows {
		if res.Windows[i].StartS+wl <= change || i+3 > len(res.Windows) {
			continue
		}
		ok := true
		for _, w := range res.Windows[i : i+3] {
			if math.Abs(w.ErrorPct) > 5 {
				ok = false
			}
		}
		if ok {
			sm.ConvergenceS = math.Max(0, res.Windows[i].StartS-change)
			break
		}
	}
	after := math.Floor(change/wl)*wl + 2*wl
	if change == 0 {
		after = warm
	}
	for _, w := range res.Windows {
		if w.StartS < after {
			continue
		}
		sm.ErrorAfterChange = math.Max(sm.ErrorAfterChange, math.Abs(w.ErrorPct))
		for _, r := range w.Regions {
			sm.RegionAfterChange = math.Max(sm.RegionAfterChange, math.Abs(r.OracleErrorPct))
		}
	}
	var falseRej, totalOff int64
	for _, ks := range m.secKey {
		for _, v := range ks {
			totalOff += v[0]
			if float64(v[0]) <= m.lsec {
				falseRej += v[1]
			}
		}
	}
	if totalOff > 0 {
		sm.FalseRejectionPct = float64(falseRej) / float64(totalOff) * 100
	}
	// One report per region per interval, in bytes per scenario second.
	var bytes float64
	for _, b := range m.reportSize {
		bytes += b
	}
	sm.ReportBytesPerS = bytes / float64(n) / sc.Share.Interval.D().Seconds()
	var sr, sr2 float64
	k := 0
	for i := range regOff {
		if regOff[i] > 0 {
			x := float64(regAdm[i]) / float64(regOff[i])
			sr += x
			sr2 += x * x
			k++
		}
	}
	sm.Jain = 1
	if k > 0 && sr2 > 0 {
		sm.Jain = sr * sr / (float64(k) * sr2)
	}
	sm.KeyErrorP99Pct = percentile(keyErrs, 0.99)
	if totOrc > 0 {
		sm.AdmittedVsOracle = float64(totAdm) / float64(totOrc) * 100
	}
	sm.NFR02Pass = sm.RegionalErrorP99 <= nfr02Regional && sm.GlobalErrorP99Pct <= nfr02Global
	for _, p := range []*float64{&sm.GlobalErrorP50Pct, &sm.GlobalErrorP99Pct, &sm.GlobalErrorMaxPct,
		&sm.MeanErrorPct, &sm.GlobalError60P99, &sm.RegionalErrorP99, &sm.OvershootMaxPct, &sm.ConvergenceS,
		&sm.ErrorAfterChange, &sm.RegionAfterChange, &sm.FalseRejectionPct, &sm.ReportBytesPerS, &sm.Jain,
		&sm.KeyErrorP99Pct, &sm.AdmittedVsOracle} {
		*p = round(*p)
	}
	// Targets name Summary fields by their JSON names.
	var fields map[string]any
	if b, err := json.Marshal(sm); err == nil {
		json.Unmarshal(b, &fields)
	}
	sm.TargetsPass = true
	for _, t := range sc.Targets {
		v, _ := fields[t.Metric].(float64)
		pass := (t.Min == nil || v >= *t.Min) && (t.Max == nil || v <= *t.Max)
		if t.Metric == "convergence_s" && v < 0 {
			pass = false
		}
		res.Targets = append(res.Targets, simulator.TargetResult{Target: t, Value: v, Pass: pass})
		sm.TargetsPass = sm.TargetsPass && pass
	}
	res.Summary = sm
	for i := range res.Windows {
		roundWindow(&res.Windows[i])
	}
	for i := range res.Windows60 {
		roundWindow(&res.Windows60[i])
	}
	return res
}

func roundWindow(w *simulator.Window) {
	w.Limit = round(w.Limit)
	w.ErrorPct = round(w.ErrorPct)
	for i := range w.Regions {
		r := &w.Regions[i]
		r.Allowed, r.Share, r.ErrorPct, r.OracleErrorPct = round(r.Allowed), round(r.Share), round(r.ErrorPct), round(r.OracleErrorPct)
	}
}
