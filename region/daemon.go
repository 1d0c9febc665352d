// Package region is the gateway-facing daemon (`sluice serve`): the check
// and forward-auth API with the RateLimit headers, the admin API for
// policies, keys and overrides, health, readiness and metrics, and the
// wiring of quota (who and which policies) to engine (the decision).
package region

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"

	"github.com/sluice-rl/sluice/decide"
	"github.com/sluice-rl/sluice/decisionlog"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/engine/limiter"
	"github.com/sluice-rl/sluice/engine/redisstore"
	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/quota/redispolicy"
	"github.com/sluice-rl/sluice/region/globalshare"
)

// Config configures a Daemon. DefaultConfig returns the defaults that
// `sluice serve` documents.
type Config struct {
	// Listen is the address of the check API, health and metrics (and of
	// the admin API when AdminListen is empty).
	Listen string
	// AdminListen, if set, serves the admin API there instead, so that it
	// can be bound to a private interface.
	AdminListen string
	// Store is "memory", "redis://HOST:PORT[/DB]",
	// "redis-cluster://H1:P1,H2:P2" or
	// "redis-sentinel://MASTER@S1:P1,S2:P2[/DB]" (the primary that those
	// Sentinels name). With Redis, limiter state and policies are shared by
	// every daemon on it.
	Store string
	// Redis holds the Redis connection settings that a store URL cannot
	// carry: TLS files for the rediss schemes (rediss://,
	// rediss-cluster://, rediss-sentinel://) and the Sentinels' own
	// credentials. The decision store and the policy store (its pub/sub
	// included) share the one client they configure.
	Redis redisstore.ClientConfig
	// StoreTimeout bounds every decision-store call.
	StoreTimeout time.Duration
	// Policies, if non-nil, seeds the policy set at start instead of
	// quota.DefaultPolicies (an empty non-nil slice seeds none).
	Policies []quota.Policy
	// DataDir holds the policy file store (policies.json) and the audit
	// log (audit.log) on the memory store; "" keeps both in memory. With
	// Redis, policies live in Redis and DataDir holds only the audit log.
	DataDir string
	// AdminToken authenticates the admin API (Authorization: Bearer). An
	// empty token disables the admin API: every admin route answers 403.
	AdminToken string
	// TrustedProxies are the CIDRs whose forwarding, tier and user headers
	// are believed.
	TrustedProxies []netip.Prefix
	// KeyHeaders are where API keys are read from; nil is the default
	// (Authorization: Bearer, then X-API-Key).
	KeyHeaders []string
	// TierHeader and UserHeader are read from trusted proxies only.
	TierHeader, UserHeader string
	// ClientIPHeader is the one header that names the client address when
	// the peer is a trusted proxy: X-Forwarded-For (also ""), X-Real-IP,
	// Forwarded or none (see quota.IdentityConfig).
	ClientIPHeader string
	// ForwardAuthHeaders names the header pair /v1/authz reads the limited
	// request's method and URI from: ForwardAuthOriginal (also "") or
	// ForwardAuthForwarded.
	ForwardAuthHeaders string
	// MaxBodyBytes caps a request body.
	MaxBodyBytes int64
	// ShutdownTimeout bounds how long in-flight requests may take to
	// finish after Run's context is cancelled.
	ShutdownTimeout time.Duration
	// PolicyRefresh is the full-refresh interval of a Redis policy store
	// (pub/sub notifies sooner).
	PolicyRefresh time.Duration
	// Shares gives global-scope policies their regional share; nil is
	// WholeShare. Ignored when Gossip is set: the coordinator gives them.
	Shares ShareSource
	// Gossip, if set, makes the daemon a node of a multi-region cluster
	// (GossipConfig); nil runs it single-region.
	Gossip *GossipConfig
	// LocalDaemons is how many daemons share one store when it is down: a
	// policy with on_store_failure "local" then admits its rate divided by
	// this many on each daemon, so together they stay within the rate. With
	// Gossip the count is the live daemons of this region in the membership
	// instead, and LocalDaemons must be 0; 0 without Gossip means 1.
	LocalDaemons int
	// DecisionLog configures the sampled decision stream and the top lists
	// of GET /v1/decisions/top.
	DecisionLog decisionlog.Config
	// Clock, if set, is the daemon's time source for its decisions, its
	// coordinator and its gossip (the live simulator offsets it to play
	// clock skew); nil means real time.
	Clock globalshare.Clock
}

