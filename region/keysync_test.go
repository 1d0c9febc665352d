package region

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/internal/testwait"
	"github.com/sluice-rl/sluice/quota"
)

// checkKey runs a zero-cost check with apiKey on l and returns the tier it
// resolved to and the ids of the policies that applied.
func (l *liveDaemon) checkKey(t *testing.T, apiKey string) (string, string) {
	t.Helper()
	code, body := l.admin(t, "POST", "/v1/check", fmt.Sprintf(`{"api_key":%q,"route":"/x","cost":0}`, apiKey))
	var d Decision
	if code != 200 || json.Unmarshal([]byte(body), &d) != nil {
		t.Fatalf("POST /v1/check = %d %s", code, body)
	}
	var ids []string
	for _, p := range d.Policies {
		ids = append(ids, p.ID)
	}
	return d.Tier, strings.Join(ids, ",")
}

// keyTiers lists l's key registry as "tier" per key of keys, "-" for one
// not registered.
func (l *liveDaemon) keyTiers(keys ...string) string {
	var out []string
	for _, k := range keys {
		tier, ok := l.d.Registry().KeyTier(quota.KeyID(k))
		if !ok {
			tier = "-"
		}
		out = append(out, tier)
	}
	return strings.Join(out, ",")
}

// keySyncSeed is a policy for every tier and one for tier pro alone.
var keySyncSeed = []quota.Policy{
	{ID: "q", Algorithm: "token_bucket", RatePerSec: 10, Burst: 10, Mode: quota.ModeEnforce},
	{ID: "pro", Algorithm: "token_bucket", RatePerSec: 100, Burst: 100, Mode: quota.ModeEnforce, Match: quota.Match{Tier: "pro"}},
}

// TestKeySync: an API key registered in one region gets its tier in the
// other, a re-registration and a deletion too; a set from a build without
// key replication leaves the receiver's keys alone; a set with an invalid
// key entry is refused whole and the last good keys stay; no key reaches
// a log.
func TestKeySync(t *testing.T) {
	if testing.Short() {
		t.Skip("real memberlist on loopback; skipped under -short")
	}
	a := startRegionDaemon(t, "a", "a1", "", keySyncSeed)
	b := startRegionDaemon(t, "b", "b1", a.d.Gossip().Addr(), keySyncSeed)
	testwait.For(t, 20*time.Second, "two regions in sync", func() bool {
		st := a.regions(t)
		return len(st.Members) == 2 && !st.PolicySkew
	})
	hashBefore := b.regions(t).PolicyHash
	rate := func(l *liveDaemon) float64 {
		p, _ := l.d.Registry().Get("q")
		return p.RatePerSec
	}
	const k1, k2, k3 = "sk-live-0001secret", "sk-live-0002secret", "sk-live-0003secret"
	putKey := func(key, tier string) {
		t.Helper()
		if code, body := a.admin(t, "PUT", "/v1/keys/"+key, fmt.Sprintf(`{"tier":%q}`, tier)); code != 200 {
			t.Fatalf("PUT /v1/keys/… = %d %s", code, body)
		}
	}
	if tier, pols := b.checkKey(t, k1); tier != quota.TierAnonymous || pols != "q" {
		t.Fatalf("check in b before the key exists = tier %q, policies %q; want %q, q", tier, pols, quota.TierAnonymous)
	}

	// A key registered in a gets its tier in b.
	putKey(k1, "pro")
	testwait.For(t, 10*time.Second, "b to give a's key its tier", func() bool {
		tier, pols := b.checkKey(t, k1)
		return tier == "pro" && pols == "pro,q"
	})
	if tier, _ := b.checkKey(t, k2); tier != quota.TierAnonymous {
		t.Errorf("check of another key in b = tier %q, want %q", tier, quota.TierAnonymous)
	}
	testwait.For(t, 10*time.Second, "a and b to advertise one hash, not the one before", func() bool {
		sa, sb := a.regions(t), b.regions(t)
		return !sb.PolicySkew && sa.PolicyHash == sb.PolicyHash && sb.PolicyHash != hashBefore
	})
	audited := false
	for _, e := range b.d.audit.Last(100) {
		audited = audited || (e.Action == "key.put" && e.Who == "gossip:a1" && e.Target == quota.KeyID(k1))
	}
	if !audited {
		t.Errorf("b's audit log has no key.put of %s by gossip:a1", quota.KeyID(k1))
	}

	// A new tier for the key reaches b.
	putKey(k1, "team")
	testwait.For(t, 10*time.Second, "b to take the key's new tier", func() bool { return b.keyTiers(k1) == "team" })

	// A set from an older build (no keys field) is applied, and b keeps
	// its keys.
	rev := broadcastAs(t, a, b, "old1", oldSet(t, a, "old1", 20))
	testwait.For(t, 10*time.Second, "b to apply the older build's set", func() bool {
		return rate(b) == 20 && b.regions(t).PolicyRevision == rev
	})
	if tier, _ := b.checkKey(t, k1); tier != "team" {
		t.Errorf("check in b after a set without keys = tier %q, want team", tier)
	}

	// A delete in a removes the key in b (and a's set brings back its rate).
	if code, body := a.admin(t, "DELETE", "/v1/keys/"+k1, ""); code != 204 {
		t.Fatalf("DELETE /v1/keys/… = %d %s", code, body)
	}
	if code, _ := a.admin(t, "DELETE", "/v1/keys/"+k1, ""); code != 404 {
		t.Errorf("DELETE of a key not registered = %d, want 404", code)
	}
	testwait.For(t, 10*time.Second, "b to forget the deleted key", func() bool {
		tier, _ := b.checkKey(t, k1)
		return tier == quota.TierAnonymous && b.keyTiers(k1) == "-" && rate(b) == 10
	})

	// A set with one invalid key entry is refused whole.
	putKey(k2, "pro")
	testwait.For(t, 10*time.Second, "b to register k2", func() bool { return b.keyTiers(k2) == "pro" })
	invalidBefore := b.syncCount(t, "invalid")
	bad := strings.TrimSuffix(oldSet(t, a, "a9", 30), "}") + fmt.Sprintf(
		`,"keys":[{"key_id":%q,"tier":"pro"},{"key_id":%q,"tier":"pro"}]}`, quota.KeyID(k3), k1)
	rev = broadcastAs(t, a, b, "a9", bad)
	testwait.For(t, 10*time.Second, "b to refuse the set", func() bool { return b.syncCount(t, "invalid") > invalidBefore })
	if got := b.keyTiers(k1, k2, k3); got != "-,pro,-" {
		t.Errorf("keys in b after an invalid set = %q, want -,pro,- (k2 alone)", got)
	}
	if r := rate(b); r != 10 {
		t.Errorf("rate in b after an invalid set = %g, want 10 (the set is refused whole)", r)
	}
	if st := b.regions(t); st.PolicyRevision == rev {
		t.Errorf("b took the revision %d of a refused set", rev)
	}
	if !strings.Contains(b.logs.String(), "invalid key entry") {
		t.Errorf("b logged no refusal of the invalid set")
	}

	// The next good change still goes through.
	if code, body := a.admin(t, "DELETE", "/v1/keys/"+k2, ""); code != 204 {
		t.Fatalf("DELETE /v1/keys/… = %d %s", code, body)
	}
	testwait.For(t, 10*time.Second, "b to forget k2 and agree with a", func() bool {
		sa, sb := a.regions(t), b.regions(t)
		return b.keyTiers(k2) == "-" && sa.PolicyHash == sb.PolicyHash && !sb.PolicySkew
	})

	for name, l := range map[string]*liveDaemon{"a": a, "b": b} {
		logs := l.logs.String()
		for _, k := range []string{k1, k2, k3} {
			if strings.Contains(logs, k) {
				t.Errorf("%s's log holds an API key", name)
			}
		}
	}
}

