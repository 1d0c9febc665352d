// Package limiter adds to an engine.Store what keeps a check fast and safe
// when the store misbehaves: a deadline on every store call, a circuit
// breaker per store shard, each policy's failure mode (open, local,
// closed), a cache of rejections, and the usage counts global shares are
// computed from.
package limiter

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sony/gobreaker/v2"
	"golang.org/x/time/rate"
)

// Source says who made a decision (engine.Source).
type Source = engine.Source

// The sources of a decision (engine.From*).
const (
	FromStore     = engine.FromStore
	FromDenyCache = engine.FromDenyCache
	FromFallback  = engine.FromFallback
)

// resetter is implemented by stores that can forget a subject's state.
type resetter interface {
	Reset(ctx context.Context, subject string, policies []string) error
}

// roundTripStore is implemented by stores that queue checks before they
// send them (the Redis store pipelines them): the deadline applies to the
// store's round trip alone, after the wait in the queue, and a check that
// waited past the queue's own bound fails with ErrStoreBusy.
type roundTripStore interface {
	CheckWithin(ctx context.Context, req engine.Request, roundTrip time.Duration) (engine.Decision, error)
}

// shardNamer is implemented by stores that spread subjects over several
// servers (Redis Cluster), so each server gets its own circuit breaker.
type shardNamer interface {
	Shard(ctx context.Context, subject string) string
}

// BreakerConfig configures the per-store (per-shard) circuit breaker.
type BreakerConfig struct {
	// FailureRatio opens the breaker when at least this share of calls in
	// Window failed. Default 0.5.
	FailureRatio float64
	// MinCalls is how many calls Window must hold before the ratio counts,
	// so two failures at startup do not open it. Default 20.
	MinCalls uint32
	// Window is the rolling period over which calls are counted. Default 10 s.
	Window time.Duration
	// OpenFor is how long the breaker stays open before it lets a probe
	// through (half-open). Default 5 s.
	OpenFor time.Duration
}

func (b BreakerConfig) withDefaults() BreakerConfig {
	if b.FailureRatio <= 0 {
		b.FailureRatio = 0.5
	}
	if b.MinCalls == 0 {
		b.MinCalls = 20
	}
	if b.Window <= 0 {
		b.Window = 10 * time.Second
	}
	if b.OpenFor <= 0 {
		b.OpenFor = 5 * time.Second
	}
	return b
}

// Config configures a Limiter.
type Config struct {
	// Store decides normally. Nil means an in-process MemoryStore, which
	// cannot fail, so nothing below applies.
	Store engine.Store
	// Clock supplies time; nil means real time.
	Clock engine.Clock
	// Timeout bounds every store call. Default 5 ms: a slow store costs at
	// most this, never a client library's default seconds. For a store
	// that queues its calls (Redis) it bounds the round trip from the
	// moment a check is sent; the wait in the queue has its own, larger
	// bound (redisstore.Config.QueueWait), so that a daemon under load slows
	// down rather than deciding without the store.
	Timeout time.Duration
	// Breaker opens per store (per shard) on sustained errors.
	Breaker BreakerConfig
	// OpenFactor multiplies a FailOpen policy's limit for the in-process
	// fallback. Default 2.
	OpenFactor float64
	// Daemons returns how many daemons share a FailLocal policy's limit
	// (live members, or configured). Nil or < 1 means 1.
	Daemons func() int
	// DenyCacheSize bounds the remembered rejections. Default 100 000;
	// negative disables the cache.
	DenyCacheSize int
	// FallbackMaxKeys bounds the fallback store. Default 1 000 000.
	FallbackMaxKeys int
	// Logger receives degraded-mode warnings, at most one per second per
	// reason. Nil discards them.
	Logger *slog.Logger
	// OnStoreCall, if set, is told of every call that reached a store
	// that is not in process (not those an open breaker refused): the
	// shard it went to (the breaker's name), how long it took in real
	// time, and its error. It runs on the check path and must
	// return at once, without I/O (observe a histogram, bump a counter).
	OnStoreCall func(shard string, took time.Duration, err error)
}

