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

type metrics struct {
	winStart int64
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
	secStart   int64
	offS, rejS []int32
	touchedS   []int32
	falseRej   int64
	totalOff   int64

	windows []Window
}

func newMetrics(s *sim) *metrics {
	m := &metrics{winStart: startNS, secStart: startNS, regs: make([]regAcc, len(s.regions))}
	m.offS = make([]int32, s.sc.Keys)
	m.rejS = make([]int32, s.sc.Keys)
	if s.sc.Keys > 1 {
		m.offK = make([]int32, s.sc.Keys)
		m.admK = make([]int32, s.sc.Keys)
		m.orcK = make([]int32, s.sc.Keys)
	}
	return m
}

func (m *metrics) tickShares(s *sim, dt float64) {
	m.lint += s.lrate * dt
	for i, r := range s.regions {
		if r.crashed {
			continue
		}
		sh := r.table.Share(policy, s.subs[0])
		m.regs[i].shareInt += sh * dt
		m.regs[i].allowed0 += sh * s.lrate * dt
		m.regs[i].allowedSec0 += sh * s.lrate * dt
	}
}

func (m *metrics) arrival(s *sim, r *region, k int, ok, oracleOK bool) {
	m.off++
	m.totalOff++
	ra := &m.regs[r.idx]
	ra.offAll++
	if ok {
		m.adm++
		ra.admAll++
	}
	if oracleOK {
		m.orc++
	}
	if k == 0 {
		m.off0++
		ra.off0++
		ra.offSec0++
		if ok {
			ra.adm0++
		}
		if oracleOK {
			m.orc0++
		}
	}
	if m.offS[k] == 0 {
		m.touchedS = append(m.touchedS, int32(k))
	}
	m.offS[k]++
	if !ok {
		m.rejS[k]++
	}
	if m.offK != nil {
		if m.offK[k] == 0 {
			m.touchedK = append(m.touchedK, int32(k))
		}
		m.offK[k]++
		if ok {
			m.admK[k]++
		}
		if oracleOK {
			m.orcK[k]++
		}
	}
}

func (m *metrics) endTick(s *sim, t int64) {
	if t-m.secStart >= int64(time.Second) {
		m.closeSecond(s, t)
	}
	if t-m.winStart >= int64(windowLen) {
		m.closeWindow(s, t)
	}
}

func (m *metrics) closeSecond(s *sim, t int64) {
	secs := float64(t-m.secStart) / 1e9
	for _, k := range m.touchedS {
		// Rejections while the key's global demand was under its limit.
		if float64(m.offS[k]) <= s.lrate*secs {
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

func (m *metrics) closeWindow(s *sim, t int64) {
	w := Window{StartS: float64(m.winStart-startNS) / 1e9, Limit: m.lint,
		Offered: m.off, Admitted: m.adm, Oracle: m.orc}
	denom := m.lint
	if m.offK != nil {
		hot := 0
		for _, k := range m.touchedK {
			if float64(m.offK[k]) > 0.5*m.lint {
				hot++
			}
			if (m.offK[k] > m.admK[k] || m.offK[k] > m.orcK[k]) && float64(m.winStart-startNS) >= float64(s.sc.Warmup.D()) {
				m.keyErrs = append(m.keyErrs, math.Abs(float64(m.admK[k]-m.orcK[k]))/m.lint*100)
			}
			m.offK[k], m.admK[k], m.orcK[k] = 0, 0, 0
		}
		m.touchedK = m.touchedK[:0]
		w.HotKeys = hot
		denom *= float64(max(1, hot))
	}
	if s.sc.Quota != nil {
		denom = float64(s.sc.Quota.Limit)
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
		if s.sc.Quota == nil {
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

func (m *metrics) finish(s *sim, end int64) {
	if end > m.secStart {
		m.closeSecond(s, end)
	}
	if end-m.winStart >= int64(windowLen)/2 {
		m.closeWindow(s, end)
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
