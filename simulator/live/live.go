// Package live runs a simulator.Scenario against real daemons: one or more
// `sluice serve` daemons per region (the region package, in process) on
// loopback, joined by real memberlist gossip, each region on the embedded
// memory store or its own redis-server, with every arrival a real HTTP
// check. Time is compressed: the scenario's report interval (10 s by
// default) becomes Options.Interval (1 s, longer when a key's burst would
// hold too few checks: needChecks), and every scenario time (duration,
// steps, warm-up, windows) is scaled by the same factor, so a 300 s scenario
// runs in 30 s. Rates are scaled too: the scenario's multiples of L apply to
// Options.Limit, the live L_global.
//
// The result has the shape of the virtual-time simulator's
// (simulator.Result, same JSON), with times and durations reported in
// scenario time, so the two can be compared field by field. The oracle is
// engine.Decide on the same arrivals at the full limit, as in the simulator.
//
// Faults are played at the scenario's times: partitions, report loss and
// delay through a gossiptest.FaultNet around every daemon's gossip transport
// (memberlist's failure detector made as fast as the scenario's
// gossip.detect, compressed like time), clock skew as an offset of each
// region's daemon clocks (region.Config.Clock), crashes as daemons stopped
// without a graceful leave and restarts as new daemons of the same names.
// A global quota is a scope: global fixed_window policy of the quota's
// count in live units and its window compressed like time; the daemons'
// clocks are shifted so that the run starts on a quota window boundary, as
// the simulator's does.
//
// Supported: every built-in scenario; splits, steps, Poisson or even
// arrivals, bursts, diurnal rotation, several keys (uniform or Zipf),
// every share-enforced algorithm (token_bucket, leaky_bucket,
// sliding_window_log within its maximum count, sliding_window_counter; see
// liveLimit), limit steps (PUT through one daemon's admin API at the step's
// time; the other daemons enforce the new limit once policy sync has
// carried it to them, a gossip delay later) and the faults above. Not
// supported live: a global fixed_window limit without a quota (the daemons
// enforce it as a quota) and gossip.no_membership (memberlist always
// detects).
package live

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/gossip/gossiptest"
	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/region"
	"github.com/sluice-rl/sluice/share"
	"github.com/sluice-rl/sluice/simulator"
)

// Options tune a live run.
type Options struct {
	// Seed seeds arrivals and key choice.
	Seed uint64
	// Store is "memory" (default) or "redis": one redis-server per region,
	// started and stopped by Run (redis-server must be on PATH).
	Store string
	// NodesPerRegion is the number of daemons per region (default 1).
	NodesPerRegion int
	// Interval is the live report interval; the scenario's interval maps
	// onto it. The default is 1 s (time compressed 10× at the simulator's
	// 10 s interval), longer when a key's burst at the live L would hold
	// too few checks for every region's share of it (minBurst): a run on
	// a coarser grain measures rounding, not the allocation.
	Interval time.Duration
	// Limit is the live L_global in units per second (default 1000, the
	// simulator's own L). The allocation estimates each region's rate from
	// the arrivals of one interval and of its last fifth; at 1 s intervals a
	// smaller L leaves a small region a handful of arrivals per estimate,
	// and the Poisson noise, not the algorithm, dominates the error
	// (steady-uneven, global_error_p99_pct: 0.07% virtual; live 3.0% at
	// L = 200 and 0.3% at 1000). Offered load is Traffic.Rate·Limit checks
	// per second; a scenario whose peak Traffic.Rate would offer more than
	// MaxLoad at 1000 gets a smaller default (zipf-keys, at 1000·L, runs at
	// L = 4, and so on a 50 s Interval: see Interval).
	Limit float64
	// Logger receives the daemons' logs (default: discarded).
	Logger *slog.Logger
	// Progress, if set, is called about once per live second with the
	// scenario time done and the total.
	Progress func(done, total time.Duration)
	// Stats, if set, receives what the run measured of itself.
	Stats *Stats
}

// Stats describe how well the machine kept up with a live run.
type Stats struct {
	// LateP50 and LateP99 are how long after its scheduled instant a check
	// was answered, live time: scheduling, HTTP and the decision. The
	// oracle decides at the scheduled instant, so lateness beyond a small
	// part of a bucket's burst (100 ms live for one second of L at the
	// default compression) bunches arrivals at the daemons and costs
	// admissions the oracle grants: a run with a LateP99 of hundreds of
	// milliseconds measures the machine, not the limiter.
	LateP50, LateP99 time.Duration
	// Errors and Dropped count checks not answered and not sent (the
	// daemon's queue was full).
	Errors, Dropped int64
	// Offered is the number of checks the run sent.
	Offered int64
	// MaxLate is the most LateP99 may be for the run to count (half a
	// burst of L, live time; see ErrBehind).
	MaxLate time.Duration
}

// ErrBehind is returned, wrapped, with the result of a run the machine
// could not drive: more than 2% of its checks not sent (a daemon's queue
// full), or checks answered later than Stats.MaxLate (p99) after their
// instants.
// Such a run's figures measure the machine, not the limiter.
var ErrBehind = errors.New("live: the machine could not drive the run's offered load")

const policyID = "live-global"

// MaxLoad is the most checks per second the default Options.Limit offers.
const MaxLoad = 4000