// DefaultConfig returns the documented defaults: listen on 127.0.0.1:8080,
// memory store, 5 ms store timeout, 1 MiB bodies, 30 s shutdown, 10 s policy
// refresh.
func DefaultConfig() Config {
	return Config{
		Listen:          "127.0.0.1:8080",
		Store:           "memory",
		StoreTimeout:    5 * time.Millisecond,
		TierHeader:      "X-Sluice-Tier",
		MaxBodyBytes:    1 << 20,
		ShutdownTimeout: 30 * time.Second,
		PolicyRefresh:   10 * time.Second,
		DecisionLog:     decisionlog.DefaultConfig(),
	}
}

// Validate reports a configuration the daemon cannot run with.
func (c Config) Validate() error {
	var errs []error
	if c.Listen == "" {
		errs = append(errs, errors.New("listen address is required"))
	}
	if c.Store != "memory" && storeKind(c.Store) == "" {
		errs = append(errs, fmt.Errorf("store must be memory, redis://HOST:PORT, redis-cluster://H1:P1,H2:P2 or redis-sentinel://MASTER@S1:P1,S2:P2, got %q", c.Store))
	}
	if c.Store != "memory" && storeKind(c.Store) != "" {
		if err := c.Redis.Validate(c.Store); err != nil {
			errs = append(errs, fmt.Errorf("redis settings: %w", err))
		}
	} else if c.Redis != (redisstore.ClientConfig{}) {
		errs = append(errs, errors.New("redis settings are given but the store is not Redis"))
	}
	if c.StoreTimeout <= 0 {
		errs = append(errs, fmt.Errorf("store timeout must be positive, got %v", c.StoreTimeout))
	}
	if c.MaxBodyBytes < 1024 {
		errs = append(errs, fmt.Errorf("max body bytes must be at least 1024, got %d", c.MaxBodyBytes))
	}
	if c.LocalDaemons < 0 {
		errs = append(errs, fmt.Errorf("local daemons must not be negative, got %d", c.LocalDaemons))
	}
	if c.LocalDaemons > 0 && c.Gossip != nil {
		errs = append(errs, errors.New("local daemons is counted from the gossip membership in multi-region mode; do not set it"))
	}
	if c.ShutdownTimeout <= 0 || c.PolicyRefresh <= 0 {
		errs = append(errs, errors.New("shutdown timeout and policy refresh must be positive"))
	}
	if err := c.DecisionLog.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.validateEdge(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Daemon is one region's daemon. Build it with New, serve with Run.
type Daemon struct {
	cfg     Config
	log     *slog.Logger
	lim     *limiter.Limiter
	rstore  *redisstore.Store   // the decision store when it is Redis, to warm before ready
	mem     *engine.MemoryStore // nil on Redis
	reg     *quota.Registry
	audit   *quota.AuditLog
	watcher *redispolicy.Watcher // nil on the memory store
	pstore  quota.Store          // nil on the memory store without DataDir
	closers []func() error
	ident   quota.IdentityConfig
	shares  ShareSource
	quotas  QuotaSource // nil when single-region
	cl      *cluster    // nil when single-region
	redis   redisKV     // nil on the memory store
	m       *metrics
	// faMisconfig counts forward-auth calls of a gateway set up for the
	// other header pair.
	faMisconfig *forwardAuthMisconfig
	events      *decisionlog.Log
	dec         *decide.Decider // the decision, over lim, reg, shares and quotas
	gather      prometheus.Gatherer
	token       [32]byte // SHA-256 of the admin token
	hasTok      bool
	routes      []Route

	ready          atomic.Bool
	readyAt        atomic.Int64 // when ready was set, Unix nanoseconds
	stopping       atomic.Bool
	lastRefreshErr atomic.Pointer[string]
	// storeDown says why the policy store has not been reached since
	// start; nil once it has (or on the memory store).
	storeDown atomic.Pointer[string]
}

// New builds a daemon: it connects the store, loads or seeds the policies
// and registers its metrics on reg (gather serves /metrics; nil uses reg if
// it is a Gatherer). It does not listen; Run does.
func New(ctx context.Context, cfg Config, log *slog.Logger, reg prometheus.Registerer, gather prometheus.Gatherer) (*Daemon, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if reg == nil {
		r := prometheus.NewRegistry()
		reg, gather = r, r
	}
	if gather == nil {
		if g, ok := reg.(prometheus.Gatherer); ok {
			gather = g
		} else {
			gather = prometheus.NewRegistry()
		}
	}
	d := &Daemon{cfg: cfg, log: log, gather: gather, shares: cfg.Shares}
	if d.shares == nil {
		d.shares = WholeShare{}
	}
	d.ident = cfg.identityConfig()
	if cfg.AdminToken != "" {
		d.token = sha256.Sum256([]byte(cfg.AdminToken))
		d.hasTok = true
	}
	ok := false
	defer func() {
		if !ok {
			d.close()
		}
	}()

	auditPath := ""
	if cfg.DataDir != "" {
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			return nil, fmt.Errorf("data dir: %w", err)
		}
		auditPath = filepath.Join(cfg.DataDir, "audit.log")
	}
	audit, err := quota.OpenAuditLog(auditPath, 0)
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	d.audit = audit
	d.closers = append(d.closers, audit.Close)

	var store engine.Store
	var pstore quota.Store
	if cfg.Store == "memory" {
		d.mem = engine.NewMemoryStore(engine.MemoryConfig{Clock: cfg.Clock})
		store = d.mem
		if cfg.DataDir != "" {
			pstore = quota.NewFileStore(filepath.Join(cfg.DataDir, "policies.json"))
		}
	} else {
		// A read is bounded by the check's deadline, and by the
		// client's IOTimeout where no context deadline is shorter: a
		// store timeout of more than a quarter second gets a bound that
		// follows it, so that a slow reply is not cut before its check's
		// deadline (the client never sends a script twice).
		rc := cfg.Redis
		if rc.IOTimeout == 0 {
			rc.IOTimeout = max(time.Second, 4*cfg.StoreTimeout)
		}
		client, err := redisstore.NewClientWith(cfg.Store, rc)
		if err != nil {
			return nil, err
		}
		d.closers = append(d.closers, client.Close)
		d.redis = client
		kp := cfg.Redis.KeyPrefix
		d.rstore = redisstore.New(client, redisstore.Config{Timeout: cfg.StoreTimeout, Prefix: kp + "rl:"})
		store = d.rstore
		ps := redispolicy.New(client, redispolicy.Config{Key: kp + policyKey, Channel: kp + policyChannel}, log)
		pstore = ps
		d.watcher = redispolicy.NewWatcher(ps, nil, cfg.PolicyRefresh, log)
	}
	d.lim = limiter.New(limiter.Config{Store: store, Timeout: cfg.StoreTimeout, Logger: log, Daemons: d.localDaemons, OnStoreCall: d.observeStoreCall, Clock: cfg.Clock})
	d.reg = quota.NewRegistry(quota.RegistryConfig{Store: pstore, Audit: audit, Logger: log})
	d.pstore = pstore
	if d.watcher != nil {
		d.watcher.SetTarget(d.reg)
	}
	d.m = newMetrics(reg, d.lim, d.mem, storeKind(cfg.Store))
	d.faMisconfig = newForwardAuthMisconfig(reg)
	if d.events, err = decisionlog.New(cfg.DecisionLog, log, reg); err != nil {
		return nil, err
	}
	d.closers = append(d.closers, d.events.Close)
	if d.watcher != nil {
		d.watcher.OnResult(func(result string, err error) {
			d.m.policyReload.WithLabelValues(result).Inc()
			if err != nil {
				s := err.Error()
				d.lastRefreshErr.Store(&s)
			} else {
				d.lastRefreshErr.Store(nil)
			}
		})
	}
	if err := d.loadPolicies(ctx); err != nil {
		return nil, err
	}
	if cfg.Gossip != nil {
		gc := *cfg.Gossip
		if err := d.newCluster(&gc, reg); err != nil {
			return nil, err
		}
		d.closers = append(d.closers, func() error { d.cl.g.Shutdown(); return nil })
	}
	d.dec = d.newDecider()
	d.routes = d.routeTable()
	ok = true
	return d, nil
}

// now is the time on the daemon's clock (Config.Clock).
func (d *Daemon) now() time.Time {
	if d.cfg.Clock != nil {
		return d.cfg.Clock.Now()
	}
	return time.Now()
}

// loadPolicies restores the saved state, then seeds: cfg.Policies when
// given (replacing the built-in defaults), else the defaults on a store that
// has never been seeded. A Redis store that cannot be reached does not stop
// the start: the daemon serves from the last good local copy of the shared
// set (DataDir), else from cfg.Policies or the defaults, reports not ready
// and keeps trying (reachStore).
func (d *Daemon) loadPolicies(ctx context.Context) error {
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := d.syncPolicyStore(lctx)
	if err == nil {
		d.saveLastGood()
		d.log.Info("policies loaded", "count", len(d.reg.List("")), "store", storeKind(d.cfg.Store))
		return nil
	}
	if d.redis == nil {
		return err
	}
	return d.startWithoutStore(lctx, err)
}

// syncPolicyStore loads the policy set from the store and seeds it (see
// loadPolicies); any error leaves the registry as it was.
func (d *Daemon) syncPolicyStore(ctx context.Context) error {
	err := d.reg.Load(ctx)
	fresh := errors.Is(err, quota.ErrNoSnapshot)
	if err != nil && !fresh {
		return fmt.Errorf("loading policies: %w", err)
	}
	if fresh && d.storeDown.Load() != nil {
		// The set in force came from elsewhere (startWithoutStore): Seed
		// would find nothing to change and save nothing, so save it
		// whole. A sibling that saved first makes this a conflict, and
		// the next probe loads its set.
		return d.pstore.Save(ctx, d.reg.Snapshot())
	}
	seed := d.cfg.Policies
	if seed == nil && fresh {
		seed = quota.DefaultPolicies()
	}
	if len(seed) == 0 {
		return nil
	}
	// Daemons starting together on one Redis race to seed it: the loser
	// reloads what the winner saved and seeds on top (Seed leaves
	// identical policies alone). A change made to a seeded policy since
	// (the admin API, another region) is kept: a restart is not an edit
	// of the file (SeedAtStart).
	for attempt := 0; ; attempt++ {
		err := d.reg.SeedAtStart(ctx, "system", seed)
		if err == nil {
			return nil
		}
		if !errors.Is(err, redispolicy.ErrConcurrentChange) || attempt == 5 {
			return fmt.Errorf("seeding policies: %w", err)
		}
		if err := d.reg.Load(ctx); err != nil && !errors.Is(err, quota.ErrNoSnapshot) {
			return fmt.Errorf("loading policies: %w", err)
		}
	}
}

// lastGoodPath is where the last policy set read from a shared store is
// kept, "" without DataDir.
func (d *Daemon) lastGoodPath() string {
	if d.cfg.DataDir == "" || d.redis == nil {
		return ""
	}
	return filepath.Join(d.cfg.DataDir, "policies.last-good.json")
}

// saveLastGood keeps a local copy of the policy set just read from the
// shared store, for a start while the store is down.
func (d *Daemon) saveLastGood() {
	path := d.lastGoodPath()
	if path == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := quota.NewFileStore(path).Save(ctx, d.reg.Snapshot()); err != nil {
		d.log.Warn("policies: cannot keep a local copy", "path", path, "err", err)
	}
}

// startWithoutStore puts in force the last good local copy of the shared
// policy set, else cfg.Policies, else the defaults, without saving them
// anywhere, and marks the daemon not ready until reachStore succeeds.
func (d *Daemon) startWithoutStore(ctx context.Context, cause error) error {
	reason := storeDownReason(cause)
	d.storeDown.Store(&reason)
	from := "last good local copy"
	var snap quota.Snapshot
	var err error
	if path := d.lastGoodPath(); path != "" {
		snap, err = quota.NewFileStore(path).Load(ctx)
	} else {
		err = quota.ErrNoSnapshot
	}
	if err != nil {
		seed, src := d.cfg.Policies, "--policies"
		if seed == nil {
			seed, src = quota.DefaultPolicies(), "built-in defaults"
		}
		scratch := quota.NewRegistry(quota.RegistryConfig{})
		if err := scratch.Seed(ctx, "system", seed); err != nil {
			return fmt.Errorf("seeding policies: %w", err)
		}
		snap, from = scratch.Snapshot(), src
	}
	if err := d.reg.Restore(snap); err != nil {
		return fmt.Errorf("policies from the %s: %w", from, err)
	}
	d.log.Warn("starting without the policy store: deciding by each policy's on_store_failure until it answers",
		"err", cause, "policies", len(d.reg.List("")), "from", from)
	return nil
}

// storeDownReason is the /readyz reason of a store not reached since
// start for err. A failed TLS handshake is said first, since it is a
// setting to fix (a CA, a certificate, a server name), not an outage to
// wait out.
func storeDownReason(err error) string {
	const down = "policy store unreachable since start: "
	var (
		verify  *tls.CertificateVerificationError
		alert   tls.AlertError
		record  tls.RecordHeaderError
		unknown x509.UnknownAuthorityError
		host    x509.HostnameError
	)
	if errors.As(err, &verify) || errors.As(err, &alert) || errors.As(err, &record) ||
		errors.As(err, &unknown) || errors.As(err, &host) {
		return down + "TLS handshake with the store failed: " + err.Error()
	}
	return down + err.Error()
}

// The hash and channel of the policies shared through Redis, after the
// store's key prefix: redispolicy's defaults.
const (
	policyKey     = "{sluice-policies}:state"
	policyChannel = "sluice-policies:changed"
)

// storeProbe is how often a daemon that started without its store tries
// it again. The decision path probes on its own (the breaker's OpenFor).
const storeProbe = time.Second

// storeWarmWait bounds how long a start waits to warm the decision store
// (redisstore.Store.Warm) before it reports ready anyway.
const storeWarmWait = 2 * time.Second

// reachStore retries the policy store every storeProbe until it loads (and,
// if the store is empty, seeds) the shared policy set, then marks the
// daemon ready. It returns at once if the store was reached at start.
func (d *Daemon) reachStore(ctx context.Context) error {
	if d.storeDown.Load() == nil {
		return nil
	}
	t := time.NewTicker(storeProbe)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		lctx, cancel := context.WithTimeout(ctx, storeProbe)
		err := d.syncPolicyStore(lctx)
		cancel()
		if err != nil {
			reason := storeDownReason(err)
			d.storeDown.Store(&reason)
			continue
		}
		d.storeDown.Store(nil)
		d.saveLastGood()
		d.log.Info("policy store reached: policies loaded", "count", len(d.reg.List("")), "store", storeKind(d.cfg.Store))
		return nil
	}
}

