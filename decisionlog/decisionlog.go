// Package decisionlog keeps two views of a daemon's decisions that
// metrics cannot give, because both name subjects: a sampled stream of
// decision events written as JSON lines, and, per policy, the subjects it
// limited most over a recent window (a bounded heavy-hitters sketch). With
// them a shadow policy can be judged before it is enforced: its would-be
// rejections appear in the stream and in the top list.
//
// Neither ever slows a check: an event is handed to a bounded queue that a
// writer goroutine drains, and one that finds the queue full is dropped and
// counted; the sketches hold a fixed number of counters per policy.
package decisionlog

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	mrand "math/rand/v2"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Config configures a Log. The zero value keeps the top lists and writes
// no stream.
type Config struct {
	// Path is where the stream goes: a file (appended to, created 0600),
	// "-" for standard output, "" for no stream.
	Path string
	// RejectRate is the fraction, in [0, 1], of rejections, unavailable
	// answers and shadow would-rejects written to the stream.
	RejectRate float64
	// AllowRate is the fraction, in [0, 1], of other admissions written;
	// usually far below RejectRate.
	AllowRate float64
	// RawSubjects writes subjects as they are. By default the stream holds
	// only a keyed hash of each subject (HMAC-SHA-256, 16 hex digits), so
	// that a log pipeline never sees API keys or addresses.
	RawSubjects bool
	// HashKey keys the subject hash; the same key on every daemon makes
	// the hashes comparable across daemons and restarts. Empty means a
	// random key per process.
	HashKey []byte
	// QueueSize bounds the events waiting for the writer. Default 4096.
	QueueSize int
	// TopWindow is the recent window of the top lists: they cover between
	// one and two of them. Default 5 minutes.
	TopWindow time.Duration
	// TopK is how many subjects each policy's sketch holds. Default 64.
	TopK int
	// MaxPolicies bounds how many policies have a sketch; limited
	// decisions of further policies are not counted. Default 1024.
	MaxPolicies int
}

// DefaultConfig is no stream, rejections at rate 1 and admissions at 0.001
// once a Path is set, and top lists over 5 minutes.
func DefaultConfig() Config {
	return Config{RejectRate: 1, AllowRate: 0.001, QueueSize: 4096, TopWindow: 5 * time.Minute, TopK: 64, MaxPolicies: 1024}
}

// Validate reports a configuration that would drop events silently.
func (c Config) Validate() error {
	var errs []error
	for _, r := range []struct {
		name string
		v    float64
	}{{"reject rate", c.RejectRate}, {"allow rate", c.AllowRate}} {
		if math.IsNaN(r.v) || r.v < 0 || r.v > 1 {
			errs = append(errs, fmt.Errorf("decision log %s must be in [0, 1], got %v", r.name, r.v))
		}
	}
	if c.QueueSize < 0 || c.TopK < 0 || c.MaxPolicies < 0 || c.TopWindow < 0 {
		errs = append(errs, errors.New("decision log queue size, top k, max policies and top window must not be negative"))
	}
	return errors.Join(errs...)
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.QueueSize == 0 {
		c.QueueSize = d.QueueSize
	}
	if c.TopWindow == 0 {
		c.TopWindow = d.TopWindow
	}
	if c.TopK == 0 {
		c.TopK = d.TopK
	}
	if c.MaxPolicies == 0 {
		c.MaxPolicies = d.MaxPolicies
	}
	return c
}

// Event is one decision as the stream writes it.
type Event struct {
	Time time.Time `json:"time"`
	// Subject is set only with RawSubjects; SubjectHash otherwise.
	Subject     string `json:"subject,omitempty"`
	SubjectHash string `json:"subject_hash,omitempty"`
	Tier        string `json:"tier"`
	Method      string `json:"method"`
	Route       string `json:"route"`
	// Decision is allowed, rejected or unavailable.
	Decision string `json:"decision"`
	// Source is store, deny_cache, fallback or none.
	Source string `json:"source"`
	// Policy is the deciding policy, "" when none applied.
	Policy string `json:"policy,omitempty"`
	// Violated are the enforced policies that rejected.
	Violated []string `json:"violated,omitempty"`
	// WouldReject are the shadow policies that would have rejected.
	WouldReject []string `json:"would_reject,omitempty"`
	Degraded    bool     `json:"degraded,omitempty"`
	// SampleRate is the rate this event was sampled at: each written event
	// stands for 1/SampleRate decisions like it.
	SampleRate float64 `json:"sample_rate"`
}

