// Package testwait waits, in a test, for a condition to hold: the one
// helper the tests use instead of sleeping for a guessed time.
package testwait

import (
	"testing"
	"time"
)

// maxPoll is the longest pause For makes between two calls of cond.
const maxPoll = 50 * time.Millisecond

// For calls cond until it returns true, and fails t (t.Fatalf) if it has
// not after within. It calls cond again after 1 ms, then after twice as
// long each time up to every 50 ms, so a condition that holds soon is seen
// soon and a long wait does not spin on a loaded machine. Inside a
// testing/synctest bubble the pauses advance the bubble's virtual clock,
// and within is virtual time. Like t.Fatalf, call it from the test's
// goroutine.
func For(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	pause := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(pause) // the pause between polls, not a wait for the condition
		pause = min(2*pause, maxPoll)
	}
}