// minBurst is the fewest live checks a key's burst (a bucket's burst, a
// window's count) may hold per region, unless the scenario's own burst
// holds fewer units (needChecks). The daemons scale a limit by each
// region's share (share.Scale), and a region's part of a burst of a few
// checks rounds to one check or to none. At a live L of 4/s and 10×
// compression a burst of one second of L is 0.4 checks, which the policy
// rounds up to 1: no region's share of it holds a whole check, so every
// daemon rejects every check while the oracle, at the full burst, admits.
// At 4 checks per region zipf-keys still lost 3.6% (global_error_p99_pct
// 4.3 against 1.5 virtual); at its own grain of 20, 1.6.
const minBurst = 10

// needChecks is how many live checks a key's burst must hold at factor
// times L: minBurst per region, or the units of the scenario's burst (a
// quota's count) at that factor when those are fewer, for a live run on
// the virtual run's own grain is as fine as it needs to be.
func needChecks(sc simulator.Scenario, factor float64) float64 {
	units := sc.Limit.Burst * factor
	if sc.Quota != nil {
		units = float64(sc.Quota.Limit) * factor
	}
	return max(1, min(minBurst*float64(sc.Regions), math.Floor(units)))
}

// burstChecks is how many live checks the burst of l holds.
func burstChecks(l engine.Limit) float64 {
	if l.Algorithm.Windowed() {
		return l.Count
	}
	return l.Burst
}

// peakRate is the largest Traffic.Rate of sc (in multiples of L), bursts
// included.
func peakRate(sc simulator.Scenario) float64 {
	r := sc.Traffic.Rate
	for _, st := range sc.Traffic.Steps {
		r = max(r, st.Rate)
	}
	if b := sc.Traffic.Bursts; b != nil {
		r += b.Rate
	}
	if d := sc.Traffic.Diurnal; d != nil {
		r *= 1 + d.Depth
	}
	return r
}

