// Package quant rounds the engine's state to what both stores keep: bucket
// levels to 29 significant bits (the 5 bytes the Redis store packs them
// in), window counts to whole numbers. The memory store applies the same
// rounding, so that both stores decide identically; redis.lua mirrors
// each function, and the Redis store's tests hold them equal on Edges and
// CountEdges.
package quant

import "math"

// The rounding is to the doubles whose low 24 encoding bits are zero,
// exactly the numbers 5 bytes can hold: 29 significant bits for normal
// numbers, and below 2^-1022 (subnormals) a fixed quantum of 2^-1050, so
// tiny values keep fewer bits rather than more than the store can hold.
// Zero, infinities and NaN are returned unchanged; rounding the largest
// finite doubles away from zero gives an infinity. None of these occur
// with valid limits (at most 1e12 units). redis.lua's q29 computes the
// same with frexp and ldexp; TestRedisQuantisersAgree holds them equal.
const lowBits = 1<<24 - 1

// Down rounds x towards minus infinity to 29 significant bits.
func Down(x float64) float64 {
	b := math.Float64bits(x)
	if b&lowBits == 0 || b>>52&0x7ff == 0x7ff {
		return x
	}
	if b>>63 == 0 {
		return math.Float64frombits(b &^ lowBits)
	}
	return math.Float64frombits(b&^lowBits + lowBits + 1)
}

// Up rounds x towards plus infinity to 29 significant bits.
func Up(x float64) float64 { return -Down(-x) }

// UpTo rounds x up, unless that takes it past most (a limit that
// is not itself a 29-bit number, such as a scaled burst) while rounding
// down leaves less than a unit below most. Then it rounds down: a level
// just under its burst must stay under it, or the next check at the same
// instant would be rejected even at cost zero; and since costs are whole
// units, no cost fits in what rounding down gives back, so nothing more is
// admitted. Past 2^28, where the gap between 29-bit numbers reaches a
// unit, rounding down could admit more, check after check; there x is
// rounded up even past most, and a cost-zero check just after may be
// rejected until the bucket drains that sliver.
func UpTo(x, most float64) float64 {
	q := Up(x)
	if q <= most {
		return q
	}
	if d := Down(x); most-d < 1 {
		return d
	}
	return q
}

// MaxStoredCount is the largest window count the Redis store can keep: it
// stores counts as 5-byte unsigned integers (struct '<I5').
const MaxStoredCount = 1<<40 - 1

// StoredCount is a window count as both stores keep it. A count is a sum
// of the whole costs admitted in its window, each admitted only while the
// sum stays within the enforced Count, which Validate bounds by 1e12 (and
// a Scale of at most 1 only lowers): so it is a whole number from 0 to
// 1e12 < 2^40, and storedCount returns it unchanged. (The 29-bit rounding
// of bucket state would not do: above 2^29 it would count a cost-1 check
// as 2.) Anything else cannot occur; should it, both stores keep the same
// number (redis.lua's stored_count mirrors this, TestRedisStoredCountAgrees
// holds them equal): a fraction rounds up, in the limiter's favour, and
// anything from 2^40 - 1 up, or NaN, is held at 2^40 - 1, which is still
// more than any valid Count, so the window keeps refusing.
func StoredCount(x float64) float64 {
	if !(x < MaxStoredCount) {
		return MaxStoredCount
	}
	if !(x > 0) {
		return 0
	}
	return math.Ceil(x)
}

// Units is the whole number of units in v, rounded down: what a result
// reports as a limit or as remaining. A negative v, or NaN, is 0.
func Units(v float64) int64 {
	if !(v > 0) {
		return 0
	}
	return int64(math.Floor(v))
}

// UnitsUp is Units rounded up instead: the units a share of v must cover.
func UnitsUp(v float64) int64 {
	if !(v > 0) {
		return 0
	}
	return int64(math.Ceil(v))
}
