package coordinator

import (
	"testing"
	"time"

	"github.com/sluice-rl/sluice/coordinator/msg"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/share"
)

// TestCoreQuotaCounters: a global quota's spend is counted as a G-counter
// and reaches the other region through the reports.
func TestCoreQuotaCounters(t *testing.T) {
	sc := testShareConfig()
	const window = time.Hour
	members := []msg.Member{{Node: "eu-1", Region: "eu", State: msg.StateAlive}, {Node: "us-1", Region: "us", State: msg.StateAlive}}
	mk := func(region, node string) *Core {
		c, err := NewCore(CoreConfig{Share: sc, Region: region, Node: node,
			Limit: func(string) (float64, bool) { return limit, true },
			Quota: func(p string) (time.Duration, bool) { return window, p == "daily" }}, members)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	eu, us := mk("eu", "eu-1"), mk("us", "us-1")
	now := sc.EpochStart(1_000_000).Add(100 * time.Millisecond)
	for _, c := range []*Core{eu, us} {
		if err := c.Start(now, members, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	spend := map[engine.UsageKey]engine.Usage{{Subject: "acme", Policy: "daily"}: {Demand: 40, Admitted: 30}}
	for at := now; at.Before(now.Add(3 * sc.Interval)); at = at.Add(50 * time.Millisecond) {
		rd := eu.Tick(at, spend, members)
		spend = nil
		for _, r := range rd.Reports {
			if got := us.Step(at, msg.Message{Kind: msg.KindReport, From: "eu-1", Region: "eu", Report: r}); got.Dropped != "" {
				t.Fatalf("us dropped eu's report: %s", got.Dropped)
			}
		}
		us.Tick(at, nil, members)
	}
	w := share.WindowIndex(now, window)
	if got := us.QuotaOthers("daily", "acme", w); got != 30 {
		t.Errorf("us: QuotaOthers = %d, want eu's 30 admitted units", got)
	}
	if got := eu.QuotaOthers("daily", "acme", w); got != 0 {
		t.Errorf("eu: QuotaOthers = %d, want 0 (its own spend is in its engine)", got)
	}
	if q, ok := us.QuotaCounter("daily", "acme"); !ok || q.Get("eu") != 30 {
		t.Errorf("us's counter = %+v, %v", q, ok)
	}
	if stats := us.QuotaStats(); len(stats) != 1 || stats[0].Counters != 1 {
		t.Errorf("QuotaStats = %+v", stats)
	}
	if got := eu.Share("daily", "acme"); got != 0.5 {
		t.Errorf("a quota is never shared: Share = %v", got)
	}
}

// TestCoreDropsQuotaCountersFromTheFuture: a report or node usage carrying
// a counter of a window that has not begun by the newest epoch the core
// accepts is refused whole as DropEpoch, so no key's count is held at a
// window no region has reached; the current window and an old one pass.
func TestCoreDropsQuotaCountersFromTheFuture(t *testing.T) {
	sc := testShareConfig()
	const window = time.Minute
	members := []msg.Member{{Node: "eu-1", Region: "eu", State: msg.StateAlive}, {Node: "eu-2", Region: "eu", State: msg.StateAlive},
		{Node: "us-1", Region: "us", State: msg.StateAlive}}
	c, err := NewCore(CoreConfig{Share: sc, Region: "eu", Node: "eu-1",
		Limit: func(string) (float64, bool) { return limit, true },
		Quota: func(p string) (time.Duration, bool) { return window, p == "daily" }}, members)
	if err != nil {
		t.Fatal(err)
	}
	now := sc.EpochStart(1_000_000).Add(100 * time.Millisecond)
	if err := c.Start(now, members, nil, nil); err != nil {
		t.Fatal(err)
	}
	cur := share.WindowIndex(now, window)
	counter := func(policy string, w int64, region string) []share.QuotaCounter {
		q := share.QuotaCounter{Key: share.Key{Policy: policy, Subject: "acme"}}
		q.Add(w, region, 5)
		return []share.QuotaCounter{q}
	}
	report := func(qs []share.QuotaCounter) msg.Message {
		return msg.Message{Kind: msg.KindReport, From: "us-1", Region: "us", Report: share.Report{
			Version: share.ReportVersion, Region: "us", Epoch: sc.Epoch(now), Quotas: qs}}
	}
	usage := func(qs []share.QuotaCounter) msg.Message {
		return msg.Message{Kind: msg.KindNodeUsage, From: "eu-2", Region: "eu", Usage: msg.NodeUsage{
			Node: "eu-2", Region: "eu", Epoch: sc.Epoch(now), Quotas: qs}}
	}
	for _, tt := range []struct {
		name string
		msg  msg.Message
		want string
	}{
		{"report, current window", report(counter("daily", cur, "us")), ""},
		{"report, past window", report(counter("daily", cur-5, "us")), ""},
		{"report, next window", report(counter("daily", cur+1, "us")), DropEpoch},
		{"report, window 2^62", report(counter("daily", 1<<62, "us")), DropEpoch},
		{"report, not a quota here", report(counter("other", 1<<62, "us")), ""},
		{"node usage, current window", usage(counter("daily", cur, "eu-2")), ""},
		{"node usage, next window", usage(counter("daily", cur+1, "eu-2")), DropEpoch},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := c.Step(now, tt.msg).Dropped; got != tt.want {
				t.Fatalf("Step(%s).Dropped = %q, want %q", tt.name, got, tt.want)
			}
		})
	}
	if q, ok := c.QuotaCounter("daily", "acme"); ok && q.Window > cur {
		t.Errorf("a counter from the future was merged: %+v", q)
	}
}
