package simulator

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/sluice-rl/sluice/coordinator"
	"github.com/sluice-rl/sluice/coordinator/msg"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/share"
)

// Options tune a run without changing what is simulated.
type Options struct {
	// Seed seeds every random choice; the same seed gives the same Result.
	Seed uint64
	// CheckShares makes Run fail if, at any tick, a live region enforces a
	// share outside [share.MinShare, 1] or its view of a key's shares over
	// the regions leaves [0, 1] or sums above 1 + 1e-9.
	CheckShares bool
	// Progress, if set, is called about once per simulated 10 s with the
	// virtual time done and the total.
	Progress func(done, total time.Duration)
}

// policy is the name of the simulated global policy.
const policy = "global"

// vclock is virtual time for the engine stores.
type vclock struct{ ns *int64 }

func (c vclock) Now() time.Time { return time.Unix(0, *c.ns) }

// start is the virtual epoch of every run: aligned to any interval.
var startNS = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()

// delivery is a gossip message in flight to a region.
type delivery struct {
	at  int64 // virtual ns
	seq int64 // send order, to break ties
	msg msg.Message
}

// region is one region: one daemon (its coordinator core and the engine
// store it checks with) behind one regional store.
type region struct {
	idx     int
	name    string
	node    string
	store   *engine.MemoryStore
	core    *coordinator.Core
	skew    int64
	crashed bool
	checks  [1]engine.Check
	inbox   []delivery
	usage   map[engine.UsageKey]engine.Usage // since the core's last Tick
	wake    int64                            // next Tick (virtual ns): the adapter's timer
	dead    []bool                           // membership: regions declared dead, by index
	bootAt  int64                            // when the daemon (and its pings) last started
	told    bool                             // the core has been given dead as it is
	pinged  int64                            // the ping round (contact_every) its members were last given at
	stepped bool                             // the core ran at this tick (CheckShares)
	// saved is what the region's store holds of its shares (Ready.Save);
	// it survives a crash, as the regional Redis would.
	saved *coordinator.Saved
}

// sim is one run's state.
type sim struct {
	sc      Scenario
	cfg     share.Config
	opt     Options
	rng     *rand.Rand
	zipf    *rand.Zipf
	now     int64
	regions []*region
	oracle  *engine.MemoryStore
	ochecks [1]engine.Check
	subs    []string
	limit   engine.Limit
	lrate   float64 // current L
	checks  int64
	m       *Recorder
	shares  []float64 // each region's share of key 0, for m
	seq     int64     // messages sent
	err     error     // first invariant broken (Options.CheckShares)
	// Requests of a charged token rate being served, by when they settle
	// (Latency is the same for all, so in arrival order), and the
	// reservations held so far.
	serving []settlement
	resv    int64
}

// settlement is an admitted request of a charged token rate being served:
// settled at at (virtual ns) with its cost, in region, or at the oracle
// when region is nil.
type settlement struct {
	at     int64
	region *region
	sub    string
	id     string
	cost   int64
}

// Run simulates sc and returns its metrics. It honours ctx between ticks.
func Run(ctx context.Context, sc Scenario, opt Options) (Result, error) {
	sc = sc.withDefaults()
	if err := sc.Validate(); err != nil {
		return Result{}, err
	}
	s, err := newSim(sc, opt)
	if err != nil {
		return Result{}, err
	}
	wall := time.Now()
	if err := s.run(ctx, opt.Progress); err != nil {
		return Result{}, err
	}
	if s.err != nil {
		return Result{}, s.err
	}
	res := s.m.Result()
	res.Seed = opt.Seed
	res.Checks = s.checks
	res.WallTime = time.Since(wall)
	return res, nil
}

