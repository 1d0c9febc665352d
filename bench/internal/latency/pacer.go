package latency

import (
	"sync/atomic"
	"time"
)

// Pacer hands the senders of a load run their next request. Open loop
// (Rate > 0) it gives each request its due time from a Schedule and makes
// the sender wait for it; closed loop it gives the current time until End.
// Safe for concurrent senders.
type Pacer struct {
	sched    Schedule
	open     bool
	due      int64 // requests due before End, open loop
	next     atomic.Int64
	end      time.Time
	hardStop time.Time
}

// NewPacer paces a run from start to end at rate requests per second (0:
// closed loop). Open-loop requests still due grace after end are not
// sent: the server fell so far behind that waiting longer would only
// measure the backlog.
func NewPacer(start, end time.Time, rate float64, grace time.Duration) *Pacer {
	p := &Pacer{sched: Schedule{Start: start, Rate: rate}, open: rate > 0, end: end, hardStop: end.Add(grace)}
	if p.open {
		p.due = p.sched.Due(end.Sub(start))
	}
	return p
}

// Next waits for the sender's next request and returns its due time at and
// from, where its latency starts: at, unless the sender sat idle until at,
// in which case waking late is the generator's timer slack, not a wait the
// server caused, so latency runs from the wake-up. skip reports a request
// past the grace, to be counted unsent and not sent; ok false ends the
// sender.
func (p *Pacer) Next() (at, from time.Time, skip, ok bool) {
	if !p.open {
		at = time.Now()
		return at, at, false, at.Before(p.end)
	}
	i := p.next.Add(1) - 1
	if i >= p.due {
		return at, from, false, false
	}
	at = p.sched.At(i)
	if wait := time.Until(at); wait > 0 {
		time.Sleep(wait)
		return at, time.Now(), false, true
	}
	if time.Now().After(p.hardStop) {
		return at, at, true, true
	}
	return at, at, false, true
}
