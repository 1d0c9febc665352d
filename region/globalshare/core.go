package globalshare

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/gossip"
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
	m     *metrics

	started  bool
	balanced bool // set after the first rebalance
	view     *view
	seen     *map[share.Key]quotaSeen
	shares   map[share.Key]regionShares
	raised   uint64 // epoch whose raises were last published

	members []gossip.Member
	live    map[string][]string // region → live nodes, sorted

	reports   map[uint64]map[string]share.Report     // epoch → region → report
	nodeUse   map[uint64]map[string]gossip.NodeUsage // epoch → node → usage (own region)
	lastSeen  map[string]reportInfo                  // region → last report received or sent
	epoch     uint64                                 // last rebalanced epoch
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
	ownUse    gossip.NodeUsage
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
	// (gossip.Member.Contact: no answered ping since) before it counts as
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
}

// Ready is what one Tick or Step asks its owner to do.
type Ready struct {
	// Reports go to every node of every other region (BroadcastReport).
	Reports []share.Report
	// NodeUsage goes to the region's other nodes (SendNodeUsage).
	NodeUsage []gossip.NodeUsage
	// Borrows go to every node of the other regions (SendBorrowRequest).
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

// Reasons a Step refuses a message: it is counted and never applied.
const (
	// DropRegion: the message names a region neither membership nor the
	// allocation knows.
	DropRegion = "unknown_region"
	// DropEpoch: its epoch is in the future or more than maxAge epochs old.
	DropEpoch = "epoch"
	// DropNumber: a rate, share, amount or limit that is NaN, infinite or
	// negative, a borrow request or loan of nothing or of more than the
	// whole limit, or a loan handing over more tokens than its cut frees.
	DropNumber = "number"
	// DropMalformed: a field that must be set is empty.
	DropMalformed = "malformed"
	// DropExpired: a borrow request or loan of a generation this region
	// has already rebalanced past; its loan expired with it.
	DropExpired = "expired"
)

// maxAge is how many epochs old a message may be and still be used (its
// quota counts; reports and node usage are filed only within fresh).
const maxAge = 16

type phase uint8

const (
	phSplit    phase = iota // boundary − Recent: first drain
	phBoundary              // boundary: last drain, node usage sent
	phCollect               // boundary + Collect: regional report
	phSettle                // boundary + Settle: rebalance, cuts
	phRaise                 // rebalance + RaiseDelay: raises, save
)

// NewCore validates cfg and returns a core that enforces 1/n of the
// regions live in members until Start.
func NewCore(cfg CoreConfig, members []gossip.Member) (*Core, error) {
	return newCore(cfg, members, nil)
}

func newCore(cfg CoreConfig, members []gossip.Member, m *metrics) (*Core, error) {
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
	if m == nil {
		m = newMetrics(nil)
	}
	sc := cfg.Share
	c := &Core{
		cfg:       cfg,
		self:      cfg.Region,
		node:      cfg.Node,
		split:     sc.Recent < sc.Interval-sc.Settle-sc.RaiseDelay,
		m:         m,
		reports:   map[uint64]map[string]share.Report{},
		nodeUse:   map[uint64]map[string]gossip.NodeUsage{},
		lastSeen:  map[string]reportInfo{},
		dropped:   map[string]uint64{},
		deadSince: map[string]time.Time{},
	}
	c.q.init()
	c.seen = &map[share.Key]quotaSeen{}
	c.setMembers(members)
	c.view = &view{t: share.NewTable(c.defaultShare(), nil)}
	return c, nil
}

// Start begins the first epoch at now: the allocator is created with the
// regions members knows, saved shares are restored if recent enough (see
// the package documentation), and usage (drained before the start, of
// unknown duration) counts for global quotas only.
func (c *Core) Start(now time.Time, members []gossip.Member, saved *Saved, usage map[engine.UsageKey]engine.Usage) error {
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

// Next returns when the epoch's next step is due. An owner ticks the core
// then, and in between at most PollEvery apart (timed from its last
// Tick), which is when membership changes, borrow ticks and scheduled
// raises are noticed.
func (c *Core) Next() time.Time { return c.deadline() }

// WantsUsage reports whether a Tick at now would consume engine usage (a
// borrow tick or a drain of the epoch is due). An owner whose usage source
// is costly to drain may pass nil to Tick otherwise; usage passed at any
// Tick is never lost, it only counts from then.
func (c *Core) WantsUsage(now time.Time) bool {
	if !c.started {
		return false
	}
	if c.borrowing() && (!now.Before(c.b.nextTick) || !now.Before(c.b.nextCheck)) {
		return true
	}
	return (c.ph == phSplit || c.ph == phBoundary) && !now.Before(c.deadline())
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

func (c *Core) deadline() time.Time {
	sc := c.cfg.Share
	switch c.ph {
	case phSplit:
		return c.boundary.Add(-sc.Recent)
	case phBoundary:
		return c.boundary
	case phCollect:
		return c.boundary.Add(c.cfg.Collect)
	case phSettle:
		return c.boundary.Add(sc.Settle)
	default:
		return c.raiseAt
	}
}

// Tick advances the core to now. usage is what this node's engine admitted
// and was offered since the last Tick (limiter.Limiter.DrainUsage); members
// is the membership as gossip sees it now (nil: unchanged).
func (c *Core) Tick(now time.Time, usage map[engine.UsageKey]engine.Usage, members []gossip.Member) Ready {
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

func (c *Core) startEpoch(now time.Time) {
	sc := c.cfg.Share
	c.boundary = sc.EpochStart(sc.Epoch(now) + 1)
	c.cur = sc.Epoch(c.boundary) - 1 // the interval that ends at boundary
	c.first, c.firstDur = nil, 0
	c.ph = phBoundary
	if c.split && now.Before(c.boundary.Add(-sc.Recent)) {
		c.ph = phSplit
	}
}

// step runs the epoch's step that is due.
func (c *Core) step(now time.Time) {
	switch c.ph {
	case phSplit:
		c.first = c.drain()
		c.firstDur, c.lastDrain = now.Sub(c.lastDrain), now
		c.ph = phBoundary
	case phBoundary:
		last := c.drain()
		lastDur := now.Sub(c.lastDrain)
		c.lastDrain = now
		c.ownUse = c.nodeUsage(c.cur, c.first, c.firstDur, last, lastDur)
		if len(c.live[c.self]) > 1 {
			u := c.filter(c.ownUse, len(c.live[c.self]))
			u.Quotas = c.nodeQuotas(c.cur)
			c.rd.NodeUsage = append(c.rd.NodeUsage, u)
		}
		c.ph = phCollect
	case phCollect:
		c.report(now, c.cur, c.ownUse)
		c.ph = phSettle
	case phSettle:
		c.rebalance(now, c.cur)
		// Raises take effect RaiseDelay after the rebalance itself (which
		// runs a little after boundary+Settle when the owner is late).
		c.raiseAt = now.Add(c.cfg.Share.RaiseDelay)
		c.ph = phRaise
	case phRaise:
		c.publish(now)
		c.raised = c.cur
		c.rd.Save = c.saved(c.cur)
		c.startEpoch(now)
	}
}

// Step applies one received message at now. A message the core cannot use
// (see the Drop* reasons) is counted and dropped, never applied.
func (c *Core) Step(now time.Time, m gossip.Message) Ready {
	c.rd = Ready{}
	if why := c.validate(now, m); why != "" {
		c.dropped[why]++
		c.rd.Dropped = why
		return c.ready()
	}
	switch m.Kind {
	case gossip.KindReport:
		r := m.Report
		if r.Region == c.self {
			break
		}
		c.mergeReportQuotas(r) // G-counters: late reports are still good
		if !c.fresh(now, r.Epoch) {
			break
		}
		if c.reports[r.Epoch] == nil {
			c.reports[r.Epoch] = map[string]share.Report{}
		}
		c.reports[r.Epoch][r.Region] = r
		c.lastSeen[r.Region] = reportInfo{At: now, Epoch: r.Epoch, Bytes: m.Size, Keys: len(r.Keys)}
	case gossip.KindNodeUsage:
		u := m.Usage
		if u.Region != c.self {
			break
		}
		c.mergeNodeQuotas(u) // cumulative: late ones are still good
		if !c.fresh(now, u.Epoch) {
			break
		}
		if c.nodeUse[u.Epoch] == nil {
			c.nodeUse[u.Epoch] = map[string]gossip.NodeUsage{}
		}
		c.nodeUse[u.Epoch][u.Node] = u
	case gossip.KindBorrow:
		if m.Borrow.Region != c.self {
			c.borrowRequest(now, m.Borrow)
		}
	case gossip.KindLoan:
		c.loan(now, m.From, m.Loan)
	}
	return c.ready()
}

// Dropped returns how many messages Step refused, by reason.
func (c *Core) Dropped() map[string]uint64 { return maps.Clone(c.dropped) }

// validate returns why m cannot be used, or "".
func (c *Core) validate(now time.Time, m gossip.Message) string {
	finite := func(vs ...float64) bool {
		for _, v := range vs {
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				return false
			}
		}
		return true
	}
	epochOK := func(e uint64) bool {
		cur := c.cfg.Share.Epoch(now)
		return e <= cur+1 && e+maxAge >= cur
	}
	switch m.Kind {
	case gossip.KindReport:
		r := m.Report
		switch {
		case r.Region == "":
			return DropMalformed
		case !c.knownRegion(r.Region):
			return DropRegion
		case !epochOK(r.Epoch):
			return DropEpoch
		}
		for _, k := range r.Keys {
			if !finite(k.Limit, k.Offered, k.Recent, k.Demand, k.Admitted, k.Share) {
				return DropNumber
			}
		}
	case gossip.KindNodeUsage:
		u := m.Usage
		switch {
		case u.Region == "" || u.Node == "":
			return DropMalformed
		case !c.knownRegion(u.Region):
			return DropRegion
		case !epochOK(u.Epoch):
			return DropEpoch
		}
		for _, k := range u.Keys {
			if !finite(k.Limit, k.Offered, k.Recent, k.Admitted) {
				return DropNumber
			}
		}
	case gossip.KindBorrow:
		r := m.Borrow
		switch {
		case r.Region == "" || r.Policy == "":
			return DropMalformed
		case !c.knownRegion(r.Region):
			return DropRegion
		case !epochOK(r.Epoch):
			return DropEpoch
		case !(r.Want > 0 && r.Want <= 1):
			return DropNumber
		case c.expired(r.Epoch):
			return DropExpired
		}
	case gossip.KindLoan:
		l := m.Loan
		switch {
		case l.Lender == "" || l.Borrower == "" || l.Policy == "":
			return DropMalformed
		case !c.knownRegion(l.Lender) || !c.knownRegion(l.Borrower):
			return DropRegion
		case !epochOK(l.Epoch):
			return DropEpoch
		case !(l.Amount > 0 && l.Amount <= 1) || !(l.Tokens >= 0 && l.Tokens <= l.Amount):
			return DropNumber
		case c.expired(l.Epoch):
			return DropExpired
		}
	}
	return ""
}

// expired reports whether a borrow request or loan of generation gen (the
// epoch of its sender's last rebalance) belongs to a generation this
// region has rebalanced past: every loan of it has expired.
func (c *Core) expired(gen uint64) bool { return c.balanced && gen < c.b.gen }

// knownRegion reports whether membership or the allocation knows region r.
func (c *Core) knownRegion(r string) bool {
	if r == c.self {
		return true
	}
	if c.alloc != nil && slices.Contains(c.known, r) {
		return true
	}
	for _, m := range c.members {
		if m.Region == r {
			return true
		}
	}
	return false
}

// fresh bounds what is filed: epochs around the current one only.
func (c *Core) fresh(now time.Time, epoch uint64) bool {
	cur := c.cfg.Share.Epoch(now)
	return epoch+3 >= cur && epoch <= cur+1
}

// SetMembers updates the membership the core knows between two Ticks, so
// that Step recognises a region that has just joined. Tick takes the
// membership as well; a nil members is ignored.
func (c *Core) SetMembers(members []gossip.Member) {
	if members != nil {
		c.setMembers(members)
	}
}

func (c *Core) setMembers(members []gossip.Member) {
	c.members = slices.Clone(members)
	live := map[string][]string{}
	for _, m := range c.members {
		if m.State.Live() {
			live[m.Region] = append(live[m.Region], m.Node)
		}
	}
	for _, nodes := range live {
		slices.Sort(nodes)
	}
	if _, ok := live[c.self]; !ok {
		live[c.self] = []string{c.node} // this node is live, whatever gossip says yet
	}
	c.live = live
}

// defaultShare is 1/n of the live regions.
func (c *Core) defaultShare() float64 { return 1 / float64(max(1, len(c.live))) }

// Share returns the fraction of L_global this region enforces now for a
// global policy and subject, loans included, in [share.MinShare, 1].
func (c *Core) Share(policy, subject string) float64 { return c.view.share(policy, subject) }

// Table returns the allocator's current table (immutable).
func (c *Core) Table() *share.Table { return c.view.t }

// RegionShares returns every region's share of a coordinated key as this
// region computed them at the last rebalance, or nil if the key is not
// coordinated.
func (c *Core) RegionShares(policy, subject string) map[string]float64 {
	rs, ok := c.shares[share.Key{Policy: policy, Subject: subject}]
	if !ok {
		return nil
	}
	out := make(map[string]float64, len(rs.regions))
	for i, r := range rs.regions {
		out[r] = rs.shares[i]
	}
	return out
}

// ShareVector returns every known region's share of a coordinated key (in
// the order of the regions RegionShares names) as computed at the last
// rebalance, or nil; without copying, for checks run at every step of a
// simulation. The caller must not modify it.
func (c *Core) ShareVector(policy, subject string) []float64 {
	return c.shares[share.Key{Policy: policy, Subject: subject}].shares
}

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

// Hold is how long this region waits, after it last had contact with
// another region, before it reclaims that region's share: Silence +
// PollEvery (by then a region cut off from the majority has noticed its
// own silence and cut to Safe) + ContactLag (this side's last answered
// ping may be that much older than the other side's) + PollEvery of
// margin. See docs/architecture.md, "Losing a region".
func (c *Core) Hold() time.Duration {
	return c.cfg.Silence + 2*c.PollEvery() + c.cfg.ContactLag
}

// regionStates sorts the other regions by what this node knows of them:
// silent (out of contact for at least Silence), gone (for at least Hold:
// its share may be reclaimed) and alive (a node alive, not even
// suspected, and not silent: its reports may be missing only through
// loss).
//
// Contact is the send time of the last answered ping to any of the
// region's nodes (gossip.Member.Contact). Being out of contact also takes
// fresh evidence: a ping sent after that contact and left unanswered
// (Member.Unanswered) within the last 2·ContactLag + PollEvery, the
// longest between two failures while the pings run, and sent after this
// node's last pause (a gap of more than 2·PollEvery between two Ticks). A
// node that was too busy to ping, or to hear the answers, sees its
// contacts age without such evidence and decides nothing until its pings
// run again; a node cut off has it all along. (A pause during a partition
// delays the cut by as much; the node admits nothing while paused.)
//
// A region none of whose nodes has a Contact yet (an owner that pings
// nothing, or a node not pinged yet) counts as out of contact from the
// first Tick at which membership showed every node of it dead: the same
// rule, timed by membership's verdict instead of the pings, which keeps
// its bound only while both sides' verdicts come within Hold − Silence of
// each other.
func (c *Core) regionStates(now time.Time) (silent, gone, alive []string) {
	contact, failed := map[string]time.Time{}, map[string]time.Time{}
	known, live, dead, up := map[string]bool{}, map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, m := range c.members {
		if m.Region == "" || m.Region == c.self || m.State == gossip.StateLeft {
			continue
		}
		r := m.Region
		known[r] = true
		if m.Contact.After(contact[r]) {
			contact[r] = m.Contact
		}
		if m.Unanswered.After(failed[r]) {
			failed[r] = m.Unanswered
		}
		switch {
		case m.State == gossip.StateAlive:
			up[r], live[r] = true, true
		case m.State.Live():
			live[r] = true
		case m.State == gossip.StateDead:
			dead[r] = true
		}
	}
	for r := range c.deadSince {
		if !dead[r] || live[r] {
			delete(c.deadSince, r)
		}
	}
	hold, fresh := c.Hold(), 2*c.cfg.ContactLag+c.PollEvery()
	for _, r := range slices.Sorted(maps.Keys(known)) {
		since, evidence := contact[r], false
		switch {
		case !since.IsZero():
			// A ping sent before this node's last pause may have been
			// given up only because the node could not hear its answer.
			evidence = failed[r].After(since) && now.Sub(failed[r]) <= fresh && !failed[r].Before(c.resumed)
		case dead[r] && !live[r]:
			if _, ok := c.deadSince[r]; !ok {
				c.deadSince[r] = now
			}
			since, evidence = c.deadSince[r], true
		}
		// Once out, a region stays out until its contact is fresh again.
		out := now.Sub(since) >= c.cfg.Silence && (evidence || slices.Contains(c.silent, r))
		if out {
			silent = append(silent, r)
		}
		if now.Sub(since) >= hold && (evidence || slices.Contains(c.dead, r)) {
			gone = append(gone, r)
		}
		if up[r] && !out {
			alive = append(alive, r)
		}
	}
	return silent, gone, alive
}

// checkMembership applies what regionStates finds: a region that has lost
// contact with a majority cuts to Safe at once (Allocator.SetSilent), and
// a region out of contact for Hold has its shares reclaimed at once
// (Allocator.SetDead), by which time, if it is alive behind a partition,
// it has cut. Both publish the new table at once.
func (c *Core) checkMembership(now time.Time) {
	silent, gone, alive := c.regionStates(now)
	c.alloc.SetLive(alive)
	changed := false
	if !slices.Equal(silent, c.silent) {
		c.silent = silent
		changed = c.alloc.SetSilent(now, silent)
	}
	if !slices.Equal(gone, c.dead) {
		c.dead = gone
		c.alloc.SetDead(now, gone)
		changed = true
	}
	if changed && c.balanced {
		c.publish(now)
	}
}

// restore enforces saved shares, if they are this region's and at most
// PartitionIntervals epochs old, until the first rebalance (with the
// default 1/n for every other key). Shares outside (0, 1] are skipped.
func (c *Core) restore(now time.Time, saved Saved) {
	sc := c.cfg.Share
	cur := sc.Epoch(now)
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
	c.view = &view{t: share.NewTable(c.defaultShare(), m)}
}

// saved is the shares this region enforces for epoch, to persist.
func (c *Core) saved(epoch uint64) *Saved {
	s := &Saved{Region: c.self, Epoch: epoch, Shares: make([]SavedShare, 0, len(c.shares))}
	for _, k := range slices.SortedFunc(maps.Keys(c.shares), compareKeys) {
		rs := c.shares[k]
		if i := slices.Index(rs.regions, c.self); i >= 0 {
			s.Shares = append(s.Shares, SavedShare{Key: k, Share: rs.shares[i]})
		}
	}
	return s
}

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

// knownRegions are the regions of the cluster for Allocator.SetMembers:
// every region with a node not known to have left, so that a failed region
// stays known (and reserved) until the allocation reclaims it.
func (c *Core) knownRegions() []string {
	set := map[string]bool{c.self: true}
	for _, m := range c.members {
		if m.State != gossip.StateLeft && m.Region != "" {
			set[m.Region] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// nodeUsage turns drained units into this node's rates for epoch.
func (c *Core) nodeUsage(epoch uint64, first map[engine.UsageKey]engine.Usage, firstDur time.Duration,
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
	slices.SortFunc(out.Keys, func(a, b gossip.KeyUsage) int { return compareKeys(a.Key, b.Key) })
	return out
}

// filter keeps the keys worth sending to the region's other nodes: those
// already coordinated, and those where this node alone offers more than
// Pressure·share/(2·nodes) of the limit (if the region's sum is above the
// pressure threshold, some node is above threshold/nodes; halving it catches
// most of the others' contributions too).
func (c *Core) filter(u gossip.NodeUsage, nodes int) gossip.NodeUsage {
	out := u
	out.Keys = nil
	for _, k := range u.Keys {
		own := c.Share(k.Policy, k.Subject)
		if c.alloc.Shares(k.Key) != nil || max(k.Offered, k.Recent) > c.cfg.Share.Pressure*own*k.Limit/float64(2*nodes) {
			out.Keys = append(out.Keys, k)
		}
	}
	return out
}

// isActor reports whether this node acts for its region: its publisher,
// the region's live node with the smallest id.
func (c *Core) isActor() bool {
	live := c.live[c.self]
	return len(live) == 0 || live[0] == c.node
}

// report sums the region's node usage for epoch, feeds it to the
// allocator and, on the region's publisher, asks for the report to be
// broadcast.
func (c *Core) report(now time.Time, epoch uint64, own gossip.NodeUsage) {
	peers := c.nodeUse[epoch]
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
	for _, n := range slices.Sorted(maps.Keys(peers)) { // fixed order: equal sums on every node
		if n != c.node {
			add(peers[n].Keys)
		}
	}
	usage := make([]share.Usage, 0, len(sum))
	for _, k := range slices.SortedFunc(maps.Keys(sum), compareKeys) {
		usage = append(usage, *sum[k])
	}
	r := c.alloc.Report(epoch, usage)
	r.Quotas = c.regionQuotas(now, epoch)
	c.m.reportKeys.Set(float64(len(r.Keys)))
	if c.isActor() {
		c.rd.Reports = append(c.rd.Reports, r)
		if c.lossy(epoch) {
			c.rd.Reports = append(c.rd.Reports, r) // see lossy
		}
	}
	c.lastSeen[c.self] = reportInfo{At: now, Epoch: epoch, Bytes: r.EncodedSizeEstimate(), Keys: len(r.Keys)}
	c.own = r
}

// lossy reports whether the report of epoch is sent twice: for K
// (PartitionIntervals) epochs after the start and after a report of a
// region membership sees live went missing here. Every region computes every share from the
// reports it received, and holds a region whose report it missed at the
// share it computed for it last time (share.Allocate, Held), which is not
// the share that region computed for itself: when reports are lost at
// random, the regions' own shares stop summing to 1 (in lossy-ten, with
// 20% lost, to 1.05 for 30 s, or to 0.95). A second copy, sent and lost
// independently, makes a report missing with p² instead of p (4% instead
// of 20%), at twice the report bytes while the loss lasts; a network that
// loses nothing sends one copy. A receiver files the same report twice.
func (c *Core) lossy(epoch uint64) bool {
	return c.lossSeen && epoch <= c.lossAt+uint64(c.cfg.Share.PartitionIntervals)
}

// noteLoss records whether a report of a live region is missing among
// the reports of epoch (lossy).
func (c *Core) noteLoss(epoch uint64, got map[string]share.Report) {
	for r, nodes := range c.live {
		if r == c.self || len(nodes) == 0 || slices.Contains(c.dead, r) {
			continue
		}
		if _, ok := got[r]; !ok {
			c.lossAt, c.lossSeen = epoch, true
			return
		}
	}
}

// rebalance computes epoch's shares and publishes the cut table.
func (c *Core) rebalance(now time.Time, epoch uint64) {
	alloc := c.alloc
	alloc.SetMembers(epoch, c.knownRegions())
	got := c.reports[epoch]
	c.noteLoss(epoch, got)
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
	if c.own.Epoch == epoch && c.own.Region != "" {
		collect(c.own)
	}
	c.epoch, c.isolated, c.coordKeys, c.known = epoch, alloc.Isolated(), alloc.Keys(), regions
	c.shares = keys

	c.m.rebalances.Inc()
	c.m.coordKeys.Set(float64(alloc.Keys()))
	c.m.regions.Set(float64(len(regions)))
	c.m.reportsMissing.Add(float64(max(0, len(regions)-1-len(reports))))
	iso := 0.0
	if alloc.Isolated() {
		iso = 1
	}
	c.m.isolated.Set(iso)
}
