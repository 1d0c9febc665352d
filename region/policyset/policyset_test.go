package policyset

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/quota"
)

// tb is a token-bucket policy as a registry lists it (normalized).
func tb(id string, rate float64) quota.Policy {
	return quota.Policy{ID: id, Algorithm: "token_bucket", RatePerSec: rate, Burst: 10, Mode: quota.ModeEnforce}.Normalize()
}

func TestNextRevisionOrders(t *testing.T) {
	t0 := time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name      string
		now       time.Time
		last      uint64
		node      string
		wantAbove uint64
	}{
		{"first change", t0, 0, "a1", 0},
		{"later wall clock", t0.Add(time.Millisecond), NextRevision(t0, 0, "z9"), "a1", NextRevision(t0, 0, "z9")},
		{"clock behind what was seen", t0.Add(-time.Hour), NextRevision(t0, 0, "b1"), "a1", NextRevision(t0, 0, "b1")},
		{"same millisecond as seen", t0, NextRevision(t0, 0, "b1"), "a1", NextRevision(t0, 0, "b1")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := NextRevision(tt.now, tt.last, tt.node); got <= tt.wantAbove {
				t.Errorf("NextRevision(%v, %d, %q) = %d, want > %d", tt.now, tt.last, tt.node, got, tt.wantAbove)
			}
		})
	}
	if a, b := NextRevision(t0, 0, "a1"), NextRevision(t0, 0, "b1"); a == b {
		t.Errorf("NextRevision at one instant = %d on two nodes, want them ordered", a)
	}
	if got, want := NextRevision(t0, 0, "a1")>>16, uint64(t0.UnixMilli()); got != want {
		t.Errorf("NextRevision(t0)>>16 = %d, want t0 in ms %d", got, want)
	}
}

// policiesOnlyHash is Hash as builds before override and key replication
// compute it.
func policiesOnlyHash(ps []quota.Policy) string {
	ps = slices.Clone(ps)
	slices.SortFunc(ps, func(a, b quota.Policy) int { return strings.Compare(a.ID, b.ID) })
	h := sha256.New()
	for _, p := range ps {
		p.Version = 0
		b, _ := json.Marshal(p)
		h.Write(b)
		h.Write([]byte{'\n'})
	}
	return hex.EncodeToString(h.Sum(nil)[:6])
}

