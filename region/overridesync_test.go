package region

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/gossip"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/internal/testwait"
	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/region/policyset"
)

// The tests of this package call the policy set's parts by these names.
type policySet = policyset.Set

func nextRevision(now time.Time, last uint64, node string) uint64 {
	return policyset.NextRevision(now, last, node)
}

func policyHash(ps []quota.Policy, ovs []quota.Override, keys []quota.KeyEntry) string {
	return policyset.New("", ps, ovs, keys).Hash()
}

func sameOverride(a, b quota.Override) bool { return policyset.SameOverride(a, b) }

// validOverrides validates the set of ps (normalized, as a registry lists
// them) and ovs and returns the overrides kept, or the id of the one
// refused and why.
func validOverrides(_ context.Context, ps []quota.Policy, ovs []quota.Override, now time.Time) ([]quota.Override, string, error) {
	norm := make([]quota.Policy, len(ps))
	for i, p := range ps {
		norm[i] = p.Normalize()
	}
	set, err := policyset.Set{Policies: norm, Overrides: &ovs}.Validate(now)
	if ie := (*policyset.InvalidError)(nil); errors.As(err, &ie) {
		return nil, ie.ID, ie.Err
	}
	if err != nil {
		return nil, "", err
	}
	return *set.Overrides, "", nil
}

// checkLimit runs a zero-cost check of subject on l and returns the first
// policy's limit and override id.
func (l *liveDaemon) checkLimit(t *testing.T, subject string) (int64, string) {
	t.Helper()
	code, body := l.admin(t, "POST", "/v1/check", fmt.Sprintf(`{"subject":%q,"route":"/x","cost":0}`, subject))
	var d Decision
	if code != 200 || json.Unmarshal([]byte(body), &d) != nil || len(d.Policies) == 0 {
		t.Fatalf("POST /v1/check = %d %s", code, body)
	}
	return d.Policies[0].Limit, d.Policies[0].Override
}

// overrideIDs lists the ids of the overrides in force on l.
func (l *liveDaemon) overrideIDs() string {
	var ids []string
	for _, o := range l.d.Registry().Overrides() {
		ids = append(ids, fmt.Sprintf("%s:%g", o.ID, o.Burst))
	}
	return strings.Join(ids, ",")
}

// syncCount reads sluice_policy_sync_total{result} from l's metrics.
func (l *liveDaemon) syncCount(t *testing.T, result string) int {
	t.Helper()
	code, body := l.admin(t, "GET", "/metrics", "")
	if code != 200 {
		t.Fatalf("GET /metrics = %d", code)
	}
	prefix := fmt.Sprintf(`sluice_policy_sync_total{result=%q} `, result)
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			n, _ := strconv.ParseFloat(v, 64)
			return int(n)
		}
	}
	return 0
}

// broadcastAs sends a policy set through l's gossip node as if another
// node had made it, with a revision above any l and other hold.
func broadcastAs(t *testing.T, l, other *liveDaemon, origin, data string) uint64 {
	t.Helper()
	last := max(l.regions(t).PolicyRevision, other.regions(t).PolicyRevision)
	rev := policyset.NextRevision(time.Now(), last, origin)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := l.d.Gossip().BroadcastPolicy(ctx, gossip.PolicyUpdate{Version: rev, Data: []byte(data)}); err != nil {
		t.Fatalf("BroadcastPolicy: %v", err)
	}
	return rev
}