// Limiter is what a daemon asks: it adds to a Store the things that keep a
// check fast and safe — a deadline on every store call, a circuit breaker,
// a per-policy answer when the store fails, a cache of rejections that
// saves store calls for subjects hammering past their limit, and the usage
// counts that global shares are computed from.
type Limiter struct {
	cfg      Config
	clock    engine.Clock
	store    engine.Store
	fallback *engine.MemoryStore
	deny     *denyCache
	usage    *usageTracker
	seed     maphash.Seed

	mu       sync.Mutex
	breakers map[string]*gobreaker.CircuitBreaker[engine.Decision]
	logs     map[string]*rate.Sometimes

	storeCalls   atomic.Uint64
	storeErrors  atomic.Uint64
	storeBusy    atomic.Uint64
	denyHits     atomic.Uint64
	degraded     atomic.Uint64
	breakerOpens atomic.Uint64

	chargeErrors   atomic.Uint64
	chargesDropped atomic.Uint64

	// leases is nil for a store in process, which a lease would only slow.
	leases *leaseTable
	lc     leaseCounters
}

// New returns a Limiter over cfg.Store.
func New(cfg Config) *Limiter {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Millisecond
	}
	if cfg.OpenFactor <= 0 {
		cfg.OpenFactor = 2
	}
	if cfg.DenyCacheSize == 0 {
		cfg.DenyCacheSize = 100_000
	}
	if cfg.FallbackMaxKeys <= 0 {
		cfg.FallbackMaxKeys = 1_000_000
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.Breaker = cfg.Breaker.withDefaults()
	l := &Limiter{
		cfg:      cfg,
		clock:    engine.ClockOrReal(cfg.Clock),
		store:    cfg.Store,
		seed:     maphash.MakeSeed(),
		breakers: make(map[string]*gobreaker.CircuitBreaker[engine.Decision]),
		logs:     make(map[string]*rate.Sometimes),
		usage:    newUsageTracker(),
	}
	if l.store == nil {
		l.store = engine.NewMemoryStore(engine.MemoryConfig{Clock: cfg.Clock})
	}
	if _, inProcess := l.store.(*engine.MemoryStore); !inProcess {
		l.fallback = engine.NewMemoryStore(engine.MemoryConfig{Clock: cfg.Clock, MaxKeys: cfg.FallbackMaxKeys})
		if cfg.DenyCacheSize > 0 {
			l.deny = newDenyCache(cfg.DenyCacheSize)
		}
		l.leases = &leaseTable{m: make(map[leaseKey]*lease)}
	}
	return l
}

// Outcome is a Decision with how it was reached (engine.Outcome).
type Outcome = engine.Outcome

// Check decides req. It returns an error only for a request no store could
// decide (ErrBadRequest); a failing store yields a degraded Outcome.
func (l *Limiter) Check(ctx context.Context, req engine.Request) (Outcome, error) {
	if err := req.Validate(); err != nil {
		return Outcome{Decision: engine.Decision{Decider: -1}}, err
	}
	now := l.clock.Now()
	if req.Checks[0].Deposit {
		return l.deposit(ctx, req)
	}
	if req.Checks[0].Lease > 0 && len(req.Checks) == 1 && l.leases != nil {
		return l.checkLeased(ctx, req, now)
	}
	return l.direct(ctx, req, now)
}

// storeFailed answers req whose store call failed with err: the caller's
// own error if it left, else req's policies' answer without the store.
func (l *Limiter) storeFailed(ctx context.Context, req engine.Request, err error) (Outcome, error) {
	if ctx.Err() != nil {
		return Outcome{Decision: engine.Decision{Decider: -1}}, ctx.Err()
	}
	out := l.degrade(ctx, req, err)
	l.track(req, out.Decision)
	return out, nil
}