func (sc Scenario) withDefaults() Scenario {
	if sc.Tick == 0 {
		sc.Tick = Duration(10 * time.Millisecond)
	}
	if sc.Keys == 0 {
		sc.Keys = 1
	}
	if sc.Limit.Burst == 0 {
		sc.Limit.Burst = sc.Limit.Rate
	}
	if sc.Gossip.Delay == 0 {
		sc.Gossip.Delay = Duration(100 * time.Millisecond)
	}
	if sc.Share.Interval == 0 {
		sc.Share.Interval = Duration(10 * time.Second)
	}
	if sc.Share.Settle == 0 {
		// Wait for the slowest report: delay, jitter, and two skews, after
		// the coordinator's collect step (a third of Settle by default),
		// which is when a region's report is sent.
		sc.Share.Settle = 3 * (sc.Gossip.Delay + sc.Gossip.Jitter + 2*sc.Gossip.Skew + Duration(400*time.Millisecond)) / 2
	}
	if sc.Share.RaiseDelay == 0 && sc.Gossip.Skew > 0 {
		// Raises must wait out the skew between regions.
		sc.Share.RaiseDelay = max(Duration(time.Second), 2*sc.Gossip.Skew+Duration(200*time.Millisecond))
	}
	if sc.Warmup == 0 {
		sc.Warmup = 2 * sc.Share.Interval
	}
	if sc.Gossip.Detect == 0 {
		sc.Gossip.Detect = Duration(5 * time.Second)
	}
	if sc.Gossip.DetectIsolated == 0 {
		sc.Gossip.DetectIsolated = 4 * sc.Gossip.Detect
	}
	if sc.Gossip.ContactEvery == 0 {
		sc.Gossip.ContactEvery = sc.Share.Interval / 40
	}
	if sc.Gossip.PingTimeout == 0 {
		sc.Gossip.PingTimeout = sc.Gossip.Detect / 10
	}
	return sc
}

func (sc Scenario) shareConfig() share.Config {
	cfg := share.DefaultConfig()
	cfg.Interval = sc.Share.Interval.D()
	cfg.Settle = sc.Share.Settle.D()
	if sc.Share.RaiseDelay != 0 {
		cfg.RaiseDelay = sc.Share.RaiseDelay.D()
	}
	if sc.Share.Pressure != 0 {
		cfg.Pressure = sc.Share.Pressure
	}
	if sc.Share.NoBorrow {
		cfg.BorrowEvery = 0
	}
	if sc.Share.LendFraction != 0 {
		cfg.LendFraction = sc.Share.LendFraction
	}
	return cfg
}

func regionName(i int) string { return fmt.Sprintf("r%d", i) }

func newSim(sc Scenario, opt Options) (*sim, error) {
	s := &sim{sc: sc, cfg: sc.shareConfig(), opt: opt, now: startNS}
	if err := s.cfg.Validate(); err != nil {
		return nil, fmt.Errorf("scenario %s: %w", sc.Name, err)
	}
	s.rng = rand.New(rand.NewPCG(opt.Seed, 0x5105e))
	if sc.Zipf > 1 && sc.Keys > 1 {
		s.zipf = rand.NewZipf(s.rng, sc.Zipf, 1, uint64(sc.Keys-1))
	}
	s.subs = make([]string, sc.Keys)
	for i := range s.subs {
		s.subs[i] = "k" + strconv.Itoa(i)
	}
	s.lrate = sc.Limit.Rate
	s.limit = engine.Limit{Algorithm: engine.TokenBucket, Rate: sc.Limit.Rate, Burst: sc.Limit.Burst}
	if sc.Quota != nil {
		s.limit = engine.Limit{Algorithm: engine.FixedWindow, Count: float64(sc.Quota.Limit), Window: sc.Quota.Window.D()}
	}
	if err := s.limit.Validate(); err != nil {
		return nil, fmt.Errorf("scenario %s: %w", sc.Name, err)
	}
	clk := vclock{&s.now}
	maxKeys := s.storeKeys()
	s.oracle = engine.NewMemoryStore(engine.MemoryConfig{Clock: clk, MaxKeys: maxKeys, Shards: 1})
	s.ochecks[0] = engine.Check{Policy: policy, Limit: s.limit, Cost: 1, Scale: 1}
	for i := range sc.Regions {
		r := &region{idx: i, name: regionName(i), node: regionName(i) + "-n0", dead: make([]bool, sc.Regions)}
		if sc.Gossip.Skew > 0 {
			r.skew = int64((s.rng.Float64()*2 - 1) * float64(sc.Gossip.Skew))
		}
		s.regions = append(s.regions, r)
	}
	for _, r := range s.regions {
		if err := s.boot(r); err != nil {
			return nil, err
		}
	}
	s.m = NewRecorder(sc)
	s.shares = make([]float64, sc.Regions)
	return s, nil
}

