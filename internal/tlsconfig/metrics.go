package tlsconfig

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the TLS metrics of every listener, labelled by listener (and
// of the TLS clients made by NewClient, labelled by the name they were
// given, such as redis; without a client certificate a client has no
// expiry, and clients count no handshakes):
//
//	sluice_tls_certificate_expiry_timestamp_seconds  when the served certificate expires (unix seconds)
//	sluice_tls_reloads_total                         new files served without a restart
//	sluice_tls_reload_errors_total                   changed files refused (the last good ones stay)
//	sluice_tls_handshake_errors_total                handshakes that failed (plaintext clients included)
//
// A nil *Metrics counts nothing.
type Metrics struct {
	expiry     *prometheus.GaugeVec
	reloads    *prometheus.CounterVec
	reloadErrs *prometheus.CounterVec
	handshakes *prometheus.CounterVec
}

// NewMetrics registers the TLS metrics with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		expiry: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_tls_certificate_expiry_timestamp_seconds",
			Help: "When the certificate a TLS listener serves expires, in unix seconds.",
		}, []string{"listener"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_tls_reloads_total",
			Help: "Changed certificate files a TLS listener has loaded and serves, without a restart.",
		}, []string{"listener"}),
		reloadErrs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_tls_reload_errors_total",
			Help: "Changed certificate files a TLS listener refused (unreadable, mismatched, expired); the last good ones are still served.",
		}, []string{"listener"}),
		handshakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_tls_handshake_errors_total",
			Help: "TLS handshakes a listener's clients failed, plaintext clients and clients without a valid certificate included.",
		}, []string{"listener"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.expiry, m.reloads, m.reloadErrs, m.handshakes} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("tls metrics: %w", err)
			}
		}
	}
	return m, nil
}

// loaded records a set of files served, at start or by a reload.
func (m *Metrics) loaded(listener string, notAfter time.Time) {
	if m == nil {
		return
	}
	if !notAfter.IsZero() {
		m.expiry.WithLabelValues(listener).Set(float64(notAfter.Unix()))
	}
	m.reloads.WithLabelValues(listener).Add(0)
	m.reloadErrs.WithLabelValues(listener).Add(0)
}

// served records a listener's first set of files, so that its handshake
// errors are exposed from zero.
func (m *Metrics) served(listener string) {
	if m != nil {
		m.handshakes.WithLabelValues(listener).Add(0)
	}
}

func (m *Metrics) reloaded(listener string) {
	if m != nil {
		m.reloads.WithLabelValues(listener).Inc()
	}
}

func (m *Metrics) reloadFailed(listener string) {
	if m != nil {
		m.reloadErrs.WithLabelValues(listener).Inc()
	}
}

func (m *Metrics) handshakeFailed(listener string) {
	if m != nil {
		m.handshakes.WithLabelValues(listener).Inc()
	}
}
