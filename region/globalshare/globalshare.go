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
	"fmt"
	"log/slog"
	"maps"
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
	// (engine.Limiter.DrainUsage). The coordinator is its only caller.
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

// Coordinator runs the per-interval exchange for one daemon.
type Coordinator struct {
	cfg   Config
	clock Clock
	log   *slog.Logger
	self  string // region
	node  string
	split bool // drain twice per interval to measure the recent rate
	// balanced is set after the first rebalance (Run's goroutine only).
	balanced bool
	view     atomic.Pointer[view]
	shares   atomic.Pointer[map[share.Key]regionShares]
	m        *metrics
	raised   atomic.Uint64 // epoch whose raises were last published

	mu        sync.Mutex
	reports   map[uint64]map[string]share.Report     // epoch → region → report
	nodeUse   map[uint64]map[string]gossip.NodeUsage // epoch → node → usage (own region)
	lastSeen  map[string]reportInfo                  // region → last report received or sent
	epoch     uint64                                 // last rebalanced epoch
	isolated  bool
	coordKeys int
	known     []string     // regions known to the allocator
	own       share.Report // this region's last report

	restored map[share.Key]float64 // shares loaded from Store (Run's goroutine)

	// Membership-driven reclaim (Run's goroutine only).
	alloc       *share.Allocator
	dead        []string  // regions membership has declared dead
	deadRaiseAt time.Time // republish the table then (raises after SetDead)

	b borrowState // Run's goroutine only
	q quotaState  // global quotas: quota.go
	// Borrow messages received, filed by receive (under mu) for Run's
	// goroutine, which wake tells to look.
	inReq  []share.BorrowRequest
	inLoan []inLoan
	wake   chan struct{}
	out    chan outMsg // to sendLoop
	// Counters of borrow traffic (for tests and metrics): enqueued to send,
	// and received and processed.
	reqSent, loansSent, reqIn, loansIn atomic.Int64
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

// New validates cfg and registers the message handler on cfg.Gossip.
func New(cfg Config) (*Coordinator, error) {
	if err := cfg.Share.Validate(); err != nil {
		return nil, err
	}
	switch {
	case cfg.Gossip == nil:
		return nil, errors.New("globalshare: Gossip is required")
	case cfg.Usage == nil:
		return nil, errors.New("globalshare: Usage is required")
	case cfg.Limit == nil:
		return nil, errors.New("globalshare: Limit is required")
	case cfg.Collect < 0 || cfg.Collect > cfg.Share.Settle:
		return nil, fmt.Errorf("globalshare: Collect %v must be in [0, Settle %v]", cfg.Collect, cfg.Share.Settle)
	}
	if cfg.Collect == 0 {
		cfg.Collect = cfg.Share.Settle / 3
	}
	if cfg.BorrowTick < 0 {
		return nil, fmt.Errorf("globalshare: BorrowTick %v must not be negative", cfg.BorrowTick)
	}
	if cfg.BorrowTick == 0 {
		cfg.BorrowTick = 250 * time.Millisecond
	}
	if cfg.Clock == nil {
		cfg.Clock = realClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Quota != nil {
		limit, quota := cfg.Limit, cfg.Quota
		cfg.Limit = func(policy string) (float64, bool) {
			if _, ok := quota(policy); ok {
				return 0, false // counted as a G-counter, never shared
			}
			return limit(policy)
		}
	}
	sc := cfg.Share
	c := &Coordinator{
		cfg:      cfg,
		clock:    cfg.Clock,
		log:      cfg.Logger,
		self:     cfg.Gossip.Region(),
		node:     cfg.Gossip.Name(),
		split:    sc.Recent < sc.Interval-sc.Settle-sc.RaiseDelay,
		m:        newMetrics(cfg.Registerer),
		reports:  map[uint64]map[string]share.Report{},
		nodeUse:  map[uint64]map[string]gossip.NodeUsage{},
		lastSeen: map[string]reportInfo{},
		wake:     make(chan struct{}, 1),
		out:      make(chan outMsg, outboxSize),
	}
	c.q.init()
	c.view.Store(&view{t: share.NewTable(1/float64(max(1, len(cfg.Gossip.Regions()))), nil)})
	cfg.Gossip.OnMessage(c.receive)
	return c, nil
}

// Share returns the fraction of L_global this region enforces now for a
// global policy and subject, loans included and at most 1: the engine's
// scale factor. Lock-free.
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
	p := c.shares.Load()
	if p == nil {
		return nil
	}
	rs, ok := (*p)[share.Key{Policy: policy, Subject: subject}]
	if !ok {
		return nil
	}
	out := make(map[string]float64, len(rs.regions))
	for i, r := range rs.regions {
		out[r] = rs.shares[i]
	}
	return out
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
	names := map[string]bool{}
	for r := range live {
		names[r] = true
	}
	for _, r := range c.known {
		names[r] = true
	}
	for r := range c.lastSeen {
		names[r] = true
	}
	st := Status{Region: c.self, Node: c.node, Interval: c.cfg.Share.Interval, Epoch: c.epoch,
		Isolated: c.isolated, CoordinatedKeys: c.coordKeys, DefaultShare: c.view.Load().t.Default()}
	for _, r := range slices.Sorted(maps.Keys(names)) {
		ri := RegionInfo{Region: r, Nodes: live[r], Live: len(live[r]) > 0}
		if s, ok := c.lastSeen[r]; ok {
			ri.LastReport, ri.LastReportEpoch, ri.LastReportBytes, ri.LastReportKeys = s.At, s.Epoch, s.Bytes, s.Keys
		}
		st.Regions = append(st.Regions, ri)
	}
	return st
}

// receive runs on the gossip decoder goroutine: file and return.
func (c *Coordinator) receive(m gossip.Message) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch m.Kind {
	case gossip.KindReport:
		r := m.Report
		if r.Region == c.self {
			return
		}
		c.mergeReportQuotas(r) // G-counters: late reports are still good
		if !c.fresh(r.Epoch) {
			return
		}
		if c.reports[r.Epoch] == nil {
			c.reports[r.Epoch] = map[string]share.Report{}
		}
		c.reports[r.Epoch][r.Region] = r
		c.lastSeen[r.Region] = reportInfo{At: c.clock.Now(), Epoch: r.Epoch, Bytes: m.Size, Keys: len(r.Keys)}
	case gossip.KindNodeUsage:
		u := m.Usage
		if u.Region != c.self {
			return
		}
		c.mergeNodeQuotas(u) // cumulative: late ones are still good
		if !c.fresh(u.Epoch) {
			return
		}
		if c.nodeUse[u.Epoch] == nil {
			c.nodeUse[u.Epoch] = map[string]gossip.NodeUsage{}
		}
		c.nodeUse[u.Epoch][u.Node] = u
	case gossip.KindBorrow:
		if m.Region == c.self || len(c.inReq) >= maxMail {
			return
		}
		c.inReq = append(c.inReq, m.Borrow)
		c.poke()
	case gossip.KindLoan:
		if len(c.inLoan) >= maxMail {
			return
		}
		c.inLoan = append(c.inLoan, inLoan{from: m.From, loan: m.Loan})
		c.poke()
	}
}

