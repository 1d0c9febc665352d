package simulator

import (
	"math"
	"time"
)

// Result is a run's outcome. Encoded as JSON it is byte-identical for the
// same scenario and seed (WallTime is not encoded).
type Result struct {
	Scenario    string         `json:"scenario"`
	Description string         `json:"description,omitempty"`
	Seed        uint64         `json:"seed"`
	Regions     int            `json:"regions"`
	Limit       float64        `json:"limit"`
	DurationS   float64        `json:"duration_s"`
	Summary     Summary        `json:"summary"`
	Targets     []TargetResult `json:"targets"`
	Windows     []Window       `json:"windows_10s"`
	Windows60   []Window       `json:"windows_60s"`
	// Checks is the number of engine checks made (regions and oracle).
	Checks   int64         `json:"checks"`
	WallTime time.Duration `json:"-"`
}

// ChecksPerSecond is engine checks per second of wall time.
func (r Result) ChecksPerSecond() float64 {
	if r.WallTime <= 0 {
		return 0
	}
	return float64(r.Checks) / r.WallTime.Seconds()
}

// Summary holds the figures of a run. Percentages are numbers (2.5 = 2.5%)
// of L_global over the window; error statistics skip the warm-up.
type Summary struct {
	GlobalErrorP50Pct float64 `json:"global_error_p50_pct"`
	GlobalErrorP99Pct float64 `json:"global_error_p99_pct"`
	GlobalErrorMaxPct float64 `json:"global_error_max_pct"`
	MeanErrorPct      float64 `json:"mean_error_pct"`
	GlobalError60P99  float64 `json:"global_error_60s_p99_pct"`
	RegionalErrorP99  float64 `json:"regional_error_p99_pct"`
	OvershootMaxPct   float64 `json:"overshoot_max_pct"`
	ConvergenceS      float64 `json:"convergence_s"`
	ErrorAfterChange  float64 `json:"error_after_change_max_pct"`
	RegionAfterChange float64 `json:"region_vs_oracle_after_change_max_pct"`
	FalseRejectionPct float64 `json:"false_rejection_pct"`
	ReportBytesPerS   float64 `json:"report_bytes_per_s_per_region"`
	Jain              float64 `json:"jain"`
	KeyErrorP99Pct    float64 `json:"key_error_p99_pct"`
	AdmittedVsOracle  float64 `json:"admitted_vs_oracle_pct"`
	// ChargedVsOracle is the units charged after the fact in every region
	// as a percentage of those the oracle charged (scenarios with Charge).
	ChargedVsOracle float64 `json:"charged_vs_oracle_pct,omitempty"`
	NFR02Pass       bool    `json:"nfr02_pass"`
	TargetsPass     bool    `json:"targets_pass"`
}

// TargetResult is one target with our figure.
type TargetResult struct {
	Target
	Value float64 `json:"value"`
	Pass  bool    `json:"pass"`
}

var metricNames = map[string]func(Summary) float64{
	"global_error_p50_pct":                  func(s Summary) float64 { return s.GlobalErrorP50Pct },
	"global_error_p99_pct":                  func(s Summary) float64 { return s.GlobalErrorP99Pct },
	"global_error_max_pct":                  func(s Summary) float64 { return s.GlobalErrorMaxPct },
	"mean_error_pct":                        func(s Summary) float64 { return s.MeanErrorPct },
	"global_error_60s_p99_pct":              func(s Summary) float64 { return s.GlobalError60P99 },
	"regional_error_p99_pct":                func(s Summary) float64 { return s.RegionalErrorP99 },
	"overshoot_max_pct":                     func(s Summary) float64 { return s.OvershootMaxPct },
	"convergence_s":                         func(s Summary) float64 { return s.ConvergenceS },
	"error_after_change_max_pct":            func(s Summary) float64 { return s.ErrorAfterChange },
	"region_vs_oracle_after_change_max_pct": func(s Summary) float64 { return s.RegionAfterChange },
	"false_rejection_pct":                   func(s Summary) float64 { return s.FalseRejectionPct },
	"report_bytes_per_s_per_region":         func(s Summary) float64 { return s.ReportBytesPerS },
	"jain":                                  func(s Summary) float64 { return s.Jain },
	"key_error_p99_pct":                     func(s Summary) float64 { return s.KeyErrorP99Pct },
	"admitted_vs_oracle_pct":                func(s Summary) float64 { return s.AdmittedVsOracle },
	"charged_vs_oracle_pct":                 func(s Summary) float64 { return s.ChargedVsOracle },
}

// NFR-02: within 5% of the limit in one region, within 15% globally (p99 of
// 10 s windows).
const (
	nfr02Regional = 5.0
	nfr02Global   = 15.0
)

func round(v float64) float64 { return math.Round(v*1e4) / 1e4 }

