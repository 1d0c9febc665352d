package main

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/soak"
)

// nemesis plays a schedule of faults on the deployment and records each
// as it happened.
type nemesis struct {
	dp    *deployment
	tl    *timeline
	net   partitioner
	log   *slog.Logger
	start time.Time

	mu     sync.Mutex
	spans  []soak.Span
	errors []string
}

func (n *nemesis) record(s soak.Span) {
	n.mu.Lock()
	n.spans = append(n.spans, s)
	n.mu.Unlock()
}

func (n *nemesis) fail(f soak.Fault, err error) {
	n.log.Warn("fault failed", "fault", f.String(), "err", err)
	n.mu.Lock()
	n.errors = append(n.errors, fmt.Sprintf("%s: %v", f, err))
	n.mu.Unlock()
}

// run starts each fault at its time, each in its own goroutine so that
// faults overlap, and returns when all have ended or ctx is done (each
// fault then undoes what it did: a stopped Redis is continued, a killed
// daemon started).
func (n *nemesis) run(ctx context.Context, plan []soak.Fault) {
	var wg sync.WaitGroup
	for _, f := range plan {
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(n.start.Add(f.At))):
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := n.apply(ctx, f); err != nil {
				n.fail(f, err)
			}
		}()
	}
	wg.Wait()
}

// sleep waits d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func (n *nemesis) apply(ctx context.Context, f soak.Fault) error {
	r := n.dp.region(f.Region)
	span := soak.Span{Kind: f.Kind, Region: f.Region, Start: time.Now()}
	defer func() {
		if !span.End.IsZero() {
			n.record(span)
		}
	}()
	// Cleanup runs on a context of its own: a fault stopped by the end of
	// the run still puts back what it broke.
	undo := context.WithoutCancel(ctx)
	switch f.Kind {
	case soak.KillDaemon:
		d := r.daemons[f.Daemon%len(r.daemons)]
		span.Daemon = d.name
		d.signal(syscall.SIGKILL)
		sleep(ctx, f.For)
		err := restart(undo, d)
		span.End = time.Now()
		return err
	case soak.RollRegion:
		for _, d := range r.daemons {
			d.signal(syscall.SIGTERM)
			if err := restart(undo, d); err != nil {
				span.End = time.Now()
				return err
			}
		}
		span.End = time.Now()
		return nil
	case soak.KillPrimary, soak.PauseRedis:
		r.storeMu.Lock()
		defer r.storeMu.Unlock()
		span.Start = time.Now()
		err := n.storeFault(ctx, r, f, &span)
		span.End = time.Now()
		return err
	case soak.Partition:
		if n.net == nil {
			return fmt.Errorf("partition: no gossip proxy")
		}
		if err := n.net.cut(f.Region); err != nil {
			return err
		}
		sleep(ctx, f.For)
		err := n.net.heal(f.Region)
		span.End = time.Now()
		return err
	case soak.Starve:
		starve(ctx, r.daemons, f)
		span.End = time.Now()
		return nil
	case soak.PolicyChange:
		span.Detail = f.Action
		err := n.policyChange(ctx, f)
		span.End = time.Now()
		return err
	}
	return fmt.Errorf("unknown fault %q", f.Kind)
}

// Starvation's pattern: a daemon stopped for starveStop and let run for
// starveRun, each drawn anew every round. The longest stops outlast the
// probe timeout of the soak's gossip preset (local: 200 ms), so single
// pings go unanswered, as on a starved host, but not the second of
// silence the daemons take for a partition; every stop is many store
// deadlines long.
const (
	starveStopMin, starveStopMax = 20 * time.Millisecond, 300 * time.Millisecond
	starveRunMin, starveRunMax   = 10 * time.Millisecond, 50 * time.Millisecond
)

// starve stops and continues ds together, in rounds drawn from the
// fault's time, for f.For or until ctx is done; every daemon is continued
// when it returns. A daemon killed and started again meanwhile is starved
// as its new process.
func starve(ctx context.Context, ds []*daemon, f soak.Fault) {
	rng := rand.New(rand.NewPCG(uint64(f.At), 0x57a4))
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(rng.Int64N(int64(hi-lo)+1)) }
	signal := func(sig syscall.Signal) {
		for _, d := range ds {
			if pid := d.pid(); pid != 0 {
				_ = syscall.Kill(pid, sig)
			}
		}
	}
	defer signal(syscall.SIGCONT)
	end := time.Now().Add(f.For)
	for ctx.Err() == nil && time.Now().Before(end) {
		signal(syscall.SIGSTOP)
		sleep(ctx, between(starveStopMin, starveStopMax))
		signal(syscall.SIGCONT)
		sleep(ctx, between(starveRunMin, starveRunMax))
	}
}

// restart starts d again and waits until it answers.
func restart(ctx context.Context, d *daemon) error {
	if err := d.start(); err != nil {
		return err
	}
	return d.waitReady(ctx)
}

// storeFault kills or stops the region's Redis primary.
func (n *nemesis) storeFault(ctx context.Context, r *region, f soak.Fault, span *soak.Span) error {
	var p *redistest.Server
	if err := try(func() { p = r.primary() }); err != nil {
		return err
	}
	span.Detail = p.Addr()
	if f.Kind == soak.PauseRedis {
		pid := p.PID()
		if pid == 0 {
			return fmt.Errorf("pause %s: not running", p.Addr())
		}
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			return err
		}
		sleep(ctx, f.For)
		return syscall.Kill(pid, syscall.SIGCONT)
	}
	return try(func() {
		switch {
		case r.sentinel != nil:
			killed, _ := r.sentinel.KillPrimaryAndWaitFailover()
			sleep(ctx, f.For)
			killed.Restart()
		case r.cluster != nil:
			killed, _ := r.cluster.KillPrimaryAndWaitFailover(hotKey)
			sleep(ctx, f.For)
			killed.Restart()
		default:
			p.Kill()
			sleep(ctx, f.For)
			p.Restart()
		}
	})
}

// policyChange changes a policy through the admin API of one daemon of
// the fault's region, and records it in the timeline.
func (n *nemesis) policyChange(ctx context.Context, f soak.Fault) error {
	r := n.dp.region(f.Region)
	d := r.daemons[int(f.At/time.Second)%len(r.daemons)]
	var p policyDoc
	switch f.Action {
	case soak.ActionRaise, soak.ActionLower:
		p, _ = n.tl.doc("api")
		if f.Action == soak.ActionRaise {
			p.Limit = min(p.Limit+4, 20)
		} else {
			p.Limit = max(p.Limit-4, 4)
		}
	case soak.ActionAdd:
		p = extraPolicy("enforce")
	case soak.ActionRemove:
		p = extraPolicy("shadow")
	case soak.ActionFile:
		return n.tl.putFile(filepath.Join(n.dp.dir, "envoy.yaml"))
	default:
		return fmt.Errorf("unknown action %q", f.Action)
	}
	return n.tl.put(ctx, d, n.dp.token, p, true)
}