func (c *Coordinator) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// fresh bounds what is buffered: epochs around the current one only.
func (c *Coordinator) fresh(epoch uint64) bool {
	cur := c.cfg.Share.Epoch(c.clock.Now())
	return epoch+3 >= cur && epoch <= cur+1
}

// Run drives the epochs until ctx ends.
func (c *Coordinator) Run(ctx context.Context) error {
	sc := c.cfg.Share
	now := c.clock.Now()
	alloc, err := share.NewAllocator(sc, c.self, c.knownRegions(), sc.Epoch(now))
	if err != nil {
		return err
	}
	c.alloc = alloc
	c.b.init(now)
	var wg sync.WaitGroup
	wg.Go(func() { c.sendLoop(ctx) })
	defer wg.Wait()
	if c.cfg.Store != nil {
		c.restore(ctx)
	}
	// Discard usage of unknown duration from before the start, but count
	// what global quotas admitted.
	c.countQuotas(c.cfg.Usage())
	lastDrain := now
	for {
		boundary := sc.EpochStart(sc.Epoch(c.clock.Now()) + 1)
		epoch := sc.Epoch(boundary) - 1 // the interval that ends at boundary
		var first map[engine.UsageKey]engine.Usage
		var firstDur time.Duration
		if c.split {
			at := boundary.Add(-sc.Recent)
			if c.clock.Now().Before(at) {
				if !c.sleepUntil(ctx, at) {
					return nil
				}
				first = c.drain()
				now := c.clock.Now()
				firstDur, lastDrain = now.Sub(lastDrain), now
			}
		}
		if !c.sleepUntil(ctx, boundary) {
			return nil
		}
		last := c.drain()
		now := c.clock.Now()
		lastDur := now.Sub(lastDrain)
		lastDrain = now
		own := c.nodeUsage(epoch, first, firstDur, last, lastDur)
		peers := c.cfg.Gossip.Regions()[c.self]
		if len(peers) > 1 {
			u := c.filter(alloc, own, len(peers))
			u.Quotas = c.nodeQuotas(epoch)
			if err := c.cfg.Gossip.SendNodeUsage(ctx, u); err != nil {
				c.log.Warn("globalshare: send node usage", "err", err)
			}
		}

		if !c.sleepUntil(ctx, boundary.Add(c.cfg.Collect)) {
			return nil
		}
		c.report(ctx, alloc, epoch, own)

		if !c.sleepUntil(ctx, boundary.Add(sc.Settle)) {
			return nil
		}
		at := c.rebalance(alloc, epoch)

		// Raises take effect RaiseDelay after the rebalance itself (which
		// runs a little after boundary+Settle): waking at
		// boundary+Settle+RaiseDelay would still get the cut table and
		// leave the raise for the next epoch.
		if !c.sleepUntil(ctx, at.Add(sc.RaiseDelay)) {
			return nil
		}
		c.publish(c.clock.Now())
		c.raised.Store(epoch)
		if c.cfg.Store != nil {
			c.persist(ctx, epoch)
		}
	}
}