// Kinds of limited decision a top list counts.
const (
	KindRejected    = "rejected"     // an enforced policy rejected (or failed closed)
	KindWouldReject = "would_reject" // a shadow policy would have rejected
)

// Log is the stream's queue and writer and the top-list sketches. Its
// methods are safe for concurrent use.
type Log struct {
	cfg       Config
	log       *slog.Logger
	key       []byte
	rejectThr uint64 // sample when rand < thr; math.MaxUint64 means always
	allowThr  uint64
	out       io.WriteCloser // nil without a stream
	closeOnce sync.Once
	closeErr  error
	q         chan Event

	mu   sync.Mutex
	tops map[topKey]*windowed

	written, droppedFull, droppedWrite, limitedUncounted prometheus.Counter
}

type topKey struct{ policy, kind string }

// New validates cfg, opens the stream's file (so an unwritable path is an
// error at start, not a daemon that drops every event) and registers the
// stream's counters on reg. Run writes the stream.
func New(cfg Config, log *slog.Logger, reg prometheus.Registerer) (*Log, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &Log{cfg: cfg, log: log, tops: make(map[topKey]*windowed),
		rejectThr: threshold(cfg.RejectRate), allowThr: threshold(cfg.AllowRate)}
	l.key = cfg.HashKey
	if len(l.key) == 0 {
		l.key = make([]byte, 32)
		rand.Read(l.key)
	}
	switch cfg.Path {
	case "":
	case "-":
		l.out = nopCloser{os.Stdout}
	default:
		f, err := os.OpenFile(cfg.Path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("decision log: %w", err)
		}
		l.out = f
	}
	if l.out != nil {
		l.q = make(chan Event, cfg.QueueSize)
	}
	l.written = prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_decision_events_written_total",
		Help: "Sampled decision events written to the decision stream."})
	dropped := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_decision_events_dropped_total",
		Help: "Sampled decision events not written: queue_full (the writer fell behind; the check was not slowed) or write_error."}, []string{"reason"})
	l.droppedFull, l.droppedWrite = dropped.WithLabelValues("queue_full"), dropped.WithLabelValues("write_error")
	l.limitedUncounted = prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_decision_top_uncounted_total",
		Help: "Limited decisions of policies beyond the top lists' policy bound, counted in no top list."})
	if reg != nil {
		if err := errors.Join(reg.Register(l.written), reg.Register(dropped), reg.Register(l.limitedUncounted)); err != nil {
			if f, ok := l.out.(*os.File); ok {
				f.Close()
			}
			return nil, fmt.Errorf("decision log metrics: %w", err)
		}
	}
	return l, nil
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

// threshold maps a rate in [0, 1] to the bound a uniform uint64 must fall
// below.
func threshold(rate float64) uint64 {
	switch {
	case rate <= 0:
		return 0
	case rate >= 1:
		return math.MaxUint64
	}
	return uint64(rate * (1 << 63) * 2)
}

// Streaming reports whether events are written anywhere.
func (l *Log) Streaming() bool { return l.q != nil }

// Sample reports whether a decision goes to the stream: limited ones (a
// rejection, an unavailable answer, a shadow would-reject) at RejectRate,
// others at AllowRate. It is cheap enough for every check.
func (l *Log) Sample(limited bool) bool {
	if l.q == nil {
		return false
	}
	thr := l.allowThr
	if limited {
		thr = l.rejectThr
	}
	switch thr {
	case 0:
		return false
	case math.MaxUint64:
		return true
	}
	return mrand.Uint64() < thr
}

// Write hands a sampled event to the writer, filling in the subject as
// configured and the sample rate. It never blocks: when the queue is full
// the event is dropped and counted.
func (l *Log) Write(e Event, limited bool) {
	if l.q == nil {
		return
	}
	e.SampleRate = l.cfg.AllowRate
	if limited {
		e.SampleRate = l.cfg.RejectRate
	}
	if !l.cfg.RawSubjects {
		e.SubjectHash, e.Subject = l.Hash(e.Subject), ""
	}
	select {
	case l.q <- e:
	default:
		l.droppedFull.Inc()
	}
}

// Hash is the stream's keyed hash of subject.
func (l *Log) Hash(subject string) string {
	m := hmac.New(sha256.New, l.key)
	m.Write([]byte(subject))
	var sum [sha256.Size]byte
	return hex.EncodeToString(m.Sum(sum[:0])[:8])
}