// storeKeys is the MaxKeys of every engine store: twice the keys, and
// room for the reservations of a charged token rate's requests in
// service (a store holds at most MaxKeys of them).
func (s *sim) storeKeys() int {
	if s.sc.chargesRate() {
		return 2*s.sc.Keys + 1<<20
	}
	return 2 * s.sc.Keys
}

// local is region r's clock at virtual time t.
func (r *region) local(t int64) time.Time { return time.Unix(0, t+r.skew) }

// members is the membership as region r sees it at t: every region's one
// node, alive unless r's membership has declared that region dead, with
// the Contact r's pings give it (contact).
func (s *sim) members(r *region, t int64) []msg.Member {
	out := make([]msg.Member, len(s.regions))
	for i, q := range s.regions {
		st := msg.StateAlive
		if r.dead[i] {
			st = msg.StateDead
		}
		out[i] = msg.Member{Node: q.node, Region: q.name, State: st}
		if q != r {
			out[i].Contact, out[i].Unanswered = s.contact(r, q, t)
		}
	}
	return out
}

// contact is when region r last sent q a ping that was answered, and the
// last that went unanswered, on r's clock, as the gossip layer's pings
// give them: r pings every ContactEvery (from time 0 of the run), and a
// ping is answered at once unless q is crashed or a partition separates
// them, when it is given up PingTimeout after it was sent. Zero before r's
// first such ping since its daemon started, and always without pings.
func (s *sim) contact(r, q *region, t int64) (answered, unanswered time.Time) {
	g := s.sc.Gossip
	if g.NoMembership || g.NoContact {
		return time.Time{}, time.Time{}
	}
	last := t // the last instant r could reach q, up to t
	rel := time.Duration(t - startNS)
	for _, c := range g.Crashes {
		if c.Region == q.idx && rel >= c.At.D() && !(c.Restart > c.At && rel >= c.Restart.D()) {
			last = min(last, startNS+c.At.D().Nanoseconds()-1)
		}
	}
	for _, p := range g.Partitions {
		if rel >= p.Start.D() && rel < p.End.D() && slices.Contains(p.Regions, r.idx) != slices.Contains(p.Regions, q.idx) {
			last = min(last, startNS+p.Start.D().Nanoseconds()-1)
		}
	}
	every := g.ContactEvery.D().Nanoseconds()
	round := func(at int64) int64 { return startNS + (at-startNS)/every*every }
	if ping := round(last); ping >= r.bootAt {
		answered = r.local(ping)
	}
	if last < t {
		if ping := round(t - g.PingTimeout.D().Nanoseconds()); ping > last && ping >= r.bootAt {
			unanswered = r.local(ping)
		}
	}
	return answered, unanswered
}

// limitOf is the coordinator's Config.Limit: L of the simulated policy.
func (s *sim) limitOf(p string) (float64, bool) { return s.lrate, p == policy }

// bucketOf is the coordinator's Config.Bucket: the simulated policy is a
// token bucket, with a burst of at least one second of its rate unless the
// scenario says otherwise.
func (s *sim) bucketOf(p string) bool {
	return p == policy && s.limit.Algorithm == engine.TokenBucket && s.limit.Burst >= s.limit.Rate
}

// quotaOf is the coordinator's Config.Quota: the quota's window, if any.
func (s *sim) quotaOf(p string) (time.Duration, bool) {
	if s.sc.Quota == nil || p != policy {
		return 0, false
	}
	return s.sc.Quota.Window.D(), true
}