func (o Options) withDefaults() Options {
	if o.Store == "" {
		o.Store = "memory"
	}
	if o.NodesPerRegion <= 0 {
		o.NodesPerRegion = 1
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// Validate reports what of sc cannot run live.
func Validate(sc simulator.Scenario) error {
	// The virtual-time simulator runs token buckets only; live runs the
	// other algorithms too, so the algorithm is checked here.
	alg := sc.Limit.Algorithm
	sc.Limit.Algorithm = ""
	if err := sc.Validate(); err != nil {
		return err
	}
	var bad []string
	if sc.Gossip.NoMembership {
		bad = append(bad, "gossip.no_membership (memberlist always detects)")
	}
	if sc.Gossip.NoContact {
		bad = append(bad, "gossip.no_contact (the daemons always ping)")
	}
	if sc.Charge != nil {
		bad = append(bad, "charge (charges after the fact are measured live by cmd/sluice's TestGlobalTokenBudgetWithCharges and TestGlobalTokenRateWithCharges)")
	}
	// Live, memberlist's own timings follow gossip.detect
	// (gossiptest.FaultNet.Detect) and the pings run every interval/40 with
	// the probe timeout; the virtual run's knobs for them have nothing to
	// set.
	if sc.Gossip.DetectIsolated != 0 {
		bad = append(bad, "gossip.detect_isolated (memberlist decides it)")
	}
	if sc.Gossip.ContactEvery != 0 || sc.Gossip.PingTimeout != 0 {
		bad = append(bad, "gossip.contact_every and gossip.ping_timeout (the daemons ping every interval/40 within memberlist's probe timeout, detect/10)")
	}
	if alg != "" {
		a, err := engine.ParseAlgorithm(alg)
		switch {
		case err != nil:
			return fmt.Errorf("scenario %s: %w", sc.Name, err)
		case a == engine.FixedWindow && sc.Quota == nil:
			// The daemons enforce a scope-global fixed_window as a global
			// quota (G-counter), not by shares: give it as a quota.
			bad = append(bad, "algorithm fixed_window (a global fixed window is a quota to the daemons: use quota)")
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("scenario %s: not supported live: %s", sc.Name, strings.Join(bad, ", "))
	}
	return nil
}

// liveLimit is the engine limit the daemons enforce for sc at factor times
// its L (a limit step's Factor; 1 before any), in live units and live time:
// L_live = Options.Limit·factor units per live second. A bucket
// (token_bucket, leaky_bucket) refills at L_live and holds the scenario's
// burst, in seconds of L, compressed like time (liveBurst). A window
// algorithm counts over a window as long as that burst lasts at L
// (Limit.Burst/Limit.Rate scenario seconds, 1 s by default), compressed
// like time and rounded to whole milliseconds, and admits L_live times the
// window in it: the same rate, and the same largest burst, as the bucket.
// Only the count follows a step; the window stays. A quota is a fixed
// window of the quota's window compressed like time, counting the quota's
// units in live units (liveUnits).
func liveLimit(sc simulator.Scenario, opt Options, f, factor float64) (engine.Limit, error) {
	if q := sc.Quota; q != nil {
		l := engine.Limit{Algorithm: engine.FixedWindow,
			Count:  math.Max(1, math.Round(float64(q.Limit)*liveUnits(sc, opt, f)*factor)),
			Window: max(time.Millisecond, time.Duration(math.Round(f*q.Window.D().Seconds()*1000))*time.Millisecond)}
		if err := l.Validate(); err != nil {
			return l, fmt.Errorf("scenario %s: live quota: %w", sc.Name, err)
		}
		return l, nil
	}
	alg := engine.TokenBucket
	if sc.Limit.Algorithm != "" {
		a, err := engine.ParseAlgorithm(sc.Limit.Algorithm)
		if err != nil {
			return engine.Limit{}, err
		}
		alg = a
	}
	l := engine.Limit{Algorithm: alg}
	if alg.Windowed() {
		secs := f * sc.Limit.Burst / sc.Limit.Rate // live seconds
		l.Window = max(time.Millisecond, time.Duration(math.Round(secs*1000))*time.Millisecond)
		l.Count = math.Max(1, math.Round(opt.Limit*factor*l.Window.Seconds()))
	} else {
		l.Rate = opt.Limit * factor
		l.Burst = math.Max(1, math.Round(opt.Limit*factor*f*sc.Limit.Burst/sc.Limit.Rate))
	}
	if err := l.Validate(); err != nil {
		return l, fmt.Errorf("scenario %s: live limit at L = %g/s: %w", sc.Name, opt.Limit*factor, err)
	}
	return l, nil
}

// liveUnits is how many live arrivals stand for one scenario unit: the
// scenario offers Traffic.Rate·Limit.Rate units per scenario second, the
// live run Traffic.Rate·Options.Limit per live second, f of a scenario
// second.
func liveUnits(sc simulator.Scenario, opt Options, f float64) float64 {
	return opt.Limit * f / sc.Limit.Rate
}

// perSec is L of l in units per second of its own time.
func perSec(l engine.Limit) float64 {
	if l.Algorithm.Windowed() {
		return l.Count / l.Window.Seconds()
	}
	return l.Rate
}

// livePolicy is the global policy document that enforces l.
func livePolicy(l engine.Limit) quota.Policy {
	p := quota.Policy{ID: policyID, Algorithm: l.Algorithm.String(),
		Mode: quota.ModeEnforce, Scope: quota.ScopeGlobal, OnStoreFailure: quota.FailOpen}
	if l.Algorithm.Windowed() {
		p.Count, p.Window = l.Count, l.Window.Seconds()
	} else {
		p.RatePerSec, p.Burst = l.Rate, l.Burst
	}
	return p
}

// node is one in-process daemon.
type node struct {
	region int
	d      *region.Daemon
	reg    *prometheus.Registry // the daemon's metrics
	addr   string
	cancel context.CancelFunc
	done   chan error
}

// cluster is the run's daemons, region by region, and the network between
// them.
type cluster struct {
	sc      simulator.Scenario
	opt     Options
	f       float64
	key     []byte // gossip secret
	token   string // the daemons' admin token
	pol     quota.Policy
	share   share.Config
	net     *gossiptest.FaultNet
	base    time.Duration  // shift of every daemon clock (quota alignment)
	clocks  []shiftedClock // by region: base plus the region's skew
	stores  []string       // by region: "memory" or the region's redis URL
	stops   []func()
	crashed []atomic.Bool

	mu    sync.Mutex
	nodes [][]*node // by region, the running (or last) daemons
	all   []*node   // every daemon ever started, for close
}

// shiftedClock is a daemon's clock: real time plus an offset (the run's
// quota alignment plus the region's skew).
type shiftedClock struct{ off time.Duration }

func (c shiftedClock) Now() time.Time                         { return time.Now().Add(c.off) }
func (c shiftedClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// liveShare is the simulator's share config for sc (sc.ShareConfig) with
// every duration compressed by f: the same settle for the same delays,
// the same raise delay for the same skew.
func liveShare(sc simulator.Scenario, f float64) share.Config {
	c := sc.ShareConfig()
	scale := func(d time.Duration) time.Duration { return time.Duration(float64(d) * f) }
	c.Interval = scale(c.Interval)
	c.Recent = scale(c.Recent)
	c.RaiseDelay = scale(c.RaiseDelay)
	c.Settle = scale(c.Settle)
	c.BorrowHorizon = scale(c.BorrowHorizon)
	c.BorrowEvery = scale(c.BorrowEvery)
	return c
}

// startupBudget is how long after start the run's first instant is
// planned: the time the daemons have to form one cluster.
const startupBudget = 3 * time.Second

// start starts every region's daemons, joined into one cluster on a
// FaultNet that plays sc's delay, jitter and loss, and returns with the
// instant the run should start at (in real time) once every node sees every
// other. Daemon clocks are shifted so that the run's start is, on them, a
// boundary of every quota window (and of the report interval), as time 0 is
// in the simulator; each region's clock is shifted further by its skew,
// drawn uniformly in ±Skew (compressed like time).
func start(ctx context.Context, sc simulator.Scenario, opt Options, f float64) (*cluster, time.Time, error) {
	cl := &cluster{sc: sc, opt: opt, f: f, nodes: make([][]*node, sc.Regions), crashed: make([]atomic.Bool, sc.Regions)}
	cl.key = make([]byte, 32)
	if _, err := rand.Read(cl.key); err != nil {
		return cl, time.Time{}, err
	}
	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return cl, time.Time{}, err
	}
	cl.token = hex.EncodeToString(tok)
	l, err := liveLimit(sc, opt, f, 1)
	if err != nil {
		return cl, time.Time{}, err
	}
	cl.pol = livePolicy(l)
	cl.share = liveShare(sc, f)
	if err := cl.share.Validate(); err != nil {
		return cl, time.Time{}, fmt.Errorf("scenario %s: live share config: %w", sc.Name, err)
	}
	scale := func(d simulator.Duration) time.Duration { return time.Duration(float64(d) * f) }
	cl.net = gossiptest.NewFaultNet(opt.Seed)
	cl.net.Detect = scale(sc.Gossip.Detect)

	// The planned start, on an interval boundary of real time, and the
	// shift that puts it on a quota window boundary of the daemons' time.
	at := time.Now().Add(startupBudget).Truncate(opt.Interval).Add(opt.Interval)
	var base time.Duration
	if sc.Quota != nil {
		w := l.Window
		base = at.Truncate(w).Add(w).Sub(at)
	}
	cl.base = base
	rng := mrand.New(mrand.NewPCG(opt.Seed, 0x5e3e))
	for range sc.Regions {
		off := base
		if sc.Gossip.Skew > 0 {
			off += time.Duration((rng.Float64()*2 - 1) * float64(scale(sc.Gossip.Skew)))
		}
		cl.clocks = append(cl.clocks, shiftedClock{off})
	}

	for r := range sc.Regions {
		store := "memory"
		if opt.Store == "redis" {
			srv, err := startRedis()
			if err != nil {
				return cl, at, err
			}
			cl.stops = append(cl.stops, srv.Close)
			store = "redis://" + srv.Addr()
		} else if opt.Store != "memory" {
			return cl, at, fmt.Errorf("live store %q: want memory or redis", opt.Store)
		}
		cl.stores = append(cl.stores, store)
		if err := cl.spawn(ctx, r); err != nil {
			return cl, at, err
		}
	}
	if err := cl.formed(ctx, 30*time.Second); err != nil {
		return cl, at, err
	}
	// The scenario's delay and loss are of the run, not of forming the
	// cluster: a virtual run starts formed, and joins whose streams are
	// lost and held for seconds (lossy-ten uncompressed: 20%, 2 s) may
	// not form ten daemons in the time allowed.
	cl.net.SetDelay(scale(sc.Gossip.Delay), scale(sc.Gossip.Jitter))
	cl.net.SetLoss(sc.Gossip.Loss)
	return cl, at, nil
}

// spawn starts region r's daemons, joining whichever daemons run.
func (cl *cluster) spawn(ctx context.Context, r int) error {
	var join []string
	cl.mu.Lock()
	for q, ns := range cl.nodes {
		if q != r && !cl.crashed[q].Load() {
			for _, n := range ns {
				join = append(join, n.d.Gossip().Addr())
			}
		}
	}
	cl.mu.Unlock()
	var ns []*node
	for i := 0; i < cl.opt.NodesPerRegion; i++ {
		cfg := region.DefaultConfig()
		cfg.Listen = "127.0.0.1:0"
		cfg.Store = cl.stores[r]
		cfg.StoreTimeout = 200 * time.Millisecond
		cfg.Policies = []quota.Policy{cl.pol}
		cfg.AdminToken = cl.token // limit steps go through the admin API
		cfg.ShutdownTimeout = 2 * time.Second
		cfg.Clock = cl.clocks[r]
		cfg.Gossip = &region.GossipConfig{Region: regionName(r), Node: fmt.Sprintf("%s-n%d", regionName(r), i),
			Listen: "127.0.0.1:0", Interval: cl.opt.Interval, SecretKey: cl.key, Preset: "local", Share: cl.share,
			Join: slices.Clone(join), Memberlist: cl.net.Attach(regionName(r))}
		reg := prometheus.NewRegistry()
		d, err := region.New(ctx, cfg, cl.opt.Logger.With("node", cfg.Gossip.Node), reg, reg)
		if err != nil {
			return fmt.Errorf("daemon %s: %w", cfg.Gossip.Node, err)
		}
		join = append(join, d.Gossip().Addr())
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			d.Gossip().Shutdown()
			return err
		}
		nctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		n := &node{region: r, d: d, reg: reg, addr: ln.Addr().String(), cancel: cancel, done: make(chan error, 1)}
		go func() { n.done <- d.Serve(nctx, ln, nil) }()
		ns = append(ns, n)
	}
	cl.mu.Lock()
	cl.nodes[r] = ns
	cl.all = append(cl.all, ns...)
	cl.mu.Unlock()
	return nil
}

// formed waits until every running node sees every running node.
func (cl *cluster) formed(ctx context.Context, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		want, ok := 0, true
		cl.mu.Lock()
		for r, ns := range cl.nodes {
			if !cl.crashed[r].Load() {
				want += len(ns)
			}
		}
		for r, ns := range cl.nodes {
			for _, n := range ns {
				if !cl.crashed[r].Load() && n.d.Gossip().NumLive() != want {
					ok = false
				}
			}
		}
		cl.mu.Unlock()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("live: the daemons did not form one cluster within %v", within)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond): // polling interval
		}
	}
}

