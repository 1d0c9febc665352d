// Command simreport runs every built-in scenario with each seed (default
// 1, 2 and 3) and writes the results tables (default
// docs/simulation-results.md), keeping the notes written by hand below
// simulator.NotesMarker in the file it replaces.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"

	"github.com/sluice-rl/sluice/simulator"
)

func main() {
	out := flag.String("o", "docs/simulation-results.md", "output file")
	seedsFlag := flag.String("seeds", "1,2,3", "comma-separated seeds")
	flag.Parse()
	if err := run(*out, *seedsFlag); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(out, seedsFlag string) error {
	var seeds []uint64
	for _, f := range strings.Split(seedsFlag, ",") {
		v, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		if err != nil {
			return fmt.Errorf("-seeds: %q is not a seed", f)
		}
		seeds = append(seeds, v)
	}
	var notes string
	switch old, err := os.ReadFile(out); {
	case err == nil:
		if _, after, ok := strings.Cut(string(old), simulator.NotesMarker); ok {
			notes = after
		}
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	runs := make([][]simulator.Result, len(seeds))
	for i, seed := range seeds {
		for _, sc := range simulator.Builtins() {
			r, err := simulator.Run(context.Background(), sc, simulator.Options{Seed: seed})
			if err != nil {
				return err
			}
			runs[i] = append(runs[i], r)
		}
	}
	var b bytes.Buffer
	if err := simulator.WriteResultsDoc(&b, seeds, runs, notes); err != nil {
		return err
	}
	return os.WriteFile(out, b.Bytes(), 0o644)
}
