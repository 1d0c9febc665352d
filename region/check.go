package region

import (
	"context"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/decide"
	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/share"
)

// The decision is package decide's; the daemon is one of its front ends.
// These names keep the daemon's API as it was.
type (
	// ShareSource is decide.ShareSource.
	ShareSource = decide.ShareSource
	// QuotaSource is decide.QuotaSource.
	QuotaSource = decide.QuotaSource
	// WholeShare is decide.WholeShare.
	WholeShare = decide.WholeShare
	// CheckRequest is the body of POST /v1/check (decide.CheckRequest).
	CheckRequest = decide.CheckRequest
	// Decision is the JSON body of a check (decide.Decision).
	Decision = decide.Decision
	// ExemptResult is decide.ExemptResult.
	ExemptResult = decide.ExemptResult
	// PolicyResult is decide.PolicyResult.
	PolicyResult = decide.PolicyResult
	// StatesVerdict is decide.StatesVerdict.
	StatesVerdict = decide.StatesVerdict
)

// quotaScale is share.QuotaScale: the daemon and the simulator scale a
// global quota with one function.
func quotaScale(count float64, others uint64) float64 { return share.QuotaScale(count, others) }

// clipStr is decide.Clip.
func clipStr(s string) string { return decide.Clip(s) }

// newDecider is the daemon's decision: its limiter and registry, its
// shares and, with a coordinator, global quotas counted across regions
// and global usage tracked for the coordinator to drain. The daemon
// observes every decision for its metrics and decision log.
func (d *Daemon) newDecider() *decide.Decider {
	return decide.New(decide.Config{Limiter: d.lim, Registry: d.reg, Shares: d.shares, Quotas: d.quotas,
		Track: d.cl != nil, Observer: daemonObserver{d}, Clock: d.cfg.Clock})
}

// Decider is the daemon's decision, for the front ends it does not serve
// itself (the Envoy rate limit service).
func (d *Daemon) Decider() *decide.Decider { return d.dec }

// DecideStates is the daemon's Decider().DecideStates: it decides
// policies the caller matched.
func (d *Daemon) DecideStates(ctx context.Context, subject string, applied []quota.Applied) (StatesVerdict, error) {
	return d.dec.DecideStates(ctx, subject, applied)
}

// daemonObserver counts the daemon's decisions in its metrics and hands
// them to its decision log.
type daemonObserver struct{ d *Daemon }

// Decided is d.observe.
func (o daemonObserver) Decided(v decide.Verdict, method, route, shadowSource string) {
	o.d.observe(&v, method, route, shadowSource)
}

// Took observes a decision's time in sluice_check_duration_seconds.
func (o daemonObserver) Took(took time.Duration) { o.d.m.duration.Observe(took.Seconds()) }

// checkSeries holds the series of sluice_checks_total as they are first
// used, so that a check counts itself without hashing its labels: by
// decision (allowed, rejected, unavailable) and source.
type checkSeries struct {
	c [3][len(checkSources)]atomic.Pointer[prometheus.Counter]
}

var (
	checkDecisions = [3]string{"allowed", "rejected", "unavailable"}
	checkSources   = [...]string{"store", "deny_cache", "fallback", "none"}
)

// counter is the series of checkDecisions[decision] and source.
func (cs *checkSeries) counter(vec *prometheus.CounterVec, decision int, source string) prometheus.Counter {
	si := slices.Index(checkSources[:], source)
	if si < 0 {
		return vec.WithLabelValues(checkDecisions[decision], source)
	}
	p := &cs.c[decision][si]
	if c := p.Load(); c != nil {
		return *c
	}
	c := vec.WithLabelValues(checkDecisions[decision], source)
	p.Store(&c)
	return c
}