// missingReports sums, over every daemon ever started, the other regions'
// reports its coordinator rebalanced without (not received by the settle
// deadline: lost, or late) and the reports it would have had with none
// missing (rebalances times the other regions). Both count every daemon
// of a region, so their ratio is the share of reports missing.
func (cl *cluster) missingReports() (missing, expected float64) {
	cl.mu.Lock()
	all := slices.Clone(cl.all)
	cl.mu.Unlock()
	for _, n := range all {
		mfs, err := n.reg.Gather()
		if err != nil {
			continue
		}
		var miss, rebal float64
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				switch mf.GetName() {
				case "sluice_globalshare_reports_missing_total":
					miss += m.GetCounter().GetValue()
				case "sluice_globalshare_rebalances_total":
					rebal += m.GetCounter().GetValue()
				}
			}
		}
		missing += miss
		expected += rebal * float64(cl.sc.Regions-1)
	}
	return missing, expected
}

// node returns the i-th daemon of region r (nil if it has none).
func (cl *cluster) node(r, i int) *node {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if i >= len(cl.nodes[r]) {
		return nil
	}
	return cl.nodes[r][i]
}

// crash stops region r's daemons abruptly: no graceful leave, as a crash.
func (cl *cluster) crash(r int) {
	if cl.crashed[r].Swap(true) {
		return
	}
	cl.mu.Lock()
	ns := cl.nodes[r]
	cl.mu.Unlock()
	for _, n := range ns {
		n.d.Gossip().Shutdown()
		n.cancel()
	}
}