func TestHash(t *testing.T) {
	p, q := tb("p", 10), tb("q", 5)
	p2 := p
	p2.Version = 7
	faster := p
	faster.RatePerSec = 11
	exp := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	o1 := quota.Override{ID: "vip", Subject: "tenant-7", Policy: "p", Burst: 50, ExpiresAt: exp}
	o2 := quota.Override{ID: "vip2", Subject: "tenant-8", Policy: "p", Burst: 30, ExpiresAt: exp}
	o1cet, o1later, o1free := o1, o1, o1
	o1cet.ExpiresAt = exp.In(time.FixedZone("CET", 3600))
	o1later.ExpiresAt = exp.Add(time.Second)
	o1free.Burst, o1free.Unlimited = 0, true
	k1 := quota.KeyEntry{KeyID: quota.KeyID("sk-1"), Tier: "pro"}
	k2 := quota.KeyEntry{KeyID: quota.KeyID("sk-2"), Tier: "free"}
	k1free := quota.KeyEntry{KeyID: k1.KeyID, Tier: "free"}
	ps := []quota.Policy{p, q}
	set := func(ps []quota.Policy, ovs []quota.Override, keys []quota.KeyEntry) Set {
		return New("a1", ps, ovs, keys)
	}
	tests := []struct {
		name string
		a, b Set
		same bool
	}{
		{"policy order and versions", set(ps, nil, nil), set([]quota.Policy{q, p2}, nil, nil), true},
		{"a changed rate", set(ps, nil, nil), set([]quota.Policy{faster, q}, nil, nil), false},
		{"origin", New("a1", ps, nil, nil), New("b7", ps, nil, nil), true},
		{"overrides absent and empty", Set{Policies: ps}, set(ps, []quota.Override{}, nil), true},
		{"an override against none", set(ps, nil, nil), set(ps, []quota.Override{o1}, nil), false},
		{"override order", set(ps, []quota.Override{o1, o2}, nil), set(ps, []quota.Override{o2, o1}, nil), true},
		{"time zone of an expiry", set(ps, []quota.Override{o1}, nil), set(ps, []quota.Override{o1cet}, nil), true},
		{"a later expiry", set(ps, []quota.Override{o1}, nil), set(ps, []quota.Override{o1later}, nil), false},
		{"an exemption against a raise", set(ps, []quota.Override{o1}, nil), set(ps, []quota.Override{o1free}, nil), false},
		{"keys absent and empty", Set{Policies: ps}, set(ps, nil, []quota.KeyEntry{}), true},
		{"a key against none", set(ps, nil, nil), set(ps, nil, []quota.KeyEntry{k1}), false},
		{"key order", set(ps, nil, []quota.KeyEntry{k1, k2}), set(ps, nil, []quota.KeyEntry{k2, k1}), true},
		{"another tier", set(ps, nil, []quota.KeyEntry{k1}), set(ps, nil, []quota.KeyEntry{k1free}), false},
		{"another key", set(ps, nil, []quota.KeyEntry{k1}), set(ps, nil, []quota.KeyEntry{k2}), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ha, hb := tt.a.Hash(), tt.b.Hash()
			if (ha == hb) != tt.same {
				t.Errorf("Hash(%+v) = %s, Hash(%+v) = %s; want equal %v", tt.a, ha, tt.b, hb, tt.same)
			}
			if len(ha) != 12 {
				t.Errorf("Hash() = %q, want 12 hex digits", ha)
			}
		})
	}
	if got, want := set(ps, nil, nil).Hash(), policiesOnlyHash(ps); got != want {
		t.Errorf("Hash of policies alone = %s, want the policies-only hash %s", got, want)
	}
}

func TestEncodeDecode(t *testing.T) {
	exp := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	ovs := []quota.Override{{ID: "svc", Subject: "user:svc", Policy: "p", Unlimited: true, ExpiresAt: exp}}
	tests := []struct {
		name            string
		in              Set
		overrides, keys int // -1: not carried
	}{
		{"everything", New("a1", []quota.Policy{tb("p", 10)}, ovs, []quota.KeyEntry{{KeyID: quota.KeyID("k"), Tier: "pro"}}), 1, 1},
		{"empty lists stay present", New("a1", nil, nil, nil), 0, 0},
		{"an older build's set", Set{Origin: "old", Policies: []quota.Policy{tb("p", 10)}}, -1, -1},
	}
	count := func(n int, present bool) int {
		if !present {
			return -1
		}
		return n
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := tt.in.Encode()
			if err != nil {
				t.Fatal(err)
			}
			got, err := Decode(b)
			if err != nil {
				t.Fatalf("Decode(%s) = %v", b, err)
			}
			nov, nkeys := -1, -1
			if got.Overrides != nil {
				nov = len(*got.Overrides)
			}
			if got.Keys != nil {
				nkeys = len(*got.Keys)
			}
			if nov != count(tt.overrides, tt.overrides >= 0) || nkeys != tt.keys {
				t.Errorf("Decode(Encode()) carries %d overrides, %d keys; want %d, %d (-1: absent)", nov, nkeys, tt.overrides, tt.keys)
			}
			if got.Origin != tt.in.Origin || got.Hash() != tt.in.Hash() {
				t.Errorf("Decode(Encode(%+v)) = %+v, a different set", tt.in, got)
			}
		})
	}
	if _, err := Decode([]byte(`{"policies":{}}`)); err == nil {
		t.Error("Decode of policies that are not a list succeeded")
	}
}

