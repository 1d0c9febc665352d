package coordinator

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/sluice-rl/sluice/coordinator/msg"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/share"
)

// Core is the coordinator's protocol as a deterministic state machine, in
// the manner of etcd's raft.RawNode: it holds no goroutine, timer, socket or
// clock. Its owner advances it with Tick (time passed, this node's drained
// engine usage, the membership it sees) and Step (one received gossip
// message), sends what each call returns in Ready, and reads the shares to
// enforce from Share and QuotaOthers. Every rule of the coordinator lives
// here once: node usage summed into the regional report, publisher choice,
// report collection and settle, the allocation, raises after RaiseDelay,
// borrowing and loans, global quota G-counters, dead regions and restored
// shares. Coordinator.Run drives it with real timers and gossip; the
// simulator drives one per region over a simulated network.
//
// A Core is not safe for concurrent use. Given the same calls with the same
// arguments it returns the same Ready values in the same order.
type Core struct {
	cfg   CoreConfig
	self  string
	node  string
	split bool // drain twice per interval to measure the recent rate
	m     *Metrics

	started  bool
	balanced bool // set after the first rebalance
	view     *View
	seen     *Others
	shares   map[share.Key]regionShares
	raised   uint64 // epoch whose raises were last published

	members []msg.Member
	live    map[string][]string // region → live nodes, sorted

	reports   map[uint64]map[string]share.Report  // epoch → region → report
	nodeUse   map[uint64]map[string]msg.NodeUsage // epoch → node → usage (own region)
	lastSeen  map[string]reportInfo               // region → last report received or sent
	epoch     uint64                              // last rebalanced epoch
	isolated  bool
	coordKeys int
	known     []string     // regions known to the allocator
	own       share.Report // this region's last report
	// lossAt is the last rebalanced epoch in which the report of a region
	// membership sees live was missing (lossSeen: there was one).
	lossAt   uint64
	lossSeen bool

	restored map[share.Key]float64 // saved shares restored at Start

	alloc     *share.Allocator
	dead      []string             // regions reclaimed: out of contact for Hold
	silent    []string             // regions out of contact for Silence
	deadSince map[string]time.Time // region → when this core first saw it dead (no Contact known)
	lastTick  time.Time            // the last Tick
	resumed   time.Time            // the first Tick after a pause of this node (see regionStates)

	b borrowState
	q quotaState

	// The epoch in progress (see the package documentation).
	ph        phase
	boundary  time.Time // end of the interval being measured
	cur       uint64    // its epoch
	first     map[engine.UsageKey]engine.Usage
	firstDur  time.Duration
	lastDrain time.Time
	ownUse    msg.NodeUsage
	raiseAt   time.Time

	rd      Ready
	dropped map[string]uint64
}

// CoreConfig configures a Core.
type CoreConfig struct {
	// Share is the allocation config; every region must use the same.
	Share share.Config
	// Region and Node name this node; Node must be unique in the cluster.
	Region, Node string
	// Limit and Quota are as in Config.
	Limit          func(policy string) (ratePerSec float64, ok bool)
	Quota          func(policy string) (window time.Duration, ok bool)
	NodeLocalStore bool
	// Collect and BorrowTick are as in Config (defaults Settle/3, 250 ms).
	Collect    time.Duration
	BorrowTick time.Duration
	// Bucket reports whether a policy is a token bucket whose burst is at
	// least one second of its rate: only then do loans hand over tokens
	// (share.Loan.Tokens), because only then does a lender's cut take
	// tokens out of its bucket, and the bucket estimate the borrow rule
	// keeps assumes one second of burst. Nil: loans move rate only.
	Bucket func(policy string) bool
	// Silence is how long this region may be out of contact with another
	// (msg.Member.Contact: no answered ping since) before it counts as
	// unreachable: a region out of contact with enough others to lose its
	// majority cuts to Safe then. Default Interval/10.
	Silence time.Duration
	// PoolTokens says the owner carries out Ready.Spends and
	// Ready.Deposits: then keys whose L_global is below
	// share.Config.BorrowMinRate, too slow for rate loans, pool their
	// buckets' tokens between regions (share/tokens.go). False: no token
	// requests are sent, none are answered and token loans received are
	// dropped unspent.
	PoolTokens bool
	// ContactLag bounds how old the last answered ping to a reachable
	// region may be: the gossip layer's ping period plus its ping timeout
	// (gossip.Node.ContactLag). Default Silence/2. The hold before another
	// region's share is reclaimed (Core.Hold) is built from it.
	ContactLag time.Duration
	// Metrics, if set, counts what the core does; nil counts into
	// collectors registered nowhere.
	Metrics *Metrics
}