// direct decides req through the deny cache and the store.
func (l *Limiter) direct(ctx context.Context, req engine.Request, now time.Time) (Outcome, error) {
	var fp uint64
	var probe chan struct{}
	if l.deny != nil {
		fp = l.fingerprint(req)
		for {
			d, ok, wait, p := l.deny.get(req.Subject, fp, now)
			if ok {
				l.denyHits.Add(1)
				l.track(req, d.Decision)
				return Outcome{Decision: d.Decision, Source: FromDenyCache}, nil
			}
			if wait == nil {
				probe = p
				break
			}
			// Another check of the same rejection, whose time is up,
			// is asking the store: its answer is this one's too if
			// the subject is still refused.
			select {
			case <-wait:
				now = l.clock.Now()
			case <-ctx.Done():
				return Outcome{Decision: engine.Decision{Decider: -1}}, ctx.Err()
			}
		}
	}
	d, err := l.callStore(ctx, req)
	if err == nil && !d.Allowed && l.deny != nil {
		if retry := d.RetryAfter(); retry > 0 {
			l.deny.put(req.Subject, fp, now.Add(retry), d, now)
		}
	}
	if probe != nil {
		l.deny.settle(req.Subject, fp, probe, err == nil && d.Allowed && exhausted(d))
	}
	if err != nil {
		return l.storeFailed(ctx, req, err)
	}
	l.track(req, d)
	return Outcome{Decision: d, Source: FromStore}, nil
}

// deposit runs a deposit (Check.Deposit): always through the store, never
// tracked, and a store that cannot decide deposits nothing whatever the
// policy's failure mode (the outcome is then degraded and not allowed).
// A deposit ends the subject's remembered rejections: its next check must
// see the tokens.
func (l *Limiter) deposit(ctx context.Context, req engine.Request) (Outcome, error) {
	d, err := l.callStore(ctx, req)
	if err != nil {
		if ctx.Err() != nil {
			return Outcome{Decision: engine.Decision{Decider: -1}}, ctx.Err()
		}
		return Outcome{Decision: engine.Decision{Decider: -1, N: d.N}, Degraded: true, Err: err}, nil
	}
	if l.deny != nil {
		l.deny.forget(req.Subject)
	}
	return Outcome{Decision: d, Source: FromStore}, nil
}

// callStore runs one store call under the deadline and the breaker.
func (l *Limiter) callStore(ctx context.Context, req engine.Request) (engine.Decision, error) {
	if _, inProcess := l.store.(*engine.MemoryStore); inProcess {
		return l.store.Check(ctx, req)
	}
	cb := l.breaker(ctx, req.Subject)
	l.storeCalls.Add(1)
	call := func() (engine.Decision, error) { return l.withDeadline(ctx, req) }
	if rs, ok := l.store.(roundTripStore); ok {
		call = func() (engine.Decision, error) { return rs.CheckWithin(ctx, req, l.cfg.Timeout) }
	}
	var start time.Time
	if l.cfg.OnStoreCall != nil {
		start = time.Now()
	}
	d, err := cb.Execute(call)
	if l.cfg.OnStoreCall != nil && !errors.Is(err, gobreaker.ErrOpenState) && !errors.Is(err, gobreaker.ErrTooManyRequests) {
		l.cfg.OnStoreCall(cb.Name(), time.Since(start), err)
	}
	switch {
	case err == nil:
	case errors.Is(err, engine.ErrStoreBusy):
		l.storeBusy.Add(1)
	default:
		l.storeErrors.Add(1)
	}
	return d, err
}

type storeAnswer struct {
	d   engine.Decision
	err error
}

