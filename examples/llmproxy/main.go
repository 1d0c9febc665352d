// Command llmproxy is an example of charging after the response: a
// reverse proxy in front of an OpenAI-style completion API that limits
// the tokens each API key uses per minute and per day. A completion's
// cost is known only once it is served (usage.total_tokens), so the proxy
// checks before forwarding (refused while the key is past a budget) and
// charges the tokens used after the answer, with Sluice's POST
// /v1/charge, past the budget if need be.
//
// Bounds: a key's tokens in one UTC minute (or day) are at most the
// budget plus what the completions in flight when it ran out use (one
// completion's tokens for a client that sends one at a time): a request
// is admitted while the key is within its budget, and its tokens are
// charged in full afterwards.
//
//	llmproxy -backend https://api.example.com -listen :8081 \
//	  -tokens-per-minute 10000 -tokens-per-day 1000000 [-sluice http://sluice:8080]
//
// Without -sluice the limits are kept in process; with it, the daemon
// there decides and must hold the policies llm-tokens-minute and
// llm-tokens-day (fixed windows of 60 s and 86400 s).
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"

	"github.com/sluice-rl/sluice/client"
	"github.com/sluice-rl/sluice/client/httplimit"
	"github.com/sluice-rl/sluice/client/local"
	"github.com/sluice-rl/sluice/quota"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "llmproxy:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("llmproxy", flag.ContinueOnError)
	listen := fs.String("listen", ":8081", "address to serve on")
	backend := fs.String("backend", "", "completion API to forward to (required)")
	server := fs.String("sluice", "", "Sluice daemon URL; empty keeps the limits in process")
	perMinute := fs.Float64("tokens-per-minute", 10000, "tokens per API key per UTC minute")
	perDay := fs.Float64("tokens-per-day", 1000000, "tokens per API key per UTC day")
	if err := fs.Parse(args); err != nil {
		return err
	}
	u, err := url.Parse(*backend)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return fmt.Errorf("-backend: want an absolute URL, got %q", *backend)
	}
	var checker httplimit.Checker
	if *server != "" {
		if checker, err = client.New(client.Config{Server: *server}); err != nil {
			return fmt.Errorf("-sluice: %w", err)
		}
	} else {
		reg := quota.NewRegistry(quota.RegistryConfig{})
		if err := reg.Seed(context.Background(), "llmproxy", policies(*perMinute, *perDay)); err != nil {
			return fmt.Errorf("policies: %w", err)
		}
		checker = local.New(nil, reg)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	h, err := newProxy(u, checker, func(r *http.Request, err error) { log.Warn("limit", "path", r.URL.Path, "err", err) })
	if err != nil {
		return err
	}
	log.Info("serving", "listen", *listen, "backend", u.String())
	return http.ListenAndServe(*listen, h)
}