func TestValidate(t *testing.T) {
	now := time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)
	ps := []quota.Policy{
		tb("tb", 10),
		quota.Policy{ID: "fw", Algorithm: "fixed_window", Count: 100, Window: 60, Mode: quota.ModeEnforce}.Normalize(),
		quota.Policy{ID: "login", Algorithm: "sliding_window_counter", Count: 5, Window: 900, Class: quota.ClassSecurity, Mode: quota.ModeEnforce}.Normalize(),
	}
	ov := func(id, subject, policy string, burst, limit float64, expires time.Duration) quota.Override {
		return quota.Override{ID: id, Subject: subject, Policy: policy, Burst: burst, Count: limit, ExpiresAt: now.Add(expires)}
	}
	exempt := quota.Override{ID: "svc", Subject: "user:svc", Policy: "tb", Unlimited: true, ExpiresAt: now.Add(time.Hour)}
	id1, id2 := quota.KeyID("sk-1"), quota.KeyID("sk-2")
	k := func(id, tier string) quota.KeyEntry { return quota.KeyEntry{KeyID: id, Tier: tier} }
	// Nine policies on every request: one more than a request may meet.
	var crowd []quota.Policy
	for i := range quota.MaxPoliciesPerRequest + 1 {
		crowd = append(crowd, tb(fmt.Sprintf("p%d", i), 1))
	}
	bad := tb("bad", 10)
	bad.Burst = -1
	withOverrides := func(ovs ...quota.Override) Set {
		if ovs == nil {
			ovs = []quota.Override{}
		}
		return Set{Policies: ps, Overrides: &ovs}
	}
	withKeys := func(keys ...quota.KeyEntry) Set {
		if keys == nil {
			keys = []quota.KeyEntry{}
		}
		return Set{Policies: ps, Keys: &keys}
	}
	tests := []struct {
		name      string
		in        Set
		overrides []string // ids kept; nil: not carried
		keys      []string // key ids kept, in order; nil: not carried
		bad       *InvalidError
	}{
		{"policies alone", Set{Policies: ps}, nil, nil, nil},
		{"no policies", Set{}, nil, nil, nil},
		{"an invalid policy", Set{Policies: []quota.Policy{ps[0], bad}}, nil, nil, &InvalidError{Part: PartPolicy, ID: "bad", Index: 1}},
		{"a policy twice", Set{Policies: []quota.Policy{ps[0], tb("tb", 20)}}, nil, nil, &InvalidError{Part: PartPolicy, ID: "tb", Index: 1}},
		{"too many policies on one request", Set{Policies: crowd}, nil, nil, &InvalidError{Part: PartPolicies}},

		{"no overrides", withOverrides(), []string{}, nil, nil},
		{"valid overrides", withOverrides(ov("a", "s1", "tb", 50, 0, time.Hour), ov("b", "s1", "fw", 0, 500, time.Hour)), []string{"a", "b"}, nil, nil},
		{"an exemption", withOverrides(exempt), []string{"svc"}, nil, nil},
		{"expired left out", withOverrides(ov("a", "s1", "tb", 50, 0, time.Hour), ov("old", "s2", "tb", 50, 0, -time.Second)), []string{"a"}, nil, nil},
		{"expiring now left out", withOverrides(ov("now", "s2", "tb", 50, 0, 0)), []string{}, nil, nil},
		{"a parameter the policy does not use", withOverrides(ov("a", "s1", "tb", 0, 5, time.Hour)), nil, nil, &InvalidError{Part: PartOverride, ID: "a"}},
		{"a policy not in the set", withOverrides(ov("a", "s1", "gone", 50, 0, time.Hour)), nil, nil, &InvalidError{Part: PartOverride, ID: "a"}},
		{"two for one subject and policy", withOverrides(ov("a", "s1", "tb", 50, 0, time.Hour), ov("b", "s1", "tb", 20, 0, time.Hour)), nil, nil, &InvalidError{Part: PartOverride, ID: "b", Index: 1}},
		{"an override id twice", withOverrides(ov("a", "s1", "tb", 50, 0, time.Hour), ov("a", "s2", "tb", 20, 0, time.Hour)), nil, nil, &InvalidError{Part: PartOverride, ID: "a", Index: 1}},
		{"an expired override id twice", withOverrides(ov("a", "s1", "tb", 50, 0, -time.Hour), ov("a", "s2", "tb", 20, 0, -time.Hour)), nil, nil, &InvalidError{Part: PartOverride, ID: "a", Index: 1}},
		{"no expiry", withOverrides(quota.Override{ID: "a", Subject: "s1", Policy: "tb", Burst: 50}), nil, nil, &InvalidError{Part: PartOverride, ID: "a"}},
		{"a bad subject", withOverrides(ov("a", "has space", "tb", 50, 0, time.Hour)), nil, nil, &InvalidError{Part: PartOverride, ID: "a"}},
		{"an exemption of a security policy", withOverrides(exempt, quota.Override{ID: "pw", Subject: "user:svc", Policy: "login", Unlimited: true, ExpiresAt: now.Add(time.Hour)}), nil, nil, &InvalidError{Part: PartOverride, ID: "pw", Index: 1}},

		{"no keys", withKeys(), nil, []string{}, nil},
		{"keys, sorted", withKeys(k(id2, "pro"), k(id1, "free")), nil, slices.Sorted(slices.Values([]string{id1, id2})), nil},
		{"a key id twice", withKeys(k(id1, "pro"), k(id1, "free")), nil, nil, &InvalidError{Part: PartKey, Index: 1}},
		{"a raw key instead of an id", withKeys(k(id1, "pro"), k("sk-live-secret", "pro")), nil, nil, &InvalidError{Part: PartKey, Index: 1}},
		{"upper-case hex", withKeys(k(strings.ToUpper(id1), "pro")), nil, nil, &InvalidError{Part: PartKey}},
		{"a short id", withKeys(k(id1[:31], "pro")), nil, nil, &InvalidError{Part: PartKey}},
		{"an empty tier", withKeys(k(id1, "")), nil, nil, &InvalidError{Part: PartKey}},
		{"a bad tier", withKeys(k(id1, "Pro")), nil, nil, &InvalidError{Part: PartKey}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.in.Validate(now)
			if tt.bad != nil {
				var ie *InvalidError
				if !errors.As(err, &ie) || ie.Part != tt.bad.Part || ie.ID != tt.bad.ID || ie.Index != tt.bad.Index {
					t.Fatalf("Validate() = %v, want %s %q (index %d) refused", err, tt.bad.Part, tt.bad.ID, tt.bad.Index)
				}
				if ie.Err == nil {
					t.Errorf("Validate() = %v, without a reason", err)
				}
				if tt.in.Keys != nil {
					for _, e := range *tt.in.Keys {
						if strings.Contains(err.Error(), e.KeyID) {
							t.Errorf("Validate() error %q quotes a key entry", err)
						}
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Validate() = %v, want no error", err)
			}
			if gotIDs := overrideIDs(got.Overrides); fmt.Sprint(gotIDs) != fmt.Sprint(tt.overrides) || (gotIDs == nil) != (tt.overrides == nil) {
				t.Errorf("Validate() kept overrides %v, want %v", gotIDs, tt.overrides)
			}
			if gotIDs := keyIDs(got.Keys); fmt.Sprint(gotIDs) != fmt.Sprint(tt.keys) || (gotIDs == nil) != (tt.keys == nil) {
				t.Errorf("Validate() kept keys %v, want %v", gotIDs, tt.keys)
			}
		})
	}
}