// boot (re)starts region r's daemon: an empty engine store and a new
// coordinator core, which restores the shares its regional store saved.
func (s *sim) boot(r *region) error {
	clk := vclock{&s.now}
	r.store = engine.NewMemoryStore(engine.MemoryConfig{Clock: clk, MaxKeys: s.storeKeys(), Shards: 1})
	cfg := coordinator.CoreConfig{Share: s.cfg, Region: r.name, Node: r.node, Limit: s.limitOf,
		Bucket: s.bucketOf, ContactLag: s.sc.Gossip.ContactEvery.D() + s.sc.Gossip.PingTimeout.D(), PoolTokens: true}
	if s.sc.Quota != nil {
		cfg.Quota = s.quotaOf
	}
	r.bootAt = s.now
	members := s.members(r, s.now)
	c, err := coordinator.NewCore(cfg, members)
	if err != nil {
		return err
	}
	if err := c.Start(r.local(s.now), members, r.saved, nil); err != nil {
		return err
	}
	r.core = c
	r.checks[0] = engine.Check{Policy: policy, Limit: s.limit, Cost: 1}
	r.inbox = r.inbox[:0]
	r.usage = map[engine.UsageKey]engine.Usage{}
	r.wake = s.now
	r.told, r.stepped = true, true
	r.pinged = (s.now - startNS) / s.sc.Gossip.ContactEvery.D().Nanoseconds()
	return nil
}

func (s *sim) run(ctx context.Context, progress func(done, total time.Duration)) error {
	tick := s.sc.Tick.D().Nanoseconds()
	end := startNS + s.sc.Duration.D().Nanoseconds()
	counts := make([]int, len(s.regions))
	carry := make([]float64, len(s.regions))
	rates := make([]float64, len(s.regions))
	var lastProgress int64
	crashed := func(i int) bool { return s.regions[i].crashed }
	t0 := startNS
	for ; t0 < end; t0 += tick {
		if t0-lastProgress >= int64(10*time.Second) {
			lastProgress = t0
			if err := ctx.Err(); err != nil {
				return err
			}
			if progress != nil {
				progress(time.Duration(t0-startNS), s.sc.Duration.D())
			}
		}
		s.now = t0
		s.settleDue()
		s.events(t0)
		s.sc.Traffic.Rates(time.Duration(t0-startNS), crashed, rates)
		total := 0
		dt := float64(tick) / 1e9
		for i, r := range rates {
			mean := r * s.lrateBase() * dt
			if s.sc.Traffic.Poisson {
				counts[i] = poisson(s.rng, mean)
			} else {
				carry[i] += mean
				counts[i] = int(carry[i])
				carry[i] -= float64(counts[i])
			}
			total += counts[i]
		}
		for i, r := range s.regions {
			s.shares[i] = 0
			if !r.crashed {
				s.shares[i] = share.Scale(r.core.Share(policy, s.subs[0]))
			}
		}
		s.m.Shares(time.Duration(t0-startNS), s.lrate, s.shares)
		remaining := total
		for j := range total {
			s.now = t0 + int64((float64(j)+0.5)*float64(tick)/float64(total))
			u := s.rng.IntN(remaining)
			ri := 0
			for ; ri < len(counts); ri++ {
				if u < counts[ri] {
					break
				}
				u -= counts[ri]
			}
			counts[ri]--
			remaining--
			k := 0
			if s.zipf != nil {
				k = int(s.zipf.Uint64())
			} else if s.sc.Keys > 1 {
				k = s.rng.IntN(s.sc.Keys)
			}
			s.settleDue()
			s.arrive(s.regions[ri], k)
		}
	}
	// End the last tick, past the Duration if the tick does not divide it.
	s.m.Shares(time.Duration(t0-startNS), s.lrate, s.shares)
	return nil
}

// lrateBase is the unit of traffic rates: the original L.
func (s *sim) lrateBase() float64 { return s.sc.Limit.Rate }

