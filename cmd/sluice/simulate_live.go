package main

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-rl/sluice/simulator"
	"github.com/sluice-rl/sluice/simulator/live"
)

// runLive is `sluice simulate --live`: the built-in scenario name played
// against real daemons on loopback (simulator/live), printed like a
// virtual-time run. store is "memory" or "redis" (--live-store: one
// redis-server per region). out, when set, is the directory for the same
// JSON, charts and report.html a virtual-time run writes.
func runLive(cmd *cobra.Command, name string, seed uint64, jsonOut bool, store, out string) error {
	sc, ok := simulator.Builtin(name)
	if !ok {
		return fmt.Errorf("unknown scenario %q (see sluice simulate --list)", name)
	}
	switch store {
	case "", "memory", "redis":
	default:
		return fmt.Errorf("--live-store %q: want memory or redis", store)
	}
	if err := live.Validate(sc); err != nil {
		return err
	}
	opt := live.Options{Seed: seed, Store: store,
		Logger: slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))}
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
