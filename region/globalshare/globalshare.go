// Package globalshare is the coordinator that runs in every daemon: it turns
// the engine's usage into this region's share.Report each interval, exchanges
// reports over gossip, rebalances with share.Allocator and publishes the
// resulting share.Table for the check path.
//
// Per epoch boundary t (share.Config.Epoch; the figures describe the
// interval that just ended, epoch e = Epoch(t)−1):
//
//	t − Recent          drain usage (the first part of the interval)
//	t                   drain usage again (the last Recent: the "recent" rate);
//	                    send this node's pressured keys to the region's other nodes
//	t + Collect         sum the region's node usage, Allocator.Report; the
//	                    region's publisher (its live node with the smallest id)
//	                    broadcasts the regional report
//	t + Settle          SetMembers from gossip, Rebalance with the reports of e,
//	                    publish Table (cuts at once)
//	t + Settle + Raise  publish Table again (raises)
//
// Every node of a region sums the same node usage and so computes the same
// regional report and the same shares; only one of them sends it. The
// regional view is built by summing node reports rather than through the
// regional Redis: see the gossip package documentation for why.
//
// The protocol lives in Core, a deterministic state machine with no timer,
// goroutine or I/O; Coordinator.Run is its adapter to real time and gossip:
// it ticks the core on a timer, steps it with each message received, sends
// what the core asks and persists its shares. The simulator drives the same
// Core for every region over a simulated network.
//
// Share is lock-free (an atomic pointer to an immutable share.Table) and is
// what the engine's check path calls.
//
// With a Store (the region's Redis), every node saves the shares its region
// enforces after each raise, and a node starting restores them when they are
// at most PartitionIntervals epochs old: the other regions hold a silent
// region's last shares that long, so until its first rebalance a restarted
// region enforces the shares the others still reserve for it instead of 1/n.
// Without a Store a restarted region starts from 1/n and converges in a few
// intervals.
package globalshare

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/gossip"
	"github.com/sluice-rl/sluice/share"
)

