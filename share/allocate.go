package share

import "math"

// SlotState says what the allocation knows about one region for one key.
type SlotState uint8

const (
	// Reported: the region's report for the epoch arrived.
	Reported SlotState = iota
	// Held: the report is missing; the region keeps its last share.
	Held
	// Down: the region has been unreachable for more than K epochs; it is
	// reserved Config.Safe and the rest of its share is reclaimed.
	Down
)

// Slot is one region's input to the allocation of one key. Demand and
// Recent are fractions of L_global (rate / L_global).
type Slot struct {
	State  SlotState
	Demand float64 // smoothed demand D (Reported)
	Recent float64 // recent rate x (Reported)
	// RecentHigh, if above Recent, is an upper confidence bound of the
	// recent rate; the cap then applies to it instead of Recent, so that a
	// region whose few recent arrivals happened to be fewer than usual is
	// not capped below its demand (see Config.NoiseZ). Zero means Recent.
	RecentHigh float64
	Last       float64 // last share (Held)
}

// Allocate computes the shares (fractions of L_global summing to 1) of one
// key for the regions described by slots, writing them to out (len(out) ≥
// len(slots)). It is deterministic and depends only on its arguments, so
// every region given the same slots computes the same shares.
//
// Held regions keep Last; Down regions get Config.Safe; reporting regions
// get the floor plus a water-fill of the rest proportional to Demand and
// capped at CapFactor·max(Recent, RecentHigh), any remainder spread in proportion to Demand.
// If held and reserved shares leave less than a floor for each reporter,
// they are scaled down first so that Σ = 1 always holds.
//
// Whatever the slots say (NaN, infinite or negative figures included),
// every share is in [0, 1] and Σ ≤ 1 + 1e-12: valid by construction.
func Allocate(cfg Config, slots []Slot, out []float64) {
	n := len(slots)
	if n == 0 {
		return
	}
	out = out[:n]
	defer bound(out)
	f := cfg.floor(n)
	safe := cfg.safe(n)
	var fixed float64 // Σ of held and reserved shares
	m := 0            // reporters
	for i, s := range slots {
		switch s.State {
		case Held:
			out[i] = clamp01(s.Last)
		case Down:
			out[i] = safe
		default:
			out[i] = 0
			m++
		}
		if s.State != Reported {
			fixed += out[i]
		}
	}
	if m == 0 {
		// Nobody reported: scale the held shares to sum to 1 (or split
		// evenly if they are all zero).
		normalise(out, fixed)
		return
	}
	budget := 1 - fixed
	if need := float64(m) * f; budget < need {
		// Make room for the reporters' floors by scaling the others.
		if fixed > 0 {
			k := (1 - need) / fixed
			for i, s := range slots {
				if s.State != Reported {
					out[i] *= k
				}
			}
		}
		budget = need
	}
	// Every reporter starts at the floor.
	var sumD float64
	for i, s := range slots {
		if s.State == Reported {
			out[i] = f
			sumD += pos(s.Demand)
		}
	}
	rem := budget - float64(m)*f
	// Water-fill ∝ D with caps: repeat until no reporter is newly capped.
	capped := make([]bool, n)
	for rem > 1e-15 {
		var active float64
		for i, s := range slots {
			if s.State == Reported && !capped[i] {
				active += pos(s.Demand)
			}
		}
		if active <= 0 {
			break
		}
		newly := false
		for i, s := range slots {
			if s.State != Reported || capped[i] {
				continue
			}
			room := max(f, cfg.CapFactor*max(pos(s.Recent), pos(s.RecentHigh))) - out[i]
			if rem*pos(s.Demand)/active >= room {
				if room > 0 {
					out[i] += room
					rem -= room
				}
				capped[i] = true
				newly = true
			}
		}
		if newly {
			continue
		}
		for i, s := range slots {
			if s.State == Reported && !capped[i] {
				out[i] += rem * pos(s.Demand) / active
			}
		}
		rem = 0
	}
	if rem > 0 {
		// Everyone is capped (or nobody has demand): spread ∝ D, evenly
		// if there is no demand at all.
		for i, s := range slots {
			if s.State != Reported {
				continue
			}
			if sumD > 0 {
				out[i] += rem * pos(s.Demand) / sumD
			} else {
				out[i] += rem / float64(m)
			}
		}
	}
}

func normalise(out []float64, sum float64) {
	if sum <= 0 {
		for i := range out {
			out[i] = 1 / float64(len(out))
		}
		return
	}
	for i := range out {
		out[i] /= sum
	}
}

// pos is v for a positive finite v, else 0 (NaN and +Inf included: a
// figure that is not a rate carries no demand).
func pos(v float64) float64 {
	if v > 0 && v <= math.MaxFloat64 {
		return v
	}
	return 0
}

// bound makes out a valid share vector: each share in [0, 1], and scaled
// down to Σ = 1 if it sums above 1 + 1e-12 (which Allocate's arithmetic
// never does with finite slots; this is the guarantee, not the rule).
func bound(out []float64) {
	var sum float64
	for i, v := range out {
		out[i] = clamp01(v)
		sum += out[i]
	}
	if sum > 1+1e-12 {
		for i := range out {
			out[i] /= sum
		}
	}
}

// clamp01 is v in [0, 1]; NaN is 0.
func clamp01(v float64) float64 {
	switch {
	case v > 1:
		return 1
	case v > 0:
		return v
	}
	return 0
}
