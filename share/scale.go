package share

// Scale is the engine Check.Scale for a region's share s of a global
// limit: s clamped to [MinShare, 1]. A share of zero, a negative one or NaN
// becomes MinShare, never 0 (which the engine reads as the whole limit);
// one above 1 (a share plus loans) becomes 1. The daemon's check path and
// the simulator both call it, so the engine never sees a scale outside
// (0, 1].
func Scale(s float64) float64 {
	switch {
	case !(s >= MinShare): // NaN, zero, negative, tiny
		return MinShare
	case s > 1:
		return 1
	}
	return s
}

// MinQuotaScale is the scale of an exhausted global quota: so small that
// no unit of any count fits, yet not zero.
const MinQuotaScale = 1e-15

// QuotaScale is the engine Check.Scale that makes a fixed window of count
// units admit at most count − others units in total: the allowance the
// other regions (and, with a per-daemon store, the region's other daemons)
// have left. Run through the engine, a quota stays all-or-nothing with the
// request's other policies. An exhausted allowance gets MinQuotaScale
// (zero would mean the whole limit). The daemon's check path and the
// simulator both call it.
func QuotaScale(count float64, others uint64) float64 {
	left := count - float64(others)
	switch {
	case left <= 0:
		return MinQuotaScale
	case left >= count:
		return 1
	}
	// A hair above, so that floating point never rounds a whole unit away.
	return min((left+1e-6)/count, 1)
}