// restart starts region r's daemons again, empty (on the memory store) and
// under the same node names, once the crashed ones have stopped; the
// region takes traffic again once they serve.
func (cl *cluster) restart(ctx context.Context, r int) error {
	if !cl.crashed[r].Load() {
		return nil
	}
	cl.mu.Lock()
	old := cl.nodes[r]
	cl.mu.Unlock()
	for _, n := range old {
		select {
		case <-n.done:
			n.done <- nil // for close
		case <-time.After(5 * time.Second):
		}
	}
	if err := cl.spawn(ctx, r); err != nil {
		return err
	}
	cl.crashed[r].Store(false)
	return nil
}

// partition cuts the regions of every partition in force at scenario time
// t from the rest (and heals every other cut).
func (cl *cluster) partition(t time.Duration) {
	all := make([]string, cl.sc.Regions)
	for r := range all {
		all[r] = regionName(r)
	}
	cl.net.Heal()
	for _, p := range cl.sc.Gossip.Partitions {
		if p.Start.D() <= t && t < p.End.D() {
			side := make([]string, len(p.Regions))
			for i, r := range p.Regions {
				side[i] = regionName(r)
			}
			cl.net.Partition(side, all)
		}
	}
}

// Run plays sc against live daemons and returns its metrics. The result's
// Description says how the run was scaled.
func Run(ctx context.Context, sc simulator.Scenario, opt Options) (simulator.Result, error) {
	opt = opt.withDefaults()
	if err := Validate(sc); err != nil {
		return simulator.Result{}, err
	}
	sc = sc.WithDefaults()
	if opt.Limit <= 0 {
		opt.Limit = 1000
		if p := peakRate(sc); p*opt.Limit > MaxLoad {
			opt.Limit = math.Floor(MaxLoad / p)
		}
	}
	factors := append([]float64{1}, stepFactors(sc)...)
	if opt.Interval <= 0 {
		opt.Interval = defaultInterval(sc, opt, factors)
	}
	f := float64(opt.Interval) / float64(sc.Share.Interval.D()) // live seconds per scenario second
	// Every limit the run will enforce must be valid (a sliding window
	// log's count within its maximum) and hold minBurst checks per region
	// before any daemon starts.
	for _, factor := range factors {
		l, err := liveLimit(sc, opt, f, factor)
		if err != nil {
			return simulator.Result{}, err
		}
		if b, need := burstChecks(l), needChecks(sc, factor); b < need {
			return simulator.Result{}, fmt.Errorf("scenario %s: at L = %g/s live and a %v interval a key's burst holds %g checks, "+
				"fewer than the %g its %d regions' shares need: lengthen the interval (at least %v) or raise L",
				sc.Name, opt.Limit*factor, opt.Interval, b, need, sc.Regions, defaultInterval(sc, opt, factors))
		}
	}

	cl, at, err := start(ctx, sc, opt, f)
	defer cl.close()
	if err != nil {
		return simulator.Result{}, err
	}
	p := newPlayer(sc, opt, f, cl)
	res, err := p.play(ctx, at)
	res.Description = strings.TrimSpace(res.Description + " " + scaling(sc, opt, f, cl, p.stats))
	return res, err
}

// defaultInterval is the live report interval of a run of sc at opt.Limit:
// a second per four daemons (rounded up), or the shortest whole number of
// seconds at which a key's burst at every factor of L holds needChecks
// before the policy rounds it (so that rounding does not stand in for the
// grain), whichever is longer. The burst grows in proportion to the
// interval.
//
// Every scenario's settle leaves 400 ms of scenario time between a
// delayed report's arrival and the rebalance, 40 ms live at 1 s, and the
// daemons' gossip work grows with their number and the compression. Ten
// daemons at 1 s (lossy-ten) kept a 2-core machine so busy that checks
// were answered 105-304 ms late (p99) and reports missed the rebalance;
// at 3 s they were answered within 6 ms and matched the virtual run.
func defaultInterval(sc simulator.Scenario, opt Options, factors []float64) time.Duration {
	daemons := sc.Regions * max(1, opt.NodesPerRegion)
	iv := time.Duration((daemons+3)/4) * time.Second
	for _, factor := range factors {
		// Checks in a key's burst per live second of interval: L·factor
		// times the burst's length in scenario seconds over the
		// scenario's interval (a quota's count in live units is the same
		// product with the count for the burst).
		units := sc.Limit.Burst
		if sc.Quota != nil {
			units = float64(sc.Quota.Limit)
		}
		perSec := opt.Limit * factor * units / sc.Limit.Rate / sc.Share.Interval.D().Seconds()
		if perSec <= 0 {
			continue
		}
		need := time.Duration(math.Ceil(needChecks(sc, factor)/perSec-1e-9)) * time.Second
		iv = max(iv, min(need, time.Hour))
	}
	return iv
}

