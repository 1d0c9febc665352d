package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/sluice-rl/sluice/client"
	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/region"
)

// The exit statuses of `sluice check`.
const (
	exitAllowed = 0
	exitLimited = 2 // 429, or 503 when a fail-closed policy could not be decided
)

// checkResult is one check in `sluice check -o json`.
type checkResult struct {
	Status   int               `json:"status"`
	Decision *client.Decision  `json:"decision"`
	Headers  map[string]string `json:"headers"`
	Problem  *client.Problem   `json:"problem,omitempty"`
}

func newCheckCmd() *cobra.Command {
	o := &adminOpts{}
	var (
		req      client.CheckRequest
		cost     int64
		repeat   int
		policies string
	)
	cmd := &cobra.Command{
		Use:   "check --route PATH (--user U | --api-key K | --ip A | --subject S)",
		Short: "Ask whether a request may proceed: of a daemon, or in-process with --policies",
		Long: `Check one request, as a gateway does, and print the decision and the
RateLimit, RateLimit-Policy and Retry-After fields it came with.

Without --policies it asks the daemon at --server (POST /v1/check, no token
needed). With --policies FILE it decides in-process, with an embedded daemon
on the memory store seeded with FILE (a JSON array of policy documents, as
for serve), so a policy can be tried before it is published; --repeat then
shows where the limit falls.

Exit status: 0 allowed, 2 limited (429, or 503 when a fail-closed policy could
not be decided), 1 for any error.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if repeat < 1 {
				return fmt.Errorf("--repeat: must be at least 1, got %d", repeat)
			}
			if cmd.Flags().Changed("cost") {
				req.Cost = &cost
			}
			if policies != "" {
				if cmd.Flags().Changed("server") {
					return fmt.Errorf("--policies: decides in-process; do not give --server too")
				}
				t, err := inProcessDaemon(cmd.Context(), policies)
				if err != nil {
					return err
				}
				o.transport = t
				o.server = "http://sluice.in-process"
			}
			c, err := o.client()
			if err != nil {
				return err
			}
			var last *client.Decision
			var results []checkResult
			for range repeat {
				d, err := c.Check(cmd.Context(), req)
				if err != nil {
					return err
				}
				last = d
				if o.output == "json" {
					results = append(results, checkResultOf(d))
					continue
				}
				printDecision(cmd.OutOrStdout(), d, repeat > 1)
			}
			if o.output == "json" {
				var v any = results
				if repeat == 1 {
					v = results[0]
				}
				if err := o.emit(cmd.OutOrStdout(), v, nil); err != nil {
					return err
				}
			}
			if !last.Allowed {
				return &exitError{exitLimited}
			}
			return nil
		},
	}
	o.register(cmd.Flags())
	f := cmd.Flags()
	f.StringVar(&req.User, "user", "", "the requester's user id")
	f.StringVar(&req.APIKey, "api-key", "", "the requester's API key")
	f.StringVar(&req.IP, "ip", "", "the requester's address")
	f.StringVar(&req.Subject, "subject", "", `the requester as a subject string, e.g. "user:42"`)
	f.StringVar(&req.Tier, "tier", "", "the requester's tier (default: the key registry's, or anonymous)")
	f.StringVar(&req.Method, "method", "GET", "the method of the request being limited")
	f.StringVar(&req.Route, "route", "", "the path of the request being limited, e.g. /v1/orders")
	f.Int64Var(&cost, "cost", 0, "spend this instead of the policies' cost (0 reads without spending)")
	f.IntVarP(&repeat, "repeat", "n", 1, "send the check this many times, printing each; the exit status is the last one's")
	f.StringVar(&policies, "policies", "", "decide in-process with the policies of this file (a JSON array) instead of asking --server")
	return cmd
}

func checkResultOf(d *client.Decision) checkResult {
	r := checkResult{Status: d.Status, Decision: d, Headers: map[string]string{}, Problem: d.Problem}
	for k := range d.Header {
		r.Headers[k] = d.Header.Get(k)
	}
	return r
}

// printDecision writes a decision for a human: the verdict, the deciding
// policy's figures, each policy's, and the header fields.
func printDecision(w io.Writer, d *client.Decision, short bool) {
	verdict := "allowed"
	switch {
	case d.Status == http.StatusServiceUnavailable:
		verdict = "unavailable (fails closed)"
	case !d.Allowed:
		verdict = "limited"
	}
	fmt.Fprintf(w, "%d %s: subject %s, tier %s", d.Status, verdict, d.Subject, orDash(d.Tier))
	if d.Policy != "" {
		fmt.Fprintf(w, ", policy %s: %d of %d remaining", d.Policy, d.Remaining, d.Limit)
	}
	fmt.Fprintln(w)
	if !short {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  POLICY\tMODE\tALLOWED\tLIMIT\tREMAINING\tRESET\tRETRY")
		for _, p := range d.Policies {
			allowed := fmt.Sprint(p.Allowed)
			switch {
			case !p.Evaluated:
				allowed = "not evaluated"
			case p.WouldReject:
				allowed = "would reject"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%d\t%s\t%s\n", p.ID, p.Mode, allowed, p.Limit, p.Remaining,
				time.Duration(p.ResetMS)*time.Millisecond, time.Duration(p.RetryAfterMS)*time.Millisecond)
		}
		for _, e := range d.Exempt {
			fmt.Fprintf(tw, "  %s\t%s\texempt (%s)\t-\t-\t-\t-\n", e.ID, e.Mode, e.Override)
		}
		tw.Flush()
	}
	for _, k := range []string{"RateLimit-Policy", "RateLimit", "Retry-After"} {
		if v := d.Header.Get(k); v != "" {
			fmt.Fprintf(w, "  %s: %s\n", k, v)
		}
	}
	if d.Problem != nil && !short {
		fmt.Fprintf(w, "  %s\n", d.Problem.Detail)
	}
}

// inProcessDaemon is a daemon on the memory store seeded with the
// policies of file, served without a socket: a transport that hands each
// request to its handler.
func inProcessDaemon(ctx context.Context, file string) (http.RoundTripper, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("--policies: %w", err)
	}
	ps, err := quota.ParsePolicies(data)
	if err != nil {
		return nil, fmt.Errorf("--policies %s: %w", file, err)
	}
	cfg := region.DefaultConfig()
	cfg.Policies = ps
	reg := prometheus.NewRegistry()
	d, err := region.New(ctx, cfg, slog.New(slog.DiscardHandler), reg, reg)
	if err != nil {
		return nil, err
	}
	return handlerTransport{d.Handler()}, nil
}

// handlerTransport serves a request with a handler in-process.
type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	t.h.ServeHTTP(rec, r)
	return rec.Result(), nil
}
