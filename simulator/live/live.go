// Package live runs a simulator.Scenario against real daemons: one or more
// `sluice serve` daemons per region (the region package, in process) on
// loopback, joined by real memberlist gossip, each region on the embedded
// memory store or its own redis-server, with every arrival a real HTTP
// check. Time is compressed: the scenario's report interval (10 s by
// default) becomes Options.Interval (1 s), and every scenario time (duration,
// steps, warm-up, windows) is scaled by the same factor, so a 300 s scenario
// runs in 30 s. Rates are scaled too: the scenario's multiples of L apply to
// Options.Limit, the live L_global.
//
// The result has the shape of the virtual-time simulator's
// (simulator.Result, same JSON), with times and durations reported in
// scenario time, so the two can be compared field by field. The oracle is
// engine.Decide on the same arrivals at the full limit, as in the simulator.
//
// Supported: splits, steps, Poisson or even arrivals, bursts, diurnal
// rotation, several keys (uniform or Zipf), crashes (the region's daemons are
// stopped without a graceful leave), every share-enforced algorithm
// (token_bucket, leaky_bucket, sliding_window_log within its maximum count,
// sliding_window_counter; see liveLimit) and limit steps (PUT through one
// daemon's admin API at the step's time; the other daemons enforce the new
// limit once policy sync has carried it to them, a gossip delay later).
// Not supported live: partitions, clock skew, injected delay and loss,
// quotas, a global fixed_window (the daemons enforce it as a quota) and
// crash restarts (Run says so).
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
	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/region"
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
	// Interval is the live report interval (default 1 s); the scenario's
	// interval maps onto it.
	Interval time.Duration
	// Limit is the live L_global in units per second (default 1000, the
	// simulator's own L). The allocation estimates each region's rate from
	// the arrivals of one interval and of its last fifth; at 1 s intervals a
	// smaller L leaves a small region a handful of arrivals per estimate,
	// and the Poisson noise, not the algorithm, dominates the error
	// (steady-uneven, global_error_p99_pct: 0.07% virtual; live 3.0% at
	// L = 200 and 0.3% at 1000). Offered load is Traffic.Rate·Limit checks
	// per second.
	Limit float64
	// Logger receives the daemons' logs (default: discarded).
	Logger *slog.Logger
	// Progress, if set, is called about once per live second with the
	// scenario time done and the total.
	Progress func(done, total time.Duration)
}

const policyID = "live-global"