// scaling says how a live run maps the scenario, for Result.Description.
func scaling(sc simulator.Scenario, opt Options, f float64, cl *cluster, st Stats) string {
	l, _ := liveLimit(sc, opt, f, 1)
	pace := fmt.Sprintf("time compressed %.3g×", 1/f)
	if f > 1 {
		pace = fmt.Sprintf("time slowed %.3g× (for a key's burst to hold enough checks)", f)
	}
	s := fmt.Sprintf("[live: %d daemon(s) per region on loopback, %s store, real memberlist and HTTP; %s: "+
		"report interval %v live for %v, %v of scenario time in %v; L = %g/s live, %.3g live arrivals per scenario unit",
		opt.NodesPerRegion, opt.Store, pace, opt.Interval, sc.Share.Interval.D(), sc.Duration.D(),
		time.Duration(float64(sc.Duration)*f).Round(time.Millisecond), opt.Limit, liveUnits(sc, opt, f))
	if sc.Quota != nil {
		s += fmt.Sprintf("; quota %g per %v live", l.Count, l.Window)
	}
	c := cl.net.Counts()
	s += fmt.Sprintf("; faults: %d packets and %d streams cut, %d streams lost, %d delayed", c.CutPackets, c.CutStreams, c.LostStreams, c.DelayedStreams)
	if miss, exp := cl.missingReports(); exp > 0 {
		s += fmt.Sprintf("; reports missing at rebalance: %.1f%%", 100*miss/exp)
	}
	s += fmt.Sprintf("; checks answered after their instant: p50 %v, p99 %v live (at most %v counts); %d unanswered, %d not sent]",
		st.LateP50.Round(100*time.Microsecond), st.LateP99.Round(100*time.Microsecond), st.MaxLate, st.Errors, st.Dropped)
	return s
}

// stepFactors are the factors of sc's limit steps in time order.
func stepFactors(sc simulator.Scenario) []float64 {
	var out []float64
	for _, st := range sortedSteps(sc) {
		out = append(out, st.Factor)
	}
	return out
}

// sortedSteps are sc's limit steps in time order.
func sortedSteps(sc simulator.Scenario) []simulator.LimitStep {
	st := slices.Clone(sc.LimitSteps)
	slices.SortStableFunc(st, func(a, b simulator.LimitStep) int { return cmp.Compare(a.At, b.At) })
	return st
}

func regionName(i int) string { return fmt.Sprintf("r%d", i) }

func (cl *cluster) close() {
	cl.mu.Lock()
	all := cl.all
	cl.mu.Unlock()
	for _, n := range all {
		n.cancel()
	}
	for _, n := range all {
		select {
		case <-n.done:
		case <-time.After(5 * time.Second):
		}
	}
	for _, s := range cl.stops {
		s()
	}
}

// arrival is one scheduled check.
type arrival struct {
	at     time.Duration // scenario time
	region int
	key    int
}

type player struct {
	sc     simulator.Scenario
	opt    Options
	f      float64
	cl     *cluster
	rng    *mrand.Rand
	zipf   *mrand.Zipf
	client *http.Client
	subs   []string
	oracle []engine.State
	limits []limitAt // the live limit from each time on, first at 0
	m      *recorder
	stats  Stats
}

// limitAt is the live limit from scenario time at on.
type limitAt struct {
	at     time.Duration
	factor float64
	limit  engine.Limit
}

// crashed says whether region r's daemons have been stopped.
func (p *player) crashed(r int) bool { return p.cl.crashed[r].Load() }

func newPlayer(sc simulator.Scenario, opt Options, f float64, cl *cluster) *player {
	p := &player{sc: sc, opt: opt, f: f, cl: cl, rng: mrand.New(mrand.NewPCG(opt.Seed, 0x5eed)),
		client: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 128}}}
	if sc.Keys > 1 && sc.Zipf > 1 {
		p.zipf = mrand.NewZipf(p.rng, sc.Zipf, 1, uint64(sc.Keys-1))
	}
	for k := 0; k < sc.Keys; k++ {
		p.subs = append(p.subs, fmt.Sprintf("live-key-%d", k))
	}
	p.oracle = make([]engine.State, sc.Keys)
	// The oracle decides the daemons' policy (liveLimit, validated by Run)
	// at each arrival's scheduled instant on the live clock, and follows
	// the limit steps at their scenario times, as the simulator's does.
	l, _ := liveLimit(sc, opt, f, 1)
	p.limits = []limitAt{{limit: l, factor: 1}}
	for _, st := range sortedSteps(sc) {
		l, _ := liveLimit(sc, opt, f, st.Factor)
		p.limits = append(p.limits, limitAt{at: st.At.D(), factor: st.Factor, limit: l})
	}
	ls := make([]limitRate, len(p.limits))
	for i, x := range p.limits {
		ls[i] = limitRate{at: x.at, lsec: perSec(x.limit) * f}
		if sc.Quota != nil {
			// L is the unit of Traffic.Rate, as in the simulator.
			ls[i].lsec = opt.Limit * x.factor * f
		}
	}
	rsc := sc
	if sc.Quota != nil {
		// Errors are fractions of the quota, here in live units.
		q := *sc.Quota
		q.Limit = uint64(l.Count)
		rsc.Quota = &q
	}
	p.m = newRecorder(rsc, f, ls)
	return p
}

// event is a fault at a scenario time.
type event struct {
	at      time.Duration
	region  int
	crash   bool // else a restart when region ≥ 0, else a partition change
	restart bool
}