// overrideIDs and keyIDs list the ids a set carries; nil when it carries
// none.
func overrideIDs(ovs *[]quota.Override) []string {
	if ovs == nil {
		return nil
	}
	ids := []string{}
	for _, o := range *ovs {
		ids = append(ids, o.ID)
	}
	return ids
}

func keyIDs(keys *[]quota.KeyEntry) []string {
	if keys == nil {
		return nil
	}
	ids := []string{}
	for _, k := range *keys {
		ids = append(ids, k.KeyID)
	}
	return ids
}

func TestDiff(t *testing.T) {
	exp := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	p, q, r := tb("p", 10), tb("q", 5), tb("r", 1)
	pv := p
	pv.Version = 4
	p2 := p
	p2.RatePerSec = 20
	o := func(id, subject, policy string, burst float64) quota.Override {
		return quota.Override{ID: id, Subject: subject, Policy: policy, Burst: burst, ExpiresAt: exp}
	}
	vip, vipCET := o("vip", "t7", "p", 50), o("vip", "t7", "p", 50)
	vipCET.ExpiresAt = exp.In(time.FixedZone("CET", 3600))
	ka, kb := quota.KeyID("a"), quota.KeyID("b")
	key := func(id, tier string) quota.KeyEntry { return quota.KeyEntry{KeyID: id, Tier: tier} }
	ovs := func(os ...quota.Override) *[]quota.Override { return &os }
	keys := func(ks ...quota.KeyEntry) *[]quota.KeyEntry { return &ks }
	tests := []struct {
		name       string
		have, want Set
		wantC      string // fmt of the Changes, ids only
	}{
		{"the same set", Set{Policies: []quota.Policy{pv, q}, Overrides: ovs(vip)}, Set{Policies: []quota.Policy{q, p}, Overrides: ovs(vipCET)}, "put[] del[] -ov[] +ov[] +k[] -k[]"},
		{"a policy changed, added and deleted", Set{Policies: []quota.Policy{p, q}}, Set{Policies: []quota.Policy{r, p2}}, "put[r p] del[q] -ov[] +ov[] +k[] -k[]"},
		{"overrides not carried: those of a deleted policy go", Set{Policies: []quota.Policy{p, q}, Overrides: ovs(vip, o("x", "t8", "q", 5))}, Set{Policies: []quota.Policy{q}}, "put[] del[p] -ov[vip] +ov[] +k[] -k[]"},
		{"an override changed in place", Set{Policies: []quota.Policy{p}, Overrides: ovs(vip)}, Set{Policies: []quota.Policy{p}, Overrides: ovs(o("vip", "t7", "p", 60))}, "put[] del[] -ov[] +ov[vip] +k[] -k[]"},
		{"an override added, one deleted", Set{Policies: []quota.Policy{p}, Overrides: ovs(vip)}, Set{Policies: []quota.Policy{p}, Overrides: ovs(o("new", "t8", "p", 5))}, "put[] del[] -ov[vip] +ov[new] +k[] -k[]"},
		{"another id takes the subject and policy", Set{Policies: []quota.Policy{p}, Overrides: ovs(vip)}, Set{Policies: []quota.Policy{p}, Overrides: ovs(o("vip2", "t7", "p", 60))}, "put[] del[] -ov[vip] +ov[vip2] +k[] -k[]"},
		{"two overrides swap subjects", Set{Policies: []quota.Policy{p}, Overrides: ovs(o("a", "s1", "p", 5), o("b", "s2", "p", 5))}, Set{Policies: []quota.Policy{p}, Overrides: ovs(o("a", "s2", "p", 5), o("b", "s1", "p", 5))}, "put[] del[] -ov[a b] +ov[a b] +k[] -k[]"},
		{"keys not carried", Set{Keys: keys(key(ka, "pro"))}, Set{}, "put[] del[] -ov[] +ov[] +k[] -k[]"},
		{"keys re-tiered, added and deleted", Set{Keys: keys(key(ka, "pro"), key(kb, "free"))}, Set{Keys: keys(key(ka, "team"))}, fmt.Sprintf("put[] del[] -ov[] +ov[] +k[%s] -k[%s]", ka, kb)},
		{"keys the same", Set{Keys: keys(key(ka, "pro"))}, Set{Keys: keys(key(ka, "pro"))}, "put[] del[] -ov[] +ov[] +k[] -k[]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Diff(tt.have, tt.want)
			if got := changesString(c); got != tt.wantC {
				t.Errorf("Diff() = %s, want %s", got, tt.wantC)
			}
			if want := tt.wantC == "put[] del[] -ov[] +ov[] +k[] -k[]"; c.Empty() != want {
				t.Errorf("Diff().Empty() = %v, want %v", c.Empty(), want)
			}
		})
	}
}