// Limited counts one limited decision of subject under policy in the top
// lists; kind is KindRejected or KindWouldReject.
func (l *Log) Limited(now time.Time, policy, kind, subject string) {
	k := topKey{policy, kind}
	l.mu.Lock()
	w := l.tops[k]
	if w == nil {
		if len(l.tops) >= 2*l.cfg.MaxPolicies {
			l.mu.Unlock()
			l.limitedUncounted.Inc()
			return
		}
		w = newWindowed(l.cfg.TopK, l.cfg.TopWindow)
		l.tops[k] = w
	}
	w.add(now, subject)
	l.mu.Unlock()
}

// PolicyTop is one policy's most limited subjects of one kind.
type PolicyTop struct {
	Policy string `json:"policy"`
	Kind   string `json:"kind"`
	// Total is every limited decision of this kind the window holds, the
	// subjects listed or not.
	Total    uint64       `json:"total"`
	Subjects []SubjectTop `json:"subjects"`
}

// SubjectTop is a subject's count in a top list: the true count lies in
// [Count-MaxOvercount, Count].
type SubjectTop struct {
	Subject      string `json:"subject"`
	SubjectHash  string `json:"subject_hash"`
	Count        uint64 `json:"count"`
	MaxOvercount uint64 `json:"max_overcount"`
}

// Top returns, for policy (every policy when ""), the n subjects most
// limited over the recent window, by policy then kind. Lists with nothing
// in the window are left out.
func (l *Log) Top(now time.Time, policy string, n int) []PolicyTop {
	l.mu.Lock()
	var out []PolicyTop
	for k, w := range l.tops {
		if policy != "" && k.policy != policy {
			continue
		}
		cs, total := w.top(now, n)
		if total == 0 {
			continue
		}
		pt := PolicyTop{Policy: k.policy, Kind: k.kind, Total: total, Subjects: make([]SubjectTop, len(cs))}
		for i, c := range cs {
			pt.Subjects[i] = SubjectTop{Subject: c.Key, Count: c.Count, MaxOvercount: c.Overcount}
		}
		out = append(out, pt)
	}
	l.mu.Unlock()
	for i := range out {
		for j := range out[i].Subjects {
			out[i].Subjects[j].SubjectHash = l.Hash(out[i].Subjects[j].Subject)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Policy != out[j].Policy {
			return out[i].Policy < out[j].Policy
		}
		return out[i].Kind < out[j].Kind
	})
	return out
}

// Window is the top lists' window.
func (l *Log) Window() time.Duration { return l.cfg.TopWindow }

// Close closes the stream's file; Run closes it when it returns. Events
// written after Close are dropped. It is safe to call more than once.
func (l *Log) Close() error {
	if l.out == nil {
		return nil
	}
	l.closeOnce.Do(func() { l.closeErr = l.out.Close() })
	return l.closeErr
}

// Run writes queued events as JSON lines until ctx ends, then writes what
// is queued and closes the file. Without a stream it returns at once. A
// failed write is logged (at most once a minute) and its events counted as
// dropped; the writer keeps going.
func (l *Log) Run(ctx context.Context) error {
	if l.q == nil {
		return nil
	}
	defer l.Close()
	bw := bufio.NewWriterSize(l.out, 64<<10)
	enc := json.NewEncoder(bw)
	pending := 0
	var lastErr time.Time
	flush := func() {
		if err := bw.Flush(); err != nil {
			l.droppedWrite.Add(float64(pending))
			if time.Since(lastErr) > time.Minute {
				lastErr = time.Now()
				l.log.Warn("decision log: write failed", "path", l.cfg.Path, "err", err)
			}
			bw.Reset(l.out)
		} else {
			l.written.Add(float64(pending))
		}
		pending = 0
	}
	write := func(e Event) {
		if err := enc.Encode(e); err != nil {
			l.droppedWrite.Inc()
			return
		}
		pending++
	}
	// drain writes what is queued, then flushes: one write per burst.
	drain := func() {
		for {
			select {
			case e := <-l.q:
				write(e)
			default:
				flush()
				return
			}
		}
	}
	for {
		select {
		case e := <-l.q:
			write(e)
			drain()
		case <-ctx.Done():
			drain()
			return nil
		}
	}
}