// Clock is the time source of the coordinator's timers. nil means real time.
type Clock interface {
	Now() time.Time
	// After returns a channel that receives once d has passed.
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Gossip is what the coordinator needs from the gossip layer; *gossip.Node
// satisfies it.
type Gossip interface {
	Name() string
	Region() string
	Members() []gossip.Member
	Regions() map[string][]string
	OnMessage(func(gossip.Message))
	BroadcastReport(ctx context.Context, r share.Report) error
	SendNodeUsage(ctx context.Context, u gossip.NodeUsage) error
	SendBorrowRequest(ctx context.Context, r share.BorrowRequest) error
	SendLoan(ctx context.Context, l share.Loan) error
}

// Config wires a Coordinator.
type Config struct {
	// Share is the allocation config; every region must use the same.
	Share share.Config
	// Gossip is this daemon's gossip node. Register the coordinator (New)
	// before the node's Run starts delivering messages.
	Gossip Gossip
	// Usage drains this node's usage since the last call, in cost units
	// (limiter.Limiter.DrainUsage). The coordinator is its only caller.
	Usage func() map[engine.UsageKey]engine.Usage
	// Limit returns L_global of a global policy in units per second; ok is
	// false for policies that are not global (their usage is ignored).
	Limit func(policy string) (ratePerSec float64, ok bool)
	// Quota returns the window of a global quota (a scope: global
	// fixed_window policy, e.g. a daily quota); ok is false for every other
	// policy. A global quota is not divided into shares: its counts are
	// exchanged as G-counters (QuotaOthers), and Limit is not consulted for
	// it. nil means no global quotas.
	Quota func(policy string) (window time.Duration, ok bool)
	// NodeLocalStore is set when each daemon keeps its own engine state
	// (the memory store): the spend of the region's other daemons then
	// counts in QuotaOthers like another region's. With a regional store
	// (Redis) the engine state already holds the region's own count.
	NodeLocalStore bool
	// Collect is how long after the epoch boundary node usage from the
	// region's other nodes is awaited (default Settle/3).
	Collect time.Duration
	// Store, if set, persists this region's shares (see the package
	// documentation); nil keeps them in memory only.
	Store Store
	// BorrowTick is how often the coordinator measures each key's offered
	// rate and bucket level and asks for or serves loans (default 250 ms,
	// the simulator's rate time constant). Borrowing is off when
	// Share.BorrowEvery is zero.
	BorrowTick time.Duration
	// Bucket is CoreConfig.Bucket: whether loans of a policy hand over
	// tokens as well as rate. Nil: rate only.
	Bucket func(policy string) bool
	// Spend and Deposit, if both are set, carry out the core's token spends
	// and deposits and turn token pooling on (CoreConfig.PoolTokens).
	// Spend carries out a Ready.Spends entry (see Spend): it
	// reads this region's bucket of sp.Key at the scale the region
	// enforces, takes sp.Take(remaining) units out of it with a check of
	// that cost, and returns the units taken, 0 when it took none. It must
	// take nothing when the store cannot decide (a degraded admission
	// would hand over tokens no bucket gave up). The coordinator calls it
	// from its send goroutine, never from Run's, and sends the filled loan
	// only when it returns more than 0 without error.
	Spend func(ctx context.Context, sp Spend) (int64, error)
	// Deposit carries out a Ready.Deposits entry (see Deposit): it puts
	// dp.Units into this region's bucket of dp.Key at the scale the region
	// enforces, up to the bucket's capacity, and must put nothing when the
	// store cannot decide. Called from the send goroutine, like Spend.
	Deposit func(ctx context.Context, dp Deposit) error
	// Silence is CoreConfig.Silence (default Share.Interval/10).
	Silence time.Duration
	// Clock drives the timers; nil means real time.
	Clock      Clock
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Store persists one region's shares, e.g. in the region's Redis. Calls are
// made from Run's goroutine with a deadline of a quarter interval.
type Store interface {
	LoadShares(ctx context.Context, region string) (Saved, error)
	SaveShares(ctx context.Context, s Saved) error
}

// Saved is a region's shares as persisted: the epoch they were computed
// for and this region's fraction of L_global per coordinated key.
type Saved struct {
	Region string       `json:"region"`
	Epoch  uint64       `json:"epoch"`
	Shares []SavedShare `json:"shares"`
}

// SavedShare is one key's share in Saved.
type SavedShare struct {
	share.Key
	Share float64 `json:"share"`
}

// Coordinator runs the per-interval exchange for one daemon: the adapter
// between Core and real time, gossip and the Store.
type Coordinator struct {
	cfg   Config
	clock Clock
	log   *slog.Logger
	m     *metrics

	mu   sync.Mutex // guards core
	core *Core

	view atomic.Pointer[view]                    // core.view, for Share
	seen atomic.Pointer[map[share.Key]quotaSeen] // core.seen, for QuotaOthers

	// Messages received, filed by receive for Run's goroutine, which wake
	// tells to look.
	inMu  sync.Mutex
	inbox []gossip.Message
	wake  chan struct{}
	out   chan outMsg // borrow messages to sendLoop
	// Counters of borrow traffic (for tests and metrics): enqueued to send,
	// and received and processed; token spends handed to sendLoop, and
	// those whose tokens were taken and whose loan was sent.
	reqSent, loansSent, reqIn, loansIn atomic.Int64
	spends, spendsSent, spendsDone     atomic.Int64
	deposits, depositsDone             atomic.Int64
}

type regionShares struct {
	regions []string
	shares  []float64
}

type reportInfo struct {
	At    time.Time
	Epoch uint64
	Bytes int
	Keys  int
}

// outboxSize bounds the borrow messages waiting to be sent; a full outbox
// drops (a dropped loan under-serves until the next rebalance).
const outboxSize = 256

// maxMail bounds the messages waiting for Run's goroutine.
const maxMail = 4096

type outMsg struct {
	req     share.BorrowRequest
	loan    share.Loan
	isLoan  bool
	spend   *Spend   // a token loan to fill (Config.Spend) before it is sent
	deposit *Deposit // tokens received, for Config.Deposit
}

// New validates cfg and registers the message handler on cfg.Gossip.
func New(cfg Config) (*Coordinator, error) {
	switch {
	case cfg.Gossip == nil:
		return nil, errors.New("globalshare: Gossip is required")
	case cfg.Usage == nil:
		return nil, errors.New("globalshare: Usage is required")
	}
	if cfg.Clock == nil {
		cfg.Clock = realClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	m := newMetrics(cfg.Registerer)
	// The contact times of Members come from the gossip node's pings; the
	// hold is built from how stale they may be.
	var lag time.Duration
	if p, ok := cfg.Gossip.(interface{ ContactLag() time.Duration }); ok {
		lag = p.ContactLag()
	}
	core, err := newCore(CoreConfig{Share: cfg.Share, Region: cfg.Gossip.Region(), Node: cfg.Gossip.Name(),
		Limit: cfg.Limit, Quota: cfg.Quota, NodeLocalStore: cfg.NodeLocalStore,
		Collect: cfg.Collect, BorrowTick: cfg.BorrowTick, Bucket: cfg.Bucket,
		Silence: cfg.Silence, ContactLag: lag, PoolTokens: cfg.Spend != nil && cfg.Deposit != nil}, cfg.Gossip.Members(), m)
	if err != nil {
		return nil, err
	}
	c := &Coordinator{
		cfg:   cfg,
		clock: cfg.Clock,
		log:   cfg.Logger,
		m:     m,
		core:  core,
		wake:  make(chan struct{}, 1),
		out:   make(chan outMsg, outboxSize),
	}
	c.view.Store(core.view)
	c.seen.Store(core.seen)
	cfg.Gossip.OnMessage(c.receive)
	return c, nil
}

// Share returns the fraction of L_global this region enforces now for a
// global policy and subject, loans included, in [share.MinShare, 1]: the
// engine's scale factor. Lock-free.
func (c *Coordinator) Share(policy, subject string) float64 {
	return c.view.Load().share(policy, subject)
}

// Table returns the allocator's current table (immutable). On a node other
// than its region's acting node, Share also subtracts what the acting node
// lent this generation, which the table does not know.
func (c *Coordinator) Table() *share.Table { return c.view.Load().t }

// RegionShares returns every region's share of a coordinated key as this
// region computed them at the last rebalance, or nil if the key is not
// coordinated (every region then runs at the default 1/n).
func (c *Coordinator) RegionShares(policy, subject string) map[string]float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.core.RegionShares(policy, subject)
}

// QuotaOthers returns the units of a global quota spent in window w (a
// share.WindowIndex) that this daemon's engine state does not hold: the
// other regions' last known counts and, with Config.NodeLocalStore, the
// last known counts of the region's other daemons. The check path admits
// while its engine count plus this plus the cost stay within the limit.
// Lock-free.
func (c *Coordinator) QuotaOthers(policy, subject string, w int64) uint64 {
	return quotaOthers(c.seen.Load(), policy, subject, w)
}

// QuotaCounter returns this node's view of a global quota's G-counter (a
// copy), and false if it knows nothing of the key.
func (c *Coordinator) QuotaCounter(policy, subject string) (share.QuotaCounter, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.core.QuotaCounter(policy, subject)
}

// QuotaView returns what this daemon knows of a global quota's spend in
// window w beyond its own engine state (Core.QuotaView). For the admin API.
func (c *Coordinator) QuotaView(policy, subject string, w int64) QuotaView {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.core.QuotaView(policy, subject, w)
}

// QuotaStats returns the size of the global quotas' G-counter state
// (Core.QuotaStats). For the admin API.
func (c *Coordinator) QuotaStats() []QuotaStat {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.core.QuotaStats()
}

// raised is the epoch whose raises were last published.
func (c *Coordinator) raised() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.core.Raised()
}

// RegionInfo describes one region for GET /v1/regions.
type RegionInfo struct {
	Region string   `json:"region"`
	Nodes  []string `json:"nodes"` // live nodes
	Live   bool     `json:"live"`
	// LastReport is when this node last received (or, for its own region,
	// built) the region's report; zero if never.
	LastReport      time.Time `json:"last_report,omitzero"`
	LastReportEpoch uint64    `json:"last_report_epoch,omitempty"`
	LastReportBytes int       `json:"last_report_bytes,omitempty"`
	LastReportKeys  int       `json:"last_report_keys"`
}

// Status is the coordinator's view for GET /v1/regions.
type Status struct {
	Region   string        `json:"region"`
	Node     string        `json:"node"`
	Interval time.Duration `json:"interval"`
	Epoch    uint64        `json:"epoch"` // last rebalanced epoch
	Isolated bool          `json:"isolated"`
	// CoordinatedKeys is the number of keys with negotiated shares.
	CoordinatedKeys int          `json:"coordinated_keys"`
	DefaultShare    float64      `json:"default_share"`
	Regions         []RegionInfo `json:"regions"`
}

// Status returns the regions, their nodes and their last reports.
func (c *Coordinator) Status() Status {
	live := c.cfg.Gossip.Regions()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.core.Status(live)
}

// receive runs on the gossip decoder goroutine: file and return.
func (c *Coordinator) receive(m gossip.Message) {
	switch m.Kind {
	case gossip.KindReport, gossip.KindNodeUsage, gossip.KindLoan:
	case gossip.KindBorrow:
		if m.Region == c.core.self {
			return
		}
	default:
		return
	}
	c.inMu.Lock()
	full := len(c.inbox) >= maxMail
	if !full {
		c.inbox = append(c.inbox, m)
	}
	c.inMu.Unlock()
	if full {
		c.m.dropped.WithLabelValues("queue_full").Inc()
		return
	}
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// Run drives the core until ctx ends: it ticks it when Core.Next is due
// (and at least every Core.PollEvery, so that membership changes and
// borrowing are seen), steps it with every message received, and does what
// each Ready asks.
func (c *Coordinator) Run(ctx context.Context) error {
	var saved *Saved
	if c.cfg.Store != nil {
		saved = c.load(ctx)
	}
	usage, members := c.cfg.Usage(), c.cfg.Gossip.Members()
	c.mu.Lock()
	err := c.core.Start(c.clock.Now(), members, saved, usage)
	c.publishLocked()
	c.mu.Unlock()
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	wg.Go(func() { c.sendLoop(ctx) })
	defer wg.Wait()
	poll := c.core.PollEvery()
	var timer <-chan time.Time // one outstanding timer, however often mail wakes us
	for {
		if timer == nil {
			c.mu.Lock()
			next := c.core.Next()
			c.mu.Unlock()
			d := next.Sub(c.clock.Now())
			if d <= 0 {
				c.mail(ctx)
				c.tick(ctx)
				continue
			}
			timer = c.clock.After(min(d, poll))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-c.wake:
			c.mail(ctx)
		case <-timer:
			timer = nil
			// Everything received before the step counts for it, even
			// when the timer and the mail are ready at once.
			c.mail(ctx)
			c.tick(ctx)
		}
	}
}

func (c *Coordinator) tick(ctx context.Context) {
	members := c.cfg.Gossip.Members()
	now := c.clock.Now()
	c.mu.Lock()
	want := c.core.WantsUsage(now)
	c.mu.Unlock()
	var usage map[engine.UsageKey]engine.Usage
	if want {
		usage = c.cfg.Usage() // drained only when the core uses it, outside the lock
	}
	c.mu.Lock()
	dead := c.core.dead
	rd := c.core.Tick(now, usage, members)
	if !slices.Equal(dead, c.core.dead) {
		c.log.Info("globalshare: membership declared regions dead", "dead", c.core.dead, "isolated", c.core.alloc.Isolated())
	}
	c.publishLocked()
	c.mu.Unlock()
	c.do(ctx, rd)
}

// mail steps the core with the messages receive filed.
func (c *Coordinator) mail(ctx context.Context) {
	c.inMu.Lock()
	in := c.inbox
	c.inbox = nil
	c.inMu.Unlock()
	if len(in) == 0 {
		return
	}
	// A message may come from a region that joined since the last tick.
	members := c.cfg.Gossip.Members()
	c.mu.Lock()
	c.core.SetMembers(members)
	c.mu.Unlock()
	for _, m := range in {
		c.mu.Lock()
		rd := c.core.Step(c.clock.Now(), m)
		c.publishLocked()
		c.mu.Unlock()
		switch m.Kind {
		case gossip.KindBorrow:
			c.reqIn.Add(1)
		case gossip.KindLoan:
			c.loansIn.Add(1)
		}
		if rd.Dropped != "" {
			c.m.dropped.WithLabelValues(rd.Dropped).Inc()
			c.log.Debug("globalshare: message dropped", "kind", m.Kind, "from", m.From, "reason", rd.Dropped)
		}
		c.do(ctx, rd)
	}
}

// publishLocked hands the core's current shares to the check path.
// Called with c.mu held.
func (c *Coordinator) publishLocked() {
	if v := c.core.view; c.view.Load() != v {
		c.view.Store(v)
	}
	if s := c.core.seen; c.seen.Load() != s {
		c.seen.Store(s)
	}
}

// do sends and saves what rd asks, in order: node usage and reports at
// once, borrow messages through sendLoop.
func (c *Coordinator) do(ctx context.Context, rd Ready) {
	for _, u := range rd.NodeUsage {
		if err := c.cfg.Gossip.SendNodeUsage(ctx, u); err != nil {
			c.log.Warn("globalshare: send node usage", "err", err)
		}
	}
	for _, r := range rd.Reports {
		if err := c.cfg.Gossip.BroadcastReport(ctx, r); err != nil {
			c.log.Warn("globalshare: broadcast report", "epoch", r.Epoch, "keys", len(r.Keys), "err", err)
		} else {
			c.m.reportsSent.Inc()
		}
	}
	for _, r := range rd.Borrows {
		c.reqSent.Add(1)
		c.enqueue(outMsg{req: r})
	}
	for _, l := range rd.Loans {
		c.loansSent.Add(1)
		c.enqueue(outMsg{loan: l, isLoan: true})
	}
	for i := range rd.Spends {
		if c.cfg.Spend == nil {
			break // the core asks for none without Config.Spend
		}
		c.spends.Add(1)
		c.enqueue(outMsg{spend: &rd.Spends[i]})
	}
	for i := range rd.Deposits {
		if c.cfg.Deposit == nil {
			break // the core asks for none without Config.Deposit
		}
		c.deposits.Add(1)
		c.enqueue(outMsg{deposit: &rd.Deposits[i]})
	}
	if rd.Save != nil && c.cfg.Store != nil {
		sctx, cancel := context.WithTimeout(ctx, c.cfg.Share.Interval/4)
		defer cancel()
		if err := c.cfg.Store.SaveShares(sctx, *rd.Save); err != nil {
			c.log.Warn("globalshare: save shares", "epoch", rd.Save.Epoch, "err", err)
		}
	}
}

// load reads the region's saved shares; the core decides whether they are
// recent enough to restore.
func (c *Coordinator) load(ctx context.Context) *Saved {
	lctx, cancel := context.WithTimeout(ctx, c.cfg.Share.Interval/4)
	defer cancel()
	saved, err := c.cfg.Store.LoadShares(lctx, c.core.self)
	if err != nil {
		c.log.Warn("globalshare: load saved shares", "err", err)
		return nil
	}
	return &saved
}

func (c *Coordinator) enqueue(m outMsg) {
	select {
	case c.out <- m:
	default:
		c.m.borrow.WithLabelValues("send_dropped").Inc()
	}
}

// sendLoop sends borrow messages off Run's goroutine, in order, so a slow
// peer delays neither the epochs nor the check path.
func (c *Coordinator) sendLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-c.out:
			var err error
			if m.spend != nil {
				c.spend(ctx, *m.spend)
				continue
			}
			if m.deposit != nil {
				c.depositTokens(ctx, *m.deposit)
				continue
			}
			if m.isLoan {
				err = c.cfg.Gossip.SendLoan(ctx, m.loan)
			} else {
				err = c.cfg.Gossip.SendBorrowRequest(ctx, m.req)
			}
			if err != nil && ctx.Err() == nil {
				c.m.borrow.WithLabelValues("send_failed").Inc()
				c.log.Debug("globalshare: send borrow message", "loan", m.isLoan, "err", err)
			}
		}
	}
}