// localDaemons is the divisor of on_store_failure "local": the live
// daemons of this region by gossip membership (this one included), else
// Config.LocalDaemons, at least 1. It returns at once: it runs on the check
// path while the store is down.
func (d *Daemon) localDaemons() int {
	if d.cl != nil {
		return d.cl.g.NumLiveInRegion()
	}
	return max(d.cfg.LocalDaemons, 1)
}

// storeKind names the kind of store s is, as /ready reports it: memory,
// redis, redis-cluster or redis-sentinel; "" if s is none of them.
func storeKind(s string) string {
	switch {
	case s == "memory":
		return "memory"
	case strings.HasPrefix(s, "redis-cluster://"), strings.HasPrefix(s, "rediss-cluster://"):
		return "redis-cluster"
	case strings.HasPrefix(s, "redis-sentinel://"), strings.HasPrefix(s, "rediss-sentinel://"):
		return "redis-sentinel"
	case strings.HasPrefix(s, "redis://"), strings.HasPrefix(s, "rediss://"):
		return "redis"
	}
	return ""
}

func (d *Daemon) close() {
	for i := len(d.closers) - 1; i >= 0; i-- {
		d.closers[i]()
	}
	d.closers = nil
}

// Registry returns the policy registry, for wiring and tests.
func (d *Daemon) Registry() *quota.Registry { return d.reg }

