package region

import (
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/gossip"
	"github.com/sluice-rl/sluice/internal/testwait"
	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/share"
)

// rejected reads sluice_gossip_rejected_total{reason} from a daemon's
// /metrics.
func rejected(t *testing.T, l *liveDaemon, reason string) string {
	t.Helper()
	return counterValue(t, l, `sluice_gossip_rejected_total{reason="`+reason+`"} `)
}

// counterValue reads the value after prefix from a daemon's /metrics, "0"
// when no line has it.
func counterValue(t *testing.T, l *liveDaemon, prefix string) string {
	t.Helper()
	res, err := http.Get(l.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			return v
		}
	}
	return "0"
}

// TestHostileGossipLeavesDaemonUnchanged: a member of another region that
// holds the cluster key sends a live daemon a report of epoch 2^64-1, one
// with NaN figures, one whose G-counter would wrap, and a policy set of
// revision 2^64-1 that would change a policy: each is rejected by gossip
// and counted there. A borrow request of epoch 2^64-1 and a report whose
// quota counter is of a window far ahead pass the transport (its clock
// check bounds only the keys of its duplicate suppression) and are refused
// and counted by the coordinator. The daemon's shares, policies and policy
// revision are as before.
func TestHostileGossipLeavesDaemonUnchanged(t *testing.T) {
	if testing.Short() {
		t.Skip("real memberlist on loopback; skipped under -short")
	}
	global := quota.Policy{ID: "g", Algorithm: "token_bucket", RatePerSec: 100, Burst: 10, Mode: quota.ModeEnforce, Scope: quota.ScopeGlobal}
	daily := quota.Policy{ID: "daily", Algorithm: "fixed_window", Count: 1000, Window: 86400, Mode: quota.ModeEnforce, Scope: quota.ScopeGlobal}
	l := startRegionDaemon(t, "eu", "eu-1", "", []quota.Policy{global, daily})
	evil, err := gossip.New(gossip.Config{Node: "ap-1", Region: "ap", BindAddr: "127.0.0.1", Dev: true, Preset: gossip.PresetLocal,
		Interval: time.Second, Join: []string{l.d.Gossip().Addr()}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = evil.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	testwait.For(t, 10*time.Second, "the daemon to see ap-1", func() bool { return len(l.d.Gossip().Regions()["ap"]) == 1 })

	type view struct {
		Share    float64
		Regions  map[string]float64
		Policies []quota.Policy
		Rev      uint64
		Hash     string
	}
	look := func() view {
		st := l.regions(t)
		return view{Share: l.d.Coordinator().Share("g", "s"), Regions: l.d.Coordinator().RegionShares("g", "s"),
			Policies: l.d.Registry().List(""), Rev: st.PolicyRevision, Hash: st.PolicyHash}
	}
	// ap's membership alone makes the default share 1/2.
	testwait.For(t, 10*time.Second, "the default share of two regions", func() bool { return l.d.Coordinator().Share("g", "s") == 0.5 })
	before := look()

	now := share.DefaultConfig()
	now.Interval = time.Second
	epoch := now.Epoch(time.Now())
	key := share.Key{Policy: "g", Subject: "s"}
	report := func(edit func(*share.Report)) share.Report {
		r := share.Report{Version: share.ReportVersion, Region: "ap", Epoch: epoch,
			Keys: []share.KeyReport{{Key: key, Limit: 100, Offered: 500, Recent: 500, Demand: 500, Admitted: 100, Share: 1}}}
		edit(&r)
		return r
	}
	changed := global
	changed.RatePerSec = 1
	data, _ := json.Marshal(policySet{Origin: "ap-1", Policies: []quota.Policy{changed}})
	sends := []struct {
		reason string
		send   func() error
	}{
		{gossip.ReasonEpoch, func() error {
			return evil.BroadcastReport(ctx, report(func(r *share.Report) { r.Epoch = math.MaxUint64 }))
		}},
		{gossip.ReasonValue, func() error {
			return evil.BroadcastReport(ctx, report(func(r *share.Report) { r.Keys[0].Share = math.NaN() }))
		}},
		{gossip.ReasonValue, func() error {
			return evil.BroadcastReport(ctx, report(func(r *share.Report) {
				r.Quotas = []share.QuotaCounter{{Key: key, Window: 1, Counts: []share.RegionCount{{Region: "ap", Count: 1 << 63}, {Region: "eu", Count: 1 << 63}}}}
			}))
		}},
		{gossip.ReasonRevision, func() error {
			return evil.BroadcastPolicy(ctx, gossip.PolicyUpdate{Version: math.MaxUint64, Data: data})
		}},
	}
	for _, s := range sends {
		was := rejected(t, l, s.reason)
		if err := s.send(); err != nil {
			t.Fatal(err)
		}
		testwait.For(t, 10*time.Second, "a rejection counted as "+s.reason, func() bool { return rejected(t, l, s.reason) != was })
	}
	dropped := func() string {
		return counterValue(t, l, `sluice_globalshare_messages_dropped_total{reason="epoch"} `)
	}
	for _, s := range []struct {
		name string
		send func() error
	}{
		{"a borrow request of epoch 2^64-1", func() error {
			return evil.SendBorrowRequest(ctx, share.BorrowRequest{Version: share.RateVersion, Region: "ap", Epoch: math.MaxUint64, Key: key, Want: 0.1})
		}},
		{"a quota counter of a window far ahead", func() error {
			q := share.QuotaCounter{Key: share.Key{Policy: "daily", Subject: "s"}}
			q.Add(1<<40, "ap", 1)
			return evil.BroadcastReport(ctx, report(func(r *share.Report) { r.Epoch++; r.Quotas = []share.QuotaCounter{q} }))
		}},
	} {
		was, wasGossip := dropped(), rejected(t, l, gossip.ReasonEpoch)
		if err := s.send(); err != nil {
			t.Fatal(err)
		}
		testwait.For(t, 10*time.Second, s.name+" dropped by the coordinator", func() bool { return dropped() != was })
		if got := rejected(t, l, gossip.ReasonEpoch); got != wasGossip {
			t.Errorf("%s: gossip counted it as epoch too (%s → %s): judged twice", s.name, wasGossip, got)
		}
	}
	// Two report intervals for anything that did get through to act.
	deadline := time.Now().Add(2 * time.Second)
	testwait.For(t, 3*time.Second, "two intervals", func() bool { return time.Now().After(deadline) })
	if after := look(); !reflect.DeepEqual(after, before) {
		t.Errorf("daemon after hostile gossip = %+v, want as before %+v", after, before)
	}
}
