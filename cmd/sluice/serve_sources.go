package main

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"golang.org/x/sync/errgroup"

	"github.com/sluice-rl/sluice/configsource"
	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/rls"
)

// Names of the watched configuration sources, in ownership, logs and
// the source label of the sluice_config_* metrics.
const (
	sourcePolicies = "policies"
	sourceEnvoy    = "envoy-config"
)

// sourceFlags are the flags of the watched configuration sources.
type sourceFlags struct {
	policies     string
	envoy        []string
	mergeDomains bool
	interval     time.Duration
}

func (s *sourceFlags) register(f *pflag.FlagSet) {
	f.StringVar(&s.policies, "policies", "", "JSON array of policy documents (a file, or a directory of *.json files) to seed at start, replacing the built-in defaults ([] = none); watched, see --config-watch-interval")
	f.StringArrayVar(&s.envoy, "envoy-config", nil, "envoyproxy/ratelimit YAML file, or directory of *.yaml and *.yml files (subdirectories included), to load as descriptor policies (repeatable); watched, see --config-watch-interval")
	f.BoolVar(&s.mergeDomains, "envoy-merge-domains", false, "let several --envoy-config files configure one domain, their descriptors merged (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG); without it a domain in two files is an error")
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
}

// loadSources reads the --policies and --envoy-config files once, at
// start: an error is a one-line error naming the flag.
func loadSources(s sourceFlags) (*sources, error) {
	if s.interval < 0 {
		return nil, fmt.Errorf("--config-watch-interval: must not be negative, got %v", s.interval)
	}
	out := &sources{interval: s.interval}
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
// reg; serve returning stops the watchers.
func (s *sources) run(ctx context.Context, reg *quota.Registry, log *slog.Logger, prom prometheus.Registerer, serve func(context.Context) error) error {
	var ws []*configsource.Watcher
	if s.interval > 0 {
		a := configsource.NewApplier(reg)
		rep := configsource.NewReporter(log, prom)
		for _, src := range []*watchedSource{s.policies, s.envoy} {
			if src == nil {
				continue
			}
			if err := a.Claim(src.cfg.Source, src.policies); err != nil {
				return err
			}
			w, err := configsource.NewWatcher(src.cfg, src.files, a, rep)
			if err != nil {
				return err
			}
			ws = append(ws, w)
		}
	}
	if len(ws) == 0 {
		return serve(ctx)
	}
	g, gctx := errgroup.WithContext(ctx)
	wctx, stop := context.WithCancel(gctx)
	g.Go(func() error {
		defer stop()
		return serve(ctx)
	})
	for _, w := range ws {
		g.Go(func() error { return w.Run(wctx) })
	}
	return g.Wait()
}
