package testwait

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestForReturnsOnceTrue: For returns once cond holds, on virtual time,
// having polled with growing pauses.
func TestForReturnsOnceTrue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var calls atomic.Int32
		For(t, time.Minute, "the fifth call", func() bool { return calls.Add(1) == 5 })
		// Pauses of 1, 2, 4 and 8 ms before the second to the fifth call.
		if got, want := time.Since(start), 15*time.Millisecond; got != want {
			t.Errorf("For returned after %v, want %v", got, want)
		}
	})
}

// fatalTB records Fatalf instead of stopping the test.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = format
	panic(f)
}

// TestForFailsAfterDeadline: a condition that never holds fails the test
// once within has passed, and not before.
func TestForFailsAfterDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		f := &fatalTB{TB: t}
		func() {
			defer func() {
				if r := recover(); r != f {
					panic(r)
				}
			}()
			For(f, time.Second, "never", func() bool { return false })
		}()
		if f.msg == "" {
			t.Fatal("For returned without failing")
		}
		if got := time.Since(start); got < time.Second || got > time.Second+maxPoll {
			t.Errorf("For failed after %v, want between 1 s and 1 s + %v", got, maxPoll)
		}
	})
}