// sleepUntil waits for t on the clock, meanwhile checking membership,
// running the borrow tick and answering borrow messages as they arrive.
func (c *Coordinator) sleepUntil(ctx context.Context, t time.Time) bool {
	poll := min(max(c.cfg.Share.Interval/10, 50*time.Millisecond), time.Second)
	if c.borrowing() {
		poll = min(poll, c.cfg.BorrowTick)
	}
	var timer <-chan time.Time // one outstanding timer, however often mail wakes us
	for {
		d := t.Sub(c.clock.Now())
		if d <= 0 {
			return ctx.Err() == nil
		}
		if timer == nil {
			timer = c.clock.After(min(d, poll))
		}
		select {
		case <-ctx.Done():
			return false
		case <-c.wake:
			c.borrowMail()
		case <-timer:
			timer = nil
			c.checkMembership()
			if !c.balanced {
				// Until the first rebalance every key runs at 1/n of the
				// live regions; n changes as the node joins.
				c.view.Store(&view{t: share.NewTable(1/float64(max(1, len(c.cfg.Gossip.Regions()))), c.restored)})
			}
			c.borrowTick()
		}
	}
}

// deadRegions are the other regions membership has declared dead: every
// node of theirs it knows is dead (a crash or a partition), none is live, and
// not all of them left gracefully (a leave is SetMembers' business).
func (c *Coordinator) deadRegions() []string {
	live, dead := map[string]bool{}, map[string]bool{}
	for _, m := range c.cfg.Gossip.Members() {
		if m.Region == "" || m.Region == c.self {
			continue
		}
		if m.State.Live() {
			live[m.Region] = true
		} else if m.State == gossip.StateDead {
			dead[m.Region] = true
		}
	}
	var out []string
	for r := range dead {
		if !live[r] {
			out = append(out, r)
		}
	}
	slices.Sort(out)
	return out
}

// checkMembership tells the allocator when membership declares a region
// dead (or alive again), so that a crashed region's shares are reclaimed
// (and an isolated region cuts) as soon as memberlist knows, instead of
// after K+1 missed reports: share.Allocator.SetDead. The cut table is
// published at once and the raised one RaiseDelay later.
func (c *Coordinator) checkMembership() {
	if c.alloc == nil {
		return
	}
	now := c.clock.Now()
	dead := c.deadRegions()
	if !slices.Equal(dead, c.dead) {
		c.dead = dead
		c.alloc.SetDead(now, dead)
		c.log.Info("globalshare: membership declared regions dead", "dead", dead, "isolated", c.alloc.Isolated())
		if c.balanced {
			c.publish(now)
			c.deadRaiseAt = now.Add(c.cfg.Share.RaiseDelay)
		}
		return
	}
	if !c.deadRaiseAt.IsZero() && !now.Before(c.deadRaiseAt) {
		c.deadRaiseAt = time.Time{}
		if c.balanced {
			c.publish(now)
		}
	}
}

