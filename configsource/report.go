package configsource

import (
	"errors"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Results of a reload, the result label of sluice_config_reloads_total.
const (
	ResultApplied = "applied" // in force (perhaps with nothing to change)
	ResultRefused = "refused" // did not parse or validate: the last good set stays
	ResultFailed  = "failed"  // the policy store failed: retried
)

// Reporter logs and counts the reloads of every source:
// sluice_config_reloads_total{source,result},
// sluice_config_reload_errors_total{source} (refused and failed) and
// sluice_config_policies{source}, the policies each source owns.
type Reporter struct {
	log     *slog.Logger
	reloads *prometheus.CounterVec
	errs    *prometheus.CounterVec
	owned   *prometheus.GaugeVec

	mu       sync.Mutex
	lastFail map[string]string
}

// NewReporter registers the metrics on reg (nil: not exported) and logs
// to log (nil: discarded).
func NewReporter(log *slog.Logger, reg prometheus.Registerer) *Reporter {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Reporter{
		log: log,
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_config_reloads_total",
			Help: "Reloads of watched configuration (--envoy-config, --policies, xDS) by source and result: applied, refused (the last good set stays) or failed (the policy store failed; retried).",
		}, []string{"source", "result"}),
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_config_reload_errors_total",
			Help: "Reloads of watched configuration that did not take effect, by source: refused or failed.",
		}, []string{"source"}),
		owned: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_config_policies",
			Help: "Policies in force that a watched configuration source owns, by source.",
		}, []string{"source"}),
		lastFail: map[string]string{},
	}
	if reg != nil {
		reg.MustRegister(r.reloads, r.errs, r.owned)
	}
	return r
}

// Start records the policies source owns at start.
func (r *Reporter) Start(source string, owned int) {
	r.owned.WithLabelValues(source).Set(float64(owned))
	r.reloads.WithLabelValues(source, ResultApplied)
	r.errs.WithLabelValues(source)
}

// Applied records a reload put in force.
func (r *Reporter) Applied(source string, p Plan, owned int) {
	r.reloads.WithLabelValues(source, ResultApplied).Inc()
	r.owned.WithLabelValues(source).Set(float64(owned))
	r.mu.Lock()
	delete(r.lastFail, source)
	r.mu.Unlock()
	r.log.Info("configuration reloaded", "source", source, "published", len(p.Put), "deleted", len(p.Delete), "policies", owned)
}

// Refused records a configuration that does not parse or validate, in
// one log line naming the file (or resource), line and field.
func (r *Reporter) Refused(source string, err error) {
	r.reloads.WithLabelValues(source, ResultRefused).Inc()
	r.errs.WithLabelValues(source).Inc()
	attrs := []any{"source", source, "err", err.Error()}
	var e *Error
	if errors.As(err, &e) {
		attrs = append(attrs, "file", e.File, "line", e.Line, "field", e.Field)
	}
	r.log.Error("configuration refused: the last good configuration stays in force", attrs...)
}

// Failed records a reload the policy store did not take; it is logged
// when its error differs from the last one of source, so a store that
// stays down does not log on every retry.
func (r *Reporter) Failed(source string, err error) {
	r.reloads.WithLabelValues(source, ResultFailed).Inc()
	r.errs.WithLabelValues(source).Inc()
	r.mu.Lock()
	same := r.lastFail[source] == err.Error()
	r.lastFail[source] = err.Error()
	r.mu.Unlock()
	if !same {
		r.log.Warn("configuration not yet in force: the policy store failed; retrying", "source", source, "err", err)
	}
}
