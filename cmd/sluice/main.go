// Command sluice is the Sluice rate limiter: the per-region daemon
// (`sluice serve`) and the multi-region simulator (`sluice simulate`).
//
// Every flag can also be set from the environment as SLUICE_<FLAG>, with
// dashes as underscores (--admin-token-file is SLUICE_ADMIN_TOKEN_FILE).
// A flag given on the command line wins over the environment, which wins
// over the default.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCmd().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sluice: "+oneLine(err.Error()))
		os.Exit(1)
	}
}