// withDeadline runs one store call and returns by the deadline whatever
// the store does. A context deadline alone is not enough: a client library
// may dial, or handshake with a stalled server, on its own timeouts (seen
// with go-redis against a paused Redis: a quarter of a second). The late
// call finishes in the background and its answer is dropped; its spend, if
// any, is the same as that of a reply lost on the network.
func (l *Limiter) withDeadline(ctx context.Context, req engine.Request) (engine.Decision, error) {
	cctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	ch := make(chan storeAnswer, 1)
	go func() {
		defer cancel()
		d, err := l.store.Check(cctx, req)
		ch <- storeAnswer{d, err}
	}()
	timer := time.NewTimer(l.cfg.Timeout)
	defer timer.Stop()
	select {
	case a := <-ch:
		return a.d, a.err
	case <-timer.C:
		return engine.Decision{Decider: -1}, engine.ErrDeadline
	case <-ctx.Done():
		return engine.Decision{Decider: -1}, ctx.Err()
	}
}

func (l *Limiter) breaker(ctx context.Context, subject string) *gobreaker.CircuitBreaker[engine.Decision] {
	name := "store"
	if s, ok := l.store.(shardNamer); ok {
		name = s.Shard(ctx, subject)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if cb, ok := l.breakers[name]; ok {
		return cb
	}
	bc := l.cfg.Breaker
	cb := gobreaker.NewCircuitBreaker[engine.Decision](gobreaker.Settings{
		Name:         name,
		MaxRequests:  1,
		Interval:     bc.Window,
		BucketPeriod: bc.Window / 10,
		Timeout:      bc.OpenFor,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			return c.Requests >= bc.MinCalls && float64(c.TotalFailures) >= bc.FailureRatio*float64(c.Requests)
		},
		// A caller that gave up is not the store's fault, nor is a check
		// that waited too long in the daemon's own queue: overload.
		IsExcluded: func(err error) bool {
			return errors.Is(err, context.Canceled) || errors.Is(err, engine.ErrBadRequest) || errors.Is(err, engine.ErrStoreBusy)
		},
		OnStateChange: func(name string, from, to gobreaker.State) {
			if to == gobreaker.StateOpen {
				l.breakerOpens.Add(1)
			}
			l.cfg.Logger.Warn("store circuit breaker", "shard", name, "from", from.String(), "to", to.String())
		},
	})
	l.breakers[name] = cb
	return cb
}

// degrade decides without the store: each policy by its failure mode.
func (l *Limiter) degrade(ctx context.Context, req engine.Request, cause error) Outcome {
	l.degraded.Add(1)
	reason := "store_error"
	if errors.Is(cause, gobreaker.ErrOpenState) || errors.Is(cause, gobreaker.ErrTooManyRequests) {
		reason = "breaker_open"
	} else if errors.Is(cause, engine.ErrStoreBusy) {
		reason = "store_busy"
	} else if errors.Is(cause, context.DeadlineExceeded) {
		reason = "store_timeout"
	}
	l.logSometimes(reason, cause)

	out := Outcome{Source: FromFallback, Degraded: true, Err: cause}
	var local [engine.MaxChecks]engine.Check
	var where [engine.MaxChecks]int
	n := 0
	closed := -1
	daemons := 1
	if l.cfg.Daemons != nil {
		daemons = max(l.cfg.Daemons(), 1)
	}
	for i, c := range req.Checks {
		switch c.OnFailure {
		case engine.FailClosed:
			if closed < 0 {
				closed = i
			}
			continue
		case engine.FailLocal:
			c.Limit = multiply(c.Effective(), 1/float64(daemons))
		default:
			c.Limit = multiply(c.Effective(), l.cfg.OpenFactor)
		}
		c.Scale = 0
		local[n], where[n] = c, i
		n++
	}
	d := engine.Decision{N: len(req.Checks), Decider: -1}
	if n > 0 {
		fd, err := l.fallback.Check(ctx, engine.Request{Subject: req.Subject, Checks: local[:n]})
		if err != nil { // cannot happen for a validated request; stay safe
			fd = engine.Decision{Decider: -1}
		}
		for j := 0; j < n; j++ {
			d.Results[where[j]] = fd.Results[j]
		}
	}
	if closed >= 0 {
		for i, c := range req.Checks {
			if c.OnFailure == engine.FailClosed {
				d.Results[i] = engine.Result{Limit: c.Effective().CapacityUnits(), RetryAfter: l.cfg.Breaker.OpenFor}
			}
		}
		out.Unavailable = true
	}
	d.Finish(req.Checks)
	out.Decision = d
	return out
}