// restore loads the region's saved shares if they are recent enough and
// publishes them (with the default 1/n for every other key) until the first
// rebalance.
func (c *Coordinator) restore(ctx context.Context) {
	sc := c.cfg.Share
	lctx, cancel := context.WithTimeout(ctx, sc.Interval/4)
	defer cancel()
	saved, err := c.cfg.Store.LoadShares(lctx, c.self)
	if err != nil {
		c.log.Warn("globalshare: load saved shares", "err", err)
		return
	}
	cur := sc.Epoch(c.clock.Now())
	if len(saved.Shares) == 0 || saved.Region != c.self || saved.Epoch+uint64(sc.PartitionIntervals) < cur {
		return
	}
	m := make(map[share.Key]float64, len(saved.Shares))
	for _, s := range saved.Shares {
		if s.Share > 0 && s.Share <= 1 {
			m[s.Key] = s.Share
		}
	}
	c.restored = m
	c.view.Store(&view{t: share.NewTable(1/float64(max(1, len(c.cfg.Gossip.Regions()))), m)})
	c.log.Info("globalshare: restored saved shares", "epoch", saved.Epoch, "keys", len(m))
}

// persist saves the shares this region enforces for epoch.
func (c *Coordinator) persist(ctx context.Context, epoch uint64) {
	p := c.shares.Load()
	if p == nil {
		return
	}
	saved := Saved{Region: c.self, Epoch: epoch, Shares: make([]SavedShare, 0, len(*p))}
	for k, rs := range *p {
		if i := slices.Index(rs.regions, c.self); i >= 0 {
			saved.Shares = append(saved.Shares, SavedShare{Key: k, Share: rs.shares[i]})
		}
	}
	sctx, cancel := context.WithTimeout(ctx, c.cfg.Share.Interval/4)
	defer cancel()
	if err := c.cfg.Store.SaveShares(sctx, saved); err != nil {
		c.log.Warn("globalshare: save shares", "epoch", epoch, "err", err)
	}
}