// arrive decides one request in region r for key k, with the engine call
// and scale a daemon makes (share.Scale of the coordinator's share, or
// share.QuotaScale of a global quota), and at the oracle.
func (s *sim) arrive(r *region, k int) {
	sub := s.subs[k]
	if s.sc.chargesRate() {
		s.arriveRate(r, k)
		return
	}
	if s.sc.Charge != nil {
		s.arriveCharged(r, k)
		return
	}
	if s.sc.Quota != nil {
		w := share.WindowIndex(r.local(s.now), s.sc.Quota.Window.D())
		r.checks[0].Scale = share.QuotaScale(s.limit.Count, r.core.QuotaOthers(policy, sub, w))
	} else {
		r.checks[0].Scale = share.Scale(r.core.Share(policy, sub))
	}
	d, err := r.store.Check(context.Background(), engine.Request{Subject: sub, Checks: r.checks[:]})
	if err != nil {
		panic(err) // scenario limits are validated up front; scales are in (0, 1]
	}
	s.checks++
	ok := d.Allowed
	uk := engine.UsageKey{Subject: sub, Policy: policy}
	u := r.usage[uk]
	u.Demand++
	if ok {
		u.Admitted++
	}
	u.Remaining, u.At = d.Results[0].Remaining, r.local(s.now)
	r.usage[uk] = u
	od, err := s.oracle.Check(context.Background(), engine.Request{Subject: sub, Checks: s.ochecks[:]})
	if err != nil {
		panic(err)
	}
	s.checks++
	s.m.Arrival(r.idx, k, ok, od.Allowed)
}

// arriveCharged decides one request whose cost is known only after it is
// served (Scenario.Charge) in region r for key k, and at the oracle: a
// check of cost 0 with the quota's scale, then, when admitted, a charge of
// the cost drawn, tracked as the daemon's limiter tracks a charge.
func (s *sim) arriveCharged(r *region, k int) {
	sub := s.subs[k]
	ctx := context.Background()
	w := share.WindowIndex(r.local(s.now), s.sc.Quota.Window.D())
	c := engine.Check{Policy: policy, Limit: s.limit, Scale: share.QuotaScale(s.limit.Count, r.core.QuotaOthers(policy, sub, w))}
	cost := 1 + s.rng.Int64N(s.sc.Charge.MaxCost)
	// One check and one charge of a store call each.
	charge := func(st *engine.MemoryStore, c engine.Check) (bool, int64) {
		d, err := st.Check(ctx, engine.Request{Subject: sub, Checks: []engine.Check{c}})
		if err != nil {
			panic(err)
		}
		s.checks++
		if !d.Allowed {
			return false, 0
		}
		c.Cost = cost
		if _, err := st.Charge(ctx, engine.ChargeRequest{Subject: sub, Checks: []engine.Check{c}}); err != nil {
			panic(err)
		}
		return true, cost
	}
	ok, units := charge(r.store, c)
	uk := engine.UsageKey{Subject: sub, Policy: policy}
	u := r.usage[uk]
	u.Demand += units
	u.Admitted += units
	u.At = r.local(s.now)
	r.usage[uk] = u
	oc := s.ochecks[0]
	oc.Cost = 0
	ook, ounits := charge(s.oracle, oc)
	s.m.Arrival(r.idx, k, ok, ook)
	s.m.Charged(units, ounits)
}

// arriveRate decides one request of a charged token rate (Scenario.Charge
// without a Quota) in region r for key k, and at the oracle: a check of
// the estimate at the region's share, held as a reservation, which an
// admitted request settles with its cost Latency later. The check's
// estimate is tracked as the daemon's limiter tracks a check (demand, and
// admitted when allowed), the settlement's extra as it tracks a charge.
func (s *sim) arriveRate(r *region, k int) {
	sub := s.subs[k]
	est := s.sc.Charge.Estimate
	cost := 1 + s.rng.Int64N(s.sc.Charge.MaxCost)
	c := engine.Check{Policy: policy, Limit: s.limit, Cost: est, Scale: share.Scale(r.core.Share(policy, sub))}
	d, id := s.reserve(r.store, sub, c)
	uk := engine.UsageKey{Subject: sub, Policy: policy}
	u := r.usage[uk]
	u.Demand += est
	if d.Allowed {
		u.Admitted += est
	}
	u.Remaining, u.At = d.Results[0].Remaining, r.local(s.now)
	r.usage[uk] = u
	oc := s.ochecks[0]
	oc.Cost = est
	od, oid := s.reserve(s.oracle, sub, oc)
	at := s.now + s.sc.Charge.Latency.D().Nanoseconds()
	if d.Allowed {
		s.serving = append(s.serving, settlement{at: at, region: r, sub: sub, id: id, cost: cost})
	}
	if od.Allowed {
		s.serving = append(s.serving, settlement{at: at, sub: sub, id: oid, cost: cost})
	}
	s.m.ArrivalUnits(r.idx, k, cost, d.Allowed, od.Allowed)
	s.settleDue()
}

