package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-rl/sluice/simulator"
	"github.com/sluice-rl/sluice/simulator/live"
)

// liveOptions are the --live flags.
type liveOptions struct {
	seed     uint64
	store    string        // --live-store: memory or redis
	interval time.Duration // --live-interval
}

// runLive is `sluice simulate --live`: sc played against real daemons on
// loopback (simulator/live), faults included, printed like a virtual-time
// run. out, when set, is the directory for the same JSON, charts and
// report.html a virtual-time run writes.
func runLive(cmd *cobra.Command, sc simulator.Scenario, o liveOptions, jsonOut bool, out string) error {
	switch o.store {
	case "", "memory", "redis":
	default:
		return fmt.Errorf("--live-store %q: want memory or redis", o.store)
	}
	if !cmd.Flags().Changed("live-interval") {
		o.interval = 0 // the runner's default: 1 s, longer when the scenario needs it
	} else if o.interval < 100*time.Millisecond {
		return fmt.Errorf("--live-interval %v: want at least 100ms", o.interval)
	}
	if err := live.Validate(sc); err != nil {
		return err
	}
	opt := live.Options{Seed: o.seed, Store: o.store, Interval: o.interval,
		Logger: slog.New(runnerOnly{slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn})})}
	if bar := newProgressBar(cmd.ErrOrStderr()); bar != nil {
		bar.start = time.Now().Add(-time.Second) // live runs are long: draw at once
		opt.Progress = bar.update
		defer bar.done()
	}
	res, err := live.Run(cmd.Context(), sc, opt)
	if err != nil {
		return err
	}
	if out != "" {
		if _, err := simulator.WriteOutputs(out, res); err != nil {
			return err
		}
	}
	if jsonOut {
		return simulator.WriteJSON(cmd.OutOrStdout(), res)
	}
	return simulator.WriteTable(cmd.OutOrStdout(), res)
}

// runnerOnly passes the live runner's own records ("live: ...") and drops
// the daemons': a live run injects faults, and the daemons log them.
type runnerOnly struct{ slog.Handler }

func (h runnerOnly) Handle(ctx context.Context, r slog.Record) error {
	if !strings.HasPrefix(r.Message, "live:") {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}
func (h runnerOnly) WithAttrs(as []slog.Attr) slog.Handler {
	return runnerOnly{h.Handler.WithAttrs(as)}
}
func (h runnerOnly) WithGroup(g string) slog.Handler { return runnerOnly{h.Handler.WithGroup(g)} }
