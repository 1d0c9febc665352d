package simulator

import (
	"math"
	"time"
)

// Rates fills rates, one entry per region, with the offered load at
// scenario time t in multiples of L: Rate and Split as changed by the Steps
// up to t, rotated by Diurnal, plus any burst under way. A region for which
// crashed says true gets nothing; its load fails over evenly to the others
// (a nil crashed: no region is down).
func (tr Traffic) Rates(t time.Duration, crashed func(region int) bool, rates []float64) {
	if crashed == nil {
		crashed = func(int) bool { return false }
	}
	rate, split := tr.Rate, tr.Split
	for _, st := range tr.Steps {
		if t >= st.At.D() {
			if st.Rate != 0 {
				rate = st.Rate
			}
			if st.Split != nil {
				split = st.Split
			}
		}
	}
	n := len(rates)
	fill(rates, split, rate)
	if d := tr.Diurnal; d != nil && d.Period > 0 {
		var sum float64
		for i := range rates {
			w := 1 + d.Depth*math.Cos(2*math.Pi*(t.Seconds()/d.Period.D().Seconds()-float64(i)/float64(n)))
			rates[i] *= math.Max(0, w)
			sum += rates[i]
		}
		if sum > 0 {
			for i := range rates {
				rates[i] *= rate / sum
			}
		}
	}
	if b := tr.Bursts; b != nil && b.Every > 0 && t%b.Every.D() < b.Length.D() {
		extra := make([]float64, n)
		fill(extra, b.Split, b.Rate)
		for i := range rates {
			rates[i] += extra[i]
		}
	}
	// A crashed region's clients fail over evenly to the others.
	var lost float64
	live := 0
	for i := range rates {
		if crashed(i) {
			lost += rates[i]
			rates[i] = 0
		} else {
			live++
		}
	}
	if lost > 0 && live > 0 {
		for i := range rates {
			if !crashed(i) {
				rates[i] += lost / float64(live)
			}
		}
	}
}

func fill(out, split []float64, rate float64) {
	if len(split) == 0 {
		for i := range out {
			out[i] = rate / float64(len(out))
		}
		return
	}
	var sum float64
	for _, v := range split {
		sum += v
	}
	for i := range out {
		if sum > 0 {
			out[i] = rate * split[i] / sum
		} else {
			out[i] = 0
		}
	}
}