// spend carries out one token spend on sendLoop's goroutine: the owner
// takes the tokens out of the region's bucket (Config.Spend), and only then
// is the loan handing them over sent. A spend that takes nothing, or
// fails, sends nothing: the borrower stays short, and no token is handed
// over that a bucket did not give up.
func (c *Coordinator) spend(ctx context.Context, sp Spend) {
	defer c.spendsDone.Add(1)
	n, err := c.cfg.Spend(ctx, sp)
	switch {
	case err != nil:
		if ctx.Err() == nil {
			c.m.borrow.WithLabelValues("spend_failed").Inc()
			c.log.Debug("globalshare: token spend", "policy", sp.Key.Policy, "err", err)
		}
		return
	case n <= 0:
		c.m.borrow.WithLabelValues("spend_empty").Inc()
		return
	}
	l := sp.Of(n)
	if err := c.cfg.Gossip.SendLoan(ctx, l); err != nil {
		if ctx.Err() == nil {
			c.m.borrow.WithLabelValues("send_failed").Inc()
			c.log.Debug("globalshare: send token loan", "err", err)
		}
		return
	}
	c.spendsSent.Add(1)
	c.m.borrow.WithLabelValues("tokens_lent").Inc()
}

// depositTokens carries out one deposit on sendLoop's goroutine. One that
// fails is lost: it leaves this region short, never over.
func (c *Coordinator) depositTokens(ctx context.Context, dp Deposit) {
	defer c.depositsDone.Add(1)
	if err := c.cfg.Deposit(ctx, dp); err != nil {
		if ctx.Err() == nil {
			c.m.borrow.WithLabelValues("deposit_failed").Inc()
			c.log.Debug("globalshare: token deposit", "policy", dp.Key.Policy, "err", err)
		}
		return
	}
	c.m.borrow.WithLabelValues("tokens_deposited").Inc()
}

