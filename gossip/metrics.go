package gossip

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	dropped       *prometheus.CounterVec
	rejected      *prometheus.CounterVec
	received      *prometheus.CounterVec
	receivedBytes *prometheus.CounterVec
	sent          *prometheus.CounterVec
	sentBytes     *prometheus.CounterVec
	sendErrors    *prometheus.CounterVec
	queueLen      prometheus.Gauge
	members       prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_gossip_dropped_total",
			Help: "Gossip messages dropped before decoding, by reason (queue_full, auth, self).",
		}, []string{"reason"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_gossip_rejected_total",
			Help: "Received gossip messages rejected whole, never applied nor relayed, by reason (malformed, version, kind, invalid, oversized, limit, value, epoch, revision, sender, region).",
		}, []string{"reason"}),
		received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_gossip_received_total",
			Help: "Gossip messages decoded and delivered, by kind.",
		}, []string{"kind"}),
		receivedBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_gossip_received_bytes_total",
			Help: "Encoded bytes of delivered gossip messages, by kind.",
		}, []string{"kind"}),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_gossip_sent_total",
			Help: "Gossip messages sent, by kind and path (gossip: piggybacked on memberlist packets; reliable: one TCP stream per target node).",
		}, []string{"kind", "path"}),
		sentBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_gossip_sent_bytes_total",
			Help: "Encoded bytes sent (once per target node on direct paths, once per message when queued), by kind.",
		}, []string{"kind"}),
		sendErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_gossip_send_errors_total",
			Help: "Gossip sends that failed, by kind.",
		}, []string{"kind"}),
		queueLen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_gossip_receive_queue_length",
			Help: "Messages waiting in the receive queue.",
		}),
		members: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_gossip_members",
			Help: "Live (alive or suspect) cluster nodes, this one included.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.dropped, m.rejected, m.received, m.receivedBytes, m.sent, m.sentBytes, m.sendErrors, m.queueLen, m.members)
	}
	return m
}

// logWriter turns memberlist's log lines ("[LEVEL] memberlist: ...") into
// slog records and counts packets and streams it could not decrypt, which
// memberlist drops before our delegate sees them.
type logWriter struct {
	log *slog.Logger
	m   *metrics
	mu  sync.Mutex
	buf []byte
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.line(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}

func (w *logWriter) line(s string) {
	level := slog.LevelInfo
	switch {
	case strings.Contains(s, "[DEBUG]"):
		level = slog.LevelDebug
	case strings.Contains(s, "[WARN]"):
		level = slog.LevelWarn
	case strings.Contains(s, "[ERR"):
		level = slog.LevelError
	}
	low := strings.ToLower(s)
	if strings.Contains(low, "decrypt") || strings.Contains(low, "encryption is configured but remote state is not encrypted") {
		w.m.dropped.WithLabelValues(ReasonAuth).Inc()
	}
	if i := strings.Index(s, "memberlist: "); i >= 0 {
		s = s[i:]
	}
	w.log.Log(context.Background(), level, s)
}