// Limiter returns the engine limiter, for wiring (gossip drains its usage).
func (d *Daemon) Limiter() *limiter.Limiter { return d.lim }

// Route is one entry of the route table: the method and the ServeMux
// pattern path, whether the admin token guards it, and its handler. The
// OpenAPI test and the auth test walk this table.
type Route struct {
	Method  string // "" for every method
	Path    string // ServeMux path pattern, e.g. /v1/policies/{id}
	Admin   bool
	Handler http.HandlerFunc
}

// Routes returns the route table.
func (d *Daemon) Routes() []Route { return append([]Route(nil), d.routes...) }

func (d *Daemon) routeTable() []Route {
	return []Route{
		{"POST", checkPath, false, d.stdRoute(routeCheck)},
		{"POST", batchPath, false, d.stdRoute(routeBatch)},
		{"POST", chargePath, false, d.stdRoute(routeCharge)},
		{"GET", authzPath, false, d.stdRoute(routeAuthz)},
		{"POST", authzPath, false, d.stdRoute(routeAuthz)},
		{"", authzPrefix + "{path...}", false, d.stdRoute(routeAuthz)},
		{"GET", "/healthz", false, d.handleHealth},
		{"GET", "/readyz", false, d.handleReady},
		{"GET", "/metrics", false, promhttp.HandlerFor(d.gather, promhttp.HandlerOpts{}).ServeHTTP},

		{"PUT", "/v1/policies/{id}", true, d.handlePutPolicy},
		{"GET", "/v1/policies", true, d.handleListPolicies},
		{"GET", "/v1/policies/{id}/versions", true, d.handleVersions},
		{"POST", "/v1/policies/{id}/rollback", true, d.handleRollback},
		{"GET", "/v1/overrides", true, d.handleListOverrides},
		{"POST", "/v1/overrides", true, d.handlePutOverride},
		{"DELETE", "/v1/overrides/{id}", true, d.handleDeleteOverride},
		{"PUT", "/v1/keys/{api_key}", true, d.handlePutKey},
		{"DELETE", "/v1/keys/{api_key}", true, d.handleDeleteKey},
		{"GET", "/v1/keys/{subject}/usage", true, d.handleUsage},
		{"DELETE", "/v1/keys/{subject}/state", true, d.handleResetState},
		{"GET", "/v1/regions", true, d.handleRegions},
		{"GET", "/v1/decisions/top", true, d.handleTopLimited},
	}
}

