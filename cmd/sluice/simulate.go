package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-rl/sluice/simulator"
)

// newSimulateCmd is `sluice simulate`: run a built-in or file scenario on
// virtual time and print its metrics.
func newSimulateCmd() *cobra.Command {
	var (
		name, file, out string
		seed            uint64
		asJSON, list    bool
		live            bool
		liveStore       string
		liveInterval    time.Duration
		duration        time.Duration
	)
	cmd := &cobra.Command{
		Use:   "simulate",
		Short: "Simulate regions sharing a global limit on virtual time",
		Long: "Runs n regions, each with the daemon's share coordinator and the engine memory store, on virtual\n" +
			"time against a central oracle limiter, and reports accuracy metrics (docs/simulator.md).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			stdout := cmd.OutOrStdout()
			if list {
				for _, sc := range simulator.Builtins() {
					fmt.Fprintf(stdout, "%s\t%s\n", sc.Name, sc.Description)
				}
				return nil
			}
			var sc simulator.Scenario
			switch {
			case file != "":
				var err error
				if sc, err = simulator.LoadScenario(file); err != nil {
					return err
				}
			case name != "":
				var ok bool
				if sc, ok = simulator.Builtin(name); !ok {
					return fmt.Errorf("unknown scenario %q (see sluice simulate --list)", name)
				}
			default:
				return fmt.Errorf("give --scenario NAME, --file FILE or --list")
			}
			if cmd.Flags().Changed("duration") {
				if duration <= 0 {
					return fmt.Errorf("--duration %v: want a positive duration", duration)
				}
				sc.Duration = simulator.Duration(min(duration, sc.Duration.D()))
			}
			if live {
				return runLive(cmd, sc, liveOptions{seed: seed, store: liveStore, interval: liveInterval}, asJSON, out)
			}
			opt := simulator.Options{Seed: seed}
			if bar := newProgressBar(cmd.ErrOrStderr()); bar != nil {
				opt.Progress = bar.update
				defer bar.done()
			}
			res, err := simulator.Run(cmd.Context(), sc, opt)
			if err != nil {
				return err
			}
			if out != "" {
				if _, err := simulator.WriteOutputs(out, res); err != nil {
					return err
				}
			}
			if asJSON {
				return simulator.WriteJSON(stdout, res)
			}
			return simulator.WriteTable(stdout, res)
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "scenario", "", "built-in scenario name (see --list)")
	f.StringVar(&file, "file", "", "JSON scenario file (docs/simulator.md)")
	f.Uint64Var(&seed, "seed", 1, "random seed; the same seed gives the same result")
	f.BoolVar(&asJSON, "json", false, "print one JSON object instead of a table")
	f.StringVar(&out, "out", "", "directory to write the JSON result, SVG charts and a self-contained report.html into")
	f.DurationVar(&duration, "duration", 0, "play only the first part of the scenario, this long (scenario time); events after it do not happen")
	f.BoolVar(&list, "list", false, "list built-in scenarios, one a line, name first")
	f.BoolVar(&live, "live", false, "run the scenario against real daemons on loopback (real memberlist and HTTP checks, faults injected, time compressed; see --live-interval)")
	f.StringVar(&liveStore, "live-store", "memory", "with --live: memory, or redis (starts one redis-server per region)")
	f.DurationVar(&liveInterval, "live-interval", time.Second, "with --live: the live report interval the scenario's maps onto; every scenario time is compressed by the same factor")
	return cmd
}

// progressBar draws on a terminal only, and only once a run has taken
// longer than a second.
type progressBar struct {
	w     io.Writer
	start time.Time
	drawn bool
}

func newProgressBar(w io.Writer) *progressBar {
	f, ok := w.(*os.File)
	if !ok {
		return nil
	}
	st, err := f.Stat()
	if err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return nil
	}
	return &progressBar{w: w, start: time.Now()}
}

func (p *progressBar) update(done, total time.Duration) {
	if time.Since(p.start) < time.Second || total <= 0 {
		return
	}
	frac := float64(done) / float64(total)
	n := int(frac * 40)
	fmt.Fprintf(p.w, "\r[%s%s] %3.0f%% of %v simulated", strings.Repeat("=", n), strings.Repeat(" ", 40-n), frac*100, total)
	p.drawn = true
}

func (p *progressBar) done() {
	if p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
	}
}
