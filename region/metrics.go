package region

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/decide"
	"github.com/sluice-rl/sluice/decisionlog"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/engine/limiter"
	"github.com/sluice-rl/sluice/quota"
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
	policyChecks *prometheus.CounterVec
	policyCache  policySeries
	storeCalls   *prometheus.HistogramVec
	storeKind    string
	storeSeries  sync.Map // shard -> prometheus.Observer
	globalLeft   *prometheus.HistogramVec
	globalSeries sync.Map // policy id -> prometheus.Observer
	globalN      atomic.Int64
}

// Label bounds of sluice_policy_checks_total. Policy ids come from the
// registry and tiers from the key registry, policies and trusted gateways;
// past these many distinct values a new one is counted as "other", so that
// neither a growing policy set nor a gateway sending odd tiers can grow
// the scrape without limit.
const (
	maxPolicyLabels = 512
	maxTierLabels   = 32
	otherLabel      = "other"
)

func newMetrics(reg prometheus.Registerer, lim *limiter.Limiter, mem *engine.MemoryStore, storeKind string) *metrics {
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
			Help: "Policy sets loaded from a shared policy store, by result (applied, unchanged, restored: the store had lost the state and this daemon put its own back, error).",
		}, []string{"result"}),
		policySync: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_policy_sync_total",
			Help: "Policy sets exchanged with other regions over gossip, by result (sent, applied, invalid, error).",
		}, []string{"result"}),
		policyChecks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_policy_checks_total",
			Help: "Policies evaluated, one per policy a check matched, by policy, tier, the policy's own decision (allowed, rejected, unavailable; for shadow policies allowed, would_reject, not_evaluated) and source (store, deny_cache, fallback, none). Rare policy ids and tiers beyond a bound are counted as other.",
		}, []string{"policy", "tier", "decision", "source"}),
		storeCalls: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_store_call_duration_seconds",
			Help:    "Time of each call that reached the decision store (Redis), by store kind and shard (the server that holds the subject); calls an open breaker refused are not in it.",
			Buckets: []float64{100e-6, 250e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 25e-3, 100e-3},
		}, []string{"store", "shard"}),
		storeKind: storeKind,
		globalLeft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_global_remaining_ratio",
			Help:    "For each check of an enforced global-scope policy (a global limit or quota), the fraction of the subject's limit left after it (remaining / limit), by policy: near zero for many checks means the limit is nearly spent.",
			Buckets: []float64{0, 0.05, 0.1, 0.25, 0.5, 0.75, 1},
		}, []string{"policy"}),
	}
	if mem != nil {
		reg.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_memory_store_keys",
				Help: "States (subject, policy) held by the in-process memory store, expired or not yet swept."},
				func() float64 { return float64(mem.Len()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_memory_store_evictions_total",
				Help: "States the memory store dropped to stay within its key bound before they expired."},
				func() float64 { return float64(mem.Evictions()) }),
		)
	}
	stat := func(name, help string, f func(limiter.Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(f(lim.Stats())) })
	}
	reg.MustRegister(m.checks, m.duration, m.wouldReject, m.badRequests, m.panics, m.policyReload, m.policySync, m.policyChecks, m.storeCalls, m.globalLeft,
		stat("sluice_store_calls_total", "Calls to the decision store (Redis); the memory store is not counted.", func(s limiter.Stats) uint64 { return s.StoreCalls }),
		stat("sluice_store_errors_total", "Store calls that failed or timed out.", func(s limiter.Stats) uint64 { return s.StoreErrors }),
		stat("sluice_deny_cache_hits_total", "Checks rejected from the local deny cache without a store call.", func(s limiter.Stats) uint64 { return s.DenyCacheHits }),
		stat("sluice_store_busy_total", "Checks that waited past the store queue's bound and were decided by on_store_failure; overload, not a store error, so the breaker does not count them.", func(s limiter.Stats) uint64 { return s.StoreBusy }),
		stat("sluice_degraded_total", "Checks decided without the store, by each policy's on_store_failure.", func(s limiter.Stats) uint64 { return s.Degraded }),
		stat("sluice_breaker_opens_total", "Times a store circuit breaker opened.", func(s limiter.Stats) uint64 { return s.BreakerOpens }),
		stat("sluice_charge_errors_total", "Charges after the fact (POST /v1/charge) the store could not apply; never retried.", func(s limiter.Stats) uint64 { return s.ChargeErrors }),
		stat("sluice_charges_dropped_total", "Charges after the fact dropped because the store could not apply them and every policy fails open.", func(s limiter.Stats) uint64 { return s.ChargesDropped }),
		stat("sluice_lease_takes_total", "Lease slices taken from the store (policies with a lease).", func(s limiter.Stats) uint64 { return s.Leases.Takes }),
		stat("sluice_lease_tokens_taken_total", "Tokens taken from the store in lease slices.", func(s limiter.Stats) uint64 { return s.Leases.TokensTaken }),
		stat("sluice_lease_takes_rejected_total", "Lease takes the store refused: the bucket held less than the slice.", func(s limiter.Stats) uint64 { return s.Leases.TakesRejected }),
		stat("sluice_lease_admitted_total", "Checks admitted from a local lease without a store call.", func(s limiter.Stats) uint64 { return s.Leases.Admitted }),
		stat("sluice_lease_rejected_total", "Checks rejected in process: their lease was spent and its next take not due yet.", func(s limiter.Stats) uint64 { return s.Leases.Rejected }),
		stat("sluice_lease_returns_total", "Deposits of a lease's unspent tokens back into the store's bucket.", func(s limiter.Stats) uint64 { return s.Leases.Returns }),
		stat("sluice_lease_tokens_returned_total", "Unspent lease tokens deposited back into the store's bucket.", func(s limiter.Stats) uint64 { return s.Leases.TokensReturned }),
		stat("sluice_lease_return_errors_total", "Lease returns the store could not apply; their tokens are lost (the bucket admits less, never more).", func(s limiter.Stats) uint64 { return s.Leases.ReturnErrors }),
		leaseFallback("policy_changed", func(s limiter.LeaseStats) uint64 { return s.PolicyChanged }, lim),
		leaseFallback("expired", func(s limiter.LeaseStats) uint64 { return s.Expired }, lim),
		leaseFallback("table_full", func(s limiter.LeaseStats) uint64 { return s.TableFull }, lim),
		&breakerCollector{lim: lim, desc: prometheus.NewDesc("sluice_breaker_state",
			"Circuit breaker state per store shard: 1 for the state it is in (closed, half_open, open), 0 for the others.", []string{"shard", "state"}, nil)},
	)
	return m
}