// Handler serves the public routes and, unless AdminListen is set, the
// admin routes.
func (d *Daemon) Handler() http.Handler {
	return d.mux(func(r Route) bool { return !r.Admin || d.cfg.AdminListen == "" }, false)
}

// AdminHandler serves the admin routes alone, and the Go profiler under
// /debug/pprof/ behind the admin token: the profiler is served on the
// admin listener only, never where the gateways call.
func (d *Daemon) AdminHandler() http.Handler {
	return d.mux(func(r Route) bool { return r.Admin }, true)
}

func (d *Daemon) mux(include func(Route) bool, profiler bool) http.Handler {
	mux := http.NewServeMux()
	if profiler {
		mux.HandleFunc("GET /debug/pprof/", d.requireAdmin(pprof.Index))
		mux.HandleFunc("GET /debug/pprof/cmdline", d.requireAdmin(pprof.Cmdline))
		mux.HandleFunc("GET /debug/pprof/profile", d.requireAdmin(pprof.Profile))
		mux.HandleFunc("GET /debug/pprof/symbol", d.requireAdmin(pprof.Symbol))
		mux.HandleFunc("GET /debug/pprof/trace", d.requireAdmin(pprof.Trace))
	}
	for _, rt := range d.routes {
		if !include(rt) {
			continue
		}
		pattern := rt.Path
		if rt.Method != "" {
			pattern = rt.Method + " " + rt.Path
		}
		h := rt.Handler
		if rt.Admin {
			h = d.requireAdmin(h)
		}
		mux.HandleFunc(pattern, h)
	}
	if include(Route{Path: authzPrefix + "{path...}"}) {
		return d.recoverer(d.authzPrefixed(d.notFound(mux)))
	}
	return d.recoverer(d.notFound(mux))
}