// multiply scales a limit by f, which may exceed one (unlike Scale).
func multiply(l engine.Limit, f float64) engine.Limit {
	l.Rate *= f
	l.Burst = math.Max(1, l.Burst*f)
	l.Count = math.Max(1, l.Count*f)
	if l.Algorithm == engine.SlidingWindowLog {
		l.Count = math.Min(l.Count, float64(l.MaxLogCount()))
	}
	return l
}

func (l *Limiter) logSometimes(reason string, err error) {
	l.mu.Lock()
	s, ok := l.logs[reason]
	if !ok {
		s = &rate.Sometimes{Interval: time.Second}
		l.logs[reason] = s
	}
	l.mu.Unlock()
	s.Do(func() {
		l.cfg.Logger.Warn("deciding without the store", "reason", reason, "err", err)
	})
}

// fingerprint identifies what a rejection was computed from: the policies,
// their versions, scales and costs. A raised limit is a new version, so a
// remembered rejection never outlives the limit it was made under.
func (l *Limiter) fingerprint(req engine.Request) uint64 {
	var h maphash.Hash
	h.SetSeed(l.seed)
	var b [8]byte
	put := func(v uint64) {
		for i := range b {
			b[i] = byte(v >> (8 * i))
		}
		h.Write(b[:])
	}
	for i := range req.Checks {
		c := &req.Checks[i]
		h.WriteString(c.Policy)
		h.WriteByte(0)
		put(c.Version)
		put(math.Float64bits(c.Scale))
		put(uint64(c.Cost))
		put(math.Float64bits(c.Limit.Rate) ^ math.Float64bits(c.Limit.Burst)<<1 ^ math.Float64bits(c.Limit.Count)<<2 ^ uint64(c.Limit.Window))
	}
	return h.Sum64()
}

func (l *Limiter) track(req engine.Request, d engine.Decision) {
	var now time.Time
	for i := range req.Checks {
		c := &req.Checks[i]
		if c.Track {
			if now.IsZero() {
				now = l.clock.Now()
			}
			l.usage.add(req.Subject, c.Policy, c.Cost, d.Allowed, d.Results[i].Remaining, now)
		}
	}
}

// DrainUsage returns the units demanded and admitted per (subject, policy)
// for tracked checks since the last drain, and starts counting afresh.
func (l *Limiter) DrainUsage() map[engine.UsageKey]engine.Usage { return l.usage.drain() }

// Stats are the limiter's counters since it started.
type Stats struct {
	StoreCalls, StoreErrors, DenyCacheHits, Degraded, BreakerOpens uint64
	// StoreBusy counts checks that waited past the store's queue bound
	// (ErrStoreBusy): decided by the fallback, but not store errors.
	StoreBusy uint64
	// ChargeErrors counts charges after the fact that the store could not
	// apply; ChargesDropped those of them dropped because every policy
	// fails open.
	ChargeErrors, ChargesDropped uint64
	// Breakers maps each store shard to its breaker state: "closed",
	// "open" or "half-open".
	Breakers map[string]string
	// Leases counts what leases did (Check.Lease).
	Leases LeaseStats
}

// Stats reads the counters; it is cheap enough for every scrape.
func (l *Limiter) Stats() Stats {
	s := Stats{
		StoreCalls:    l.storeCalls.Load(),
		StoreErrors:   l.storeErrors.Load(),
		StoreBusy:     l.storeBusy.Load(),
		DenyCacheHits: l.denyHits.Load(),
		Degraded:      l.degraded.Load(),
		BreakerOpens:  l.breakerOpens.Load(),
		Breakers:      map[string]string{},

		ChargeErrors:   l.chargeErrors.Load(),
		ChargesDropped: l.chargesDropped.Load(),
		Leases:         l.lc.stats(),
	}
	l.mu.Lock()
	for name, cb := range l.breakers {
		s.Breakers[name] = cb.State().String()
	}
	l.mu.Unlock()
	return s
}

