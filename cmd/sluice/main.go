// Command sluice is the Sluice rate limiter: the per-region daemon
// (`sluice serve`), the multi-region simulator (`sluice simulate`), and the
// admin CLI that talks to a daemon (`sluice check`, `policies`,
// `overrides`, `keys`, `regions`, `usage`; see docs/cli.md).
//
// Every flag can also be set from the environment as SLUICE_<FLAG>, with
// dashes as underscores (--admin-token-file is SLUICE_ADMIN_TOKEN_FILE).
// A flag given on the command line wins over the environment, which wins
// over the default.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCmd().ExecuteContext(ctx)
	stop()
	var ec interface{ ExitCode() int }
	switch {
	case errors.As(err, &ec):
		os.Exit(ec.ExitCode()) // the command has printed its answer
	case err != nil:
		fmt.Fprintln(os.Stderr, "sluice: "+oneLine(err.Error()))
		os.Exit(1)
	}
}