// reserve checks c for sub in st and, when allowed, holds its cost as a
// reservation, whose id it returns.
func (s *sim) reserve(st *engine.MemoryStore, sub string, c engine.Check) (engine.Decision, string) {
	ctx := context.Background()
	d, err := st.Check(ctx, engine.Request{Subject: sub, Checks: []engine.Check{c}})
	if err != nil {
		panic(err) // scenario limits are validated up front; scales are in (0, 1]
	}
	s.checks++
	if !d.Allowed {
		return d, ""
	}
	s.resv++
	id := strconv.FormatInt(s.resv, 36)
	if err := st.Reserve(ctx, sub, id, []engine.Check{c}, s.sc.Charge.Latency.D()+time.Minute); err != nil {
		panic(err)
	}
	return d, id
}

// settleDue settles the requests in service whose time has come: each
// region's reservation at the share it enforces now, adding what the
// settlement charged beyond the estimate to its usage (a refund takes
// nothing back, as the daemon's limiter counts it); the oracle's at full
// scale. A crashed region's requests are lost with it.
func (s *sim) settleDue() {
	for len(s.serving) > 0 && s.serving[0].at <= s.now {
		p := s.serving[0]
		s.serving = s.serving[1:]
		st, c := s.oracle, s.ochecks[0]
		if p.region != nil {
			if p.region.crashed {
				continue
			}
			st, c = p.region.store, engine.Check{Policy: policy, Limit: s.limit, Scale: share.Scale(p.region.core.Share(policy, p.sub))}
		}
		c.Cost = p.cost
		held := make([]int64, 1)
		d, err := st.Charge(context.Background(), engine.ChargeRequest{Subject: p.sub, Checks: []engine.Check{c}, Reservation: p.id, Held: held})
		if err != nil {
			panic(err) // the reservation is held for Latency and a minute
		}
		if p.region == nil {
			s.m.Charged(0, p.cost)
			continue
		}
		uk := engine.UsageKey{Subject: p.sub, Policy: policy}
		u := p.region.usage[uk]
		extra := max(p.cost-held[0], 0)
		u.Demand += extra
		u.Admitted += extra
		u.Remaining, u.At = d.Results[0].Remaining, p.region.local(s.now)
		p.region.usage[uk] = u
		s.m.Charged(p.cost, 0)
	}
}

// tick runs region r's coordinator as Coordinator.Run would at t: Tick when
// its timer is due (the epoch's next step, or PollEvery after the last
// Tick), with the usage drained since and the membership it sees.
func (s *sim) tick(r *region, t int64) {
	for t >= r.wake {
		local := r.local(t)
		var usage map[engine.UsageKey]engine.Usage
		if r.core.WantsUsage(local) {
			usage = r.usage
			r.usage = map[engine.UsageKey]engine.Usage{}
		}
		// Contact moves only with each round of pings, verdicts only
		// when membership changes: pass the members then, as the
		// daemon's view changes.
		var members []msg.Member
		if round := (t - startNS) / s.sc.Gossip.ContactEvery.D().Nanoseconds(); !r.told || round != r.pinged {
			members, r.told, r.pinged = s.members(r, t), true, round
		}
		s.do(r, t, r.core.Tick(local, usage, members))
		r.stepped = true
		next := r.core.Next().UnixNano() - r.skew
		if next <= t {
			continue // another step is due at once
		}
		r.wake = min(next, t+r.core.PollEvery().Nanoseconds())
	}
}

// deliver steps r's coordinator with the messages due at t, earliest
// first (the inbox is kept sorted by arrival, then send order).
func (s *sim) deliver(r *region, t int64) {
	if len(r.inbox) == 0 {
		return
	}
	for len(r.inbox) > 0 && r.inbox[0].at <= t {
		d := r.inbox[0]
		r.inbox = r.inbox[1:]
		s.do(r, t, r.core.Step(r.local(t), d.msg))
		r.stepped = true
	}
}

