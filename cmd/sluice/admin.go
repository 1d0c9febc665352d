package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluice-rl/sluice/client"
)

// adminOpts are the flags every command that talks to a daemon shares.
type adminOpts struct {
	server    string
	tokenFile string
	output    string
	timeout   time.Duration
	// transport, when set, replaces the network: `sluice check --policies`
	// serves the requests with an in-process daemon.
	transport http.RoundTripper
}

func (o *adminOpts) register(fs *pflag.FlagSet) {
	fs.StringVar(&o.server, "server", "http://127.0.0.1:8080", "base URL of the daemon (its admin API for admin commands)")
	fs.StringVar(&o.tokenFile, "token-file", "", "file holding the admin token (default: the SLUICE_ADMIN_TOKEN variable)")
	fs.StringVarP(&o.output, "output", "o", "table", "output format: table or json")
	fs.DurationVar(&o.timeout, "timeout", 5*time.Second, "deadline of each call to the daemon")
}

// client builds the client of the flags, after checking them.
func (o *adminOpts) client() (*client.Client, error) {
	if o.output != "table" && o.output != "json" {
		return nil, fmt.Errorf("--output: must be table or json, got %q", o.output)
	}
	token := os.Getenv("SLUICE_ADMIN_TOKEN")
	if o.tokenFile != "" {
		b, err := os.ReadFile(o.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %w", err)
		}
		if token = strings.TrimSpace(string(b)); token == "" {
			return nil, fmt.Errorf("--token-file %s is empty", o.tokenFile)
		}
	}
	cfg := client.Config{Server: o.server, Token: token, Timeout: o.timeout}
	if o.transport != nil {
		cfg.HTTPClient = &http.Client{Transport: o.transport}
	}
	c, err := client.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("--%w", err)
	}
	return c, nil
}

// adminError words a daemon's refusal for the command line: the problem's
// status, title and detail, with a hint for a missing token.
func adminError(err error) error {
	var p *client.Problem
	if errors.As(err, &p) && p.Status == http.StatusUnauthorized {
		return fmt.Errorf("%w (set SLUICE_ADMIN_TOKEN or --token-file)", err)
	}
	return err
}

// emit writes v as indented JSON with -o json, else calls table.
func (o *adminOpts) emit(w io.Writer, v any, table func(*tabwriter.Writer)) error {
	if o.output == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	table(tw)
	return tw.Flush()
}

// newAdminCmds are the commands that talk to a daemon's admin API.
func newAdminCmds() []*cobra.Command {
	return []*cobra.Command{newPoliciesCmd(), newOverridesCmd(), newKeysCmd(), newRegionsCmd(), newUsageCmd()}
}

// adminGroup is a parent command whose subcommands share adminOpts.
func adminGroup(use, short string, o *adminOpts, subs ...*cobra.Command) *cobra.Command {
	cmd := &cobra.Command{Use: use, Short: short, Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return fmt.Errorf("%s: give a subcommand: %s", use, subNames(cmd))
		}}
	o.register(cmd.PersistentFlags())
	cmd.AddCommand(subs...)
	return cmd
}

func subNames(cmd *cobra.Command) string {
	var names []string
	for _, c := range cmd.Commands() {
		if c.IsAvailableCommand() {
			names = append(names, c.Name())
		}
	}
	return strings.Join(names, ", ")
}

// orDash is s, or "-" when empty, for table cells.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// exitError ends the process with code, printing nothing more: the
// command has said what there was to say.
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// ExitCode is the process's exit status.
func (e *exitError) ExitCode() int { return e.code }
