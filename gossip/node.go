package gossip

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/sluice-rl/sluice/coordinator/msg"
	"github.com/sluice-rl/sluice/share"
	"golang.org/x/sync/errgroup"
)

// ReconnectFor is how long a node keeps trying to reach a dead peer again.
const ReconnectFor = 24 * time.Hour

// seedRounds is how many rejoin rounds after start re-push state to the
// seeds (see rejoin).
const seedRounds = 10

// MaxPacketPayload is the largest encoded message sent through memberlist's
// gossip queue (piggybacked on UDP packets of UDPBufferSize = 1400 bytes,
// less memberlist's framing and AES-GCM overhead). Anything larger goes over
// memberlist's reliable (TCP) path to each target node.
const MaxPacketPayload = 1024

// State is a member's state as this node sees it (msg.State).
type State = msg.State

// Member states.
const (
	StateAlive   = msg.StateAlive
	StateSuspect = msg.StateSuspect
	StateDead    = msg.StateDead
	StateLeft    = msg.StateLeft
)

// Member is one node of the cluster (msg.Member). Its PolicyRevision and
// PolicyHash are what the node advertises (SetPolicyVersion); its Contact
// and Unanswered are on this node's clock (Config.Now), for members of
// other regions only (Config.ContactEvery).
type Member = msg.Member

// member is a Member as this node keeps it.
type member struct {
	Member
	leaving bool      // announced a graceful leave
	since   time.Time // when the state last changed
	pings   bool      // answers contact pings of its own (nodeMeta.Pings)
}

// Node is one daemon's gossip endpoint: a memberlist node plus the
// bounded receive queue and decoder. Create it with New, start it with Run.
// Register handlers (OnReport, OnNodeUsage, OnPolicy, OnMessage) before Run.
type Node struct {
	cfg     Config
	ml      *memberlist.Memberlist
	queue   chan []byte
	bq      *memberlist.TransmitLimitedQueue
	metrics *metrics
	meta    atomic.Pointer[[]byte]
	addr    string // host:port others reach this node at
	metaMu  sync.Mutex
	// metaFields is what meta encodes (guarded by metaMu); metaChanged
	// and metaSent are when it last changed and was last announced.
	metaFields  nodeMeta
	metaChanged time.Time
	metaSent    time.Time
	updMu       sync.Mutex // serializes UpdateNode
	run         atomic.Bool
	down        atomic.Bool

	pingTimeout time.Duration // memberlist's ProbeTimeout, which bounds Ping

	mu       sync.Mutex
	members  map[string]member
	contact  map[string]time.Time // node → send time of its last answered ping
	failed   map[string]time.Time // node → send time of its last unanswered ping
	pinging  map[string]bool      // nodes with a ping in flight
	book     pingBook             // this node's own contact pings (KindPing)
	pingedBy map[string]bool      // nodes whose contact ping arrived since start
	joined   atomic.Bool          // a seed answered (or there were none)

	hmu       sync.RWMutex
	onMessage []func(Message)

	rmu          sync.Mutex
	rejectLogged map[string]time.Time // reason → when last logged

	held []heldMessage // only the decode goroutine touches it

	fwd      chan forward      // messages to send on inside this region (forwardLoop)
	relayMu  sync.Mutex        // guards relayVia
	relayVia map[string]string // region → the node its last relayed message went through

	pmu          sync.Mutex
	policyVer    uint64
	policyLatest []byte            // encoded envelope of the newest policy seen
	reportSeen   map[string]uint64 // region → newest report epoch delivered
}