// events are sc's crashes, restarts and partition starts and ends, in time
// order.
func events(sc simulator.Scenario) []event {
	var ev []event
	for _, c := range sc.Gossip.Crashes {
		ev = append(ev, event{at: c.At.D(), region: c.Region, crash: true})
		if c.Restart > c.At {
			ev = append(ev, event{at: c.Restart.D(), region: c.Region, restart: true})
		}
	}
	for _, pt := range sc.Gossip.Partitions {
		ev = append(ev, event{at: pt.Start.D(), region: -1}, event{at: pt.End.D(), region: -1})
	}
	slices.SortStableFunc(ev, func(a, b event) int { return cmp.Compare(a.at, b.at) })
	return ev
}

// play generates arrivals in scenario-time order on the live clock, decides
// each at the oracle and sends it to a daemon of its region, until the
// scenario's end; then it waits for the answers and computes the result.
func (p *player) play(ctx context.Context, at time.Time) (simulator.Result, error) {
	sc := p.sc
	total := sc.Duration.D()
	// Start at the planned instant (start), or, if forming the cluster
	// took too long, at a later one that is as aligned: an interval
	// boundary, and a quota window boundary on the daemons' clocks.
	step := p.opt.Interval
	if sc.Quota != nil {
		step = p.limits[0].limit.Window
	}
	start := at
	for time.Until(start) < p.opt.Interval/2 {
		start = start.Add(step)
	}
	if start.Sub(at) > p.opt.Interval {
		p.opt.Logger.Warn("live: the cluster formed late; the run starts at the next aligned instant", "wait", time.Until(start).Round(time.Millisecond))
	}
	live := func(t time.Duration) time.Time { return start.Add(time.Duration(float64(t) * p.f)) }
	// The oracle's clock is the daemons' without skew.
	oracleAt := func(t time.Duration) time.Time { return live(t).Add(p.cl.base) }

	type job struct {
		a   arrival
		ok  bool // oracle
		sub string
	}
	work := make([][]chan job, sc.Regions)
	var wg sync.WaitGroup
	for r := range work {
		for i := range p.opt.NodesPerRegion {
			ch := make(chan job, 1024)
			work[r] = append(work[r], ch)
			for range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for j := range ch {
						// The region's i-th daemon of the moment: a
						// restart replaces it.
						allowed, err := p.check(ctx, p.cl.node(r, i).addr, j.sub)
						p.m.arrival(j.a, j.ok, allowed, err, time.Since(live(j.a.at)))
					}
				}()
			}
		}
	}
	stopShares := p.m.sampleShares(ctx, p.cl, start, p.subs[0])
	steps := p.stepLimits(ctx, live)

	// Next arrival per region: exponential (Poisson) or even gaps in
	// scenario time at rate·L_scenario, re-evaluated as rates change.
	rates := make([]float64, sc.Regions)
	next := make([]time.Duration, sc.Regions)
	rr := make([]int, sc.Regions)
	gap := func(r int, t time.Duration) time.Duration {
		p.sc.Traffic.Rates(t, p.crashed, rates)
		lam := rates[r] * p.opt.Limit * p.f // arrivals per scenario second
		if lam <= 0 {
			return 100 * time.Millisecond // look again later
		}
		mean := 1 / lam
		if sc.Traffic.Poisson {
			return time.Duration(p.rng.ExpFloat64() * mean * float64(time.Second))
		}
		return time.Duration(mean * float64(time.Second))
	}
	for r := range next {
		next[r] = gap(r, 0)
	}
	evs, ei := events(sc), 0
	var restarts sync.WaitGroup
	var restartErr atomic.Pointer[error]
	lastProgress := time.Now()
	li := 0 // p.limits[li] is in force
	for {
		r := 0
		for i := range next {
			if next[i] < next[r] {
				r = i
			}
		}
		t := next[r]
		if t >= total {
			break
		}
		for ; ei < len(evs) && evs[ei].at <= t; ei++ {
			switch e := evs[ei]; {
			case e.crash:
				p.cl.crash(e.region)
			case e.restart:
				// Off the arrival loop: starting daemons takes a while,
				// and the region takes traffic again once they serve.
				restarts.Go(func() {
					if err := p.cl.restart(ctx, e.region); err != nil {
						restartErr.CompareAndSwap(nil, &err)
					}
				})
			default:
				p.cl.partition(e.at)
			}
		}
		if d := time.Until(live(t)); d > 0 {
			select {
			case <-ctx.Done():
				stopShares()
				return simulator.Result{}, ctx.Err()
			case <-time.After(d):
			}
		}
		if p.opt.Progress != nil && time.Since(lastProgress) >= time.Second {
			p.opt.Progress(t, total)
			lastProgress = time.Now()
		}
		p.sc.Traffic.Rates(t, p.crashed, rates)
		if rates[r] > 0 && !p.cl.crashed[r].Load() {
			k := 0
			if sc.Keys > 1 {
				if p.zipf != nil {
					k = int(p.zipf.Uint64())
				} else {
					k = p.rng.IntN(sc.Keys)
				}
			}
			a := arrival{at: t, region: r, key: k}
			for li+1 < len(p.limits) && p.limits[li+1].at <= t {
				li++
			}
			var res engine.Result
			p.oracle[k], res = engine.Decide(oracleAt(t), p.oracle[k], p.limits[li].limit, 1)
			ch := work[r][rr[r]%len(work[r])]
			rr[r]++
			select {
			case ch <- job{a: a, ok: res.Allowed, sub: p.subs[k]}:
			default:
				p.m.dropped() // the daemon cannot keep up; counted, not queued
			}
		}
		next[r] = t + gap(r, t)
	}
	for r := range work {
		for _, ch := range work[r] {
			close(ch)
		}
	}
	wg.Wait()
	restarts.Wait()
	stopShares()
	stepErr := steps()
	if e := restartErr.Load(); e != nil && stepErr == nil {
		stepErr = fmt.Errorf("live: restart: %w", *e)
	}
	res := p.m.result()
	p.m.mu.Lock()
	errs, drops, offered, firstErr := p.m.errs, p.m.drops, p.m.checks/2, p.m.firstErr
	st := Stats{Errors: errs, Dropped: drops, Offered: offered, MaxLate: p.maxLate()}
	st.LateP50, st.LateP99 = p.m.lateness()
	p.m.mu.Unlock()
	if p.opt.Stats != nil {
		*p.opt.Stats = st
	}
	p.stats = st
	if stepErr != nil {
		return res, stepErr
	}
	if bad := errs + drops; bad > 0 {
		p.opt.Logger.Warn("live: checks not answered", "errors", errs, "dropped", drops, "of", offered+drops, "first_error", firstErr)
		switch all := 0.02 * float64(offered+drops); {
		case float64(drops) > all:
			return res, fmt.Errorf("%w: %d of %d checks not sent (a daemon's queue was full); lower Options.Limit", ErrBehind, drops, offered+drops)
		case float64(bad) > all && len(sc.Gossip.Crashes) == 0:
			return res, fmt.Errorf("live: %d of %d checks failed or were dropped (first error: %v)", bad, offered+drops, firstErr)
		}
	}
	if st.LateP99 > st.MaxLate {
		return res, fmt.Errorf("%w: checks were answered up to %v (p99) after their instants, more than %v (half a burst of L, live): "+
			"they reached the daemons bunched, and the figures measure the machine", ErrBehind,
			st.LateP99.Round(time.Millisecond), st.MaxLate)
	}
	return res, nil
}

