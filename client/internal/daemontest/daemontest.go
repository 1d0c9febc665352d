// Package daemontest runs a real region daemon in-process for the tests
// and examples of the client packages: the memory store, the given
// policies, an admin token, served by an httptest.Server on loopback.
package daemontest

import (
	"context"
	"log/slog"
	"net/http/httptest"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/region"
)

// Token is the daemon's admin token.
const Token = "daemontest-admin-token"

// Start serves a daemon with policies until the returned function is
// called. It panics if the daemon cannot be built, which only a broken
// policy list causes.
func Start(policies []quota.Policy) (url string, stop func()) {
	cfg := region.DefaultConfig()
	cfg.AdminToken = Token
	cfg.Policies = policies
	if cfg.Policies == nil {
		cfg.Policies = []quota.Policy{}
	}
	reg := prometheus.NewRegistry()
	d, err := region.New(context.Background(), cfg, slog.New(slog.DiscardHandler), reg, reg)
	if err != nil {
		panic("daemontest: " + err.Error())
	}
	srv := httptest.NewServer(d.Handler())
	return srv.URL, srv.Close
}

// Policy is an enforced token bucket of burst units refilled at rate per
// second, on every route.
func Policy(id string, rate, burst float64) quota.Policy {
	return quota.Policy{ID: id, Algorithm: "token_bucket", RatePerSec: rate, Burst: burst, Mode: quota.ModeEnforce}
}