// New validates cfg, creates the memberlist node and binds its ports. It
// does not join: Run does.
func New(cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	n := &Node{
		cfg:          cfg,
		queue:        make(chan []byte, cfg.QueueSize),
		members:      map[string]member{},
		contact:      map[string]time.Time{},
		failed:       map[string]time.Time{},
		pinging:      map[string]bool{},
		pingedBy:     map[string]bool{},
		reportSeen:   map[string]uint64{},
		rejectLogged: map[string]time.Time{},
		metrics:      newMetrics(cfg.Registerer),
		fwd:          make(chan forward, forwardQueue),
		relayVia:     map[string]string{},
	}
	watchCluster(n, cfg.Registerer)
	n.metaFields = nodeMeta{V: WireVersion, Region: cfg.Region, Relays: true, Pings: true}
	meta, err := marshal(n.metaFields)
	if err != nil {
		return nil, err
	}
	if len(meta) > memberlist.MetaMaxSize {
		return nil, fmt.Errorf("gossip: node metadata is %d bytes > %d", len(meta), memberlist.MetaMaxSize)
	}
	n.meta.Store(&meta)
	mc := cfg.memberlistConfig()
	mc.Delegate = (*delegate)(n)
	mc.Events = (*events)(n)
	mc.LogOutput = &logWriter{log: cfg.Logger, m: n.metrics}
	if cfg.Memberlist != nil {
		if err := cfg.Memberlist(mc); err != nil {
			return nil, err
		}
	}
	n.pingTimeout = mc.ProbeTimeout
	n.book = newPingBook(n.pingTimeout, cfg.lateAnswers())
	n.bq = &memberlist.TransmitLimitedQueue{RetransmitMult: mc.RetransmitMult, NumNodes: n.numLive}
	ml, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("gossip: start memberlist: %w", err)
	}
	n.ml = ml
	// Read once: LocalNode's fields change under memberlist's lock on
	// every UpdateNode (SetPolicyVersion), the address never does.
	ln := ml.LocalNode()
	n.addr = net.JoinHostPort(ln.Addr.String(), strconv.Itoa(int(ln.Port)))
	return n, nil
}

// Addr returns the address other nodes reach this one at (host:port), for
// the Join lists of tests and tools.
func (n *Node) Addr() string { return n.addr }

// Name returns the node id.
func (n *Node) Name() string { return n.cfg.Node }

// Region returns this node's region.
func (n *Node) Region() string { return n.cfg.Region }

// Interval returns the configured report interval.
func (n *Node) Interval() time.Duration { return n.cfg.Interval }

// OnMessage registers h to receive every decoded message, on the decoder
// goroutine, one at a time: h must not block for long (hand work to another
// goroutine), or the receive queue fills and messages are dropped.
func (n *Node) OnMessage(h func(Message)) {
	n.hmu.Lock()
	n.onMessage = append(n.onMessage, h)
	n.hmu.Unlock()
}

// OnReport registers h for regional reports (same contract as OnMessage).
func (n *Node) OnReport(h func(share.Report)) {
	n.OnMessage(func(m Message) {
		if m.Kind == KindReport {
			h(m.Report)
		}
	})
}

// OnNodeUsage registers h for node usage reports from nodes of this region.
func (n *Node) OnNodeUsage(h func(NodeUsage)) {
	n.OnMessage(func(m Message) {
		if m.Kind == KindNodeUsage && m.Region == n.cfg.Region {
			h(m.Usage)
		}
	})
}

// OnPolicy registers h for policy updates newer than any this node has seen
// or sent: h sees each version at most once, in increasing order.
func (n *Node) OnPolicy(h func(PolicyUpdate)) {
	n.OnMessage(func(m Message) {
		if m.Kind == KindPolicy {
			h(m.Policy)
		}
	})
}

// Run joins the cluster (retrying until a seed answers, and again whenever
// this node knows of dead peers or is alone), decodes received messages and
// dispatches them to the handlers until ctx ends; then it leaves gracefully
// and shuts memberlist down. Run may be called once.
func (n *Node) Run(ctx context.Context) error {
	if !n.run.CompareAndSwap(false, true) {
		return errors.New("gossip: Run called twice")
	}
	defer n.stop(true)
	var wg sync.WaitGroup
	wg.Go(func() { n.decodeLoop(ctx) })
	wg.Go(func() { n.contactLoop(ctx, &wg) })
	wg.Go(func() { n.forwardLoop(ctx) })
	defer wg.Wait()
	n.joinLoop(ctx)
	return nil
}

// Shutdown stops the node without a graceful leave, as if the process had
// died (peers declare it dead). It is for a node whose Run never started or
// must not leave; Run's own shutdown leaves gracefully. Later calls, and Run
// afterwards, do nothing.
func (n *Node) Shutdown() { n.stop(false) }

