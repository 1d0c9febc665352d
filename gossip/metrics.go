package gossip

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

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
	pings         *prometheus.CounterVec
	relayChanges  *prometheus.CounterVec
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
		pings: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_gossip_contact_pings_total",
			Help: "Contact pings this node sent to nodes of other regions, by result: answered within the probe timeout, unanswered within it, late (answered after it: also counted unanswered) or stale (an answer to no ping kept).",
		}, []string{"result"}),
		relayChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_gossip_relay_changes_total",
			Help: "Times the node this node's messages to a region go through (its relay) changed, by region: the relay failed a send, died, left or was replaced in membership.",
		}, []string{"region"}),
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
		reg.MustRegister(m.dropped, m.rejected, m.received, m.receivedBytes, m.sent, m.sentBytes, m.sendErrors, m.pings, m.relayChanges, m.queueLen, m.members)
	}
	return m
}

// clusterCollector reads, at scrape time, what a node knows of the other
// regions: how old their newest usage report is and whether they hold the
// policy set this node holds. Its series are labelled by region, a set the
// cluster's configuration bounds (a region is known only through a member
// that holds the gossip key).
type clusterCollector struct {
	n   *Node
	now func() time.Time // the local clock; not Config.Now, which judges message epochs

	mu         sync.Mutex
	lastReport map[string]time.Time // region → when its newest report was delivered here

	reportAge *prometheus.Desc
	skew      *prometheus.Desc
}

// watchCluster registers n's cluster collector on reg and has it note
// every report n delivers. Call it from New, before Run.
func watchCluster(n *Node, reg prometheus.Registerer) {
	c := &clusterCollector{n: n, now: time.Now, lastReport: map[string]time.Time{},
		reportAge: prometheus.NewDesc("sluice_gossip_report_age_seconds",
			"Seconds since this node last received a usage report from each other region, or, if none has come, since it saw the region's first node join. Regions whose nodes all left gracefully are not listed; a crashed region stays, its age growing.",
			[]string{"region"}, nil),
		skew: prometheus.NewDesc("sluice_policy_set_skewed_regions",
			"Regions, this one included, with a live node advertising a policy set (content hash) other than this node's; 0 when every live node holds the same set.",
			nil, nil),
	}
	n.OnMessage(func(m Message) {
		if m.Kind == KindReport {
			c.mu.Lock()
			c.lastReport[m.Region] = c.now()
			c.mu.Unlock()
		}
	})
	if reg != nil {
		reg.MustRegister(c)
	}
}

func (c *clusterCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.reportAge
	ch <- c.skew
}

func (c *clusterCollector) Collect(ch chan<- prometheus.Metric) {
	members := c.n.memberList()
	for region, age := range c.reportAges(members, c.now()) {
		ch <- prometheus.MustNewConstMetric(c.reportAge, prometheus.GaugeValue, age.Seconds(), region)
	}
	c.n.metaMu.Lock()
	own := c.n.metaFields.PolicyHash
	c.n.metaMu.Unlock()
	ch <- prometheus.MustNewConstMetric(c.skew, prometheus.GaugeValue, float64(skewedRegions(members, own)))
}

// reportAges is the age, at now, of the newest report of every other
// region that has a member not gone by a graceful leave; a region that has
// sent none is as old as its oldest member's state.
func (c *clusterCollector) reportAges(members []member, now time.Time) map[string]time.Duration {
	joined := map[string]time.Time{}
	for _, m := range members {
		if m.Region == "" || m.Region == c.n.cfg.Region || m.State == StateLeft {
			continue
		}
		if t, ok := joined[m.Region]; !ok || m.since.Before(t) {
			joined[m.Region] = m.since
		}
	}
	out := make(map[string]time.Duration, len(joined))
	c.mu.Lock()
	defer c.mu.Unlock()
	for region, since := range joined {
		if t, ok := c.lastReport[region]; ok {
			since = t
		}
		out[region] = max(now.Sub(since), 0)
	}
	return out
}

// skewedRegions counts the regions with a live member whose advertised
// policy hash is not own.
func skewedRegions(members []member, own string) int {
	skewed := map[string]bool{}
	for _, m := range members {
		if m.State.Live() && m.PolicyHash != own {
			skewed[m.Region] = true
		}
	}
	return len(skewed)
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