// notFound turns the mux's plain-text 404 and 405 into problems. A
// request is routed once: a matched pattern without wildcards (the check
// routes) is served here with r.Pattern set as ServeMux.ServeHTTP sets it;
// only one with wildcards goes through ServeHTTP again, which alone can
// set the path values.
func (d *Daemon) notFound(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, pattern := mux.Handler(r)
		switch {
		case pattern != "" && strings.IndexByte(pattern, '{') < 0:
			r.Pattern = pattern
			h.ServeHTTP(w, r)
			return
		case pattern != "":
			mux.ServeHTTP(w, r) // sets r.Pattern and the path values
			return
		}
		rec := &statusProbe{header: http.Header{}}
		h.ServeHTTP(rec, r)
		switch rec.status {
		case http.StatusMethodNotAllowed:
			w.Header().Set("Allow", rec.header.Get("Allow"))
			writeProblem(w, r, newProblem(http.StatusMethodNotAllowed, ProblemMethod, fmt.Sprintf("%s is not allowed on %s", r.Method, r.URL.Path)))
		case http.StatusMovedPermanently, http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
			for k, v := range rec.header {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.status)
		default:
			writeProblem(w, r, newProblem(http.StatusNotFound, ProblemNotFound, "no such route: "+r.URL.Path))
		}
	})
}