// Peek reads a subject's state under the given checks without spending:
// every cost is set to zero. It goes to the store like any check.
func (l *Limiter) Peek(ctx context.Context, req engine.Request) (Outcome, error) {
	checks := make([]engine.Check, len(req.Checks))
	copy(checks, req.Checks)
	for i := range checks {
		checks[i].Cost = 0
		checks[i].Track = false
		checks[i].Deposit = false
	}
	req.Checks = checks
	if err := req.Validate(); err != nil {
		return Outcome{}, err
	}
	d, err := l.callStore(ctx, req)
	if err != nil {
		return Outcome{}, fmt.Errorf("reading state: %w", err)
	}
	return Outcome{Decision: d, Source: FromStore}, nil
}

// Reset forgets subject's state under each of policies, in the store, in
// the in-process fallback and in the cache of rejections, so that its next
// check is decided as for a subject never seen: what an operator does for
// a customer locked out by mistake. It is not on the hot path and gets the
// caller's deadline, not the per-check one. A store that cannot forget is
// an error; a failing store's error is returned after the in-process state
// is cleared.
func (l *Limiter) Reset(ctx context.Context, subject string, policies []string) error {
	if subject == "" {
		return fmt.Errorf("%w: empty subject", engine.ErrBadRequest)
	}
	r, ok := l.store.(resetter)
	if !ok {
		return fmt.Errorf("reset: the %T store cannot forget state", l.store)
	}
	if l.fallback != nil {
		_ = l.fallback.Reset(ctx, subject, policies) // in process: cannot fail
	}
	if l.deny != nil {
		l.deny.forget(subject)
	}
	l.dropLeases(subject, policies)
	if err := r.Reset(ctx, subject, policies); err != nil {
		return fmt.Errorf("reset %q: %w", subject, err)
	}
	return nil
}

// denyCache remembers rejections until their retry time. It is sharded by
// subject so that concurrent checks rarely share a lock.
//
// When a rejection's time is up, the first check to find it asks the store
// (it is the rejection's probe) and the checks of the same rejection that
// come meanwhile wait for its answer (settle says what follows it).
// Without the wait, a subject hammered from many connections sent the
// store every check that came while the probe was out (at 1 000 checks a
// second, one for each millisecond of a store call), several times the
// calls its limit needs. Only the checks of a subject whose rejection has
// just run out wait, and while its store calls leave it nothing to spare.
type denyCache struct {
	seed   maphash.Seed
	shards [16]*lru.Cache[denyKey, denied]
	mu     [16]sync.Mutex // a rejection's turning into a probe, and the probe's end
}

type denyKey struct {
	subject string
	fp      uint64
}

type denied struct {
	until time.Time
	at    time.Time
	probe chan struct{} // set once the time is up and a check asks the store; closed when it has its answer
	engine.Decision
}

func newDenyCache(size int) *denyCache {
	c := &denyCache{seed: maphash.MakeSeed()}
	per := max(size/len(c.shards), 1)
	for i := range c.shards {
		c.shards[i], _ = lru.New[denyKey, denied](per) // only errs for size <= 0
	}
	return c
}

func (c *denyCache) shard(subject string) (*lru.Cache[denyKey, denied], *sync.Mutex) {
	i := maphash.String(c.seed, subject) % uint64(len(c.shards))
	return c.shards[i], &c.mu[i]
}

