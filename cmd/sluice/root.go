package main

import (
	"fmt"
	"os"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "sluice",
		Short:         "Multi-region rate limiter",
		Long:          "Sluice decides, once per request, whether a subject may spend a cost on a route:\nexact inside a region, close to the global limit across regions.",
		Version:       buildVersion(),
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return flagsFromEnv(cmd.Flags(), os.LookupEnv)
		},
	}
	root.AddCommand(newVersionCmd(), newSimulateCmd())
	root.AddCommand(newServeCmd())
	root.AddCommand(newCheckCmd())
	root.AddCommand(newAdminCmds()...)
	return root
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), "sluice", buildVersion())
			return err
		},
	}
}

func buildVersion() string {
	if version != "dev" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return version
}

// flagsFromEnv sets every flag not given on the command line from
// SLUICE_<NAME>, so that flag > environment > default.
func flagsFromEnv(fs *pflag.FlagSet, lookup func(string) (string, bool)) error {
	var firstErr error
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed || firstErr != nil || f.Name == "help" || f.Name == "version" {
			return
		}
		name := envName(f.Name)
		v, ok := lookup(name)
		if !ok {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			firstErr = fmt.Errorf("environment %s=%q: %w", name, v, err)
		}
	})
	return firstErr
}

func envName(flag string) string {
	return "SLUICE_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// oneLine keeps a CLI error to one line, as scripts and humans expect.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