var _ Gossip = (*gossip.Node)(nil)

type metrics struct {
	rebalances     prometheus.Counter
	reportsSent    prometheus.Counter
	reportsMissing prometheus.Counter
	reportKeys     prometheus.Gauge
	coordKeys      prometheus.Gauge
	regions        prometheus.Gauge
	isolated       prometheus.Gauge
	borrow         *prometheus.CounterVec
	dropped        *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		rebalances: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_globalshare_rebalances_total",
			Help: "Epochs rebalanced."}),
		reportsSent: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_globalshare_reports_sent_total",
			Help: "Regional reports broadcast by this node (the region's publisher)."}),
		reportsMissing: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_globalshare_reports_missing_total",
			Help: "Other regions' reports not received by the settle deadline, summed over epochs."}),
		reportKeys: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_globalshare_report_keys",
			Help: "Keys in this region's last report."}),
		coordKeys: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_globalshare_coordinated_keys",
			Help: "Keys with negotiated shares."}),
		regions: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_globalshare_regions",
			Help: "Regions known to the allocation (failed ones included until reclaimed)."}),
		isolated: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_globalshare_isolated",
			Help: "1 while this region cannot reach a majority and runs at the safe share."}),
		borrow: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_globalshare_borrow_total",
			Help: "Borrowing events on this node: requested (a borrow request sent), lent (a loan sent, own share cut), " +
				"accepted (a loan applied), mirrored (another node of this region lent: cut applied here), " +
				"tokens_requested (a token request sent), tokens_offered (a token loan handed to the owner to fill), " +
				"tokens_lent (its tokens taken out of the bucket and the loan sent), spend_empty (the bucket had none to spare), " +
				"spend_failed (the engine could not take them), tokens_accepted (a token loan received, to deposit), " +
				"tokens_deposited, deposit_failed, send_dropped (outbox full), send_failed."}, []string{"event"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_globalshare_messages_dropped_total",
			Help: "Received messages the coordinator did not apply: unknown_region, epoch (future or too old), " +
				"number (NaN, infinite, negative or above the whole limit), malformed, queue_full."}, []string{"reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.rebalances, m.reportsSent, m.reportsMissing, m.reportKeys, m.coordKeys, m.regions, m.isolated, m.borrow, m.dropped)
	}
	return m
}
