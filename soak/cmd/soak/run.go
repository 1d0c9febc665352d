package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sluice-rl/sluice/soak"
)

func jsonOf(v any) (string, error) {
	b, err := json.MarshalIndent(v, "", " ")
	return string(b), err
}

// partitioner cuts a region's gossip from the others.
type partitioner interface {
	cut(region string) error
	heal(region string) error
}

// run sets the deployment up, drives it for o.duration with the nemesis
// playing its schedule, stops it, and checks and writes the report. A
// report is returned whenever the run got as far as traffic.
func run(ctx context.Context, o options) (*soak.Report, error) {
	// Redis runs in a directory of its own: every path it is given must
	// be absolute.
	var err error
	if o.out, err = filepath.Abs(o.out); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return nil, err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	tb := &harnessTB{dir: o.out, log: log}
	defer tb.close()
	dp, err := setup(ctx, o, tb, log)
	if dp != nil {
		defer dp.stop()
	}
	if err != nil {
		return nil, err
	}
	start := time.Now()
	rep := &soak.Report{Seed: o.seed, Duration: o.duration.String(), Started: start}
	plan := soak.Plan(soak.PlanConfig{Seed: o.seed, Duration: o.duration, Kinds: o.kinds, Regions: regionNames, Daemons: daemonsPerRegion})
	rep.Schedule = plan
	tl := newTimeline(start.Add(-time.Minute))
	nem := &nemesis{dp: dp, tl: tl, log: log, start: start, net: proxyPartitioner{dp.proxy}}
	rc := &recorder{}
	runCtx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	var clients sync.WaitGroup
	closeRLS, err := startTraffic(runCtx, o, dp, rc, start, &clients)
	if err != nil {
		return nil, err
	}
	defer closeRLS()
	samples := make(chan soak.Sample)
	go sampler(runCtx, dp, samples)
	var wg sync.WaitGroup
	var failovers []soak.Span
	wg.Add(1)
	go func() { defer wg.Done(); failovers = watchFailovers(runCtx, dp) }()
	wg.Add(1)
	go func() { defer wg.Done(); nem.run(runCtx, plan) }()
	var injectedAt time.Time
	if o.inject != "" {
		wg.Add(1)
		go func() { defer wg.Done(); rep.Injected, injectedAt = inject(runCtx, dp, tl, o.duration, log) }()
	}
	for s := range samples {
		rep.Samples = append(rep.Samples, s)
	}
	wg.Wait()
	clients.Wait()
	rep.Ended = time.Now()
	rep.Interrupted = ctx.Err() != nil
	if err := rc.markGatewayDegraded(dp.nginxLog); err != nil {
		rep.Errors = append(rep.Errors, err.Error())
	}
	finish(rep, o, rc, tl, nem, failovers)
	for _, v := range rep.Violations {
		if !injectedAt.IsZero() && v.Rule == soak.RuleOverAdmission && strings.Contains(v.Key, "/api/") && v.Time.After(injectedAt) {
			rep.InjectedSeen++
		}
	}
	return rep, writeReport(rep, o.out)
}

// startTraffic starts the clients: /v1/check on every region, nginx on
// the single one, RLS on the Sentinel one.
func startTraffic(ctx context.Context, o options, dp *deployment, rc *recorder, start time.Time, wg *sync.WaitGroup) (func(), error) {
	tr := soak.DefaultTraffic(o.seed)
	if o.base > 0 {
		tr.Base = o.base
	}
	rlsSend, closeRLS, err := rlsSender(dp.region(regionSentinel))
	if err != nil {
		return nil, err
	}
	wg.Add(len(dp.regions) + 2)
	for _, r := range dp.regions {
		go drive(ctx, rc, tr, start, r.name, "check", checkSender(r), wg.Done)
	}
	go drive(ctx, rc, tr, start, regionSingle, "nginx", nginxSender(dp.region(regionSingle), dp.nginxAddr), wg.Done)
	go drive(ctx, rc, tr, start, regionSentinel, "rls", rlsSend, wg.Done)
	return closeRLS, nil
}

