// Package soak is the pure core of the soak run (make soak, soak/cmd/soak):
// the nemesis's schedule of faults (Plan), the traffic's shape (Traffic),
// the checker that judges what the clients saw against the bounds the
// documentation states (Check), the leak comparison (Leaks) and the
// report (Report). Nothing here starts a process or reads a clock: the
// runner records what happened and hands it over.
package soak