// Result ends the run at the scenario's Duration (its last interval runs
// until then; a Shares call past it ends the run there instead) and returns
// its figures. Seed, Checks and WallTime are the caller's to fill in. Call
// it once, last.
func (m *Recorder) Result() Result {
	m.finish()
	sc := m.sc
	res := Result{Scenario: sc.Name, Description: sc.Description, Regions: sc.Regions, Limit: sc.Limit.Rate,
		DurationS: sc.Duration.D().Seconds(), Windows: m.windows}
	warm := sc.Warmup.D().Seconds()
	var errs, abs, regs []float64
	var sum float64
	var sumRatio, sumRatio2 float64
	regOff := make([]int64, sc.Regions)
	regAdm := make([]int64, sc.Regions)
	var totAdm, totOrc int64
	for _, w := range m.windows {
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
	var sm Summary
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
	// 60 s windows.
	for i := 0; i+6 <= len(m.windows); i += 6 {
		w := Window{StartS: m.windows[i].StartS}
		for _, x := range m.windows[i : i+6] {
			w.Limit += x.Limit
			w.Offered += x.Offered
			w.Admitted += x.Admitted
			w.Oracle += x.Oracle
			w.HotKeys = max(w.HotKeys, x.HotKeys)
		}
		w.ErrorPct = float64(w.Admitted-w.Oracle) / (w.Limit * float64(max(1, w.HotKeys))) * 100
		if sc.Quota != nil {
			w.ErrorPct = float64(w.Admitted-w.Oracle) / float64(sc.Quota.Limit) * 100
		}
		res.Windows60 = append(res.Windows60, w)
	}
	var abs60 []float64
	for _, w := range res.Windows60 {
		if w.StartS >= warm {
			abs60 = append(abs60, math.Abs(w.ErrorPct))
		}
	}
	sm.GlobalError60P99 = percentile(abs60, 0.99)
	// Convergence: from ChangeAt until |E₁₀| ≤ 5% for 3 consecutive
	// windows; the value is the start of the first such window minus
	// ChangeAt (0 if the window holding the change already qualifies).
	change := sc.ChangeAt.D().Seconds()
	sm.ConvergenceS = -1
	wl := windowLen.Seconds()
	for i := range m.windows {
		if m.windows[i].StartS+wl <= change || i+3 > len(m.windows) {
			continue
		}
		ok := true
		for _, w := range m.windows[i : i+3] {
			if math.Abs(w.ErrorPct) > 5 {
				ok = false
			}
		}
		if ok {
			sm.ConvergenceS = math.Max(0, m.windows[i].StartS-change)
			break
		}
	}
	// After the change: windows starting one full window after the one
	// holding the change.
	after := math.Floor(change/wl)*wl + 2*wl
	if change == 0 {
		after = warm
	}
	for _, w := range m.windows {
		if w.StartS < after {
			continue
		}
		sm.ErrorAfterChange = math.Max(sm.ErrorAfterChange, math.Abs(w.ErrorPct))
		for _, r := range w.Regions {
			sm.RegionAfterChange = math.Max(sm.RegionAfterChange, math.Abs(r.OracleErrorPct))
		}
	}
	if m.totalOff > 0 {
		sm.FalseRejectionPct = float64(m.falseRej) / float64(m.totalOff) * 100
	}
	sm.ReportBytesPerS = float64(m.sent) / sc.Duration.D().Seconds() / float64(sc.Regions)
	n := 0
	for i := range regOff {
		if regOff[i] > 0 {
			x := float64(regAdm[i]) / float64(regOff[i])
			sumRatio += x
			sumRatio2 += x * x
			n++
		}
	}
	sm.Jain = 1
	if n > 0 && sumRatio2 > 0 {
		sm.Jain = sumRatio * sumRatio / (float64(n) * sumRatio2)
	}
	sm.KeyErrorP99Pct = percentile(m.keyErrs, 0.99)
	if totOrc > 0 {
		sm.AdmittedVsOracle = float64(totAdm) / float64(totOrc) * 100
	}
	if m.chargedOrc > 0 {
		sm.ChargedVsOracle = round(float64(m.charged) / float64(m.chargedOrc) * 100)
	}
	sm.NFR02Pass = sm.RegionalErrorP99 <= nfr02Regional && sm.GlobalErrorP99Pct <= nfr02Global
	for _, p := range []*float64{&sm.GlobalErrorP50Pct, &sm.GlobalErrorP99Pct, &sm.GlobalErrorMaxPct,
		&sm.MeanErrorPct, &sm.GlobalError60P99, &sm.RegionalErrorP99, &sm.OvershootMaxPct, &sm.ConvergenceS,
		&sm.ErrorAfterChange, &sm.RegionAfterChange, &sm.FalseRejectionPct, &sm.ReportBytesPerS, &sm.Jain,
		&sm.KeyErrorP99Pct, &sm.AdmittedVsOracle} {
		*p = round(*p)
	}
	sm.TargetsPass = true
	for _, t := range sc.Targets {
		v := metricNames[t.Metric](sm)
		pass := (t.Min == nil || v >= *t.Min) && (t.Max == nil || v <= *t.Max)
		if t.Metric == "convergence_s" && v < 0 {
			pass = false // never converged
		}
		res.Targets = append(res.Targets, TargetResult{Target: t, Value: v, Pass: pass})
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

func roundWindow(w *Window) {
	w.Limit = round(w.Limit)
	w.ErrorPct = round(w.ErrorPct)
	for i := range w.Regions {
		r := &w.Regions[i]
		r.Allowed, r.Share, r.ErrorPct, r.OracleErrorPct = round(r.Allowed), round(r.Share), round(r.ErrorPct), round(r.OracleErrorPct)
	}
}
