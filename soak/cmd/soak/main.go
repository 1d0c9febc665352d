// Command soak runs Sluice for a long while under traffic and faults and
// judges what its clients saw (make soak; SOAK=5m for a short run).
//
// It starts three regions of two sluice serve daemons each, all in one
// gossip cluster: "single" on one redis-server with nginx (the shipped
// deploy/nginx/sluice.conf) in front, "sentinel" on a Sentinel deployment
// with RLS (gRPC) clients, and "cluster" on a Redis Cluster of three
// primaries with a replica each; /v1/check clients run against every
// region. The traffic (soak.Traffic) and the nemesis's faults (soak.Plan)
// come from -seed. When the run ends, or on SIGINT, it stops every process
// it started, checks the requests against the documented bounds
// (soak.Check) and the leak figures (soak.Leaks), and writes
// report.json and report.html under -out. It exits 1 on any violation.
//
//	go run ./soak/cmd/soak -duration 5m -seed 1 -out out/soak
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/soak"
)

type options struct {
	seed     uint64
	duration time.Duration
	kinds    []soak.Kind
	out      string
	repo     string
	inject   string
	latency  time.Duration
	interval time.Duration
	base     float64
	storeTO  string
	preset   string
}

// parseFlags reads the command line; any error is one line.
func parseFlags(args []string) (options, error) {
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	seed := fs.String("seed", "1", "seed of the traffic and of the nemesis's schedule (an unsigned integer)")
	dur := fs.String("duration", "60m", "how long the soak runs (a Go duration, at least 2m)")
	faults := fs.String("faults", "all", "comma-separated faults the nemesis may inject ("+joinKinds()+"), all or none")
	var o options
	fs.StringVar(&o.out, "out", "out/soak", "directory of the report and the processes' logs")
	fs.StringVar(&o.repo, "repo", ".", "the repository (deploy/nginx/sluice.conf and ./cmd/sluice are read from it)")
	fs.StringVar(&o.inject, "inject", "", "over-admission: raise a policy through one daemon half-way, hidden from the checker, which must report it")
	fs.DurationVar(&o.latency, "latency-bound", 1500*time.Millisecond, "slowest answer allowed: store deadline, queue wait and the gateway's margin on a shared machine")
	fs.DurationVar(&o.interval, "gossip-interval", 10*time.Second, "the daemons' --gossip-interval (the daemon's default: 10s)")
	fs.StringVar(&o.preset, "gossip-preset", "local", "the daemons' --gossip-preset: local (loopback timings), lan or wan")
	fs.StringVar(&o.storeTO, "store-timeout", "", "the daemons' --store-timeout (empty: the daemon's default)")
	fs.Float64Var(&o.base, "rate", 0, "requests per second per region and client kind (default: soak.DefaultTraffic's)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	var err error
	if o.seed, err = strconv.ParseUint(*seed, 10, 64); err != nil {
		return o, fmt.Errorf("-seed %q: not an unsigned integer", *seed)
	}
	if o.duration, err = time.ParseDuration(*dur); err != nil {
		return o, fmt.Errorf("-duration %q: not a duration (e.g. 5m)", *dur)
	}
	if o.duration < 2*time.Minute {
		return o, fmt.Errorf("-duration %v: at least 2m (warm-up, faults and a quiet tail)", o.duration)
	}
	if o.kinds, err = soak.ParseKinds(*faults); err != nil {
		return o, fmt.Errorf("-faults: %v", err)
	}
	if o.storeTO != "" {
		if _, err := time.ParseDuration(o.storeTO); err != nil {
			return o, fmt.Errorf("-store-timeout %q: not a duration", o.storeTO)
		}
	}
	if o.preset != "local" && o.preset != "lan" && o.preset != "wan" {
		return o, fmt.Errorf("-gossip-preset %q: want local, lan or wan", o.preset)
	}
	if o.inject != "" && o.inject != "over-admission" {
		return o, fmt.Errorf("-inject %q: only over-admission", o.inject)
	}
	return o, nil
}

func joinKinds() string {
	s := ""
	for i, k := range soak.Kinds {
		if i > 0 {
			s += ", "
		}
		s += string(k)
	}
	return s
}

func main() {
	// internal/redistest asks testing.Short(), which needs the testing
	// flags registered and parsed; none is given.
	testing.Init()
	_ = flag.CommandLine.Parse(nil)
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "soak: %v\n", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx, o)
	if rep != nil {
		fmt.Println(rep.Summary())
		fmt.Println("report:", filepath.Join(o.out, "report.html"))
	}
	switch {
	case err != nil:
		fmt.Fprintf(os.Stderr, "soak: %v\n", err)
		os.Exit(1)
	case rep != nil && len(rep.Violations) > 0:
		os.Exit(1)
	case rep != nil && rep.Interrupted:
		os.Exit(130)
	}
}

// setup builds sluice and starts the deployment: Redis, daemons, nginx.
func setup(ctx context.Context, o options, tb *harnessTB, log *slog.Logger) (*deployment, error) {
	dp := &deployment{dir: o.out, bin: filepath.Join(o.out, "sluice")}
	build := exec.CommandContext(ctx, "go", "build", "-o", dp.bin, "./cmd/sluice")
	build.Dir, build.Stderr = o.repo, os.Stderr
	if err := build.Run(); err != nil {
		return nil, fmt.Errorf("build sluice: %w", err)
	}
	tok := make([]byte, 16)
	_, _ = rand.Read(tok)
	dp.token = hex.EncodeToString(tok)
	files := map[string]string{"admin-token": dp.token, "envoy.yaml": envoyConfig(int(rlsPolicy.Limit))}
	pol, err := jsonOf(initialPolicies())
	if err != nil {
		return nil, err
	}
	files["policies.json"] = pol
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(o.out, name), []byte(body), 0o600); err != nil {
			return nil, err
		}
	}
	for _, name := range regionNames {
		r := &region{name: name}
		log.Info("starting redis", "region", name)
		if err := startRedis(tb, r); err != nil {
			return dp, fmt.Errorf("region %s: %w", name, err)
		}
		dp.regions = append(dp.regions, r)
	}
	if err := dp.newDaemons(filepath.Join(o.out, "policies.json"), filepath.Join(o.out, "envoy.yaml"), o.interval, o.preset); err != nil {
		return dp, err
	}
	if o.storeTO != "" {
		for _, d := range dp.daemons() {
			d.args = append(d.args, "--store-timeout", o.storeTO)
		}
	}
	dp.proxy = newGossipProxy(dp, log)
	for _, d := range dp.daemons() {
		if err := dp.proxy.serve(ctx, d, d.advertise); err != nil {
			return dp, err
		}
	}
	for _, d := range dp.daemons() {
		if err := d.start(); err != nil {
			return dp, err
		}
		if err := d.waitReady(ctx); err != nil {
			return dp, err
		}
	}
	log.Info("daemons up", "daemons", len(dp.daemons()))
	if err := dp.startNginx(o.repo, dp.region(regionSingle)); err != nil {
		return dp, err
	}
	return dp, nil
}

var errInterrupted = errors.New("interrupted")
