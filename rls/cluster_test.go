package rls

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/quota"
)

// scriptCalls is how many script calls (EVALSHA, EVAL, FCALL and their
// read-only forms) a server has run since its statistics were reset.
func scriptCalls(t *testing.T, s *redistest.Server) int64 {
	t.Helper()
	info, err := s.Client(t).Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("INFO commandstats on %s: %v", s.Addr(), err)
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		switch name {
		case "cmdstat_evalsha", "cmdstat_eval", "cmdstat_evalsha_ro", "cmdstat_eval_ro", "cmdstat_fcall", "cmdstat_fcall_ro":
		default:
			continue
		}
		if !ok {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		c, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			t.Fatalf("%s: %q: %v", s.Addr(), line, err)
		}
		n += c
	}
	return n
}

// On a 3-primary Cluster, the descriptors of one domain spread over the
// primaries: 10 000 distinct descriptor values put between 25% and 42%
// of the script calls on each primary, where one subject per domain put
// them all on one.
func TestDescriptorsSpreadOverCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	url := "redis-cluster://" + strings.Join(cl.Addrs(), ",")
	c := rlsv3.NewRateLimitServiceClient(startRLSOn(t, url, []quota.Policy{
		{ID: "per-user", Mode: quota.ModeEnforce, Algorithm: "fixed_window", Count: 100, Window: 60,
			Match: quota.Match{Domain: "api", Descriptors: []quota.DescriptorEntry{{Key: "user"}}}},
	}))
	// The first call loads the script on the primaries.
	ask(t, c, call{domain: "api", ds: []*rlv3.RateLimitDescriptor{desc("user", "warm-up")}})
	nodes := cl.Nodes()
	for _, n := range nodes {
		if err := n.Client(t).ConfigResetStat(context.Background()).Err(); err != nil {
			t.Fatalf("CONFIG RESETSTAT on %s: %v", n.Addr(), err)
		}
	}
	const values, workers = 10000, 16
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < values; i += workers {
				r, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api",
					Descriptors: []*rlv3.RateLimitDescriptor{desc("user", fmt.Sprintf("u%05d", i))}})
				if err != nil {
					errs <- err
					return
				}
				if r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 99 {
					errs <- fmt.Errorf("u%05d = %v remaining %d, want OK with 99 left", i, r.OverallCode, r.Statuses[0].LimitRemaining)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var total int64
	calls := make([]int64, len(nodes))
	for i, n := range nodes {
		calls[i] = scriptCalls(t, n)
		total += calls[i]
	}
	if total < values/64 {
		t.Fatalf("%d script calls over the primaries for %d checks", total, values)
	}
	for i, n := range nodes {
		share := float64(calls[i]) / float64(total)
		t.Logf("primary %s: %d of %d script calls (%.1f%%)", n.Addr(), calls[i], total, 100*share)
		if share < 0.25 || share > 0.42 {
			t.Errorf("primary %s ran %.1f%% of the script calls, want 25%% to 42%%", n.Addr(), 100*share)
		}
	}
}

// On a Cluster, a request whose descriptors have different subjects is
// decided descriptor by descriptor: the one under its limit spends its
// hits while the one over spends nothing.
func TestSpreadDescriptorsDecidedApart(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	url := "redis-cluster://" + strings.Join(cl.Addrs(), ",")
	c := rlsv3.NewRateLimitServiceClient(startRLSOn(t, url, []quota.Policy{
		{ID: "per-user", Mode: quota.ModeEnforce, Algorithm: "token_bucket", RatePerSec: 0.001, Burst: 5, Match: quota.Match{Domain: "api", Descriptors: []quota.DescriptorEntry{{Key: "user"}}}},
		{ID: "per-route", Mode: quota.ModeEnforce, Algorithm: "token_bucket", RatePerSec: 0.001, Burst: 3, Match: quota.Match{Domain: "api", Descriptors: []quota.DescriptorEntry{{Key: "route", Value: "/export"}}}},
	}))
	both := []*rlv3.RateLimitDescriptor{desc("user", "ann"), desc("route", "/export")}
	if r := ask(t, c, call{domain: "api", ds: both, hits: 2}); codesOf(r) != "OK OK OK" || r.Statuses[0].LimitRemaining != 3 || r.Statuses[1].LimitRemaining != 1 {
		t.Fatalf("2 hits = %s %v, want OK with 3 and 1 left", codesOf(r), r.Statuses)
	}
	r := ask(t, c, call{domain: "api", ds: both, hits: 2})
	if codesOf(r) != "OVER_LIMIT OK OVER_LIMIT" || r.Statuses[0].LimitRemaining != 1 || header(r, "Retry-After") == "" {
		t.Fatalf("2 more hits = %s %v, want OVER_LIMIT by the route, the user spending 2 (1 left), with Retry-After", codesOf(r), r.Statuses)
	}
	if r := ask(t, c, call{domain: "api", ds: both[1:2], hits: 1}); codesOf(r) != "OK OK" || r.Statuses[0].LimitRemaining != 0 {
		t.Errorf("the route after its rejection = %s %v, want OK with 0 left (nothing spent over)", codesOf(r), r.Statuses)
	}
}
