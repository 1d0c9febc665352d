package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"golang.org/x/sync/errgroup"

	"github.com/sluice-rl/sluice/configsource"
	"github.com/sluice-rl/sluice/configsource/xds"
	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/rls"
)

// Names of the watched configuration sources, in ownership, logs and
// the source label of the sluice_config_* metrics.
const (
	sourcePolicies = "policies"
	sourceEnvoy    = "envoy-config"
	sourceXDS      = "xds"
)

// sourceFlags are the flags of the watched configuration sources.
type sourceFlags struct {
	policies     string
	envoy        []string
	mergeDomains bool
	interval     time.Duration
	xdsServer    string
	xdsNode      string
}

func (s *sourceFlags) register(f *pflag.FlagSet) {
	f.StringVar(&s.policies, "policies", "", "JSON array of policy documents (a file, or a directory of *.json files) to seed at start, replacing the built-in defaults ([] = none); watched, see --config-watch-interval")
	f.StringArrayVar(&s.envoy, "envoy-config", nil, "envoyproxy/ratelimit YAML file, or directory of *.yaml and *.yml files (subdirectories included), to load as descriptor policies (repeatable); watched, see --config-watch-interval")
	f.BoolVar(&s.mergeDomains, "envoy-merge-domains", false, "let several --envoy-config files configure one domain, their descriptors merged (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG); without it a domain in two files is an error")
	f.StringVar(&s.xdsServer, "envoy-xds-server", "", "host:port of an xDS server to take rate limit configuration from (state of the world, ratelimit.config.ratelimit.v3.RateLimitConfig, as envoyproxy/ratelimit's CONFIG_TYPE=GRPC_XDS_SOTW; plaintext); empty: off")
	f.StringVar(&s.xdsNode, "envoy-xds-node-id", "default", "node id sent to --envoy-xds-server (envoyproxy/ratelimit's CONFIG_GRPC_XDS_NODE_ID)")
	f.DurationVar(&s.interval, "config-watch-interval", configsource.DefaultInterval, "how often --policies and --envoy-config files are read for changes (a change is in force after two reads that agree); 0: read once at start")
}

// watchedSource is one file source: its configuration, and the files and
// policies read at start.
type watchedSource struct {
	cfg      configsource.FileConfig
	files    configsource.Files
	policies []quota.Policy
}

// sources are the configuration sources serve watches.
type sources struct {
	policies, envoy *watchedSource
	interval        time.Duration
	xds             *xds.Config
}

// loadSources reads the --policies and --envoy-config files once, at
// start: an error is a one-line error naming the flag.
func loadSources(s sourceFlags) (*sources, error) {
	if s.interval < 0 {
		return nil, fmt.Errorf("--config-watch-interval: must not be negative, got %v", s.interval)
	}
	out := &sources{interval: s.interval}
	if s.xdsServer != "" {
		if _, _, err := net.SplitHostPort(s.xdsServer); err != nil {
			return nil, fmt.Errorf("--envoy-xds-server: want host:port, got %q", s.xdsServer)
		}
		if s.xdsNode == "" {
			return nil, errors.New("--envoy-xds-node-id: must not be empty")
		}
		c := xds.DefaultConfig(s.xdsServer)
		c.NodeID, c.Source, c.Merge = s.xdsNode, sourceXDS, s.mergeDomains
		out.xds = &c
	}
	if s.policies != "" {
		c := configsource.FileConfig{Source: sourcePolicies, Paths: []string{s.policies}, Exts: configsource.PolicyExts,
			MaxBytes: quota.MaxPoliciesBytes, Parse: configsource.PolicyParser, Interval: s.interval}
		files, ps, err := configsource.Load(c)
		if err != nil {
			return nil, fmt.Errorf("--policies: %w", err)
		}
		out.policies = &watchedSource{cfg: c, files: files, policies: ps}
	}
	if len(s.envoy) > 0 {
		c := configsource.FileConfig{Source: sourceEnvoy, Paths: s.envoy, Exts: configsource.EnvoyExts,
			MaxBytes: rls.MaxEnvoyConfigBytes, Parse: configsource.EnvoyParser(s.mergeDomains), Interval: s.interval}
		files, ps, err := configsource.Load(c)
		if err != nil {
			return nil, fmt.Errorf("--envoy-config: %w", err)
		}
		out.envoy = &watchedSource{cfg: c, files: files, policies: ps}
	}
	return out, nil
}

// seed is the policy set to seed at start (region.Config.Policies): the
// --policies file's, else nil (the built-in defaults), with the
// --envoy-config policies added.
func (s *sources) seed() []quota.Policy {
	var ps []quota.Policy
	if s.policies != nil {
		ps = s.policies.policies
		if ps == nil {
			ps = []quota.Policy{}
		}
	}
	if s.envoy != nil {
		if ps == nil {
			ps = quota.DefaultPolicies()
		}
		ps = append(slices.Clip(ps), s.envoy.policies...)
	}
	return ps
}

// run runs serve and, beside it, a watcher of each source writing into
// t (the daemon's region.SourceWriter); serve returning stops the
// watchers.
func (s *sources) run(ctx context.Context, t configsource.Target, log *slog.Logger, prom prometheus.Registerer, serve func(context.Context) error) error {
	var runs []func(context.Context) error
	a := configsource.NewApplier(t)
	rep := configsource.NewReporter(log, prom)
	for _, src := range []*watchedSource{s.policies, s.envoy} {
		if src == nil || s.interval == 0 {
			continue
		}
		if err := a.Claim(src.cfg.Source, src.policies); err != nil {
			return err
		}
		w, err := configsource.NewWatcher(src.cfg, src.files, a, rep)
		if err != nil {
			return err
		}
		runs = append(runs, w.Run)
	}
	if s.xds != nil {
		sub, err := xds.New(*s.xds, a, rep, log)
		if err != nil {
			return fmt.Errorf("--envoy-xds-server: %w", err)
		}
		runs = append(runs, sub.Run)
	}
	if len(runs) == 0 {
		return serve(ctx)
	}
	g, gctx := errgroup.WithContext(ctx)
	wctx, stop := context.WithCancel(gctx)
	g.Go(func() error {
		defer stop()
		return serve(ctx)
	})
	for _, run := range runs {
		g.Go(func() error { return run(wctx) })
	}
	return g.Wait()
}