// stop leaves the cluster (gracefully if leave is set, else as if the
// process died) and shuts memberlist down; later calls do nothing.
func (n *Node) stop(leave bool) {
	if !n.down.CompareAndSwap(false, true) {
		return
	}
	if leave {
		// Announce the departure in the metadata first, so peers record
		// "left" rather than "dead" (memberlist's leave event does not say).
		n.metaMu.Lock()
		n.metaFields.Leaving = true
		meta, err := marshal(n.metaFields)
		if err == nil {
			n.meta.Store(&meta)
		}
		n.metaMu.Unlock()
		if err == nil {
			_ = n.ml.UpdateNode(n.cfg.LeaveTimeout / 2)
		}
		if err := n.ml.Leave(n.cfg.LeaveTimeout); err != nil {
			n.cfg.Logger.Warn("gossip: leave", "err", err)
		}
	}
	if err := n.ml.Shutdown(); err != nil {
		n.cfg.Logger.Warn("gossip: shutdown", "err", err)
	}
}

func (n *Node) joinLoop(ctx context.Context) {
	backoff := 100 * time.Millisecond
	joined := len(n.cfg.Join) == 0
	n.joined.Store(joined)
	rounds := 0
	for {
		if n.down.Load() {
			<-ctx.Done()
			return
		}
		if !joined {
			if k, err := n.ml.Join(n.cfg.Join); err == nil && k > 0 {
				joined = true
				n.joined.Store(true)
				n.cfg.Logger.Info("gossip: joined", "node", n.cfg.Node, "region", n.cfg.Region, "contacted", k)
			} else {
				n.cfg.Logger.Debug("gossip: join failed, retrying", "err", err, "in", backoff)
			}
		} else {
			n.rejoin(rounds < seedRounds)
			rounds++
		}
		wait := n.cfg.rejoinInterval()
		if !joined {
			wait = backoff
			backoff = min(2*backoff, n.cfg.rejoinInterval())
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// rejoin tries to reach dead (not left) members again for ReconnectFor
// after they died, and the seeds when alone, so that a healed partition
// merges without an operator. While seeds is set (the first rounds after
// start) it pushes its state to the seeds again, because a node restarted
// under the same name on a new address is refused until its old
// incarnation is declared dead and DeadNodeReclaim has passed.
func (n *Node) rejoin(seeds bool) {
	var addrs []string
	for _, m := range n.memberList() {
		if m.State == StateDead && m.Node != n.cfg.Node && time.Since(m.since) < ReconnectFor {
			addrs = append(addrs, m.Node+"/"+m.Addr)
		}
	}
	if seeds || n.numLive() <= 1 {
		addrs = append(addrs, n.cfg.Join...)
	}
	if len(addrs) > 0 {
		_, _ = n.ml.Join(addrs)
	}
}

func (n *Node) decodeLoop(ctx context.Context) {
	t := time.NewTicker(holdRetry)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case b := <-n.queue:
			n.metrics.queueLen.Set(float64(len(n.queue)))
			n.handle(b)
		case <-t.C:
			n.retryHeld()
		}
	}
}

// A message from a node this one has not heard of yet is held for up to
// holdUnknown, retried every holdRetry, before it is rejected (reason
// "sender"): a node that has just joined may send before the news of its
// join reaches every member. At most maxHeld messages are held.
const (
	holdUnknown = 2 * time.Second
	holdRetry   = 100 * time.Millisecond
	maxHeld     = 64
)

// heldMessage is a decoded message waiting for its sender to be known.
type heldMessage struct {
	m     Message
	env   envelopeView
	b     []byte
	until time.Time
}

func (n *Node) handle(b []byte) {
	m, env, err := decode(b, n.cfg.MaxMessageSize)
	if err == nil && m.From == n.cfg.Node {
		n.metrics.dropped.WithLabelValues(ReasonSelf).Inc()
		return
	}
	if err == nil {
		err = n.admit(m)
	}
	var de *DecodeError
	if errors.As(err, &de) && de.Reason == ReasonSender && !n.known(m.From) && len(n.held) < maxHeld {
		n.held = append(n.held, heldMessage{m: m, env: env, b: b, until: time.Now().Add(holdUnknown)})
		return
	}
	if err != nil {
		n.reject(m, err, len(b))
		return
	}
	n.deliverRelayed(m, env, b)
}

// deliverRelayed delivers m and, the first time it is delivered, sends it
// on inside this region when its sender asked this node to relay it.
func (n *Node) deliverRelayed(m Message, env envelopeView, b []byte) {
	if m.Kind == KindPing {
		n.onPing(m) // the transport's own: never handed on
		return
	}
	if !n.deliver(m, b) || !env.Relay || m.Region == n.cfg.Region {
		return
	}
	switch m.Kind {
	case KindReport, KindBorrow, KindLoan:
	default:
		return // only what crosses regions is relayed
	}
	out, err := unrelayed(env)
	if err != nil {
		return
	}
	select {
	case n.fwd <- forward{kind: m.Kind, b: out}:
	default:
		n.metrics.dropped.WithLabelValues(ReasonRelayFull).Inc()
	}
}

// retryHeld delivers the held messages whose sender is now known and
// rejects those held for holdUnknown. Called on the decode goroutine.
func (n *Node) retryHeld() {
	if len(n.held) == 0 {
		return
	}
	now := time.Now()
	keep := n.held[:0]
	for _, h := range n.held {
		if !n.known(h.m.From) && now.Before(h.until) {
			keep = append(keep, h)
			continue
		}
		if err := n.admit(h.m); err != nil {
			n.reject(h.m, err, len(h.b))
			continue
		}
		n.deliverRelayed(h.m, h.env, h.b)
	}
	clear(n.held[len(keep):])
	n.held = keep
}

// known reports whether name is in the member table, in any state.
func (n *Node) known(name string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	_, ok := n.members[name]
	return ok
}

// deliver hands an admitted message to the handlers, once: a policy or a
// report seen before is not delivered again (false). A policy is relayed.
func (n *Node) deliver(m Message, b []byte) bool {
	switch m.Kind {
	case KindPolicy:
		if !n.notePolicy(m.Policy.Version, b) {
			return false // not newer than what we have: already delivered
		}
	case KindReport:
		if !n.noteReport(m.Region, m.Report.Epoch) {
			return false // this region's report for this epoch was delivered already
		}
	}
	if m.Kind == KindPolicy && len(b) <= MaxPacketPayload {
		// Relay on first sight: memberlist's queue hands a message to only
		// RetransmitMult·log10(N+1) nodes and does not relay user messages,
		// so receivers re-gossip (as serf does with user events).
		n.bq.QueueBroadcast(&broadcast{kind: m.Kind, from: m.From, msg: b})
	}
	n.metrics.received.WithLabelValues(m.Kind.String()).Inc()
	n.metrics.receivedBytes.WithLabelValues(m.Kind.String()).Add(float64(len(b)))
	n.hmu.RLock()
	hs := n.onMessage
	n.hmu.RUnlock()
	for _, h := range hs {
		h(m)
	}
	return true
}

// admit checks a decoded message against what this node knows: its
// sender's membership (checkSender) and the two times its duplicate
// suppression keys on (clockCheck).
func (n *Node) admit(m Message) error {
	n.mu.Lock()
	sender, known := n.members[m.From]
	n.mu.Unlock()
	if err := checkSender(m, sender.Member, known, n.cfg.Region); err != nil {
		return err
	}
	cc := clockCheck{now: n.cfg.Now(), interval: n.cfg.Interval, tolerance: n.cfg.ClockTolerance}
	return cc.check(m)
}

// reject counts a message that is not applied and logs it, at most once a
// second per reason, with the sending node's name when its header was
// read.
func (n *Node) reject(m Message, err error, size int) {
	reason := ReasonMalformed
	var de *DecodeError
	if errors.As(err, &de) {
		reason = de.Reason
	}
	n.metrics.rejected.WithLabelValues(reason).Inc()
	now := time.Now()
	n.rmu.Lock()
	last, seen := n.rejectLogged[reason]
	quiet := seen && now.Sub(last) < time.Second
	if !quiet {
		n.rejectLogged[reason] = now
	}
	n.rmu.Unlock()
	if quiet {
		return
	}
	from := m.From
	if from == "" {
		from = "unknown"
	}
	n.cfg.Logger.Warn("gossip: rejected message", "reason", reason, "node", from, "region", m.Region, "kind", m.Kind.String(), "bytes", size, "err", err)
}

// noteReport records that region's report for epoch was seen; false if it
// (or a later one) was seen before.
func (n *Node) noteReport(region string, epoch uint64) bool {
	n.pmu.Lock()
	defer n.pmu.Unlock()
	if last, ok := n.reportSeen[region]; ok && epoch <= last {
		return false
	}
	n.reportSeen[region] = epoch
	return true
}

// notePolicy records the newest policy envelope; false if v is not newer.
func (n *Node) notePolicy(v uint64, env []byte) bool {
	ok, _ := n.notePolicyHave(v, env)
	return ok
}

// notePolicyHave is notePolicy that also returns the version held, read
// under the same lock.
func (n *Node) notePolicyHave(v uint64, env []byte) (bool, uint64) {
	n.pmu.Lock()
	defer n.pmu.Unlock()
	if v <= n.policyVer && n.policyLatest != nil {
		return false, n.policyVer
	}
	n.policyVer, n.policyLatest = v, env
	return true, v
}

// enqueue is the receive path of NotifyMsg and MergeRemoteState: copy,
// offer to the bounded queue, return at once.
func (n *Node) enqueue(b []byte) {
	if len(b) > n.cfg.MaxMessageSize {
		n.metrics.rejected.WithLabelValues(ReasonOversized).Inc()
		return
	}
	c := slices.Clone(b)
	select {
	case n.queue <- c:
	default:
		n.metrics.dropped.WithLabelValues(ReasonQueueFull).Inc()
	}
}

// BroadcastReport sends this region's report to every other region, over
// memberlist's reliable (TCP) path, whatever its size: a report must reach
// every node before the settle deadline, and the gossip queue gives no
// such promise (see the package documentation). Each region gets it
// through its relay, which sends it on to the region's other nodes
// (sendAcross). It returns once every send has finished; an error names
// the nodes that failed.
func (n *Node) BroadcastReport(ctx context.Context, r share.Report) error {
	if r.Region != n.cfg.Region {
		return fmt.Errorf("gossip: report of region %q from a node of %q", r.Region, n.cfg.Region)
	}
	n.noteReport(r.Region, r.Epoch)
	return n.sendAcross(ctx, r, KindReport, func(region string) bool { return region != n.cfg.Region })
}

// SendNodeUsage sends this node's usage to the other live nodes of its
// region over the reliable path.
func (n *Node) SendNodeUsage(ctx context.Context, u NodeUsage) error {
	u.Node, u.Region = n.cfg.Node, n.cfg.Region
	return n.send(ctx, u, KindNodeUsage, func(m Member) bool { return m.Region == n.cfg.Region }, false)
}

// SendBorrowRequest sends this region's borrow request to every live node of
// the other regions over the reliable path, through each region's relay
// (any of them may be its region's lender; the receivers decide which one
// answers). A lost request costs the
// borrower one BorrowEvery; a duplicate is answered at most once per
// borrower and key (share.Allocator.Lend supersedes the pending one).
func (n *Node) SendBorrowRequest(ctx context.Context, r share.BorrowRequest) error {
	if r.Region != n.cfg.Region {
		return fmt.Errorf("gossip: borrow request of region %q from a node of %q", r.Region, n.cfg.Region)
	}
	return n.sendAcross(ctx, r, KindBorrow, func(region string) bool { return region != n.cfg.Region })
}

// SendLoan sends this region's loan over the reliable path, first to the
// other live nodes of this (the lender's) region, which must cut as this
// node already has, and only when those sends have finished to the live
// nodes of the borrower's region, through its relay: the lender's nodes have the cut in hand
// before any borrower node can raise. A lost loan leaves the lender's share
// cut and the borrower's unraised until the next rebalance (under-service,
// never overshoot); a duplicate is applied once (share.Loan.Seq). If the
// sends to this region fail the loan is not sent to the borrower.
func (n *Node) SendLoan(ctx context.Context, l share.Loan) error {
	if l.Lender != n.cfg.Region {
		return fmt.Errorf("gossip: loan of region %q from a node of %q", l.Lender, n.cfg.Region)
	}
	b, err := Encode(n.cfg.Node, n.cfg.Region, l)
	if err != nil {
		return err
	}
	if err := n.sendEncoded(ctx, b, KindLoan, func(m Member) bool { return m.Region == n.cfg.Region }, false); err != nil {
		return err
	}
	if l.Borrower == n.cfg.Region {
		return nil
	}
	return n.sendAcross(ctx, l, KindLoan, func(region string) bool { return region == l.Borrower })
}

// BroadcastPolicy sends a policy set to every live node over the reliable
// path and, when it fits in a packet, also through the gossip queue (each
// receiver relays it once), so a node the direct send missed still gets it.
// Receivers deliver it to OnPolicy only if its version is newer than any
// they have seen; a node joining later gets the newest one by push/pull.
func (n *Node) BroadcastPolicy(ctx context.Context, p PolicyUpdate) error {
	b, err := Encode(n.cfg.Node, n.cfg.Region, p)
	if err != nil {
		return err
	}
	if ok, have := n.notePolicyHave(p.Version, b); !ok {
		return fmt.Errorf("gossip: policy version %d is not newer than %d", p.Version, have)
	}
	all := func(Member) bool { return true }
	if len(b) <= MaxPacketPayload {
		_ = n.sendEncoded(ctx, b, KindPolicy, all, true)
	}
	return n.sendEncoded(ctx, b, KindPolicy, all, false)
}

func (n *Node) send(ctx context.Context, payload any, kind Kind, to func(Member) bool, queue bool) error {
	b, err := Encode(n.cfg.Node, n.cfg.Region, payload)
	if err != nil {
		return err
	}
	return n.sendEncoded(ctx, b, kind, to, queue)
}

// sendEncoded sends b: through the gossip queue when queue is set and b fits
// in a packet, else directly to every live member accepted by to over
// memberlist's reliable TCP path. Never truncated: a message above
// MaxMessageSize is an error.
func (n *Node) sendEncoded(ctx context.Context, b []byte, kind Kind, to func(Member) bool, queue bool) error {
	if len(b) > n.cfg.MaxMessageSize {
		n.metrics.sendErrors.WithLabelValues(kind.String()).Inc()
		return fmt.Errorf("gossip: %s message is %d bytes > MaxMessageSize %d", kind, len(b), n.cfg.MaxMessageSize)
	}
	if queue && len(b) <= MaxPacketPayload {
		n.bq.QueueBroadcast(&broadcast{kind: kind, from: n.cfg.Node, msg: b})
		n.metrics.sent.WithLabelValues(kind.String(), pathGossip).Inc()
		n.metrics.sentBytes.WithLabelValues(kind.String()).Add(float64(len(b)))
		return nil
	}
	var targets []Member
	for _, m := range n.Members() {
		if m.Node != n.cfg.Node && m.State.Live() && to(m) {
			targets = append(targets, m)
		}
	}
	return n.sendTo(ctx, b, kind, pathReliable, targets)
}

// Paths of sluice_gossip_sent_total: queued on memberlist's gossip, sent
// to one node over TCP, or sent on over TCP by a relay.
const (
	pathGossip   = "gossip"
	pathReliable = "reliable"
	pathRelay    = "relay"
)

// sendTo sends b to every target over memberlist's reliable path, at most
// 16 at once, and returns once every send has finished.
func (n *Node) sendTo(ctx context.Context, b []byte, kind Kind, path string, targets []Member) error {
	_, err := n.sendEach(ctx, b, kind, path, targets)
	return err
}

// sendEach sends b to every target, at most 16 at a time, and returns the
// nodes whose send failed with their errors joined.
func (n *Node) sendEach(ctx context.Context, b []byte, kind Kind, path string, targets []Member) (failed []string, err error) {
	var mu sync.Mutex
	var errs []error
	g, _ := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for _, t := range targets {
		g.Go(func() error {
			if err := n.sendOne(ctx, b, kind, path, t); err != nil {
				mu.Lock()
				failed, errs = append(failed, t.Node), append(errs, err)
				mu.Unlock()
			}
			return nil
		})
	}
	_ = g.Wait()
	return failed, errors.Join(errs...)
}

// sendOne sends b to member t over memberlist's reliable path.
func (n *Node) sendOne(ctx context.Context, b []byte, kind Kind, path string, t Member) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	mn, err := mlNode(t)
	if err != nil {
		return fmt.Errorf("gossip: send %s to %s: %w", kind, t.Node, err)
	}
	if err := n.ml.SendReliable(mn, b); err != nil {
		n.metrics.sendErrors.WithLabelValues(kind.String()).Inc()
		return fmt.Errorf("gossip: send %s to %s: %w", kind, t.Node, err)
	}
	n.metrics.sent.WithLabelValues(kind.String(), path).Inc()
	n.metrics.sentBytes.WithLabelValues(kind.String()).Add(float64(len(b)))
	return nil
}