// leaseFallback is one reason of sluice_lease_fallbacks_total.
func leaseFallback(reason string, f func(limiter.LeaseStats) uint64, lim *limiter.Limiter) prometheus.Collector {
	return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_lease_fallbacks_total",
		Help:        "Leases given up, by reason: policy_changed (a check came with another policy version or limit: the lease was returned and the key checked directly until seen hot again), expired (a lease outlived its lifetime with tokens left, which were returned), table_full (a check sent directly because the daemon leased as many keys as it may).",
		ConstLabels: prometheus.Labels{"reason": reason}},
		func() float64 { return float64(f(lim.Stats().Leases)) })
}

// breakerCollector reads the breaker states at scrape time.
type breakerCollector struct {
	lim  *limiter.Limiter
	desc *prometheus.Desc
}

func (c *breakerCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// breakerStates are the label values of sluice_breaker_state, one series
// each per shard, so that an alert reads {state="open"} == 1.
var breakerStates = [...]string{"closed", "half_open", "open"}

func (c *breakerCollector) Collect(ch chan<- prometheus.Metric) {
	for shard, state := range c.lim.Stats().Breakers {
		if state == "half-open" {
			state = "half_open"
		}
		for _, s := range breakerStates {
			v := 0.0
			if s == state {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v, shard, s)
		}
	}
}

// observeStoreCall is the limiter's OnStoreCall: one histogram observation
// per call, its series resolved once per shard.
func (d *Daemon) observeStoreCall(shard string, took time.Duration, _ error) {
	m := d.m
	if m == nil {
		return
	}
	if o, ok := m.storeSeries.Load(shard); ok {
		o.(prometheus.Observer).Observe(took.Seconds())
		return
	}
	o := m.storeCalls.WithLabelValues(m.storeKind, shard)
	m.storeSeries.Store(shard, o)
	o.Observe(took.Seconds())
}

// globalRemaining is the series of sluice_global_remaining_ratio for
// policy, resolved once per policy id, at most maxPolicyLabels of them.
func (m *metrics) globalRemaining(policy string) prometheus.Observer {
	if o, ok := m.globalSeries.Load(policy); ok {
		return o.(prometheus.Observer)
	}
	if m.globalN.Load() >= maxPolicyLabels {
		return m.globalLeft.WithLabelValues(otherLabel)
	}
	o := m.globalLeft.WithLabelValues(policy)
	if _, loaded := m.globalSeries.LoadOrStore(policy, o); !loaded {
		m.globalN.Add(1)
	}
	return o
}

// Per-policy decisions in sluice_policy_checks_total.
const (
	polAllowed = iota
	polRejected
	polUnavailable
	polWouldReject
	polNotEvaluated
)

var policyDecisions = [...]string{"allowed", "rejected", "unavailable", "would_reject", "not_evaluated"}

// policySeries resolves the series of sluice_policy_checks_total once per
// label set and bounds the distinct policy ids and tiers it labels.
type policySeries struct {
	series   sync.Map // policySeriesKey -> prometheus.Counter
	mu       sync.Mutex
	policies map[string]bool
	tiers    map[string]bool
}

type policySeriesKey struct {
	policy, tier     string
	decision, source uint8
}

func (ps *policySeries) counter(vec *prometheus.CounterVec, k policySeriesKey) prometheus.Counter {
	if c, ok := ps.series.Load(k); ok {
		return c.(prometheus.Counter)
	}
	raw := k
	ps.mu.Lock()
	if ps.policies == nil {
		ps.policies, ps.tiers = map[string]bool{}, map[string]bool{}
	}
	k.policy = bounded(ps.policies, k.policy, maxPolicyLabels)
	k.tier = bounded(ps.tiers, k.tier, maxTierLabels)
	ps.mu.Unlock()
	c := vec.WithLabelValues(k.policy, k.tier, policyDecisions[k.decision], sourceLabel(k.source))
	if k == raw {
		// Only label sets within the bounds are remembered, so the cache
		// is as bounded as the series; the rest take this slow path.
		ps.series.Store(raw, c)
	}
	return c
}

// bounded is v if it is in seen or seen has room for it, else otherLabel.
func bounded(seen map[string]bool, v string, limit int) string {
	if seen[v] {
		return v
	}
	if len(seen) >= limit {
		return otherLabel
	}
	seen[v] = true
	return v
}

func sourceIndex(s string) uint8 {
	for i, x := range checkSources {
		if x == s {
			return uint8(i)
		}
	}
	return uint8(len(checkSources) - 1) // none
}

func sourceLabel(i uint8) string { return checkSources[i] }

// observe counts a decided check in sluice_checks_total and, per policy,
// in sluice_policy_checks_total (and a shadow policy that would have
// rejected in sluice_shadow_would_reject_total), and hands it to the
// decision log: its
// limited policies to the top lists, and a sample to the event stream.
// shadowSource is the source of the shadow policies' decision ("none" if
// they were not decided). It runs on the check path and does no I/O.
func (d *Daemon) observe(v *decide.Verdict, method, route, shadowSource string) {
	decision := v.Outcome()
	d.m.checkSeries.counter(d.m.checks, decision, v.Source).Inc()
	src, shSrc := sourceIndex(v.Source), sourceIndex(shadowSource)
	for i := range v.Policies {
		pr := &v.Policies[i]
		k := policySeriesKey{policy: pr.ID, tier: v.Tier, source: src}
		switch {
		case pr.Mode == quota.ModeEnforce && pr.Allowed:
			k.decision = polAllowed
		case pr.Mode == quota.ModeEnforce && decision == 2:
			k.decision = polUnavailable
		case pr.Mode == quota.ModeEnforce:
			k.decision = polRejected
		case !pr.Evaluated:
			k.decision, k.source = polNotEvaluated, sourceIndex("none")
		case pr.WouldReject:
			k.decision, k.source = polWouldReject, shSrc
		default:
			k.decision, k.source = polAllowed, shSrc
		}
		d.m.policyCache.counter(d.m.policyChecks, k).Inc()
		if pr.WouldReject {
			d.m.wouldReject.WithLabelValues(pr.ID).Inc()
		}
		if pr.Scope == quota.ScopeGlobal && pr.Mode == quota.ModeEnforce && pr.Evaluated && pr.Limit > 0 {
			d.m.globalRemaining(pr.ID).Observe(float64(pr.Remaining) / float64(pr.Limit))
		}
	}
	ev := d.events
	if ev == nil {
		return
	}
	limited := decision != 0 || v.WouldReject
	if limited {
		now := time.Now()
		for _, id := range v.Violated {
			ev.Limited(now, id, decisionlog.KindRejected, v.Subject)
		}
		if v.WouldReject {
			for i := range v.Policies {
				if pr := &v.Policies[i]; pr.WouldReject {
					ev.Limited(now, pr.ID, decisionlog.KindWouldReject, v.Subject)
				}
			}
		}
	}
	if !ev.Sample(limited) {
		return
	}
	e := decisionlog.Event{Time: time.Now().UTC(), Subject: v.Subject, Tier: v.Tier, Method: method, Route: route,
		Decision: checkDecisions[decision], Source: v.Source, Policy: v.Policy, Violated: slices.Clone(v.Violated), Degraded: v.Degraded}
	if v.WouldReject {
		for i := range v.Policies {
			if pr := &v.Policies[i]; pr.WouldReject {
				e.WouldReject = append(e.WouldReject, pr.ID)
			}
		}
	}
	// The event outlives the request: it holds copies, never the
	// verdict's own slices.
	ev.Write(e, limited)
}
