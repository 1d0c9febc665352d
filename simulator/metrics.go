package simulator

import (
	"math"
	"slices"
	"time"
)

// windowLen is the length of the error windows (E₁₀); 60 s windows are
// built from six of them.
const windowLen = 10 * time.Second

// Window holds one 10 s (or 60 s) window. Counts are units; Limit is the
// integral of L over the window (L·W units per key).
type Window struct {
	StartS   float64        `json:"start_s"`
	Limit    float64        `json:"limit"`
	Offered  int64          `json:"offered"`
	Admitted int64          `json:"admitted"`
	Oracle   int64          `json:"oracle"`
	ErrorPct float64        `json:"error_pct"`
	HotKeys  int            `json:"hot_keys,omitempty"`
	Regions  []RegionWindow `json:"regions"`
}

// RegionWindow is one region's figures for the hottest key (key 0) in a
// window. Allowed is ∫ share·L dt; Share its mean.
type RegionWindow struct {
	Offered  int64   `json:"offered"`
	Admitted int64   `json:"admitted"`
	Allowed  float64 `json:"allowed"`
	Share    float64 `json:"share"`
	// ErrorPct is (admitted − Σ_seconds min(offered, allowed)) / (L·W):
	// how well the region enforces its own share (zero for quotas).
	ErrorPct float64 `json:"error_pct"`
	// OracleErrorPct is (admitted − offered·a) / (L·W), where a is the
	// oracle's admit ratio: how far the region is from the admissions a
	// central limiter would have given its traffic.
	OracleErrorPct float64 `json:"oracle_error_pct"`
}

// A Recorder computes a run's Result (its windows, summary and targets, by
// the definitions of docs/simulator.md) from what happened in the run: the
// limit and each region's share of key 0 over time, every arrival with the
// region's and the oracle's decisions, and the share traffic sent. The
// virtual-time simulator feeds one every tick; simulator/live feeds one the
// arrivals and share samples of a run against real daemons, so that both
// report the same figures by the same code.
//
// Time is scenario time since the start of the run and moves only with
// Shares. Each Shares call starts an interval that lasts until the next
// call (or, for the last, until the scenario's Duration), and every
// Arrival belongs to the interval begun by the last Shares call. A second
// ends at the first Shares call at least 1 s after its start, a 10 s window
// at the first call at least 10 s after its start: call Shares at the start
// of every tick, or at least at every whole second.
//
// A Recorder is not safe for concurrent use.
type Recorder struct {
	sc Scenario
	// Units charged after the fact, in every region and at the oracle.
	charged, chargedOrc int64
	now                 time.Duration // start of the current interval
	limit               float64       // L over the current interval, units/s
	shares              []float64     // per region, over the current interval
	sent                int64         // bytes of share traffic

	winStart time.Duration
	lint     float64 // ∫ L dt, units
	off, adm int64
	orc      int64
	off0     int64
	orc0     int64
	regs     []regAcc

	// Per key, per window (multi-key scenarios).
	offK, admK, orcK []int32
	touchedK         []int32
	keyErrs          []float64

	// Per key, per second (false rejections).
	secStart   time.Duration
	offS, rejS []int32
	touchedS   []int32
	falseRej   int64
	totalOff   int64

	windows []Window
}

type regAcc struct {
	off0, adm0  int64
	allowed0    float64
	shareInt    float64
	offAll      int64
	admAll      int64
	offSec0     int64
	allowedSec0 float64
	expected0   float64 // Σ over seconds of min(offered, allowed)
}

// NewRecorder returns a Recorder for sc (with the simulator's defaults
// filled in) at time 0, with every share zero until the first Shares call.
func NewRecorder(sc Scenario) *Recorder {
	sc = sc.withDefaults()
	m := &Recorder{sc: sc, limit: sc.Limit.Rate, shares: make([]float64, sc.Regions), regs: make([]regAcc, sc.Regions)}
	m.offS = make([]int32, sc.Keys)
	m.rejS = make([]int32, sc.Keys)
	if sc.Keys > 1 {
		m.offK = make([]int32, sc.Keys)
		m.admK = make([]int32, sc.Keys)
		m.orcK = make([]int32, sc.Keys)
	}
	return m
}

// Shares ends the current interval at at (not before it) and starts the
// next: from at on, the limit of every key is limit units per second, and
// region i enforces shares[i] of it for key 0 (zero for a crashed region).
// shares has one entry per region; the Recorder keeps a copy.
func (m *Recorder) Shares(at time.Duration, limit float64, shares []float64) {
	m.advance(at)
	m.limit = limit
	copy(m.shares, shares)
}

// advance integrates the current interval up to at and closes the second
// and the window if at ends them.
func (m *Recorder) advance(at time.Duration) {
	if at > m.now {
		dt := float64(at-m.now) / 1e9
		m.lint += m.limit * dt
		for i, sh := range m.shares {
			m.regs[i].shareInt += sh * dt
			m.regs[i].allowed0 += sh * m.limit * dt
			m.regs[i].allowedSec0 += sh * m.limit * dt
		}
		m.now = at
	}
	if at-m.secStart >= time.Second {
		m.closeSecond(at)
	}
	if at-m.winStart >= windowLen {
		m.closeWindow(at)
	}
}