// do sends what a Ready asks, as the daemon's adapter does: reports and
// borrow requests to every other region, loans to the borrower (token
// loans once their tokens are out of the region's bucket), token deposits
// into the region's bucket, saves to the region's store.
func (s *sim) do(r *region, t int64, rd coordinator.Ready) {
	for _, rep := range rd.Reports {
		m := msg.Message{Kind: msg.KindReport, Report: rep, Size: rep.EncodedSizeEstimate()}
		for _, q := range s.regions {
			if q != r {
				s.send(r, q, t, m)
			}
		}
	}
	for _, req := range rd.Borrows {
		m := msg.Message{Kind: msg.KindBorrow, Borrow: req, Size: req.EncodedSizeEstimate()}
		for _, q := range s.regions {
			if q != r {
				s.send(r, q, t, m)
			}
		}
	}
	loans := rd.Loans
	for _, sp := range rd.Spends {
		if n, _ := sp.Do(context.Background(), bucket{r}); n > 0 {
			loans = append(loans, sp.Of(n))
		}
	}
	for _, l := range loans {
		if i := slices.IndexFunc(s.regions, func(q *region) bool { return q.name == l.Borrower }); i >= 0 {
			s.send(r, s.regions[i], t, msg.Message{Kind: msg.KindLoan, Loan: l, Size: l.EncodedSizeEstimate()})
		}
	}
	for _, dp := range rd.Deposits {
		_ = dp.Do(context.Background(), bucket{r})
	}
	if rd.Save != nil {
		r.saved = rd.Save
	}
}

// bucket is region r's token buckets as the owner of a core reaches them
// (coordinator.TokenBucket): checks of its engine at the scale the region
// enforces. The policy is a token bucket and costs are not negative, so
// an engine error is a bug of the simulator.
type bucket struct{ r *region }

func (b bucket) check(key share.Key, cost int64, deposit bool) (engine.Decision, error) {
	chk := b.r.checks
	chk[0].Scale = share.Scale(b.r.core.Share(key.Policy, key.Subject))
	chk[0].Cost, chk[0].Deposit = cost, deposit
	return b.r.store.Check(context.Background(), engine.Request{Subject: key.Subject, Checks: chk[:]})
}

func (b bucket) Level(_ context.Context, key share.Key) (int64, bool, error) {
	d, err := b.check(key, 0, false)
	if err != nil {
		panic(err)
	}
	return d.Results[0].Remaining, true, nil
}

func (b bucket) Take(_ context.Context, key share.Key, units int64) (bool, error) {
	d, err := b.check(key, units, false)
	return err == nil && d.Allowed, nil
}

func (b bucket) Put(_ context.Context, key share.Key, units int64) error {
	if _, err := b.check(key, units, true); err != nil {
		panic(err)
	}
	return nil
}

// send hands a message from r to q to the simulated gossip layer: dropped
// across a partition, to a crashed region or by loss; delivered after the
// delay (and jitter) otherwise. Bytes count as report traffic.
func (s *sim) send(r, q *region, t int64, m msg.Message) {
	if q.crashed || s.partitioned(r.idx, q.idx, t) {
		return
	}
	s.m.Sent(m.Size)
	if s.sc.Gossip.Loss > 0 && s.rng.Float64() < s.sc.Gossip.Loss {
		return
	}
	at := t + s.sc.Gossip.Delay.D().Nanoseconds()
	if j := s.sc.Gossip.Jitter.D(); j > 0 {
		at += int64(s.rng.Float64() * float64(j))
	}
	m.From, m.Region = r.node, r.name
	s.seq++
	d := delivery{at: at, seq: s.seq, msg: m}
	i, _ := slices.BinarySearchFunc(q.inbox, d, func(a, b delivery) int {
		return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.seq, b.seq))
	})
	q.inbox = slices.Insert(q.inbox, i, d)
}

