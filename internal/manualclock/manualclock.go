// Package manualclock is a clock that tests move by hand, safe for
// concurrent use, so that time-dependent code is tested without sleeping.
package manualclock

import (
	"sync"
	"time"
)

// Start is the time a new Clock shows: a fixed instant, so that runs repeat.
var Start = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// Clock shows a time that changes only when Advance or Set is called.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// New returns a Clock showing Start.
func New() *Clock { return &Clock{t: Start} }

// Now returns the time the clock shows.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}
