package simulator

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/share"
)

// Options tune a run without changing what is simulated.
type Options struct {
	// Seed seeds every random choice; the same seed gives the same Result.
	Seed uint64
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

type inMsg struct {
	at  int64
	rep share.Report
}

// mail is a borrow request or a loan in flight.
type mail struct {
	at    int64
	from  int
	req   share.BorrowRequest
	loan  share.Loan
	isReq bool
}

// rateTau is the time constant of each region's per-key offered-rate
// estimate (an exponentially decaying count), used for borrowing.
const rateTau = 250 * time.Millisecond

type region struct {
	idx     int
	name    string
	store   *engine.MemoryStore
	alloc   *share.Allocator
	table   *share.Table
	skew    int64
	crashed bool
	checks  [1]engine.Check
	inbox   []inMsg
	mail    []mail
	dead    []string // membership's dead regions as last told to alloc

	nextPublish   int64 // virtual ns
	nextRebalance int64
	rebalEpoch    uint64
	pendingRebal  bool

	// Per-key counters over the current report interval.
	offered, recent, admitted []int32
	touched                   []int32
	quota                     share.QuotaCounter

	// Offered-rate estimate per key: rate[k]·exp(−(now−rateAt[k])/τ), units/s.
	rate   []float64
	rateAt []int64
}

// sim is one run's state.
type sim struct {
	sc      Scenario
	cfg     share.Config
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
	subIdx  map[string]int
	loans   int64 // loans accepted
}

// Run simulates sc and returns its metrics. It honours ctx between ticks.
func Run(ctx context.Context, sc Scenario, opt Options) (Result, error) {
	sc = sc.withDefaults()
	if err := sc.Validate(); err != nil {
		return Result{}, err
	}
	s, err := newSim(sc, opt.Seed)
	if err != nil {
		return Result{}, err
	}
	wall := time.Now()
	if err := s.run(ctx, opt.Progress); err != nil {
		return Result{}, err
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
		// Wait for the slowest report: delay, jitter, and two skews.
		sc.Share.Settle = sc.Gossip.Delay + sc.Gossip.Jitter + 2*sc.Gossip.Skew + Duration(400*time.Millisecond)
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

func newSim(sc Scenario, seed uint64) (*sim, error) {
	s := &sim{sc: sc, cfg: sc.shareConfig(), now: startNS}
	if err := s.cfg.Validate(); err != nil {
		return nil, fmt.Errorf("scenario %s: %w", sc.Name, err)
	}
	s.rng = rand.New(rand.NewPCG(seed, 0x5105e))
	if sc.Zipf > 1 && sc.Keys > 1 {
		s.zipf = rand.NewZipf(s.rng, sc.Zipf, 1, uint64(sc.Keys-1))
	}
	s.subs = make([]string, sc.Keys)
	s.subIdx = make(map[string]int, sc.Keys)
	for i := range s.subs {
		s.subs[i] = "k" + strconv.Itoa(i)
		s.subIdx[s.subs[i]] = i
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
	maxKeys := 2 * sc.Keys
	s.oracle = engine.NewMemoryStore(engine.MemoryConfig{Clock: clk, MaxKeys: maxKeys, Shards: 1})
	s.ochecks[0] = engine.Check{Policy: policy, Limit: s.limit, Cost: 1, Scale: 1}
	names := make([]string, sc.Regions)
	for i := range names {
		names[i] = regionName(i)
	}
	for i := range sc.Regions {
		r := &region{idx: i, name: names[i]}
		if sc.Gossip.Skew > 0 {
			r.skew = int64((s.rng.Float64()*2 - 1) * float64(sc.Gossip.Skew))
		}
		s.regions = append(s.regions, r)
		if err := s.boot(r, names); err != nil {
			return nil, err
		}
	}
	s.m = NewRecorder(sc)
	s.shares = make([]float64, sc.Regions)
	return s, nil
}

// boot (re)starts a region with an empty store and allocator.
func (s *sim) boot(r *region, names []string) error {
	clk := vclock{&s.now}
	r.store = engine.NewMemoryStore(engine.MemoryConfig{Clock: clk, MaxKeys: 2 * s.sc.Keys, Shards: 1})
	local := s.now + r.skew
	epoch := s.cfg.Epoch(time.Unix(0, local))
	a, err := share.NewAllocator(s.cfg, r.name, names, epoch)
	if err != nil {
		return err
	}
	r.alloc = a
	r.table = a.Table(time.Unix(0, local))
	r.checks[0] = engine.Check{Policy: policy, Limit: s.limit, Cost: 1}
	r.nextPublish = s.cfg.EpochStart(epoch+1).UnixNano() - r.skew
	r.pendingRebal = false
	r.inbox = r.inbox[:0]
	r.offered = make([]int32, s.sc.Keys)
	r.recent = make([]int32, s.sc.Keys)
	r.admitted = make([]int32, s.sc.Keys)
	r.touched = r.touched[:0]
	r.quota = share.QuotaCounter{Key: share.Key{Policy: policy, Subject: s.subs[0]}}
	r.mail = r.mail[:0]
	r.dead = nil
	r.rate = make([]float64, s.sc.Keys)
	r.rateAt = make([]int64, s.sc.Keys)
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
				s.shares[i] = r.table.Share(policy, s.subs[0])
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
			s.arrive(s.regions[ri], k)
		}
	}
	// End the last tick, past the Duration if the tick does not divide it.
	s.m.Shares(time.Duration(t0-startNS), s.lrate, s.shares)
	return nil
}

// lrateBase is the unit of traffic rates: the original L.
func (s *sim) lrateBase() float64 { return s.sc.Limit.Rate }

// arrive decides one request in region r for key k, and at the oracle.
func (s *sim) arrive(r *region, k int) {
	sub := s.subs[k]
	var ok bool
	if s.sc.Quota != nil {
		w := share.WindowIndex(time.Unix(0, s.now), s.sc.Quota.Window.D())
		if r.quota.Allow(w, s.sc.Quota.Limit, 1) {
			r.quota.Add(w, r.name, 1)
			ok = true
		}
	} else {
		scale := r.table.Share(policy, sub)
		if scale < minScale {
			scale = minScale
		}
		r.checks[0].Scale = scale
		d, err := r.store.Check(context.Background(), engine.Request{Subject: sub, Checks: r.checks[:]})
		if err != nil {
			panic(err) // scenario limits are validated up front
		}
		s.checks++
		ok = d.Allowed
		// Offered-rate estimate, and a loan request when the bucket will
		// empty within the horizon.
		rate := r.bump(k, s.now)
		if refill := scale * s.lrate; rate > refill && s.lrate >= s.cfg.BorrowMinRate {
			if tokens := float64(d.Results[0].Remaining); tokens < (rate-refill)*s.cfg.BorrowHorizon.Seconds() {
				local := time.Unix(0, s.now+r.skew)
				if req, ok := r.alloc.Borrow(local, share.Key{Policy: policy, Subject: sub}, s.lrate, rate, tokens); ok {
					for _, q := range s.regions {
						if q != r {
							s.send(r, q, s.now, mail{req: req, isReq: true}, req.EncodedSizeEstimate())
						}
					}
				}
			}
		}
	}
	od, err := s.oracle.Check(context.Background(), engine.Request{Subject: sub, Checks: s.ochecks[:]})
	if err != nil {
		panic(err)
	}
	s.checks++
	if r.offered[k] == 0 {
		r.touched = append(r.touched, int32(k))
	}
	r.offered[k]++
	if s.now >= r.nextPublish-s.cfg.Recent.Nanoseconds() {
		r.recent[k]++
	}
	if ok {
		r.admitted[k]++
	}
	s.m.Arrival(r.idx, k, ok, od.Allowed)
}

// bump counts one arrival of key k at now and returns the rate estimate.
func (r *region) bump(k int, now int64) float64 {
	v := r.rateNow(k, now) + 1/rateTau.Seconds()
	r.rate[k], r.rateAt[k] = v, now
	return v
}

// rateNow is the offered-rate estimate of key k at now, units/s.
func (r *region) rateNow(k int, now int64) float64 {
	if r.rate[k] == 0 {
		return 0
	}
	return r.rate[k] * math.Exp(-float64(now-r.rateAt[k])/float64(rateTau))
}

// send hands a borrow message from r to q to the simulated gossip layer:
// dropped across a partition, to a crashed region or by loss; delivered
// after the delay (and jitter) otherwise. Bytes count as report traffic.
func (s *sim) send(r, q *region, t int64, m mail, size int) {
	if q.crashed || s.partitioned(r.idx, q.idx, t) {
		return
	}
	s.m.Sent(size)
	if s.sc.Gossip.Loss > 0 && s.rng.Float64() < s.sc.Gossip.Loss {
		return
	}
	m.at = t + s.sc.Gossip.Delay.D().Nanoseconds()
	if j := s.sc.Gossip.Jitter.D(); j > 0 {
		m.at += int64(s.rng.Float64() * float64(j))
	}
	m.from = r.idx
	q.mail = append(q.mail, m)
}

// deliverMail processes r's borrow messages due at t: a request is
// answered (a loan sent back, or kept pending), a loan accepted; then
// pending requests are retried.
func (s *sim) deliverMail(r *region, t int64) {
	local := time.Unix(0, t+r.skew)
	if len(r.mail) > 0 {
		keep := r.mail[:0]
		var due []mail
		for _, m := range r.mail {
			if m.at <= t {
				due = append(due, m)
			} else {
				keep = append(keep, m)
			}
		}
		r.mail = keep
		for _, m := range due {
			if m.isReq {
				k := s.subIdx[m.req.Subject]
				if loan, ok := r.alloc.Lend(local, m.req, s.lrate, r.rateNow(k, t)); ok {
					s.send(r, s.regions[m.from], t, mail{loan: loan}, loan.EncodedSizeEstimate())
				}
			} else if r.alloc.Accept(local, m.loan) {
				s.loans++
			}
		}
	}
	if r.alloc.Pending() > 0 {
		loans := r.alloc.ServeLoans(local, func(key share.Key) (float64, float64) {
			return s.lrate, r.rateNow(s.subIdx[key.Subject], t)
		})
		for _, loan := range loans {
			q := s.regions[s.index(loan.Borrower)]
			s.send(r, q, t, mail{loan: loan}, loan.EncodedSizeEstimate())
		}
	}
}

func (s *sim) index(name string) int {
	for i, r := range s.regions {
		if r.name == name {
			return i
		}
	}
	return -1
}

// membership tells each live region which others memberlist would call
// dead at t: crashed, or cut off by a partition, for at least Detect.
func (s *sim) membership(t int64) {
	if s.sc.Gossip.NoMembership || len(s.regions) < 2 {
		return
	}
	rel := time.Duration(t - startNS)
	det := s.sc.Gossip.Detect.D()
	for _, r := range s.regions {
		if r.crashed {
			continue
		}
		var dead []string
		for _, q := range s.regions {
			if q == r {
				continue
			}
			gone := false
			for _, c := range s.sc.Gossip.Crashes {
				if c.Region == q.idx && q.crashed && rel-c.At.D() >= det {
					gone = true
				}
			}
			for _, p := range s.sc.Gossip.Partitions {
				if rel >= p.Start.D()+det && rel < p.End.D() &&
					slices.Contains(p.Regions, r.idx) != slices.Contains(p.Regions, q.idx) {
					gone = true
				}
			}
			if gone {
				dead = append(dead, q.name)
			}
		}
		if !slices.Equal(dead, r.dead) {
			r.dead = dead
			r.alloc.SetDead(time.Unix(0, t+r.skew), dead)
		}
	}
}

// minScale keeps a share of zero from meaning "the whole limit" (the
// engine's Scale treats zero as one).
const minScale = 1e-9

// events runs publications, deliveries, rebalances, crashes and limit steps
// due at t.
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
			names := make([]string, len(s.regions))
			for i := range names {
				names[i] = regionName(i)
			}
			if err := s.boot(r, names); err != nil {
				panic(err)
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
		s.deliverMail(r, t)
		if t >= r.nextPublish {
			s.publish(r, t)
		}
		local := time.Unix(0, t+r.skew)
		if r.pendingRebal && t >= r.nextRebalance {
			var in []share.Report
			keep := r.inbox[:0]
			for _, m := range r.inbox {
				switch {
				case m.at <= t && m.rep.Epoch == r.rebalEpoch:
					in = append(in, m.rep)
					for _, q := range m.rep.Quotas {
						r.quota.Merge(q)
					}
				case m.rep.Epoch > r.rebalEpoch:
					keep = append(keep, m)
				}
			}
			r.inbox = keep
			r.alloc.Rebalance(local, r.rebalEpoch, in)
			r.pendingRebal = false
		}
		r.table = r.alloc.Table(local)
	}
}

// publish ends region r's interval: builds its report, sends it to every
// reachable peer, and schedules its rebalance.
func (s *sim) publish(r *region, t int64) {
	local := t + r.skew
	epoch := s.cfg.Epoch(time.Unix(0, local)) - 1
	secs := s.cfg.Interval.Seconds()
	rsecs := s.cfg.Recent.Seconds()
	usage := make([]share.Usage, 0, len(r.touched))
	slices.Sort(r.touched)
	for _, k := range r.touched {
		usage = append(usage, share.Usage{Key: share.Key{Policy: policy, Subject: s.subs[k]}, Limit: s.lrate,
			Offered: float64(r.offered[k]) / secs, Recent: float64(r.recent[k]) / rsecs,
			Admitted: float64(r.admitted[k]) / secs})
		r.offered[k], r.recent[k], r.admitted[k] = 0, 0, 0
	}
	r.touched = r.touched[:0]
	rep := r.alloc.Report(epoch, usage)
	if s.sc.Quota != nil {
		rep.Quotas = []share.QuotaCounter{r.quota.Clone()}
	}
	size := rep.EncodedSizeEstimate()
	for _, q := range s.regions {
		if q == r || q.crashed || s.partitioned(r.idx, q.idx, t) {
			continue
		}
		s.m.Sent(size)
		if s.sc.Gossip.Loss > 0 && s.rng.Float64() < s.sc.Gossip.Loss {
			continue
		}
		at := t + s.sc.Gossip.Delay.D().Nanoseconds()
		if j := s.sc.Gossip.Jitter.D(); j > 0 {
			at += int64(s.rng.Float64() * float64(j))
		}
		q.inbox = append(q.inbox, inMsg{at: at, rep: rep})
	}
	r.nextPublish = s.cfg.EpochStart(epoch+2).UnixNano() - r.skew
	r.nextRebalance = t + s.cfg.Settle.Nanoseconds()
	r.rebalEpoch = epoch
	r.pendingRebal = true
	if s.sc.Quota != nil {
		s.mergeQuotas(r)
	}
}

// mergeQuotas folds delivered quota counters into r (at its publication,
// which is when a daemon would process its inbox as well).
func (s *sim) mergeQuotas(r *region) {
	for _, m := range r.inbox {
		if m.at <= s.now {
			for _, q := range m.rep.Quotas {
				r.quota.Merge(q)
			}
		}
	}
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