// get returns the rejection remembered for subject and fp (ok), or a
// channel to wait on while another check asks the store for it (wait), or
// neither: the caller asks the store, and if it was given a probe, it
// reports the end of its call (settle).
func (c *denyCache) get(subject string, fp uint64, now time.Time) (e denied, ok bool, wait <-chan struct{}, probe chan struct{}) {
	sh, mu := c.shard(subject)
	k := denyKey{subject, fp}
	e, ok = sh.Get(k)
	if !ok {
		return denied{}, false, nil, nil
	}
	if e.probe != nil {
		return denied{}, false, e.probe, nil
	}
	if !now.Before(e.until) {
		mu.Lock()
		defer mu.Unlock()
		e, ok = sh.Peek(k)
		switch {
		case !ok:
			return denied{}, false, nil, nil
		case e.probe != nil:
			return denied{}, false, e.probe, nil
		case !now.Before(e.until):
			e.probe = make(chan struct{})
			sh.Add(k, e)
			return denied{}, false, nil, e.probe
		}
	}
	// Time has passed since the store decided: count it down.
	el := now.Sub(e.at)
	for i := 0; i < e.N; i++ {
		r := &e.Results[i]
		if r.RetryAfter > 0 {
			r.RetryAfter = max(r.RetryAfter-el, time.Microsecond)
		}
		r.ResetAfter = max(r.ResetAfter-el, 0)
	}
	return e, true, nil, nil
}

// settle ends probe, the store call of a check of subject and fp whose
// rejection's time was up, and the checks waiting for it go on. Unless the
// call put a new rejection, the old one goes, or, with again, stays out of
// time: the call was allowed the last of what the subject had, and the
// next check to find it is the next probe, the others waiting again. A
// subject refilled a token at a time (a hammered key) thus sends the store
// one call at a time until it is refused; one allowed with more to spare
// goes back to concurrent calls.
func (c *denyCache) settle(subject string, fp uint64, probe chan struct{}, again bool) {
	sh, mu := c.shard(subject)
	k := denyKey{subject, fp}
	mu.Lock()
	if e, ok := sh.Peek(k); ok && e.probe == probe {
		if again {
			e.probe = nil
			sh.Add(k, e)
		} else {
			sh.Remove(k)
		}
	}
	mu.Unlock()
	close(probe)
}

// exhausted reports whether an allowed decision left one of its policies
// nothing: the subject's next check would likely be refused.
func exhausted(d engine.Decision) bool {
	for i := range d.N {
		if d.Results[i].Remaining <= 0 {
			return true
		}
	}
	return false
}

// forget drops every cached rejection of subject.
func (c *denyCache) forget(subject string) {
	sh, _ := c.shard(subject)
	for _, k := range sh.Keys() {
		if k.subject == subject {
			sh.Remove(k)
		}
	}
}

// put remembers d, a rejection of subject and fp, until until. It may
// replace a rejection whose probe is out: the probe's checks wait until it
// settles, and then find d.
func (c *denyCache) put(subject string, fp uint64, until time.Time, d engine.Decision, now time.Time) {
	sh, mu := c.shard(subject)
	mu.Lock()
	sh.Add(denyKey{subject, fp}, denied{until: until, at: now, Decision: d})
	mu.Unlock()
}

type usageTracker struct {
	mu sync.Mutex
	m  map[engine.UsageKey]*engine.Usage
}

func newUsageTracker() *usageTracker {
	return &usageTracker{m: make(map[engine.UsageKey]*engine.Usage)}
}

func (u *usageTracker) add(subject, policy string, cost int64, allowed bool, remaining int64, at time.Time) {
	k := engine.UsageKey{Subject: subject, Policy: policy}
	u.mu.Lock()
	e := u.m[k]
	if e == nil {
		e = &engine.Usage{}
		u.m[k] = e
	}
	e.Demand += cost
	if allowed {
		e.Admitted += cost
	}
	if !at.Before(e.At) {
		e.Remaining, e.At = remaining, at
	}
	u.mu.Unlock()
}

func (u *usageTracker) drain() map[engine.UsageKey]engine.Usage {
	u.mu.Lock()
	old := u.m
	u.m = make(map[engine.UsageKey]*engine.Usage, len(old))
	u.mu.Unlock()
	out := make(map[engine.UsageKey]engine.Usage, len(old))
	for k, v := range old {
		out[k] = *v
	}
	return out
}