// Ready is what one Tick or Step asks its owner to do.
type Ready struct {
	// Reports go to every node of every other region (BroadcastReport),
	// through each region's relay (Relay).
	Reports []share.Report
	// NodeUsage goes to the region's other nodes (SendNodeUsage).
	NodeUsage []msg.NodeUsage
	// Borrows go to every node of the other regions (SendBorrowRequest),
	// through their relays.
	Borrows []share.BorrowRequest
	// Loans go to the lender region's other nodes, then to the borrower's
	// (SendLoan). The share they cut is already enforced.
	Loans []share.Loan
	// Spends are token loans to send once their tokens have been taken
	// out of this region's bucket (CoreConfig.PoolTokens); see Spend.
	Spends []Spend
	// Deposits are tokens received from other regions, to put into this
	// region's bucket (CoreConfig.PoolTokens); see Deposit.
	Deposits []Deposit
	// Save, if set, is this region's shares to persist.
	Save *Saved
	// Dropped is why Step refused its message (a Drop* reason), or empty.
	Dropped string
}

// NewCore validates cfg and returns a core that enforces 1/n of the
// regions live in members until Start.
func NewCore(cfg CoreConfig, members []msg.Member) (*Core, error) {
	if err := cfg.Share.Validate(); err != nil {
		return nil, err
	}
	switch {
	case cfg.Region == "" || cfg.Node == "":
		return nil, errors.New("globalshare: Region and Node are required")
	case cfg.Limit == nil:
		return nil, errors.New("globalshare: Limit is required")
	case cfg.Collect < 0 || cfg.Collect > cfg.Share.Settle:
		return nil, fmt.Errorf("globalshare: Collect %v must be in [0, Settle %v]", cfg.Collect, cfg.Share.Settle)
	case cfg.BorrowTick < 0:
		return nil, fmt.Errorf("globalshare: BorrowTick %v must not be negative", cfg.BorrowTick)
	}
	if cfg.Collect == 0 {
		cfg.Collect = cfg.Share.Settle / 3
	}
	if cfg.BorrowTick == 0 {
		cfg.BorrowTick = 250 * time.Millisecond
	}
	switch {
	case cfg.Silence < 0 || cfg.ContactLag < 0:
		return nil, errors.New("globalshare: Silence and ContactLag must not be negative")
	case cfg.Silence == 0:
		cfg.Silence = cfg.Share.Interval / 10
	}
	if cfg.ContactLag == 0 {
		cfg.ContactLag = cfg.Silence / 2
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
	m := cfg.Metrics
	if m == nil {
		m = NewMetrics(nil)
	}
	sc := cfg.Share
	c := &Core{
		cfg:       cfg,
		self:      cfg.Region,
		node:      cfg.Node,
		split:     sc.Recent < sc.Interval-sc.Settle-sc.RaiseDelay,
		m:         m,
		reports:   map[uint64]map[string]share.Report{},
		nodeUse:   map[uint64]map[string]msg.NodeUsage{},
		lastSeen:  map[string]reportInfo{},
		dropped:   map[string]uint64{},
		deadSince: map[string]time.Time{},
	}
	c.q.init()
	c.seen = &Others{}
	c.setMembers(members)
	c.view = &View{t: share.NewTable(c.defaultShare(), nil)}
	return c, nil
}

// Start begins the first epoch at now: the allocator is created with the
// regions members knows, saved shares are restored if recent enough (see
// the package documentation), and usage (drained before the start, of
// unknown duration) counts for global quotas only.
func (c *Core) Start(now time.Time, members []msg.Member, saved *Saved, usage map[engine.UsageKey]engine.Usage) error {
	if c.started {
		return errors.New("globalshare: core already started")
	}
	c.setMembers(members)
	sc := c.cfg.Share
	alloc, err := share.NewAllocator(sc, c.self, c.knownRegions(), sc.Epoch(now))
	if err != nil {
		return err
	}
	c.alloc = alloc
	c.started = true
	c.b.init(now)
	c.b.gen, c.b.actorGen = alloc.Generation(), c.isActor()
	// The first reports coordinate keys for the first time: a region that
	// misses one holds the sender at 1/n until it hears from it again.
	c.lossAt, c.lossSeen = sc.Epoch(now), true
	if saved != nil {
		c.restore(now, *saved)
	}
	c.countQuotas(now, usage)
	c.lastDrain = now
	c.startEpoch(now)
	return nil
}

// Tick advances the core to now. usage is what this node's engine admitted
// and was offered since the last Tick (limiter.Limiter.DrainUsage); members
// is the membership as gossip sees it now (nil: unchanged).
func (c *Core) Tick(now time.Time, usage map[engine.UsageKey]engine.Usage, members []msg.Member) Ready {
	c.rd = Ready{}
	if members != nil {
		c.setMembers(members)
	}
	if !c.started {
		return c.ready()
	}
	c.countQuotas(now, usage)
	addUsage(c.b.acc, usage)
	addUsage(c.b.fast, usage)
	if !c.lastTick.IsZero() && now.Sub(c.lastTick) > 2*c.PollEvery() {
		c.resumed = now // this node was paused: its pings' failures since are suspect
	}
	c.lastTick = now
	c.checkMembership(now)
	if !c.balanced {
		// Until the first rebalance every key runs at 1/n of the live
		// regions (n changes as the node joins), with the start
		// generation's loans on top.
		c.publishStart(now)
	}
	c.borrowTick(now)
	for !now.Before(c.deadline()) {
		c.step(now)
	}
	return c.ready()
}

func (c *Core) ready() Ready {
	rd := c.rd
	c.rd = Ready{}
	return rd
}

// Step applies one received message at now. A message the core cannot use
// (see the Drop* reasons) is counted and dropped, never applied.
func (c *Core) Step(now time.Time, m msg.Message) Ready {
	c.rd = Ready{}
	if why := c.validate(now, m); why != "" {
		c.dropped[why]++
		c.rd.Dropped = why
		return c.ready()
	}
	switch m.Kind {
	case msg.KindReport:
		c.fileReport(now, m.Report, m.Size)
	case msg.KindNodeUsage:
		c.fileNodeUsage(now, m.Usage)
	case msg.KindBorrow:
		if m.Borrow.Region != c.self {
			c.borrowRequest(now, m.Borrow)
		}
	case msg.KindLoan:
		c.loan(now, m.From, m.Loan)
	}
	return c.ready()
}

// PollEvery is how often an owner should Tick at most apart while waiting
// for Next, so that membership changes and borrowing are noticed.
func (c *Core) PollEvery() time.Duration {
	poll := min(max(c.cfg.Share.Interval/10, 50*time.Millisecond), time.Second)
	if c.borrowing() {
		poll = min(poll, c.checkEvery())
	}
	// A lost contact must be noticed within a bounded time (Hold).
	return min(poll, c.cfg.Silence/4)
}

// Published returns what the check path reads, for an owner that hands
// it to other goroutines: the shares (View.Share is Core.Share) and the
// others' quota spend (Others.Units is Core.QuotaOthers). Both are
// immutable; a Tick or Step that changes them publishes new ones.
func (c *Core) Published() (*View, *Others) { return c.view, c.seen }

// Filed returns, sorted, the regions whose reports and the nodes whose
// usage are filed for epoch (those the rebalance of epoch will use).
func (c *Core) Filed(epoch uint64) (reports, nodes []string) {
	return slices.Sorted(maps.Keys(c.reports[epoch])), slices.Sorted(maps.Keys(c.nodeUse[epoch]))
}

// Generation returns the allocator's generation (the last rebalanced
// epoch, or the start one), and false before Start.
func (c *Core) Generation() (uint64, bool) {
	if c.alloc == nil {
		return 0, false
	}
	return c.alloc.Generation(), true
}

// Config returns the core's configuration, defaults filled in.
func (c *Core) Config() CoreConfig { return c.cfg }

// Region returns the region this core acts for.
func (c *Core) Region() string { return c.self }

// Raised returns the epoch whose raises were last published.
func (c *Core) Raised() uint64 { return c.raised }

// Status returns the regions, their nodes and their last reports; live is
// the membership's live nodes per region now.
func (c *Core) Status(live map[string][]string) Status {
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
		Isolated: c.isolated, CoordinatedKeys: c.coordKeys, DefaultShare: c.view.t.Default()}
	for _, r := range slices.Sorted(maps.Keys(names)) {
		ri := RegionInfo{Region: r, Nodes: live[r], Live: len(live[r]) > 0}
		if s, ok := c.lastSeen[r]; ok {
			ri.LastReport, ri.LastReportEpoch, ri.LastReportBytes, ri.LastReportKeys = s.At, s.Epoch, s.Bytes, s.Keys
		}
		st.Regions = append(st.Regions, ri)
	}
	return st
}

// Dropped returns how many messages Step refused, by reason.
func (c *Core) Dropped() map[string]uint64 { return maps.Clone(c.dropped) }

func compareKeys(a, b share.Key) int {
	switch {
	case a.Policy < b.Policy:
		return -1
	case a.Policy > b.Policy:
		return 1
	case a.Subject < b.Subject:
		return -1
	case a.Subject > b.Subject:
		return 1
	}
	return 0
}