// oldSet is l's policies with policy q at rate, as a build without
// override replication sends them: no overrides field.
func oldSet(t *testing.T, l *liveDaemon, origin string, rate float64) string {
	t.Helper()
	ps := l.d.Registry().List("")
	for i := range ps {
		if ps[i].ID == "q" {
			ps[i].RatePerSec = rate
		}
	}
	b, err := json.Marshal(struct {
		Origin   string         `json:"origin"`
		Policies []quota.Policy `json:"policies"`
	}{origin, ps})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestOverrideSync: an override made in one region is enforced in the
// other, its deletion too; a set from a build without override
// replication leaves the receiver's overrides alone; a set with an invalid
// override is refused whole and the last good state stays in force.
func TestOverrideSync(t *testing.T) {
	if testing.Short() {
		t.Skip("real memberlist on loopback; skipped under -short")
	}
	seed := []quota.Policy{{ID: "q", Algorithm: "token_bucket", RatePerSec: 10, Burst: 10, Mode: quota.ModeEnforce}}
	a := startRegionDaemon(t, "a", "a1", "", seed)
	b := startRegionDaemon(t, "b", "b1", a.d.Gossip().Addr(), seed)
	testwait.For(t, 20*time.Second, "two regions in sync", func() bool {
		st := a.regions(t)
		return len(st.Members) == 2 && !st.PolicySkew
	})
	hashBefore := b.regions(t).PolicyHash
	rate := func(l *liveDaemon) float64 {
		p, _ := l.d.Registry().Get("q")
		return p.RatePerSec
	}
	expires := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	putOverride := func(id string, burst int) {
		t.Helper()
		doc := fmt.Sprintf(`{"id":%q,"subject":"tenant-7","policy":"q","burst":%d,"expires_at":%q}`, id, burst, expires)
		if code, body := a.admin(t, "POST", "/v1/overrides", doc); code != 201 {
			t.Fatalf("POST /v1/overrides = %d %s", code, body)
		}
	}

	// A put in a is enforced in b.
	putOverride("vip", 50)
	testwait.For(t, 10*time.Second, "b to enforce a's override", func() bool {
		l, id := b.checkLimit(t, "tenant-7")
		return l == 50 && id == "vip"
	})
	if l, id := b.checkLimit(t, "tenant-8"); l != 10 || id != "" {
		t.Errorf("check of another subject in b = limit %d, override %q; want 10, none", l, id)
	}
	testwait.For(t, 10*time.Second, "a and b to advertise one hash, not the one before", func() bool {
		sa, sb := a.regions(t), b.regions(t)
		return !sb.PolicySkew && sa.PolicyHash == sb.PolicyHash && sb.PolicyHash != hashBefore
	})

	// A set from an older build (no overrides field) is applied, and b
	// keeps its overrides.
	rev := broadcastAs(t, a, b, "old1", oldSet(t, a, "old1", 20))
	testwait.For(t, 10*time.Second, "b to apply the older build's set", func() bool {
		return rate(b) == 20 && b.regions(t).PolicyRevision == rev
	})
	if got := b.overrideIDs(); got != "vip:50" {
		t.Errorf("overrides in b after a set without overrides = %q, want vip:50", got)
	}
	if l, id := b.checkLimit(t, "tenant-7"); l != 50 || id != "vip" {
		t.Errorf("check in b after a set without overrides = limit %d, override %q; want 50, vip", l, id)
	}

	// A delete in a removes it in b (and a's set brings back its rate).
	if code, body := a.admin(t, "DELETE", "/v1/overrides/vip", ""); code != 204 {
		t.Fatalf("DELETE /v1/overrides/vip = %d %s", code, body)
	}
	testwait.For(t, 10*time.Second, "b to drop the deleted override", func() bool {
		l, id := b.checkLimit(t, "tenant-7")
		return l == 10 && id == "" && b.overrideIDs() == "" && rate(b) == 10
	})

	// A set with one invalid override is refused whole.
	putOverride("vip2", 30)
	testwait.For(t, 10*time.Second, "b to enforce vip2", func() bool { return b.overrideIDs() == "vip2:30" })
	invalidBefore := b.syncCount(t, "invalid")
	bad := strings.TrimSuffix(oldSet(t, a, "a9", 30), "}") + fmt.Sprintf(
		`,"overrides":[{"id":"vip3","subject":"tenant-9","policy":"q","burst":40,"expires_at":%q},`+
			`{"id":"bad","subject":"tenant-8","policy":"q","limit":5,"expires_at":%q}]}`, expires, expires)
	rev = broadcastAs(t, a, b, "a9", bad)
	testwait.For(t, 10*time.Second, "b to refuse the set", func() bool { return b.syncCount(t, "invalid") > invalidBefore })
	if got := b.overrideIDs(); got != "vip2:30" {
		t.Errorf("overrides in b after an invalid set = %q, want vip2:30", got)
	}
	if r := rate(b); r != 10 {
		t.Errorf("rate in b after an invalid set = %g, want 10 (the set is refused whole)", r)
	}
	if st := b.regions(t); st.PolicyRevision == rev {
		t.Errorf("b took the revision %d of a refused set", rev)
	}

	// The next good change still goes through.
	if code, body := a.admin(t, "DELETE", "/v1/overrides/vip2", ""); code != 204 {
		t.Fatalf("DELETE /v1/overrides/vip2 = %d %s", code, body)
	}
	testwait.For(t, 10*time.Second, "b to drop vip2 and agree with a", func() bool {
		sa, sb := a.regions(t), b.regions(t)
		return b.overrideIDs() == "" && sa.PolicyHash == sb.PolicyHash && !sb.PolicySkew
	})
}

// TestOverrideSyncSiblingsOnRedis: region b runs two daemons on one Redis.
// An override made in region a reaches both (each applies the set; the
// second finds it done), and one made on b1 reaches b2 through Redis and a
// through gossip.
func TestOverrideSyncSiblingsOnRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("real memberlist and redis-server on loopback; skipped under -short")
	}
	seed := []quota.Policy{{ID: "q", Algorithm: "token_bucket", RatePerSec: 10, Burst: 10, Mode: quota.ModeEnforce}}
	a := startRegionDaemon(t, "a", "a1", "", seed)
	store := "redis://" + redistest.Start(t).Addr()
	startB := func(node string) *liveDaemon {
		cfg := DefaultConfig()
		cfg.AdminToken = testToken
		cfg.Policies = seed
		cfg.Store = store
		cfg.Listen = "127.0.0.1:0"
		cfg.ShutdownTimeout = time.Second
		cfg.Gossip = &GossipConfig{Region: "b", Node: node, Listen: "127.0.0.1:0", Interval: time.Second, Dev: true, Preset: "local",
			Join: []string{a.d.Gossip().Addr()}}
		return serveDaemon(t, cfg)
	}
	b1, b2 := startB("b1"), startB("b2")
	testwait.For(t, 20*time.Second, "three nodes in sync", func() bool {
		st := a.regions(t)
		return len(st.Members) == 3 && !st.PolicySkew
	})
	expires := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)

	doc := fmt.Sprintf(`{"id":"vip","subject":"tenant-7","policy":"q","burst":50,"expires_at":%q}`, expires)
	if code, body := a.admin(t, "POST", "/v1/overrides", doc); code != 201 {
		t.Fatalf("POST /v1/overrides on a = %d %s", code, body)
	}
	for _, l := range []*liveDaemon{b1, b2} {
		testwait.For(t, 10*time.Second, "both b daemons to enforce a's override", func() bool {
			n, id := l.checkLimit(t, "tenant-7")
			return n == 50 && id == "vip"
		})
	}

	doc = fmt.Sprintf(`{"id":"vip8","subject":"tenant-8","policy":"q","burst":40,"expires_at":%q}`, expires)
	if code, body := b1.admin(t, "POST", "/v1/overrides", doc); code != 201 {
		t.Fatalf("POST /v1/overrides on b1 = %d %s", code, body)
	}
	for _, l := range []*liveDaemon{b2, a} {
		testwait.For(t, 10*time.Second, "b2 (Redis) and a (gossip) to enforce b1's override", func() bool {
			n, id := l.checkLimit(t, "tenant-8")
			return n == 40 && id == "vip8" && l.overrideIDs() == "vip:50,vip8:40"
		})
	}
	testwait.For(t, 10*time.Second, "one hash everywhere", func() bool {
		return !a.regions(t).PolicySkew && !b2.regions(t).PolicySkew
	})
	if n := b1.syncCount(t, "error") + b2.syncCount(t, "error"); n != 0 {
		t.Errorf("policy sync errors in b = %d, want 0", n)
	}
}
