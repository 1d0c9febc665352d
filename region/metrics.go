package region

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/engine"
)

// metrics are the daemon's own series. None carries a subject label: the
// number of subjects is unbounded, and a label per subject would let one
// client grow the scrape without limit. Policy ids are bounded by the
// registry, so shadow rejections are labelled by policy.
type metrics struct {
	checks       *prometheus.CounterVec
	checkSeries  checkSeries // checks' series, resolved once each
	duration     prometheus.Histogram
	wouldReject  *prometheus.CounterVec
	badRequests  *prometheus.CounterVec
	panics       prometheus.Counter
	policyReload *prometheus.CounterVec
	policySync   *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, lim *engine.Limiter) *metrics {
	m := &metrics{
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_checks_total",
			Help: "Checks decided, by decision (allowed, rejected, unavailable) and source (store, deny_cache, fallback, none).",
		}, []string{"decision", "source"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_check_duration_seconds",
			Help:    "Time to decide one check, from a decoded request to a decision (engine calls included).",
			Buckets: []float64{50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 25e-3, 100e-3},
		}),
		wouldReject: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_shadow_would_reject_total",
			Help: "Checks a shadow policy would have rejected had it been enforced (they were not rejected).",
		}, []string{"policy"}),
		badRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_bad_requests_total",
			Help: "Requests answered with a 4xx problem, by route pattern.",
		}, []string{"route"}),
		panics: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_http_panics_total",
			Help: "Handler panics recovered and answered with a 500 problem. Any is a bug.",
		}),
		policyReload: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_policy_reloads_total",
			Help: "Policy sets loaded from a shared policy store, by result (applied, unchanged, error).",
		}, []string{"result"}),
		policySync: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_policy_sync_total",
			Help: "Policy sets exchanged with other regions over gossip, by result (sent, applied, invalid, error).",
		}, []string{"result"}),
	}
	stat := func(name, help string, f func(engine.Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(f(lim.Stats())) })
	}
	reg.MustRegister(m.checks, m.duration, m.wouldReject, m.badRequests, m.panics, m.policyReload, m.policySync,
		stat("sluice_store_calls_total", "Calls to the decision store (Redis); the memory store is not counted.", func(s engine.Stats) uint64 { return s.StoreCalls }),
		stat("sluice_store_errors_total", "Store calls that failed or timed out.", func(s engine.Stats) uint64 { return s.StoreErrors }),
		stat("sluice_deny_cache_hits_total", "Checks rejected from the local deny cache without a store call.", func(s engine.Stats) uint64 { return s.DenyCacheHits }),
		stat("sluice_store_busy_total", "Checks that waited past the store queue's bound and were decided by on_store_failure; overload, not a store error, so the breaker does not count them.", func(s engine.Stats) uint64 { return s.StoreBusy }),
		stat("sluice_degraded_total", "Checks decided without the store, by each policy's on_store_failure.", func(s engine.Stats) uint64 { return s.Degraded }),
		stat("sluice_breaker_opens_total", "Times a store circuit breaker opened.", func(s engine.Stats) uint64 { return s.BreakerOpens }),
		&breakerCollector{lim: lim, desc: prometheus.NewDesc("sluice_breaker_state",
			"Circuit breaker state per store shard: 0 closed, 1 half-open, 2 open.", []string{"shard"}, nil)},
	)
	return m
}

// breakerCollector reads the breaker states at scrape time.
type breakerCollector struct {
	lim  *engine.Limiter
	desc *prometheus.Desc
}

func (c *breakerCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *breakerCollector) Collect(ch chan<- prometheus.Metric) {
	for shard, state := range c.lim.Stats().Breakers {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, breakerValue(state), shard)
	}
}

func breakerValue(state string) float64 {
	switch state {
	case "half-open":
		return 1
	case "open":
		return 2
	}
	return 0
}