type statusProbe struct {
	header http.Header
	status int
}

func (s *statusProbe) Header() http.Header         { return s.header }
func (s *statusProbe) Write(b []byte) (int, error) { return len(b), nil }
func (s *statusProbe) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
}

// recoverer answers a panic with a 500 problem and logs it: a last resort,
// since every bad input must be a 4xx.
func (d *Daemon) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer d.recovered(w, r.Method, r.URL.Path)
		next.ServeHTTP(w, r)
	})
}

// recovered, deferred by the handler of a request of method and path,
// answers a panic of that handler with a 500 problem, counts it and logs
// it. http.ErrAbortHandler, which asks the server to drop the connection,
// is panicked again.
func (d *Daemon) recovered(w http.ResponseWriter, method, path string) {
	v := recover()
	if v == nil {
		return
	}
	if v == http.ErrAbortHandler {
		panic(v)
	}
	d.m.panics.Inc()
	d.log.Error("handler panic", "method", method, "path", path, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
	p := newProblem(http.StatusInternalServerError, ProblemInternal, "an internal error occurred; it has been logged")
	p.Instance = path
	writeProblem(w, nil, p)
}

// requireAdmin checks the bearer token in constant time: 401 without
// credentials, 403 with wrong ones or when no token is configured.
func (d *Daemon) requireAdmin(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !d.hasTok {
			writeProblem(w, r, newProblem(http.StatusForbidden, ProblemForbidden, "the admin API is disabled: start sluice with --admin-token-file or SLUICE_ADMIN_TOKEN"))
			return
		}
		auth := r.Header.Get("Authorization")
		scheme, tok, _ := strings.Cut(strings.TrimSpace(auth), " ")
		if auth == "" || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sluice-admin"`)
			writeProblem(w, r, newProblem(http.StatusUnauthorized, ProblemUnauthorized, "the admin API needs Authorization: Bearer <token>"))
			return
		}
		sum := sha256.Sum256([]byte(strings.TrimSpace(tok)))
		if subtle.ConstantTimeCompare(sum[:], d.token[:]) != 1 {
			writeProblem(w, r, newProblem(http.StatusForbidden, ProblemForbidden, "the admin token is not valid"))
			return
		}
		next(w, r)
	}
}

