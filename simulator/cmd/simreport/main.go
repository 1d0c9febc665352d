// Command simreport runs every built-in scenario with seed 1 and writes the
// results table (default docs/simulation-results.md).
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/sluice-rl/sluice/simulator"
)

func main() {
	out := flag.String("o", "docs/simulation-results.md", "output file")
	flag.Parse()
	var results []simulator.Result
	for _, sc := range simulator.Builtins() {
		r, err := simulator.Run(context.Background(), sc, simulator.Options{Seed: 1})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		results = append(results, r)
	}
	var b bytes.Buffer
	if err := simulator.WriteMarkdown(&b, results); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := os.WriteFile(*out, b.Bytes(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