// maxLate is Stats.MaxLate: half the live time in which L fills a key's
// burst (one second of L, 100 ms live, at the default compression gives
// 50 ms). Checks that reach the daemons later than that bunch by more
// than their buckets absorb, and they reject what the oracle, deciding at
// each scheduled instant, admits.
func (p *player) maxLate() time.Duration {
	secs := p.f * p.sc.Limit.Burst / p.sc.Limit.Rate / 2
	return time.Duration(secs * float64(time.Second))
}

// stepLimits changes the global policy's limit at each limit step's live
// time through the admin API of one daemon (the first of the first region
// not crashed); policy sync carries it to the others, so every other
// daemon enforces the new limit a gossip delay later (logged, per step, as
// the time until every daemon held it). The returned wait stops what has
// not happened yet and reports the first failed change.
func (p *player) stepLimits(ctx context.Context, live func(time.Duration) time.Time) (wait func() error) {
	if len(p.limits) < 2 {
		return func() error { return nil }
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		var first error
		for _, x := range p.limits[1:] {
			select {
			case <-ctx.Done():
				done <- first
				return
			case <-time.After(time.Until(live(x.at))):
			}
			if err := p.putLimit(ctx, x); err != nil && first == nil && ctx.Err() == nil {
				first = err
			}
		}
		done <- first
	}()
	return func() error {
		cancel()
		return <-done
	}
}

// putLimit puts the policy of x through one daemon and waits (at most one
// report interval) until every running daemon holds it.
func (p *player) putLimit(ctx context.Context, x limitAt) error {
	var via *node
	for r := range p.sc.Regions {
		if n := p.cl.node(r, 0); !p.crashed(r) && n != nil {
			via = n
			break
		}
	}
	if via == nil {
		return nil // every region is down: nobody to tell
	}
	body, err := json.Marshal(livePolicy(x.limit))
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, "http://"+via.addr+"/v1/policies/"+policyID, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+p.cl.token)
	sent := time.Now()
	res, err := p.client.Do(req)
	if err != nil {
		return fmt.Errorf("live: limit step at %v: %w", x.at, err)
	}
	msg, _ := io.ReadAll(io.LimitReader(res.Body, 4<<10))
	res.Body.Close()
	if res.StatusCode != http.StatusOK && res.StatusCode != http.StatusCreated {
		return fmt.Errorf("live: limit step at %v: PUT /v1/policies/%s = %d %s", x.at, policyID, res.StatusCode, msg)
	}
	want := livePolicy(x.limit).Limit()
	deadline := time.Now().Add(p.opt.Interval)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		all := true
		for r := range p.sc.Regions {
			for i := range p.opt.NodesPerRegion {
				n := p.cl.node(r, i)
				if got, ok := n.d.Registry().Get(policyID); !p.crashed(r) && (!ok || got.Limit() != want) {
					all = false
				}
			}
		}
		if all {
			p.opt.Logger.Info("live: limit step", "at", x.at, "factor", x.factor, "limit_per_s", perSec(x.limit),
				"via", regionName(via.region), "every_daemon_after", time.Since(sent))
			return nil
		}
		if time.Now().After(deadline) {
			p.opt.Logger.Warn("live: limit step not yet on every daemon", "at", x.at, "after", time.Since(sent))
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func (p *player) check(ctx context.Context, addr, subject string) (bool, error) {
	body := fmt.Sprintf(`{"subject":%q,"route":"/live"}`, subject)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/check", strings.NewReader(body))
	if err != nil {
		return false, err
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := p.client.Do(req)
	if err != nil {
		return false, err
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	switch res.StatusCode {
	case http.StatusOK:
		return true, nil
	case http.StatusTooManyRequests:
		return false, nil
	}
	return false, fmt.Errorf("check: HTTP %d", res.StatusCode)
}
