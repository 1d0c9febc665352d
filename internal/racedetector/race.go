//go:build race

package racedetector

// Enabled is true: the binary was built with -race.
const Enabled = true