func changesString(c Changes) string {
	var put, putOv, putKeys []string
	for _, p := range c.PutPolicies {
		put = append(put, p.ID)
	}
	for _, o := range c.PutOverrides {
		putOv = append(putOv, o.ID)
	}
	for _, k := range c.PutKeys {
		putKeys = append(putKeys, k.KeyID)
	}
	list := func(s []string) string { return "[" + strings.Join(s, " ") + "]" }
	return fmt.Sprintf("put%s del%s -ov%s +ov%s +k%s -k%s", list(put), list(c.DeletePolicies), list(c.DeleteOverrides), list(putOv), list(putKeys), list(c.DeleteKeys))
}

// TestDiffAppliedReachesTheSet writes Diff's changes into a registry, in
// the documented order, and requires the registry to hold the wanted set
// after, and a second Diff to be empty.
func TestDiffAppliedReachesTheSet(t *testing.T) {
	now := time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)
	exp := now.Add(time.Hour)
	o := func(id, subject, policy string, burst float64) quota.Override {
		return quota.Override{ID: id, Subject: subject, Policy: policy, Burst: burst, ExpiresAt: exp}
	}
	start := New("a1", []quota.Policy{tb("p", 10), tb("q", 5)},
		[]quota.Override{o("a", "s1", "p", 5), o("b", "s2", "p", 5), o("x", "s3", "q", 5)},
		[]quota.KeyEntry{{KeyID: quota.KeyID("k1"), Tier: "pro"}})
	wants := []struct {
		name string
		set  Set
	}{
		{"a changed, swaps and deletes", New("b1", []quota.Policy{tb("p", 20), tb("r", 1)},
			[]quota.Override{o("a", "s2", "p", 5), o("b", "s1", "p", 6), o("y", "s3", "r", 2)},
			[]quota.KeyEntry{{KeyID: quota.KeyID("k1"), Tier: "team"}, {KeyID: quota.KeyID("k2"), Tier: "free"}})},
		{"an older build's set", Set{Origin: "old", Policies: []quota.Policy{tb("p", 10)}}},
		{"nothing", New("b1", nil, nil, nil)},
	}
	for _, w := range wants {
		t.Run(w.name, func(t *testing.T) {
			reg := quota.NewRegistry(quota.RegistryConfig{Clock: fixedClock(now)})
			if err := apply(t, reg, start); err != nil {
				t.Fatalf("applying the start set: %v", err)
			}
			want, err := w.set.Validate(now)
			if err != nil {
				t.Fatalf("Validate() = %v", err)
			}
			if err := apply(t, reg, want); err != nil {
				t.Fatalf("applying Diff: %v", err)
			}
			held := New("", reg.List(""), reg.Overrides(), reg.Snapshot().Keys)
			expect := want
			if want.Overrides == nil { // the start's overrides stay, but those of deleted policies
				var kept []quota.Override
				for _, o := range *start.Overrides {
					if _, ok := reg.Get(o.Policy); ok {
						kept = append(kept, o)
					}
				}
				expect.Overrides = &kept
			}
			if want.Keys == nil {
				expect.Keys = start.Keys
			}
			if held.Hash() != expect.Hash() {
				t.Errorf("registry after Diff holds %+v, want %+v", held, expect)
			}
			if c := Diff(held, want); !c.Empty() {
				t.Errorf("Diff again = %s, want nothing", changesString(c))
			}
		})
	}
}

// apply writes Diff(held, want) into reg as the daemon does.
func apply(t *testing.T, reg *quota.Registry, want Set) error {
	t.Helper()
	ctx := t.Context()
	c := Diff(New("", reg.List(""), reg.Overrides(), reg.Snapshot().Keys), want)
	for _, p := range c.PutPolicies {
		if _, err := reg.Put(ctx, "test", p, nil); err != nil {
			return err
		}
	}
	for _, id := range c.DeletePolicies {
		if err := reg.Delete(ctx, "test", id, nil); err != nil {
			return err
		}
	}
	for _, id := range c.DeleteOverrides {
		if err := reg.DeleteOverride(ctx, "test", id); err != nil && !errors.Is(err, quota.ErrNotFound) {
			return err
		}
	}
	for _, o := range c.PutOverrides {
		if _, err := reg.PutOverride(ctx, "test", o); err != nil {
			return err
		}
	}
	if len(c.PutKeys)+len(c.DeleteKeys) > 0 {
		return reg.SyncKeys(ctx, "test", *want.Keys)
	}
	return nil
}
