package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sync/errgroup"

	"github.com/sluice-rl/sluice/decisionlog"
	"github.com/sluice-rl/sluice/engine/redisstore"
	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/region"
	"github.com/sluice-rl/sluice/rls"
)

// buildInfo is sluice_build_info{version,goversion}, always 1: which build
// of sluice a daemon runs, for dashboards to show and queries to join on.
func buildInfo() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "sluice_build_info",
		Help:        "Always 1; labelled with the version of sluice and of Go it was built with.",
		ConstLabels: prometheus.Labels{"version": buildVersion(), "goversion": runtime.Version()},
	}, func() float64 { return 1 })
}

// newServeCmd is `sluice serve`: flags (and SLUICE_* variables, and an
// optional --config file of flag values) to region.Config, then Run.
func newServeCmd() *cobra.Command {
	def := region.DefaultConfig()
	var (
		cfg          = def
		sf           sourceFlags
		tokenFile    string
		trusted      []string
		configFile   string
		logLevel     string
		mr           multiRegionFlags
		rlsListen    string
		rlsTransport string
		rlsHeaders   string
		rlsBounds    rlsBoundFlags
		rlsCountOver bool
		hashKeyFile  string
		tf           tlsFlags
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the gateway-facing daemon: check API, forward-auth, admin API",
		Long: `Run the region daemon. With no flags it listens on 127.0.0.1:8080 with the
in-process memory store and the built-in default policies.

With --region the daemon joins a multi-region cluster over memberlist
(--gossip-listen, --join) and enforces global-scope policies at its region's
share; gossip is encrypted with the AES key of --gossip-key-file (16, 24 or 32
bytes, raw or base64), required unless --dev.

Precedence: command-line flag > SLUICE_<FLAG> environment variable >
--config file > default. The admin token comes from --admin-token-file or
SLUICE_ADMIN_TOKEN; without one the admin API answers 403.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configFile != "" {
				if err := applyConfigFile(cmd.Flags(), configFile); err != nil {
					return err
				}
			}
			var lvl slog.Level
			if err := lvl.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("--log-level: %w", err)
			}
			gc, err := mr.config(cmd.Flags())
			if err != nil {
				return err
			}
			cfg.Gossip = gc
			cfg.LocalDaemons = mr.localCount()
			log := slog.New(slog.NewJSONHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: lvl}))
			// go-redis logs every failed dial through a process-wide
			// logger: one unstructured line per check while Redis is down.
			redis.SetLogger(redisstore.Logger{L: log})
			if err := identityFlags(&cfg, trusted); err != nil {
				return err
			}
			if err := redisFlags(cfg.Store, cfg.Redis); err != nil {
				return err
			}
			srcs, err := loadSources(sf)
			if err != nil {
				return err
			}
			cfg.Policies = srcs.seed()
			cfg.AdminToken = os.Getenv("SLUICE_ADMIN_TOKEN")
			if tokenFile != "" {
				b, err := os.ReadFile(tokenFile)
				if err != nil {
					return fmt.Errorf("--admin-token-file: %w", err)
				}
				cfg.AdminToken = strings.TrimSpace(string(b))
				if cfg.AdminToken == "" {
					return fmt.Errorf("--admin-token-file %s is empty", tokenFile)
				}
			}
			if err := decisionLogFlags(&cfg.DecisionLog, hashKeyFile); err != nil {
				return err
			}
			if cfg.AdminToken == "" {
				log.Warn("no admin token: the admin API is disabled (set --admin-token-file or SLUICE_ADMIN_TOKEN)")
			}
			var tr rls.Transport
			if rlsListen != "" {
				if tr, err = rlsTransportOf(rlsTransport); err != nil {
					return err
				}
				if err := rlsBounds.check(); err != nil {
					return err
				}
			}
			plan, err := tf.plan(cfg, rlsListen)
			if err != nil {
				return err
			}
			reg := prometheus.NewRegistry()
			reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfo())
			tm := &tlsMetrics{reg: reg}
			reloaders, err := loadTLS(time.Now(), plan, log, tm)
			if err != nil {
				return err
			}
			if cfg.Store != "memory" {
				if err := redisTLSReload(&cfg.Redis, log, tm); err != nil {
					return err
				}
			}
			announceTLS(plan, reloaders, cfg.AdminToken != "", log)
			d, err := region.New(cmd.Context(), cfg, log, reg, reg)
			if err != nil {
				return err
			}
			opts := rlsBounds.config()
			opts.Transport = tr
			if rlsListen != "" {
				hs, err := rls.ParseHeaderStyle(rlsHeaders)
				if err != nil {
					return fmt.Errorf("--rls-response-headers: %w", err)
				}
				opts.Headers = hs
				opts.CountOverLimit = rlsCountOver
			}
			ls, err := openListeners(plan, reloaders)
			if err != nil {
				return err
			}
			serve := func(ctx context.Context) error { return serveWithRLS(ctx, d, cfg, ls, opts, log, reg) }
			return srcs.run(cmd.Context(), d.SourceWriter(), log, reg, serve)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Listen, "listen", def.Listen, "address of the check API, /healthz, /readyz, /metrics (and the admin API without --admin-listen)")
	f.StringVar(&cfg.AdminListen, "admin-listen", "", "serve the admin API on this address instead of --listen")
	f.StringVar(&cfg.Store, "store", def.Store, "decision store: memory, redis://HOST:PORT[/DB], redis-cluster://H1:P1,H2:P2 or redis-sentinel://MASTER@S1:P1,S2:P2[/DB], or over TLS rediss://, rediss-cluster://, rediss-sentinel:// (policies are then shared through it too)")
	f.StringVar(&cfg.Redis.TLS.CAFile, "redis-tls-ca", "", "PEM file of the CAs that Redis servers (and Sentinels) are verified against, for a rediss:// store; default: the system's")
	f.StringVar(&cfg.Redis.TLS.CertFile, "redis-tls-cert", "", "PEM client certificate presented to Redis (with --redis-tls-key), for servers that require one")
	f.StringVar(&cfg.Redis.TLS.KeyFile, "redis-tls-key", "", "PEM key of --redis-tls-cert")
	f.StringVar(&cfg.Redis.TLS.ServerName, "redis-tls-server-name", "", "name every Redis server's certificate must carry; default: the host dialled")
	f.StringVar(&cfg.Redis.SentinelUsername, "redis-sentinel-username", "", "ACL user to authenticate to the Sentinels as (the store URL's credentials are the data nodes')")
	f.StringVar(&cfg.Redis.SentinelPassword, "redis-sentinel-password", "", "password of the Sentinels (requirepass, or of --redis-sentinel-username); prefer SLUICE_REDIS_SENTINEL_PASSWORD")
	f.StringVar(&cfg.Redis.KeyPrefix, "redis-key-prefix", "", "prefix of every key this daemon writes in Redis (limiter state, shared policies, saved shares) and of its policy channel, so that deployments sharing one Redis share no counters (envoyproxy/ratelimit's CACHE_KEY_PREFIX); letters, digits and . _ - : / only")
	f.DurationVar(&cfg.StoreTimeout, "store-timeout", def.StoreTimeout, "deadline of every decision-store call")
	f.StringVar(&cfg.DataDir, "data-dir", "", "directory for policies.json and audit.log (memory store); empty keeps them in memory")
	f.StringVar(&tokenFile, "admin-token-file", "", "file holding the admin API bearer token (or set SLUICE_ADMIN_TOKEN)")
	f.StringSliceVar(&trusted, "trusted-proxies", nil, "comma-separated CIDRs or addresses of the gateways whose --client-ip-header, tier and user headers are believed")
	f.StringVar(&cfg.ClientIPHeader, "client-ip-header", quota.ClientIPXForwardedFor, "where the client address comes from when the peer is a trusted proxy: X-Forwarded-For (right-most untrusted address), X-Real-IP, Forwarded (RFC 7239 for=, from the right) or none (the socket peer); no other forwarding header is read")
	f.StringVar(&cfg.ForwardAuthHeaders, "forward-auth-headers", region.ForwardAuthOriginal, "header pair /v1/authz reads the limited request's method and URI from: original (X-Original-Method, X-Original-URI: nginx) or forwarded (X-Forwarded-Method, X-Forwarded-Uri: Traefik, Caddy)")
	f.StringSliceVar(&cfg.KeyHeaders, "key-headers", quota.DefaultKeyHeaders(), "headers carrying the API key, in order (Authorization is read as Bearer)")
	f.StringVar(&cfg.TierHeader, "tier-header", def.TierHeader, "header a trusted gateway sets to name the tier (empty: off)")
	f.StringVar(&cfg.UserHeader, "user-header", "", "header a trusted gateway sets to name the user (empty: off)")
	f.Int64Var(&cfg.MaxBodyBytes, "max-body-bytes", def.MaxBodyBytes, "largest request body accepted")
	f.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", def.ShutdownTimeout, "how long in-flight requests may take to finish on SIGTERM")
	f.DurationVar(&cfg.PolicyRefresh, "policy-refresh", def.PolicyRefresh, "full refresh interval of policies shared through Redis (changes arrive at once by pub/sub)")
	f.StringVar(&configFile, "config", "", "JSON file of flag values, e.g. {\"listen\": \":8080\", \"trusted-proxies\": [\"10.0.0.0/8\"]}")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&rlsListen, "rls-listen", "", "serve Envoy's rate limit service (gRPC, envoy.service.ratelimit.v3) on this address; empty: off")
	f.StringVar(&rlsTransport, "rls-transport", "h2", "transport of --rls-listen: h2 (the service's own for a proxy's calls) or grpc (grpc-go tuned, for comparing them)")
	_ = f.MarkHidden("rls-transport")
	f.StringVar(&rlsHeaders, "rls-response-headers", "draft", "rate limit headers of --rls-listen's answers: draft (RateLimit-Policy, RateLimit), envoy (RateLimit-Limit, -Remaining, -Reset, as envoyproxy/ratelimit with LIMIT_RESPONSE_HEADERS_ENABLED) or both")
	rlsBounds.register(f)
	f.BoolVar(&rlsCountOver, "rls-count-over-limit", false, "count the hits of every --rls-listen request even when it is over the limit, as envoyproxy/ratelimit does (a token bucket into debt, a window past its count), for every domain; without it only the domains whose files set count_over_limit do, and a request over the limit spends nothing")
	f.StringVar(&cfg.DecisionLog.Path, "decision-log", "", "write sampled decision events as JSON lines to this file (appended), or - for standard output; empty: off")
	f.Float64Var(&cfg.DecisionLog.RejectRate, "decision-log-reject-rate", def.DecisionLog.RejectRate, "fraction in [0, 1] of rejections and shadow would-rejects written to --decision-log")
	f.Float64Var(&cfg.DecisionLog.AllowRate, "decision-log-allow-rate", def.DecisionLog.AllowRate, "fraction in [0, 1] of other admissions written to --decision-log")
	f.BoolVar(&cfg.DecisionLog.RawSubjects, "decision-log-raw-subjects", false, "write subjects as they are in --decision-log instead of their keyed hash")
	f.StringVar(&hashKeyFile, "decision-log-hash-key-file", "", "file holding the key of the subject hash in --decision-log (the same on every daemon makes hashes comparable); default: a random key per process")
	f.DurationVar(&cfg.DecisionLog.TopWindow, "top-window", def.DecisionLog.TopWindow, "window of GET /v1/decisions/top, the most limited subjects per policy")
	mr.register(f)
	sf.register(f)
	tf.register(f)
	return cmd
}

// rlsBoundFlags are the flags that bound --rls-listen's connections.
type rlsBoundFlags struct {
	maxConns, maxConnsPerAddr int
	writeTimeout              time.Duration
	maxAge, maxAgeGrace       time.Duration
}

func (b *rlsBoundFlags) register(f *pflag.FlagSet) {
	f.IntVar(&b.maxConns, "rls-max-connections", rls.DefaultMaxConnections, "most connections --rls-listen serves at once; one past it is closed as soon as it is accepted (sluice_rls_connections_refused_total{reason=\"max_connections\"})")
	f.IntVar(&b.maxConnsPerAddr, "rls-max-connections-per-address", rls.DefaultMaxConnectionsPerAddress, "most connections --rls-listen serves at once from one peer IP address; one past it is closed as soon as it is accepted (sluice_rls_connections_refused_total{reason=\"max_connections_per_address\"}); 0: no bound per address (for peers behind a proxy that hides their addresses)")
	f.DurationVar(&b.writeTimeout, "rls-write-timeout", rls.DefaultWriteTimeout, "how long one write of answers on --rls-listen may block on a peer that reads nothing before the connection is closed (sluice_rls_connections_closed_total)")
	f.DurationVar(&b.maxAge, "rls-max-connection-age", 0, "how long --rls-listen serves a connection before it sends a GOAWAY (calls in flight are answered, new ones go to a new connection), jittered by ±10%, so that proxies rebalance onto new servers; 0: no age (grpc-go's MaxConnectionAge)")
	f.DurationVar(&b.maxAgeGrace, "rls-max-connection-age-grace", 0, "how long after its --rls-max-connection-age GOAWAY a connection is closed with calls still in flight; 0: wait for them (grpc-go's MaxConnectionAgeGrace)")
}

// check checks the flags into one-line errors that name the flag.
func (b *rlsBoundFlags) check() error {
	switch {
	case b.maxConns <= 0:
		return fmt.Errorf("--rls-max-connections: must be positive, got %d", b.maxConns)
	case b.maxConnsPerAddr < 0:
		return fmt.Errorf("--rls-max-connections-per-address: must be 0 (no bound) or positive, got %d", b.maxConnsPerAddr)
	case b.writeTimeout <= 0:
		return fmt.Errorf("--rls-write-timeout: must be positive, got %v", b.writeTimeout)
	case b.maxAge < 0:
		return fmt.Errorf("--rls-max-connection-age: must be 0 (no age) or positive, got %v", b.maxAge)
	case b.maxAgeGrace < 0:
		return fmt.Errorf("--rls-max-connection-age-grace: must be 0 (wait for the calls) or positive, got %v", b.maxAgeGrace)
	case b.maxAgeGrace > 0 && b.maxAge == 0:
		return fmt.Errorf("--rls-max-connection-age-grace: needs --rls-max-connection-age, got %v without it", b.maxAgeGrace)
	}
	return nil
}

// config is the rls.Config of the flags' bounds.
func (b *rlsBoundFlags) config() rls.Config {
	perAddr := b.maxConnsPerAddr
	if perAddr == 0 {
		perAddr = -1 // no bound per address
	}
	return rls.Config{MaxConnections: b.maxConns, MaxConnectionsPerAddress: perAddr, WriteTimeout: b.writeTimeout,
		MaxConnectionAge: b.maxAge, MaxConnectionAgeGrace: b.maxAgeGrace}
}

// rlsTransportOf is the rls.Transport that --rls-transport names.
func rlsTransportOf(name string) (rls.Transport, error) {
	switch name {
	case "h2":
		return rls.TransportH2, nil
	case "grpc":
		return rls.TransportGRPC, nil
	}
	return 0, fmt.Errorf("--rls-transport: %q is neither h2 nor grpc", name)
}

// serveWithRLS runs the daemon on ls and, with ls.rls, the rate limit
// service together, and reloads their TLS files: either server failing
// stops the rest. On shutdown the rate limit service finishes its
// in-flight calls first, then the daemon, which closes the store those
// calls use.
func serveWithRLS(ctx context.Context, d *region.Daemon, cfg region.Config, ls *servingListeners, opts rls.Config, log *slog.Logger, reg prometheus.Registerer) error {
	var s *rls.Server
	if ls.rls != nil {
		// On a Cluster one engine call is one slot: each descriptor gets a
		// subject (a slot) of its own, so a domain spreads over the primaries.
		spread := strings.HasPrefix(cfg.Store, "redis-cluster://")
		var err error
		s, err = rls.New(rls.Config{Decider: d.Decider(), Matcher: d.Registry(), Logger: log, Registerer: reg, ShutdownTimeout: cfg.ShutdownTimeout,
			Transport: opts.Transport, Headers: opts.Headers, SpreadDescriptors: spread,
			MaxConnections: opts.MaxConnections, MaxConnectionsPerAddress: opts.MaxConnectionsPerAddress,
			MaxConnectionAge: opts.MaxConnectionAge, MaxConnectionAgeGrace: opts.MaxConnectionAgeGrace,
			WriteTimeout: opts.WriteTimeout, CountOverLimit: opts.CountOverLimit})
		if err != nil {
			ls.close()
			return err
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	dctx, stopDaemon := context.WithCancel(context.WithoutCancel(ctx))
	defer stopDaemon()
	rctx, stopReload := context.WithCancel(gctx)
	g.Go(func() error {
		defer stopReload()
		return d.Serve(dctx, ls.gateway, ls.admin)
	})
	g.Go(func() error { return ls.reload(rctx) })
	g.Go(func() error {
		defer stopDaemon()
		if s == nil {
			<-rctx.Done() // the daemon has stopped, or ctx ended
			return nil
		}
		return s.Serve(gctx, ls.rls)
	})
	return g.Wait()
}

// decisionLogFlags checks the decision-log flags into one-line errors
// that name the flag, and reads the hash key file.
func decisionLogFlags(c *decisionlog.Config, hashKeyFile string) error {
	for _, r := range []struct {
		flag string
		v    float64
	}{{"--decision-log-reject-rate", c.RejectRate}, {"--decision-log-allow-rate", c.AllowRate}} {
		if !(r.v >= 0 && r.v <= 1) {
			return fmt.Errorf("%s: must be in [0, 1], got %v", r.flag, r.v)
		}
	}
	if c.TopWindow <= 0 {
		return fmt.Errorf("--top-window: must be positive, got %v", c.TopWindow)
	}
	if hashKeyFile != "" {
		b, err := os.ReadFile(hashKeyFile)
		if err != nil {
			return fmt.Errorf("--decision-log-hash-key-file: %w", err)
		}
		if c.HashKey = []byte(strings.TrimSpace(string(b))); len(c.HashKey) == 0 {
			return fmt.Errorf("--decision-log-hash-key-file %s is empty", hashKeyFile)
		}
	}
	return nil
}

// redisFlagNames maps a redisstore.SettingError's setting to its flag.
var redisFlagNames = map[string]string{
	"url": "--store", "tls-ca": "--redis-tls-ca", "tls-cert": "--redis-tls-cert", "tls-key": "--redis-tls-key",
	"tls-server-name": "--redis-tls-server-name", "sentinel-username": "--redis-sentinel-username",
	"sentinel-password": "--redis-sentinel-password",
	"key-prefix":        "--redis-key-prefix",
}

// redisFlags checks the Redis connection flags against --store and reads
// their files, so that a CA or certificate that cannot be used is a
// one-line error naming the flag at start, not a store that never answers.
func redisFlags(store string, rc redisstore.ClientConfig) error {
	if store == "memory" {
		if rc != (redisstore.ClientConfig{}) {
			return errors.New("--store: memory takes no --redis-* settings")
		}
		return nil
	}
	err := rc.Check(store)
	var se *redisstore.SettingError
	if errors.As(err, &se) {
		name := redisFlagNames[se.Setting]
		if name == "" {
			name = "--store"
		}
		return fmt.Errorf("%s: %w", name, se.Err)
	}
	return err
}

// identityFlags parses --trusted-proxies into cfg and checks the identity
// flags, so that a setting that could never work is a one-line error at
// start: a prefix that can never match a peer (IPv4-mapped IPv6, zoned), an
// unknown --client-ip-header or --forward-auth-headers, an invalid header
// name.
func identityFlags(cfg *region.Config, trusted []string) error {
	for _, s := range trusted {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if strings.Contains(s, "%") {
			return fmt.Errorf("--trusted-proxies: %q has a zone; peers are compared without zone, so it would never match: drop the %%zone", s)
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return fmt.Errorf("--trusted-proxies: %q is not a CIDR or address", s)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		if p.Addr().Is4In6() {
			return fmt.Errorf("--trusted-proxies: %q is IPv4-mapped IPv6; peers are compared as IPv4, so it would never match: write the IPv4 form (e.g. 10.0.0.0/8)", s)
		}
		cfg.TrustedProxies = append(cfg.TrustedProxies, p.Masked())
	}
	h, err := quota.ParseClientIPHeader(cfg.ClientIPHeader)
	if err != nil || cfg.ClientIPHeader == "" {
		return fmt.Errorf("--client-ip-header: must be X-Forwarded-For, X-Real-IP, Forwarded or none, got %q", cfg.ClientIPHeader)
	}
	cfg.ClientIPHeader = h
	switch cfg.ForwardAuthHeaders {
	case region.ForwardAuthOriginal, region.ForwardAuthForwarded:
	default:
		return fmt.Errorf("--forward-auth-headers: must be original or forwarded, got %q", cfg.ForwardAuthHeaders)
	}
	for _, fl := range []struct{ name, v string }{{"--tier-header", cfg.TierHeader}, {"--user-header", cfg.UserHeader}} {
		if fl.v != "" && !quota.ValidHeaderName(fl.v) {
			return fmt.Errorf("%s: %q is not a valid header name", fl.name, fl.v)
		}
	}
	for _, k := range cfg.KeyHeaders {
		if !quota.ValidHeaderName(k) {
			return fmt.Errorf("--key-headers: %q is not a valid header name", k)
		}
	}
	return nil
}

// applyConfigFile sets every flag not already set on the command line or
// from the environment from a JSON object keyed by flag name.
func applyConfigFile(fs *pflag.FlagSet, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return fmt.Errorf("--config %s: want a JSON object of flag values: %w", path, err)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fl := fs.Lookup(k)
		if fl == nil || k == "config" || k == "help" {
			return fmt.Errorf("--config %s: unknown setting %q", path, k)
		}
		if fl.Changed {
			continue
		}
		val, err := configValue(m[k])
		if err != nil {
			return fmt.Errorf("--config %s: %s: %w", path, k, err)
		}
		if err := fs.Set(k, val); err != nil {
			return fmt.Errorf("--config %s: %s: %w", path, k, err)
		}
	}
	return nil
}

func configValue(raw json.RawMessage) (string, error) {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return "", err
	}
	switch x := v.(type) {
	case string:
		return x, nil
	case bool, float64:
		return strings.TrimSpace(string(raw)), nil
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			s, ok := e.(string)
			if !ok {
				return "", errors.New("a list must hold strings")
			}
			parts[i] = s
		}
		return strings.Join(parts, ","), nil
	}
	return "", errors.New("want a string, number, boolean or list of strings")
}