// inject raises the api policy through one daemon half-way through the
// run without telling the checker: the checker must report it.
func inject(ctx context.Context, dp *deployment, tl *timeline, d time.Duration, log *slog.Logger) (string, time.Time) {
	sleep(ctx, d/2)
	if ctx.Err() != nil {
		return "", time.Time{}
	}
	p, _ := tl.doc("api")
	p.Limit *= 4
	dm := dp.region(regionCluster).daemons[0]
	if err := tl.put(ctx, dm, dp.token, p, false); err != nil {
		log.Warn("inject", "err", err)
		return "over-admission: failed: " + err.Error(), time.Time{}
	}
	at := time.Now()
	return fmt.Sprintf("over-admission: api raised to %v through %s at %s, hidden from the checker", p.Limit, dm.name, at.UTC().Format(time.RFC3339)), at
}

// degradedHealthy is the share of answers, with a region's stores and
// daemons up, that the fallback may decide: a store call that misses its
// deadline (5 ms by default) because Redis waited for a CPU, with some
// twenty processes on the machine, is decided so, and one in two hundred
// is the margin this deployment is held to.
const degradedHealthy = 0.005

// finish checks what the clients saw and fills the report. The faults are
// the nemesis's and the failovers the watch saw that none of them explains.
func finish(rep *soak.Report, o options, rc *recorder, tl *timeline, nem *nemesis, failovers []soak.Span) {
	reqs, unsent := rc.all()
	rep.Bounds = soak.Bounds{DaemonsPerRegion: daemonsPerRegion, ReportDelay: 2 * o.interval, Settle: 6 * time.Second,
		PolicySlack: 5 * time.Second, Latency: o.latency, ChartSubject: soak.HotSubject, DegradedHealthy: degradedHealthy}
	nem.mu.Lock()
	rep.Faults = append([]soak.Span(nil), nem.spans...)
	rep.Errors = append(rep.Errors, nem.errors...)
	nem.mu.Unlock()
	rep.Faults = append(rep.Faults, soak.Spontaneous(failovers, rep.Faults, rep.Bounds.Settle)...)
	sort.SliceStable(rep.Faults, func(i, j int) bool { return rep.Faults[i].Start.Before(rep.Faults[j].Start) })
	rep.Policies = tl.snapshot()
	rep.Violations, rep.Windows = soak.Check(reqs, rep.Policies, rep.Faults, rep.Bounds)
	var lost []soak.Violation
	lost, rep.Losses = soak.FalsePartitions(rep.Samples, rep.Faults, rep.Bounds.Settle)
	rep.Violations = append(rep.Violations, lost...)
	sort.SliceStable(rep.Violations, func(i, j int) bool { return rep.Violations[i].Time.Before(rep.Violations[j].Time) })
	rep.Degraded = soak.DegradedShares(reqs, rep.Faults, rep.Bounds)
	rep.Counts = soak.Counts(reqs)
	if unsent > 0 {
		rep.Counts["unsent"] = unsent
	}
	rep.Latency = soak.Latencies(reqs, 10*time.Second)
	wf, wt := soak.Window(o.duration)
	from, to := rep.Started.Add(wf), rep.Started.Add(wt)
	for _, f := range rep.Faults {
		from, to = minTime(from, f.Start), maxTime(to, f.End)
	}
	soak.CountActive(rep.Samples, reqs, rep.Policies)
	rep.Leaks = soak.Leaks(rep.Samples, rep.Started, from, to, 10*time.Second, daemonsPerRegion*len(regionNames))
	if !rep.Interrupted {
		rep.Violations = append(rep.Violations, soak.LeakViolations(rep.Leaks, rep.Ended)...)
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func writeReport(rep *soak.Report, dir string) error {
	for name, write := range map[string]func(*os.File) error{
		"report.json": func(f *os.File) error { return rep.WriteJSON(f) },
		"report.html": func(f *os.File) error { return rep.WriteHTML(f) },
	} {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		err = write(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}