// broadcast is one queued message; a newer message of the same kind from
// the same node replaces an older one still queued.
type broadcast struct {
	kind Kind
	from string
	msg  []byte
}

func (b *broadcast) Invalidates(o memberlist.Broadcast) bool {
	ob, ok := o.(*broadcast)
	return ok && ob.kind == b.kind && ob.from == b.from
}
func (b *broadcast) Message() []byte { return b.msg }
func (b *broadcast) Finished()       {}

// Members returns every node this node knows of, itself included, dead and
// left ones too, sorted by name.
func (n *Node) Members() []Member {
	list := n.memberList()
	out := make([]Member, len(list))
	for i, m := range list {
		out[i] = m.Member
	}
	return out
}

// memberList is Members with what this node keeps of each.
func (n *Node) memberList() []member {
	n.mu.Lock()
	out := make([]member, 0, len(n.members))
	for _, m := range n.members {
		m.Contact, m.Unanswered = n.contact[m.Node], n.failed[m.Node]
		out = append(out, m)
	}
	n.mu.Unlock()
	slices.SortFunc(out, func(a, b member) int {
		if a.Node < b.Node {
			return -1
		} else if a.Node > b.Node {
			return 1
		}
		return 0
	})
	return out
}

// Regions maps every region with a live (alive or suspect) node to its live
// nodes, sorted. A region is live while any of its nodes is.
func (n *Node) Regions() map[string][]string {
	out := map[string][]string{}
	for _, m := range n.Members() {
		if m.State.Live() {
			out[m.Region] = append(out[m.Region], m.Node)
		}
	}
	return out
}