func (d *Daemon) handleHealth(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// Readiness is the body of /readyz.
type Readiness struct {
	Status string `json:"status"` // ready, degraded, store_unreachable, joining, stopping
	Store  string `json:"store"`
	// Breakers maps each store shard to closed, half-open or open.
	Breakers map[string]string `json:"breakers"`
	Policies int               `json:"policies"`
	// PolicyStoreError is the last failure to refresh shared policies; the
	// last good set stays in force meanwhile.
	PolicyStoreError string `json:"policy_store_error,omitempty"`
	// Reason says why the daemon is not ready: it is stopping, it has not
	// reached its store since it started (it then decides by each
	// policy's on_store_failure, on policies that may be stale), or, in a
	// multi-region deployment, the other regions have not pinged it yet
	// (joining; see cluster.unconfirmed).
	Reason string `json:"reason,omitempty"`
}

func (d *Daemon) handleReady(w http.ResponseWriter, r *http.Request) {
	st := d.lim.Stats()
	rd := Readiness{Status: "ready", Store: storeKind(d.cfg.Store), Breakers: st.Breakers, Policies: len(d.reg.List(""))}
	if e := d.lastRefreshErr.Load(); e != nil {
		rd.PolicyStoreError = *e
		rd.Status = "degraded"
	}
	for _, s := range st.Breakers {
		if s != "closed" {
			rd.Status = "degraded"
		}
	}
	code := http.StatusOK
	if down := d.storeDown.Load(); down != nil {
		rd.Status, rd.Reason = "store_unreachable", *down
		code = http.StatusServiceUnavailable
	}
	if d.cl != nil && code == http.StatusOK && d.ready.Load() {
		if why := d.cl.unconfirmed(time.Since(time.Unix(0, d.readyAt.Load()))); why != "" {
			rd.Status, rd.Reason = "joining", why
			code = http.StatusServiceUnavailable
		}
	}
	if d.stopping.Load() || !d.ready.Load() {
		rd.Status, rd.Reason = "stopping", "not serving yet or shutting down"
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, rd)
}

// Run listens and serves until ctx is cancelled, then stops accepting,
// lets in-flight requests finish (up to ShutdownTimeout) and returns.
func (d *Daemon) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", d.cfg.Listen)
	if err != nil {
		d.close()
		return err
	}
	var aln net.Listener
	if d.cfg.AdminListen != "" {
		if aln, err = net.Listen("tcp", d.cfg.AdminListen); err != nil {
			ln.Close()
			d.close()
			return err
		}
	}
	return d.Serve(ctx, ln, aln)
}

// Serve is Run on listeners the caller opened (aln may be nil).
func (d *Daemon) Serve(ctx context.Context, ln, aln net.Listener) error {
	defer d.close()
	g, gctx := errgroup.WithContext(ctx)
	fs := d.fastServer(d.Handler())
	d.log.Info("listening", "addr", ln.Addr().String(), "admin", aln == nil)
	g.Go(func() error { return fs.Serve(ln) })
	var servers []*http.Server
	if aln != nil {
		s := d.httpServer(d.AdminHandler())
		servers = append(servers, s)
		d.log.Info("listening", "addr", aln.Addr().String(), "admin", true)
		g.Go(func() error {
			if err := s.Serve(aln); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	g.Go(func() error { return d.events.Run(gctx) })
	if d.mem != nil {
		g.Go(func() error { return d.mem.Run(gctx, time.Minute) })
	} else {
		// Returns expired leases' tokens, and every lease's on the way out.
		g.Go(func() error { return d.lim.RunLeases(gctx) })
	}
	if d.watcher != nil {
		g.Go(func() error { return d.watcher.Run(gctx) })
		g.Go(func() error { return d.reachStore(gctx) })
	}
	if d.cl != nil {
		g.Go(func() error { return d.cl.g.Run(gctx) })
		g.Go(func() error { return d.cl.c.Run(gctx) })
		g.Go(func() error { return d.runPolicySync(gctx) })
	}
	if d.rstore != nil {
		// A Redis that cannot be reached now is not a reason not to serve:
		// checks are decided by on_store_failure until it answers.
		wctx, cancel := context.WithTimeout(gctx, storeWarmWait)
		if err := d.rstore.Warm(wctx); err != nil {
			d.log.Warn("decision store not warmed: the first checks may be decided by on_store_failure", "err", err)
		}
		cancel()
	}
	d.readyAt.Store(time.Now().UnixNano())
	d.ready.Store(true)
	d.log.Info("ready", "store", storeKind(d.cfg.Store))
	g.Go(func() error {
		<-gctx.Done()
		d.stopping.Store(true)
		d.log.Info("shutting down: finishing in-flight requests", "timeout", d.cfg.ShutdownTimeout)
		sctx, cancel := context.WithTimeout(context.WithoutCancel(gctx), d.cfg.ShutdownTimeout)
		defer cancel()
		var errs []error
		if err := fs.ShutdownWithContext(sctx); err != nil {
			errs = append(errs, err)
		}
		ln.Close() // Shutdown does nothing to a Serve that has not begun
		for _, s := range servers {
			if err := s.Shutdown(sctx); err != nil {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	})
	err := g.Wait()
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}

// IdleTimeout is how long the daemon's listeners keep an idle connection
// open. A client that keeps connections for longer may send a request on
// one the daemon is closing and see it fail; its pool should let them go
// first.
const IdleTimeout = 2 * time.Minute

func (d *Daemon) httpServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(d.log.Handler(), slog.LevelWarn),
	}
}
