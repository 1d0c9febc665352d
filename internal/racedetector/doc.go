// Package racedetector tells tests whether the race detector is on. Load
// tests that measure what the machine can drive (live simulations at
// thousands of checks a second) skip under it: it slows the daemons several
// times over, and what they would then measure is the detector. Every other
// test runs under it in `make test`.
package racedetector
