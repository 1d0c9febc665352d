//go:build !race

package racedetector

// Enabled is false: the binary was built without -race.
const Enabled = false