// TestKeySyncSiblingsOnRedis: region b runs two daemons on one Redis. A
// key registered in region a reaches both (each applies the set; the
// second finds it done), and one registered or deleted on b1 reaches b2
// through Redis and a through gossip.
func TestKeySyncSiblingsOnRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("real memberlist and redis-server on loopback; skipped under -short")
	}
	a := startRegionDaemon(t, "a", "a1", "", keySyncSeed)
	store := "redis://" + redistest.Start(t).Addr()
	startB := func(node string) *liveDaemon {
		cfg := DefaultConfig()
		cfg.AdminToken = testToken
		cfg.Policies = keySyncSeed
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
	const k1, k2 = "sk-live-0001secret", "sk-live-0002secret"

	if code, body := a.admin(t, "PUT", "/v1/keys/"+k1, `{"tier":"pro"}`); code != 200 {
		t.Fatalf("PUT /v1/keys/… on a = %d %s", code, body)
	}
	for _, l := range []*liveDaemon{b1, b2} {
		testwait.For(t, 10*time.Second, "both b daemons to give a's key its tier", func() bool {
			tier, pols := l.checkKey(t, k1)
			return tier == "pro" && pols == "pro,q"
		})
	}

	if code, body := b1.admin(t, "PUT", "/v1/keys/"+k2, `{"tier":"pro"}`); code != 200 {
		t.Fatalf("PUT /v1/keys/… on b1 = %d %s", code, body)
	}
	for _, l := range []*liveDaemon{b2, a} {
		testwait.For(t, 10*time.Second, "b2 (Redis) and a (gossip) to register b1's key", func() bool {
			tier, _ := l.checkKey(t, k2)
			return tier == "pro" && l.keyTiers(k1, k2) == "pro,pro"
		})
	}

	if code, body := b1.admin(t, "DELETE", "/v1/keys/"+k1, ""); code != 204 {
		t.Fatalf("DELETE /v1/keys/… on b1 = %d %s", code, body)
	}
	for _, l := range []*liveDaemon{b2, a} {
		testwait.For(t, 10*time.Second, "b2 (Redis) and a (gossip) to forget the key b1 deleted", func() bool {
			tier, _ := l.checkKey(t, k1)
			return tier == quota.TierAnonymous && l.keyTiers(k1, k2) == "-,pro"
		})
	}
	testwait.For(t, 10*time.Second, "one hash everywhere", func() bool {
		return !a.regions(t).PolicySkew && !b2.regions(t).PolicySkew
	})
	if n := b1.syncCount(t, "error") + b2.syncCount(t, "error"); n != 0 {
		t.Errorf("policy sync errors in b = %d, want 0", n)
	}
}
