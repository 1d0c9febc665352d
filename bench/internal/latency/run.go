package latency

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
)

// RunConfig is how a load run is paced: from its start, warm-up calls that
// are made but not measured, then Duration of measured ones, at Rate calls
// a second (0: closed loop), over Senders concurrent senders.
type RunConfig struct {
	Warmup, Duration time.Duration
	Rate             float64
	Senders          int
}

// Measure is what a load run measured: the latency of every answered
// call from its due time (Lat), the sender's lag behind that time (Lag)
// and the service time from the actual send (Svc), with the counts.
type Measure struct {
	Lat, Lag, Svc Histogram
	// Requests counts the measured calls answered; Errors those that
	// failed; Unsent those the pacer gave up (past the grace).
	Requests, Errors uint64
	Unsent           int64
	// Elapsed runs from the end of the warm-up to the last measured
	// answer.
	Elapsed  time.Duration
	FirstErr error
	lastDone time.Time
}

// Drive runs cfg.Senders senders paced by one Pacer until the run ends or
// ctx does, and returns what they measured together. call makes sender
// w's next call, counted whether measured or not (warm-up), and returns
// its error; calls of one sender are never concurrent.
func Drive(ctx context.Context, cfg RunConfig, call func(w int, measured bool) error) *Measure {
	start := time.Now()
	measureFrom := start.Add(cfg.Warmup)
	pacer := NewPacer(start, measureFrom.Add(cfg.Duration), cfg.Rate, 2*time.Second)
	var wg sync.WaitGroup
	parts := make([]Measure, cfg.Senders)
	for w := range parts {
		m := &parts[w]
		wg.Go(func() {
			for ctx.Err() == nil {
				at, from, skip, ok := pacer.Next()
				if !ok {
					return
				}
				if skip {
					m.Unsent++
					continue
				}
				sent := time.Now()
				measured := !at.Before(measureFrom)
				err := call(w, measured)
				done := time.Now()
				if !measured {
					continue
				}
				m.lastDone = done
				if err != nil {
					m.Errors++
					if m.FirstErr == nil {
						m.FirstErr = err
					}
					continue
				}
				m.Requests++
				m.Lat.Record(done.Sub(from))
				m.Lag.Record(sent.Sub(at))
				m.Svc.Record(done.Sub(sent))
			}
		})
	}
	wg.Wait()
	total := &Measure{}
	var last time.Time
	for i := range parts {
		p := &parts[i]
		total.Lat.Merge(&p.Lat)
		total.Lag.Merge(&p.Lag)
		total.Svc.Merge(&p.Svc)
		total.Requests += p.Requests
		total.Errors += p.Errors
		total.Unsent += p.Unsent
		if total.FirstErr == nil {
			total.FirstErr = p.FirstErr
		}
		if p.lastDone.After(last) {
			last = p.lastDone
		}
	}
	total.Elapsed = last.Sub(measureFrom)
	return total
}

// Achieved is the measured calls answered per second.
func (m *Measure) Achieved() float64 {
	if m.Elapsed <= 0 {
		return 0
	}
	return float64(m.Requests) / m.Elapsed.Seconds()
}

// Mode says how the run was paced: "open loop at N/s" or "closed loop".
func Mode(rate float64) string {
	if rate == 0 {
		return "closed loop"
	}
	return fmt.Sprintf("open loop at %.0f/s", rate)
}

// Report is the tool's report of m: headline, the latency quantiles, the
// first error, the service time and lag, and the RESULT line for scripts,
// whose counts (after requests=, before the quantiles) are counts.
func (m *Measure) Report(headline string, rate float64, counts string) string {
	us := func(d time.Duration) int64 { return d.Microseconds() }
	var b strings.Builder
	b.WriteString(headline + "\n")
	fmt.Fprintf(&b, "latency p50 %v p90 %v p99 %v p99.9 %v max %v\n",
		m.Lat.Quantile(0.5), m.Lat.Quantile(0.9), m.Lat.Quantile(0.99), m.Lat.Quantile(0.999), m.Lat.Max())
	if m.FirstErr != nil {
		fmt.Fprintf(&b, "first error: %v\n", m.FirstErr)
	}
	fmt.Fprintf(&b, "service time (from the actual send) p50 %v p99 %v; sender lag p50 %v p99 %v\n",
		m.Svc.Quantile(0.5), m.Svc.Quantile(0.99), m.Lag.Quantile(0.5), m.Lag.Quantile(0.99))
	fmt.Fprintf(&b, "RESULT offered=%.0f achieved=%.1f requests=%d %s p50_us=%d p90_us=%d p99_us=%d p999_us=%d max_us=%d lag_p50_us=%d lag_p99_us=%d svc_p50_us=%d svc_p99_us=%d\n",
		rate, m.Achieved(), m.Requests, counts,
		us(m.Lat.Quantile(0.5)), us(m.Lat.Quantile(0.9)), us(m.Lat.Quantile(0.99)), us(m.Lat.Quantile(0.999)), us(m.Lat.Max()),
		us(m.Lag.Quantile(0.5)), us(m.Lag.Quantile(0.99)), us(m.Svc.Quantile(0.5)), us(m.Svc.Quantile(0.99)))
	return b.String()
}