// membership updates which other regions each live region's membership
// calls dead at t: crashed for at least Detect, or cut off by a partition
// for at least Detect (DetectIsolated on the partition's smaller side).
func (s *sim) membership(t int64) {
	if s.sc.Gossip.NoMembership || len(s.regions) < 2 {
		return
	}
	rel := time.Duration(t - startNS)
	det, iso := s.sc.Gossip.Detect.D(), s.sc.Gossip.DetectIsolated.D()
	for _, r := range s.regions {
		if r.crashed {
			continue
		}
		for i, q := range s.regions {
			gone := false
			if q != r {
				for _, c := range s.sc.Gossip.Crashes {
					if c.Region == q.idx && q.crashed && rel-c.At.D() >= det {
						gone = true
					}
				}
				for _, p := range s.sc.Gossip.Partitions {
					in := slices.Contains(p.Regions, r.idx)
					d := det
					if in == (2*len(p.Regions) < len(s.regions)) {
						d = iso // r is on the smaller side
					}
					if rel >= p.Start.D()+d && rel < p.End.D() && in != slices.Contains(p.Regions, q.idx) {
						gone = true
					}
				}
			}
			if r.dead[i] != gone {
				r.dead[i], r.told = gone, false
			}
		}
	}
}

// events runs limit steps, crashes, restarts, membership, deliveries and
// coordinator ticks due at t.
func (s *sim) events(t int64) {
	rel := time.Duration(t - startNS)
	for _, st := range s.sc.LimitSteps {
		if rel == st.At.D() {
			s.lrate = s.sc.Limit.Rate * st.Factor
			s.limit.Rate = s.lrate
			s.limit.Burst = s.sc.Limit.Burst * st.Factor
			for _, r := range s.regions {
				r.checks[0].Limit = s.limit
			}
			s.ochecks[0].Limit = s.limit
		}
	}
	for _, c := range s.sc.Gossip.Crashes {
		r := s.regions[c.Region]
		if rel == c.At.D() {
			r.crashed = true
		}
		if c.Restart > c.At && rel == c.Restart.D() {
			r.crashed = false
			clear(r.dead) // boot tells the new core
			if err := s.boot(r); err != nil {
				panic(err) // the config was validated by the first boot
			}
		}
	}
	if (t-startNS)%int64(100*time.Millisecond) == 0 {
		s.membership(t)
	}
	for _, r := range s.regions {
		if r.crashed {
			continue
		}
		s.deliver(r, t)
		s.tick(r, t)
	}
	if s.opt.CheckShares && s.err == nil {
		s.err = s.checkShares(rel)
	}
}

// checkShares verifies, for every live region and the first keys, that
// the share it enforces is in [share.MinShare, 1] and that its view of
// every region's share (Core.ShareVector) is in [0, 1] and sums to at
// most 1 + 1e-9. Shares change only when a core runs, so only regions
// whose core ran at this tick are checked.
func (s *sim) checkShares(at time.Duration) error {
	for _, r := range s.regions {
		if r.crashed || !r.stepped {
			continue
		}
		r.stepped = false
		for _, sub := range s.subs[:min(len(s.subs), 8)] {
			if v := r.core.Share(policy, sub); !(v >= share.MinShare && v <= 1) {
				return fmt.Errorf("%v: %s enforces %v for %s, outside [MinShare, 1]", at, r.name, v, sub)
			}
			sum := 0.0
			for i, v := range r.core.ShareVector(policy, sub) {
				if !(v >= 0 && v <= 1) {
					return fmt.Errorf("%v: %s's share of %s for region %d is %v, outside [0, 1]", at, r.name, sub, i, v)
				}
				sum += v
			}
			if sum > 1+1e-9 {
				return fmt.Errorf("%v: %s's shares of %s sum to %v > 1", at, r.name, sub, sum)
			}
		}
	}
	return nil
}

func (s *sim) partitioned(a, b int, t int64) bool {
	rel := time.Duration(t - startNS)
	for _, p := range s.sc.Gossip.Partitions {
		if rel < p.Start.D() || rel >= p.End.D() {
			continue
		}
		if slices.Contains(p.Regions, a) != slices.Contains(p.Regions, b) {
			return true
		}
	}
	return false
}

// poisson draws a Poisson(mean) count.
func poisson(r *rand.Rand, mean float64) int {
	if mean <= 0 {
		return 0
	}
	if mean > 30 {
		v := math.Round(mean + math.Sqrt(mean)*r.NormFloat64())
		return int(math.Max(0, v))
	}
	l := math.Exp(-mean)
	k, p := 0, 1.0
	for {
		p *= r.Float64()
		if p <= l {
			return k
		}
		k++
	}
}
