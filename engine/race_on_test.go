//go:build race

package engine

// raceSlowdown is how much longer deadlines in tests must be under the
// race detector, which slows every memory access of the process many
// times over: a deadline then measures the detector, not Redis.
const raceSlowdown = 5
