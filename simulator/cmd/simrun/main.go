package main

import (
	"context"
	"fmt"
	"os"

	"github.com/sluice-rl/sluice/simulator"
)

func main() {
	for _, sc := range simulator.Builtins() {
		if len(os.Args) > 1 && os.Args[1] != sc.Name {
			continue
		}
		r, err := simulator.Run(context.Background(), sc, simulator.Options{Seed: 1})
		if err != nil {
			fmt.Println(sc.Name, err)
			continue
		}
		fmt.Printf("%-22s %6.1fs %5.1fM/s %+v\n", sc.Name, r.WallTime.Seconds(), r.ChecksPerSecond()/1e6, r.Summary)
		for _, t := range r.Targets {
			fmt.Printf("   %s %v pass=%v\n", t.Metric, t.Value, t.Pass)
		}
	}
}
