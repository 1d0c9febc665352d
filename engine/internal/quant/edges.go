package quant

import "math"

// Edges are the numbers the quantisers must get right, and agree on
// with redis.lua's q29.
var Edges = []float64{
	0, math.Copysign(0, -1), 1, 2, 3, 100, 1e12,
	1<<29 - 1, 1 << 29, 1<<29 + 1, 1<<53 - 1,
	1.0 / 3, 0.1, 99.99999, 1e12 + 0.5, -1.0 / 3, -(1<<29 + 1),
	(1<<29 - 1) / 1024.0, (1<<29 - 1) * 1024.0, // exactly 29 significant bits
	(1<<30 - 1) / 1024.0,   // 30 significant bits
	1e-300, 1e-310, 5e-324, // tiny; the last two subnormal
	0x1p-1022, 0x1p-1022 - 0x1p-1074, 0x1p-1050, 0x1p-1050 + 0x1p-1074,
	1e300, math.MaxFloat64, -math.MaxFloat64,
	math.Inf(1), math.Inf(-1), math.NaN(),
}

// CountEdges are the numbers StoredCount must get right, and agree on with
// redis.lua's stored_count, with what both
// must keep. Only whole numbers from 0 to 1e12 occur with valid limits.
var CountEdges = []struct{ X, Want float64 }{
	{0, 0}, {1, 1}, {2, 2}, {1<<29 - 1, 1<<29 - 1}, {1 << 29, 1 << 29}, {1<<29 + 1, 1<<29 + 1},
	{6e8 + 1, 6e8 + 1}, {1<<30 + 3, 1<<30 + 3}, {1<<32 + 1, 1<<32 + 1},
	{1e12 - 1, 1e12 - 1}, {1e12, 1e12}, {1<<40 - 2, 1<<40 - 2},
	// Never occur: held to what '<I5' holds, in the limiter's favour.
	{math.Copysign(0, -1), 0}, {0.25, 1}, {6e8 + 0.5, 6e8 + 1}, {1e12 + 0.5, 1e12 + 1}, {-1, 0},
	{1<<40 - 1, 1<<40 - 1}, {1<<40 - 1.5, 1<<40 - 1}, {1 << 40, 1<<40 - 1}, {1<<41 + 3, 1<<40 - 1},
	{math.MaxFloat64, 1<<40 - 1}, {math.Inf(1), 1<<40 - 1}, {math.Inf(-1), 0}, {math.NaN(), 1<<40 - 1},
}
