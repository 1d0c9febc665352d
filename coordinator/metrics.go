package coordinator

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the Prometheus collectors of a Core and of its owner, which
// counts reports sent, borrow messages and messages dropped into the same
// collectors.
type Metrics struct {
	Rebalances     prometheus.Counter
	ReportsSent    prometheus.Counter
	ReportsMissing prometheus.Counter
	ReportKeys     prometheus.Gauge
	CoordKeys      prometheus.Gauge
	Regions        prometheus.Gauge
	Isolated       prometheus.Gauge
	// Lost counts, per other region, the times this node found it out of
	// contact: stage silent (for Silence) and reclaimed (for Hold, its
	// share taken back). Sampled gauges miss a loss shorter than the
	// scrape; a counter does not.
	Lost    *prometheus.CounterVec
	Borrow  *prometheus.CounterVec
	Dropped *prometheus.CounterVec
}

// NewMetrics returns the collectors, registered with reg unless it is nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Rebalances: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_globalshare_rebalances_total",
			Help: "Epochs rebalanced."}),
		ReportsSent: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_globalshare_reports_sent_total",
			Help: "Regional reports broadcast by this node (the region's publisher)."}),
		ReportsMissing: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_globalshare_reports_missing_total",
			Help: "Other regions' reports not received by the settle deadline, summed over epochs."}),
		ReportKeys: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_globalshare_report_keys",
			Help: "Keys in this region's last report."}),
		CoordKeys: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_globalshare_coordinated_keys",
			Help: "Keys with negotiated shares."}),
		Regions: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_globalshare_regions",
			Help: "Regions known to the allocation (failed ones included until reclaimed)."}),
		Isolated: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_globalshare_isolated",
			Help: "1 while this region cannot reach a majority and runs at the safe share."}),
		Lost: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_globalshare_region_lost_total",
			Help: "Times another region went out of contact: stage silent (for the silence bound), reclaimed (for the hold: its share taken back)."},
			[]string{"region", "stage"}),
		Borrow: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_globalshare_borrow_total",
			Help: "Borrowing events on this node: requested (a borrow request sent), lent (a loan sent, own share cut), " +
				"accepted (a loan applied), mirrored (another node of this region lent: cut applied here), " +
				"tokens_requested (a token request sent), tokens_offered (a token loan handed to the owner to fill), " +
				"tokens_lent (its tokens taken out of the bucket and the loan sent), spend_empty (the bucket had none to spare), " +
				"spend_failed (the engine could not take them), tokens_accepted (a token loan received, to deposit), " +
				"tokens_deposited, deposit_failed, send_dropped (outbox full), send_failed."}, []string{"event"}),
		Dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_globalshare_messages_dropped_total",
			Help: "Received messages the coordinator did not apply: unknown_region, epoch (future or too old), " +
				"number (NaN, infinite, negative or above the whole limit), malformed, queue_full."}, []string{"reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.Rebalances, m.ReportsSent, m.ReportsMissing, m.ReportKeys, m.CoordKeys, m.Regions, m.Isolated, m.Lost, m.Borrow, m.Dropped)
	}
	return m
}