// NumLive returns the number of live nodes, this one included.
func (n *Node) NumLive() int { return max(n.numLive(), 1) }

// NumLiveInRegion returns the number of live nodes of this node's region,
// this one included: at least 1, whatever the membership says.
func (n *Node) NumLiveInRegion() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	live := 0
	for _, x := range n.members {
		if x.State.Live() && x.Region == n.cfg.Region && x.Node != n.cfg.Node {
			live++
		}
	}
	return live + 1
}

func (n *Node) numLive() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	live := 0
	for _, x := range n.members {
		if x.State.Live() {
			live++
		}
	}
	return live
}

// SetPolicyVersion advertises, in this node's metadata, the revision and
// content hash of the policy set it enforces, so that every node can show
// policy-version skew between regions (Member.PolicyRevision, PolicyHash).
// It returns at once; memberlist spreads the update by gossip. Gossip is
// best effort (a round may go only to dead nodes), so callers should call it
// periodically: for metaRepeat after a change, an unchanged call announces
// the metadata again (at most once a second).
func (n *Node) SetPolicyVersion(rev uint64, hash string) {
	n.metaMu.Lock()
	now := time.Now()
	if n.metaFields.PolicyRev == rev && n.metaFields.PolicyHash == hash {
		repeat := now.Sub(n.metaChanged) < metaRepeat && now.Sub(n.metaSent) >= time.Second
		if repeat {
			n.metaSent = now
		}
		n.metaMu.Unlock()
		if repeat {
			n.announceMeta()
		}
		return
	}
	n.metaFields.PolicyRev, n.metaFields.PolicyHash = rev, hash
	meta, err := marshal(n.metaFields)
	if err != nil || len(meta) > memberlist.MetaMaxSize {
		n.metaMu.Unlock()
		return
	}
	n.meta.Store(&meta)
	n.metaChanged, n.metaSent = now, now
	n.metaMu.Unlock()
	// Our own entry in Members follows at once.
	n.mu.Lock()
	if self, ok := n.members[n.cfg.Node]; ok {
		self.PolicyRevision, self.PolicyHash = rev, hash
		n.members[n.cfg.Node] = self
	}
	n.mu.Unlock()
	n.announceMeta()
}