// Charged records units charged after the fact in a region and at the
// oracle (scenarios with Charge).
func (m *Recorder) Charged(region, oracle int64) {
	m.charged += region
	m.chargedOrc += oracle
}

// Arrival records one arrival of key (0 ≤ key < Keys) in region, admitted
// or not by the region and by the oracle (a central limiter at the full
// limit fed every arrival): one unit.
func (m *Recorder) Arrival(region, key int, admitted, oracle bool) {
	m.ArrivalUnits(region, key, 1, admitted, oracle)
}

// ArrivalUnits records one arrival of key in region that costs units
// (what it was charged, or would have been charged had it been admitted),
// admitted or not by the region and by the oracle: every count of the
// Result (offered, admitted, oracle, rejections) grows by units, so that
// the windows' errors are in units of L_global, tokens for a token rate
// whose requests are charged after the fact.
func (m *Recorder) ArrivalUnits(region, key int, units int64, admitted, oracle bool) {
	m.off += units
	m.totalOff += units
	ra := &m.regs[region]
	ra.offAll += units
	if admitted {
		m.adm += units
		ra.admAll += units
	}
	if oracle {
		m.orc += units
	}
	if key == 0 {
		m.off0 += units
		ra.off0 += units
		ra.offSec0 += units
		if admitted {
			ra.adm0 += units
		}
		if oracle {
			m.orc0 += units
		}
	}
	u := int32(units)
	if m.offS[key] == 0 {
		m.touchedS = append(m.touchedS, int32(key))
	}
	m.offS[key] += u
	if !admitted {
		m.rejS[key] += u
	}
	if m.offK != nil {
		if m.offK[key] == 0 {
			m.touchedK = append(m.touchedK, int32(key))
		}
		m.offK[key] += u
		if admitted {
			m.admK[key] += u
		}
		if oracle {
			m.orcK[key] += u
		}
	}
}

// Sent records bytes of share traffic (reports, borrow requests, loans)
// sent by any region to any peer; report_bytes_per_s_per_region is their
// sum over the Duration and the regions.
func (m *Recorder) Sent(bytes int) { m.sent += int64(bytes) }

func (m *Recorder) closeSecond(t time.Duration) {
	secs := float64(t-m.secStart) / 1e9
	for _, k := range m.touchedS {
		// Rejections while the key's global demand was under its limit.
		if float64(m.offS[k]) <= m.limit*secs {
			m.falseRej += int64(m.rejS[k])
		}
		m.offS[k], m.rejS[k] = 0, 0
	}
	m.touchedS = m.touchedS[:0]
	m.secStart = t
	for i := range m.regs {
		ra := &m.regs[i]
		ra.expected0 += math.Min(float64(ra.offSec0), ra.allowedSec0)
		ra.offSec0, ra.allowedSec0 = 0, 0
	}
}

func (m *Recorder) closeWindow(t time.Duration) {
	w := Window{StartS: float64(m.winStart) / 1e9, Limit: m.lint,
		Offered: m.off, Admitted: m.adm, Oracle: m.orc}
	denom := m.lint
	if m.offK != nil {
		hot := 0
		for _, k := range m.touchedK {
			if float64(m.offK[k]) > 0.5*m.lint {
				hot++
			}
			if (m.offK[k] > m.admK[k] || m.offK[k] > m.orcK[k]) && float64(m.winStart) >= float64(m.sc.Warmup.D()) {
				m.keyErrs = append(m.keyErrs, math.Abs(float64(m.admK[k]-m.orcK[k]))/m.lint*100)
			}
			m.offK[k], m.admK[k], m.orcK[k] = 0, 0, 0
		}
		m.touchedK = m.touchedK[:0]
		w.HotKeys = hot
		denom *= float64(max(1, hot))
	}
	if m.sc.Quota != nil {
		denom = float64(m.sc.Quota.Limit)
	}
	w.ErrorPct = float64(m.adm-m.orc) / denom * 100
	ratio := 1.0
	if m.off0 > 0 {
		ratio = float64(m.orc0) / float64(m.off0)
	}
	for i := range m.regs {
		ra := &m.regs[i]
		secs := float64(t-m.winStart) / 1e9
		rw := RegionWindow{Offered: ra.off0, Admitted: ra.adm0, Allowed: ra.allowed0, Share: ra.shareInt / secs}
		if m.sc.Quota == nil {
			rw.ErrorPct = (float64(ra.adm0) - ra.expected0) / m.lint * 100
		}
		rw.OracleErrorPct = (float64(ra.adm0) - float64(ra.off0)*ratio) / m.lint * 100
		w.Regions = append(w.Regions, rw)
		*ra = regAcc{}
	}
	m.windows = append(m.windows, w)
	m.winStart = t
	m.lint, m.off, m.adm, m.orc, m.off0, m.orc0 = 0, 0, 0, 0, 0, 0
}

// finish ends the run at the scenario's Duration: the last second, and the
// last window if it is at least half a window long.
func (m *Recorder) finish() {
	end := m.sc.Duration.D()
	m.advance(end)
	if end > m.secStart {
		m.closeSecond(end)
	}
	if end-m.winStart >= windowLen/2 {
		m.closeWindow(end)
	}
}

// percentile returns the p-th percentile (0..1) of v by nearest rank.
func percentile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}
