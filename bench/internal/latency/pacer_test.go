package latency

import (
	"testing"
	"time"
)

func TestPacer(t *testing.T) {
	t.Run("open loop, on time", func(t *testing.T) {
		start := time.Now().Add(10 * time.Millisecond)
		p := NewPacer(start, start.Add(50*time.Millisecond), 100, time.Second) // 5 due
		var n int
		for {
			at, from, skip, ok := p.Next()
			if !ok {
				break
			}
			if skip || at != start.Add(time.Duration(n)*10*time.Millisecond) || from.Before(at) {
				t.Fatalf("request %d: at %v from %v skip %v", n, at.Sub(start), from.Sub(start), skip)
			}
			n++
		}
		if n != 5 {
			t.Errorf("%d requests, want 5", n)
		}
	})
	t.Run("open loop, past the grace", func(t *testing.T) {
		start := time.Now().Add(-time.Second)
		p := NewPacer(start, start.Add(100*time.Millisecond), 100, 10*time.Millisecond)
		at, from, skip, ok := p.Next()
		if !ok || !skip || at != start || from != at {
			t.Errorf("a request due 1 s ago with 10 ms of grace: at %v from %v skip %v ok %v, want skipped", at.Sub(start), from.Sub(start), skip, ok)
		}
	})
	t.Run("closed loop", func(t *testing.T) {
		end := time.Now().Add(20 * time.Millisecond)
		p := NewPacer(time.Now(), end, 0, time.Second)
		at, from, skip, ok := p.Next()
		if !ok || skip || at != from {
			t.Fatalf("first: at %v from %v skip %v ok %v", at, from, skip, ok)
		}
		time.Sleep(time.Until(end))
		if _, _, _, ok := p.Next(); ok {
			t.Error("closed loop went on past its end")
		}
	})
}