// metaRepeat is how long after a metadata change SetPolicyVersion keeps
// announcing it again.
const metaRepeat = 10 * time.Second

// announceMeta has memberlist gossip our current metadata, off the
// caller's goroutine. Announcements are serialized: UpdateNode reads the
// metadata before taking a new incarnation, so two at once could send the
// older metadata with the newer incarnation.
func (n *Node) announceMeta() {
	if n.down.Load() {
		return
	}
	go func() {
		n.updMu.Lock()
		defer n.updMu.Unlock()
		if !n.down.Load() {
			_ = n.ml.UpdateNode(time.Second)
		}
	}()
}

// noteMember records a membership event. memberlist does not fill in
// Node.State for events, so the state comes from the event itself: join and
// update mean alive, leave means left if the node announced its departure
// (leaving flag in its metadata), dead otherwise.
func (n *Node) noteMember(mn *memberlist.Node, gone bool) {
	meta, _ := decodeMeta(mn.Meta)
	m := member{Member: Member{Node: mn.Name, Region: meta.Region, Addr: net.JoinHostPort(mn.Addr.String(), strconv.Itoa(int(mn.Port))), State: StateAlive,
		PolicyRevision: meta.PolicyRev, PolicyHash: meta.PolicyHash, Relays: meta.Relays}, pings: meta.Pings}
	n.mu.Lock()
	old, known := n.members[m.Node]
	if m.Region == "" && known {
		m.Region, m.Relays, m.pings = old.Region, old.Relays, old.pings
	}
	if gone {
		m.State = StateDead
		if meta.Leaving || (known && old.leaving) {
			m.State = StateLeft
		}
	}
	m.leaving = meta.Leaving && !gone
	m.since = old.since
	if !known || old.State != m.State {
		m.since = time.Now()
	}
	n.members[m.Node] = m
	n.mu.Unlock()
	n.metrics.members.Set(float64(n.numLive()))
}

// delegate implements memberlist.Delegate; every method returns at once.
type delegate Node

func (d *delegate) NodeMeta(limit int) []byte {
	meta := *d.meta.Load()
	if len(meta) > limit {
		return nil
	}
	return meta
}

func (d *delegate) NotifyMsg(b []byte) { (*Node)(d).enqueue(b) }

func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte {
	return d.bq.GetBroadcasts(overhead, limit)
}

// LocalState hands the newest policy set to push/pull, so a node that
// (re)joins catches up without waiting for the next change.
func (d *delegate) LocalState(join bool) []byte {
	d.pmu.Lock()
	defer d.pmu.Unlock()
	return d.policyLatest
}

func (d *delegate) MergeRemoteState(b []byte, join bool) {
	if len(b) > 0 {
		(*Node)(d).enqueue(b)
	}
}

// events implements memberlist.EventDelegate.
type events Node

func (e *events) NotifyJoin(mn *memberlist.Node)   { (*Node)(e).noteMember(mn, false) }
func (e *events) NotifyLeave(mn *memberlist.Node)  { (*Node)(e).noteMember(mn, true) }
func (e *events) NotifyUpdate(mn *memberlist.Node) { (*Node)(e).noteMember(mn, false) }