func (o Options) withDefaults() Options {
	if o.Store == "" {
		o.Store = "memory"
	}
	if o.NodesPerRegion <= 0 {
		o.NodesPerRegion = 1
	}
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.Limit <= 0 {
		o.Limit = 1000
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
	if len(sc.Gossip.Partitions) > 0 {
		bad = append(bad, "partitions")
	}
	if sc.Gossip.Skew > 0 || sc.Gossip.Loss > 0 {
		bad = append(bad, "clock skew and loss")
	}
	if sc.Quota != nil {
		bad = append(bad, "quotas")
	}
	if alg != "" {
		a, err := engine.ParseAlgorithm(alg)
		switch {
		case err != nil:
			return fmt.Errorf("scenario %s: %w", sc.Name, err)
		case a == engine.FixedWindow:
			// The daemons enforce a scope-global fixed_window as a global
			// quota (G-counter), not by shares: that is a quota.
			bad = append(bad, "algorithm fixed_window (a global fixed window is a quota to the daemons)")
		}
	}
	for _, c := range sc.Gossip.Crashes {
		if c.Restart > 0 {
			bad = append(bad, "crash restarts")
			break
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
// Only the count follows a step; the window stays.
func liveLimit(sc simulator.Scenario, opt Options, f, factor float64) (engine.Limit, error) {
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
	addr   string
	cancel context.CancelFunc
	done   chan error
}

type cluster struct {
	nodes   [][]*node // by region
	stops   []func()
	crashed []atomic.Bool
	token   string // the daemons' admin token
}

// Run plays sc against live daemons and returns its metrics.
func Run(ctx context.Context, sc simulator.Scenario, opt Options) (simulator.Result, error) {
	opt = opt.withDefaults()
	if err := Validate(sc); err != nil {
		return simulator.Result{}, err
	}
	sc = withDefaults(sc)
	f := float64(opt.Interval) / float64(sc.Share.Interval.D()) // live seconds per scenario second
	// Every limit the run will enforce must be valid (a sliding window
	// log's count within its maximum) before any daemon starts.
	for _, factor := range append([]float64{1}, stepFactors(sc)...) {
		if _, err := liveLimit(sc, opt, f, factor); err != nil {
			return simulator.Result{}, err
		}
	}

	cl, err := start(ctx, sc, opt, f)
	defer cl.close()
	if err != nil {
		return simulator.Result{}, err
	}
	p := newPlayer(sc, opt, f, cl)
	return p.play(ctx)
}

// withDefaults fills what the simulator fills (simulator.Scenario's
// documented defaults).
func withDefaults(sc simulator.Scenario) simulator.Scenario {
	if sc.Keys == 0 {
		sc.Keys = 1
	}
	if sc.Limit.Burst == 0 {
		sc.Limit.Burst = sc.Limit.Rate
	}
	if sc.Share.Interval == 0 {
		sc.Share.Interval = simulator.Duration(10 * time.Second)
	}
	if sc.Warmup == 0 {
		sc.Warmup = 2 * sc.Share.Interval
	}
	return sc
}

func start(ctx context.Context, sc simulator.Scenario, opt Options, f float64) (*cluster, error) {
	cl := &cluster{nodes: make([][]*node, sc.Regions), crashed: make([]atomic.Bool, sc.Regions)}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return cl, err
	}
	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return cl, err
	}
	cl.token = hex.EncodeToString(tok)
	// The live policy: L_live, with the scenario's burst in its own
	// seconds of L, compressed like time (liveLimit).
	l, err := liveLimit(sc, opt, f, 1)
	if err != nil {
		return cl, err
	}
	pol := livePolicy(l)
	sh := region.ShareConfig(opt.Interval)
	if sc.Share.Pressure != 0 {
		sh.Pressure = sc.Share.Pressure
	}
	if sc.Share.NoBorrow {
		sh.BorrowEvery = 0
	}
	if sc.Share.LendFraction != 0 {
		sh.LendFraction = sc.Share.LendFraction
	}
	var seed string
	for r := 0; r < sc.Regions; r++ {
		store := "memory"
		if opt.Store == "redis" {
			srv, err := startRedis(ctx)
			if err != nil {
				return cl, err
			}
			cl.stops = append(cl.stops, srv.stop)
			store = "redis://" + srv.addr
		} else if opt.Store != "memory" {
			return cl, fmt.Errorf("live store %q: want memory or redis", opt.Store)
		}
		for i := 0; i < opt.NodesPerRegion; i++ {
			cfg := region.DefaultConfig()
			cfg.Listen = "127.0.0.1:0"
			cfg.Store = store
			cfg.StoreTimeout = 200 * time.Millisecond
			cfg.Policies = []quota.Policy{pol}
			cfg.AdminToken = cl.token // limit steps go through the admin API
			cfg.ShutdownTimeout = 2 * time.Second
			cfg.Gossip = &region.GossipConfig{Region: regionName(r), Node: fmt.Sprintf("%s-n%d", regionName(r), i),
				Listen: "127.0.0.1:0", Interval: opt.Interval, SecretKey: key, Preset: "local", Share: sh}
			if seed != "" {
				cfg.Gossip.Join = []string{seed}
			}
			reg := prometheus.NewRegistry()
			d, err := region.New(ctx, cfg, opt.Logger.With("node", cfg.Gossip.Node), reg, reg)
			if err != nil {
				return cl, fmt.Errorf("daemon %s: %w", cfg.Gossip.Node, err)
			}
			if seed == "" {
				seed = d.Gossip().Addr()
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return cl, err
			}
			nctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
			n := &node{region: r, d: d, addr: ln.Addr().String(), cancel: cancel, done: make(chan error, 1)}
			go func() { n.done <- d.Serve(nctx, ln, nil) }()
			cl.nodes[r] = append(cl.nodes[r], n)
		}
	}
	// Wait until every node sees every other.
	want := sc.Regions * opt.NodesPerRegion
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok := true
		for _, ns := range cl.nodes {
			for _, n := range ns {
				if n.d.Gossip().NumLive() != want {
					ok = false
				}
			}
		}
		if ok {
			return cl, nil
		}
		if time.Now().After(deadline) {
			return cl, errors.New("live: the daemons did not form one cluster within 30 s")
		}
		select {
		case <-ctx.Done():
			return cl, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
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

// crash stops region r's daemons abruptly: no graceful leave, as a crash.
func (cl *cluster) crash(r int) {
	if cl.crashed[r].Swap(true) {
		return
	}
	for _, n := range cl.nodes[r] {
		n.d.Gossip().Shutdown()
		n.cancel()
	}
}

func (cl *cluster) close() {
	for _, ns := range cl.nodes {
		for _, n := range ns {
			n.cancel()
		}
	}
	for _, ns := range cl.nodes {
		for _, n := range ns {
			select {
			case <-n.done:
			case <-time.After(5 * time.Second):
			}
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
	}
	p.m = newRecorder(sc, f, ls)
	return p
}

// play generates arrivals in scenario-time order on the live clock, decides
// each at the oracle and sends it to a daemon of its region, until the
// scenario's end; then it waits for the answers and computes the result.
func (p *player) play(ctx context.Context) (simulator.Result, error) {
	sc := p.sc
	total := sc.Duration.D()
	// Start on an epoch boundary of the live interval, as the simulator's
	// windows start on its epochs.
	now := time.Now()
	start := now.Truncate(p.opt.Interval).Add(p.opt.Interval)
	if start.Sub(now) < p.opt.Interval/2 {
		start = start.Add(p.opt.Interval)
	}
	live := func(t time.Duration) time.Time { return start.Add(time.Duration(float64(t) * p.f)) }

	type job struct {
		a   arrival
		ok  bool // oracle
		sub string
	}
	work := make([][]chan job, sc.Regions)
	var wg sync.WaitGroup
	for r := range work {
		for _, n := range p.cl.nodes[r] {
			ch := make(chan job, 1024)
			work[r] = append(work[r], ch)
			for range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for j := range ch {
						allowed, err := p.check(ctx, n.addr, j.sub)
						p.m.arrival(j.a, j.ok, allowed, err)
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
	crashes := sc.Gossip.Crashes
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
		for _, c := range crashes {
			if t >= c.At.D() && c.Region < sc.Regions && !p.cl.crashed[c.Region].Load() {
				p.cl.crash(c.Region)
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
			p.oracle[k], res = engine.Decide(live(t), p.oracle[k], p.limits[li].limit, 1)
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
	stopShares()
	stepErr := steps()
	res := p.m.result()
	p.m.mu.Lock()
	errs, drops, offered := p.m.errs, p.m.drops, p.m.checks/2
	p.m.mu.Unlock()
	if stepErr != nil {
		return res, stepErr
	}
	if bad := errs + drops; bad > 0 {
		p.opt.Logger.Warn("live: checks not answered", "errors", errs, "dropped", drops, "of", offered+drops)
		if float64(bad) > 0.02*float64(offered+drops) && len(sc.Gossip.Crashes) == 0 {
			return res, fmt.Errorf("live: %d of %d checks failed or were dropped: the machine cannot drive this load; lower Options.Limit", bad, offered+drops)
		}
	}
	return res, nil
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
	for r, ns := range p.cl.nodes {
		if !p.crashed(r) && len(ns) > 0 {
			via = ns[0]
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
		for r, ns := range p.cl.nodes {
			for _, n := range ns {
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