// knownRegions are the regions of the cluster for Allocator.SetMembers:
// every region with a node not known to have left, so that a failed region
// stays known (and reserved) until the allocation reclaims it.
func (c *Coordinator) knownRegions() []string {
	set := map[string]bool{c.self: true}
	for _, m := range c.cfg.Gossip.Members() {
		if m.State != gossip.StateLeft && m.Region != "" {
			set[m.Region] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// nodeUsage turns drained units into this node's rates for epoch.
func (c *Coordinator) nodeUsage(epoch uint64, first map[engine.UsageKey]engine.Usage, firstDur time.Duration,
	last map[engine.UsageKey]engine.Usage, lastDur time.Duration) gossip.NodeUsage {
	total := (firstDur + lastDur).Seconds()
	recent := lastDur.Seconds()
	if total <= 0 || recent <= 0 {
		return gossip.NodeUsage{Node: c.node, Region: c.self, Epoch: epoch}
	}
	if first == nil {
		recent = total // no split: the recent rate is the interval rate
	}
	sums := map[engine.UsageKey]*gossip.KeyUsage{}
	add := func(m map[engine.UsageKey]engine.Usage, isLast bool) {
		for k, u := range m {
			limit, ok := c.cfg.Limit(k.Policy)
			if !ok || limit <= 0 {
				continue
			}
			s := sums[k]
			if s == nil {
				s = &gossip.KeyUsage{Key: share.Key{Policy: k.Policy, Subject: k.Subject}, Limit: limit}
				sums[k] = s
			}
			s.Offered += float64(u.Demand) / total
			s.Admitted += float64(u.Admitted) / total
			if isLast || first == nil {
				s.Recent += float64(u.Demand) / recent
			}
		}
	}
	add(first, false)
	add(last, true)
	out := gossip.NodeUsage{Node: c.node, Region: c.self, Epoch: epoch, Keys: make([]gossip.KeyUsage, 0, len(sums))}
	for _, s := range sums {
		out.Keys = append(out.Keys, *s)
	}
	return out
}

// filter keeps the keys worth sending to the region's other nodes: those
// already coordinated, and those where this node alone offers more than
// Pressure·share/(2·nodes) of the limit (if the region's sum is above the
// pressure threshold, some node is above threshold/nodes; halving it catches
// most of the others' contributions too).
func (c *Coordinator) filter(alloc *share.Allocator, u gossip.NodeUsage, nodes int) gossip.NodeUsage {
	out := u
	out.Keys = nil
	for _, k := range u.Keys {
		own := c.Share(k.Policy, k.Subject)
		if alloc.Shares(k.Key) != nil || max(k.Offered, k.Recent) > c.cfg.Share.Pressure*own*k.Limit/float64(2*nodes) {
			out.Keys = append(out.Keys, k)
		}
	}
	return out
}

// report sums the region's node usage for epoch, feeds it to the
// allocator and, on the region's publisher, broadcasts the report.
func (c *Coordinator) report(ctx context.Context, alloc *share.Allocator, epoch uint64, own gossip.NodeUsage) {
	c.mu.Lock()
	peers := c.nodeUse[epoch]
	c.mu.Unlock()
	sum := map[share.Key]*share.Usage{}
	add := func(keys []gossip.KeyUsage) {
		for _, k := range keys {
			s := sum[k.Key]
			if s == nil {
				s = &share.Usage{Key: k.Key}
				sum[k.Key] = s
			}
			s.Limit = max(s.Limit, k.Limit)
			s.Offered += k.Offered
			s.Recent += k.Recent
			s.Admitted += k.Admitted
		}
	}
	add(own.Keys)
	live := c.cfg.Gossip.Regions()[c.self]
	for _, n := range slices.Sorted(maps.Keys(peers)) { // fixed order: equal sums on every node
		if n != c.node {
			add(peers[n].Keys)
		}
	}
	usage := make([]share.Usage, 0, len(sum))
	for _, s := range sum {
		usage = append(usage, *s)
	}
	r := alloc.Report(epoch, usage)
	r.Quotas = c.regionQuotas(epoch)
	size := r.EncodedSizeEstimate()
	c.m.reportKeys.Set(float64(len(r.Keys)))
	publisher := len(live) == 0 || live[0] == c.node
	if publisher {
		if err := c.cfg.Gossip.BroadcastReport(ctx, r); err != nil {
			c.log.Warn("globalshare: broadcast report", "epoch", epoch, "keys", len(r.Keys), "err", err)
		} else {
			c.m.reportsSent.Inc()
		}
	}
	c.mu.Lock()
	c.lastSeen[c.self] = reportInfo{At: c.clock.Now(), Epoch: epoch, Bytes: size, Keys: len(r.Keys)}
	c.own = r
	c.mu.Unlock()
}

// rebalance computes epoch's shares and publishes the cut table; it
// returns the time it rebalanced at.
func (c *Coordinator) rebalance(alloc *share.Allocator, epoch uint64) time.Time {
	known := c.knownRegions()
	alloc.SetMembers(epoch, known)
	c.mu.Lock()
	got := c.reports[epoch]
	reports := make([]share.Report, 0, len(got))
	for _, r := range slices.Sorted(maps.Keys(got)) {
		reports = append(reports, got[r])
	}
	for e := range c.reports {
		if e+2 < epoch {
			delete(c.reports, e)
		}
	}
	for e := range c.nodeUse {
		if e+2 < epoch {
			delete(c.nodeUse, e)
		}
	}
	c.mu.Unlock()

	now := c.clock.Now()
	c.expireCuts(now)
	alloc.Rebalance(now, epoch, reports)
	c.b.gen = epoch
	c.b.actorGen = c.isActor()
	c.balanced = true
	c.publish(now)

	// Every region's shares of the keys in play, for RegionShares.
	regions := alloc.Regions()
	keys := map[share.Key]regionShares{}
	collect := func(r share.Report) {
		for _, k := range r.Keys {
			if _, done := keys[k.Key]; done {
				continue
			}
			if s := alloc.Shares(k.Key); s != nil {
				keys[k.Key] = regionShares{regions: regions, shares: s}
			}
		}
	}
	for _, r := range reports {
		collect(r)
	}
	c.mu.Lock()
	if c.own.Epoch == epoch && c.own.Region != "" {
		collect(c.own)
	}
	c.epoch, c.isolated, c.coordKeys, c.known = epoch, alloc.Isolated(), alloc.Keys(), regions
	c.mu.Unlock()
	c.shares.Store(&keys)

	c.m.rebalances.Inc()
	c.m.coordKeys.Set(float64(alloc.Keys()))
	c.m.regions.Set(float64(len(regions)))
	c.m.reportsMissing.Add(float64(max(0, len(regions)-1-len(reports))))
	iso := 0.0
	if alloc.Isolated() {
		iso = 1
	}
	c.m.isolated.Set(iso)
	return now
}

type metrics struct {
	rebalances     prometheus.Counter
	reportsSent    prometheus.Counter
	reportsMissing prometheus.Counter
	reportKeys     prometheus.Gauge
	coordKeys      prometheus.Gauge
	regions        prometheus.Gauge
	isolated       prometheus.Gauge
	borrow         *prometheus.CounterVec
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
				"send_dropped (outbox full), send_failed."}, []string{"event"}),
	}
	if reg != nil {
		reg.MustRegister(m.rebalances, m.reportsSent, m.reportsMissing, m.reportKeys, m.coordKeys, m.regions, m.isolated, m.borrow)
	}
	return m
}
