package quota

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/engine"
)

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// memStore is a Store in memory that can be told to fail.
type memStore struct {
	mu    sync.Mutex
	snap  *Snapshot
	fail  error
	saves int
}

func (m *memStore) Load(context.Context) (Snapshot, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.snap == nil {
		return Snapshot{}, ErrNoSnapshot
	}
	return *m.snap, nil
}

func (m *memStore) Save(_ context.Context, s Snapshot) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return m.fail
	}
	m.saves++
	m.snap = &s
	return nil
}

func tb(id, tier string, rate, burst float64, routes ...string) Policy {
	return Policy{ID: id, Match: Match{Tier: tier, Routes: routes}, Algorithm: "token_bucket", RatePerSec: rate, Burst: burst, Mode: ModeEnforce}
}

func mustPut(t *testing.T, r *Registry, p Policy) Policy {
	t.Helper()
	out, err := r.Put(t.Context(), "test", p, nil)
	if err != nil {
		t.Fatalf("Put(%s) = %v", p.ID, err)
	}
	return out
}

func ids(as []Applied) []string {
	var out []string
	for _, a := range as {
		out = append(out, a.Policy.ID)
	}
	return out
}

func TestRegistryVersions(t *testing.T) {
	ctx := t.Context()
	r := NewRegistry(RegistryConfig{})
	p1 := mustPut(t, r, tb("pro", "pro", 100, 200))
	if p1.Version != 1 {
		t.Fatalf("first Put version = %d, want 1", p1.Version)
	}
	p2 := tb("pro", "pro", 50, 100)
	p2.Mode = "" // a new version without a mode starts in shadow
	got, err := r.Put(ctx, "test", p2, new(1))
	if err != nil || got.Version != 2 || got.Mode != ModeShadow {
		t.Fatalf("Put(ifMatch 1) = v%d mode %s, %v; want v2 shadow", got.Version, got.Mode, err)
	}

	// A stale If-Match is a conflict and changes nothing.
	_, err = r.Put(ctx, "test", tb("pro", "pro", 1, 1), new(1))
	var ce *ConflictError
	if !errors.As(err, &ce) || !errors.Is(err, ErrConflict) || ce.Want != 1 || ce.Have != 2 {
		t.Fatalf("Put(stale ifMatch) = %v, want ConflictError{Want 1, Have 2}", err)
	}
	// ifMatch 0 means "create only".
	if _, err := r.Put(ctx, "test", tb("pro", "pro", 1, 1), new(0)); !errors.Is(err, ErrConflict) {
		t.Errorf("Put(ifMatch 0) on an existing policy = %v, want a conflict", err)
	}

	// An invalid document is rejected whole; version 2 stays in force.
	bad := tb("pro", "pro", 100, 0)
	if _, err := r.Put(ctx, "test", bad, nil); !errors.Is(err, ErrInvalidPolicy) {
		t.Fatalf("Put(invalid) = %v, want ErrInvalidPolicy", err)
	}
	if cur, _ := r.Get("pro"); cur.Version != 2 || cur.RatePerSec != 50 {
		t.Errorf("after a rejected Put, in force = v%d rate %v, want v2 rate 50", cur.Version, cur.RatePerSec)
	}

	// Rollback re-publishes version 1's content, with its mode, as version 3.
	rb, err := r.Rollback(ctx, "test", "pro", new(2))
	if err != nil || rb.Version != 3 || rb.RatePerSec != 100 || rb.Mode != ModeEnforce {
		t.Fatalf("Rollback = %+v, %v; want v3 rate 100 enforce", rb, err)
	}
	vs, _ := r.Versions("pro")
	var nums []int
	for _, v := range vs {
		nums = append(nums, v.Version)
	}
	if !slices.Equal(nums, []int{1, 2, 3}) {
		t.Errorf("Versions = %v, want [1 2 3]", nums)
	}

	// Delete keeps the history; a later Put continues the numbering.
	if err := r.Delete(ctx, "test", "pro", new(3)); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Get("pro"); ok {
		t.Error("Get after Delete found the policy")
	}
	if got := r.Match(Query{Tier: "pro", Method: "GET", Route: "/"}); len(got) != 0 {
		t.Errorf("Match after Delete = %v, want none", ids(got))
	}
	if _, err := r.Rollback(ctx, "test", "pro", nil); !errors.Is(err, ErrNotFound) {
		t.Errorf("Rollback of a deleted policy = %v, want ErrNotFound", err)
	}
	if err := r.Delete(ctx, "test", "pro", nil); !errors.Is(err, ErrNotFound) {
		t.Errorf("second Delete = %v, want ErrNotFound", err)
	}
	p4, err := r.Put(ctx, "test", tb("pro", "pro", 1, 1), new(0))
	if err != nil || p4.Version != 4 {
		t.Errorf("Put after Delete = v%d, %v; want v4", p4.Version, err)
	}

	if _, err := r.Versions("nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Versions(unknown) = %v, want ErrNotFound", err)
	}
	mustPut(t, r, tb("solo", "", 1, 1))
	if _, err := r.Rollback(ctx, "test", "solo", nil); !errors.Is(err, ErrNoPreviousVersion) {
		t.Errorf("Rollback with one version = %v, want ErrNoPreviousVersion", err)
	}
}

func TestRegistryMaxVersions(t *testing.T) {
	r := NewRegistry(RegistryConfig{MaxVersions: 3})
	for i := 1; i <= 5; i++ {
		mustPut(t, r, tb("a", "", float64(i), 1))
	}
	vs, _ := r.Versions("a")
	if len(vs) != 3 || vs[0].Version != 3 || vs[2].Version != 5 {
		t.Errorf("Versions with MaxVersions 3 = %+v, want versions 3..5", vs)
	}
}

func TestRegistryMatch(t *testing.T) {
	r := NewRegistry(RegistryConfig{})
	all := tb("all", "", 1000, 1000)
	pro := tb("pro", "pro", 100, 200, "/v1/*")
	pro.Cost = map[string]int64{"POST /v1/exports": 10}
	free := tb("free", "free", 10, 20)
	login := Policy{ID: "login", Match: Match{Routes: []string{"/login"}, Methods: []string{"POST"}},
		Algorithm: "sliding_window_counter", Count: 5, Window: 900, Class: ClassSecurity}
	for _, p := range []Policy{all, pro, free, login} {
		mustPut(t, r, p)
	}
	tests := []struct {
		q     Query
		want  []string
		costs []int64
	}{
		{Query{Tier: "pro", Method: "GET", Route: "/v1/orders"}, []string{"all", "pro"}, []int64{1, 1}},
		{Query{Tier: "pro", Method: "post", Route: "/v1/exports?x=1"}, []string{"all", "pro"}, []int64{1, 10}},
		{Query{Tier: "pro", Method: "GET", Route: "/v2/orders"}, []string{"all"}, []int64{1}},
		{Query{Tier: "free", Method: "POST", Route: "/login"}, []string{"all", "free", "login"}, []int64{1, 1, 1}},
		{Query{Tier: "free", Method: "GET", Route: "/login"}, []string{"all", "free"}, []int64{1, 1}},
		{Query{Tier: "gold", Method: "GET", Route: "/v1/x"}, []string{"all"}, []int64{1}},
		{Query{Tier: "", Method: "POST", Route: "/login"}, []string{"all", "login"}, []int64{1, 1}},
	}
	for _, tt := range tests {
		got := r.Match(tt.q)
		var costs []int64
		for _, a := range got {
			costs = append(costs, a.Cost)
			if a.Limit != a.Policy.Limit() || a.Override != "" {
				t.Errorf("Match(%+v) %s limit = %+v override %q, want the policy's", tt.q, a.Policy.ID, a.Limit, a.Override)
			}
		}
		if !slices.Equal(ids(got), tt.want) || !slices.Equal(costs, tt.costs) {
			t.Errorf("Match(%+v) = %v costs %v, want %v costs %v", tt.q, ids(got), costs, tt.want, tt.costs)
		}
	}
	if got := r.List("pro"); len(got) != 3 { // all, login, pro
		t.Errorf("List(pro) = %d policies, want 3", len(got))
	}
	if got := r.List(""); len(got) != 4 {
		t.Errorf("List() = %d policies, want 4", len(got))
	}

	// Matching reuses a buffer without allocating.
	buf := make([]Applied, 0, MaxPoliciesPerRequest)
	q := Query{Tier: "pro", Method: "POST", Route: "/v1/exports"}
	if n := testing.AllocsPerRun(100, func() { buf = r.AppendMatch(buf[:0], q) }); n != 0 {
		t.Errorf("AppendMatch allocates %v times per call, want 0", n)
	}
}

func TestRegistryFanout(t *testing.T) {
	ctx := t.Context()
	r := NewRegistry(RegistryConfig{})
	// Eight policies on every request of tier pro: fine.
	for i := range MaxPoliciesPerRequest {
		mustPut(t, r, tb(fmt.Sprintf("p%d", i), "pro", 1, 1))
	}
	// A ninth for tier pro (or every tier) is refused, naming "match".
	for _, tier := range []string{"pro", ""} {
		_, err := r.Put(ctx, "test", tb("p9", tier, 1, 1, "/v1/x"), nil)
		var ve *ValidationError
		if !errors.As(err, &ve) || ve.Problems[0].Field != "match" {
			t.Errorf("Put(9th policy, tier %q) = %v, want a ValidationError on match", tier, err)
		}
	}
	// Other tiers, other methods and disjoint routes do not count.
	mustPut(t, r, tb("free", "free", 1, 1))
	m := tb("posts", "pro", 1, 1)
	m.Match.Methods = []string{"POST"}
	if _, err := r.Put(ctx, "test", m, nil); err == nil {
		t.Error("Put(9th policy for POST in tier pro) succeeded")
	}

	r2 := NewRegistry(RegistryConfig{})
	mustPut(t, r2, tb("global", "", 1, 1)) // every route of every tier
	for i := range 20 {                    // each on its own route: at most 2 per request
		mustPut(t, r2, tb(fmt.Sprintf("route%d", i), "pro", 1, 1, fmt.Sprintf("/v1/r%d/*", i)))
	}
	for i := range 6 {
		mustPut(t, r2, tb(fmt.Sprintf("all%d", i), "pro", 1, 1, "/v1/**"))
	}
	// global + 6 all + route0 = 8 on /v1/r0/x: one more overlapping is refused.
	if _, err := r2.Put(ctx, "test", tb("extra", "pro", 1, 1, "/v1/r0/x"), nil); err == nil {
		t.Error("Put(a 9th policy on /v1/r0/x) succeeded")
	}
	if got := r2.Match(Query{Tier: "pro", Method: "GET", Route: "/v1/r0/x"}); len(got) != 8 {
		t.Errorf("Match = %d policies, want 8", len(got))
	}
}

func TestRegistryRejectedPutKeepsStore(t *testing.T) {
	ctx := t.Context()
	st := &memStore{}
	audit, _ := OpenAuditLog("", 10)
	r := NewRegistry(RegistryConfig{Store: st, Audit: audit})
	mustPut(t, r, tb("a", "", 1, 1))
	st.fail = errors.New("disk full")
	if _, err := r.Put(ctx, "test", tb("a", "", 2, 2), nil); !errors.Is(err, ErrStore) {
		t.Fatalf("Put with a failing store = %v, want ErrStore", err)
	}
	if p, _ := r.Get("a"); p.Version != 1 || p.RatePerSec != 1 {
		t.Errorf("after a failed save, in force = %+v, want version 1", p)
	}
	if n := len(audit.Last(10)); n != 1 {
		t.Errorf("audit entries = %d, want 1 (the failed change is not audited)", n)
	}
	st.fail = nil
	mustPut(t, r, tb("a", "", 2, 2))

	// A new registry loads what was saved.
	r2 := NewRegistry(RegistryConfig{Store: st})
	if err := r2.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(r2.Snapshot(), r.Snapshot()) {
		t.Errorf("loaded snapshot = %+v, want %+v", r2.Snapshot(), r.Snapshot())
	}
	if p, _ := r2.Get("a"); p.Version != 2 {
		t.Errorf("loaded version = %d, want 2", p.Version)
	}
	if err := NewRegistry(RegistryConfig{Store: &memStore{}}).Load(ctx); !errors.Is(err, ErrNoSnapshot) {
		t.Errorf("Load(empty store) = %v, want ErrNoSnapshot", err)
	}
}

func TestRegistryOverrides(t *testing.T) {
	ctx := t.Context()
	clk := newFakeClock()
	audit, _ := OpenAuditLog("", 100)
	r := NewRegistry(RegistryConfig{Clock: clk, Audit: audit})
	mustPut(t, r, tb("free", "free", 10, 20))
	mustPut(t, r, Policy{ID: "daily", Algorithm: "fixed_window", Count: 1000, Window: 86400})

	o := Override{ID: "vip", Subject: "user:42", Policy: "free", RatePerSec: 50, Burst: 100, ExpiresAt: clk.Now().Add(time.Hour)}
	if _, err := r.PutOverride(ctx, "ops", o); err != nil {
		t.Fatal(err)
	}
	q := Query{Tier: "free", Subject: "user:42", Method: "GET", Route: "/"}
	got := r.Match(q)
	want := engine.Limit{Algorithm: engine.TokenBucket, Rate: 50, Burst: 100}
	if len(got) != 2 || got[1].Limit != want || got[1].Override != "vip" {
		t.Fatalf("Match with override = %+v, want free at %+v", got, want)
	}
	if other := r.Match(Query{Tier: "free", Subject: "user:43", Method: "GET", Route: "/"}); other[1].Override != "" {
		t.Errorf("override applied to another subject")
	}

	bad := []struct {
		o     Override
		field string
	}{
		{Override{ID: "x", Subject: "user:1", Policy: "free", Burst: 0.5, ExpiresAt: clk.Now().Add(time.Hour)}, "burst"},
		{Override{ID: "x", Subject: "user:1", Policy: "free", Count: 5, ExpiresAt: clk.Now().Add(time.Hour)}, "limit"},
		{Override{ID: "x", Subject: "user:1", Policy: "daily", Window: 0.0001, ExpiresAt: clk.Now().Add(time.Hour)}, "window"},
		{Override{ID: "x", Subject: "user:1", Policy: "free", Burst: 5, ExpiresAt: clk.Now().Add(-time.Second)}, "expires_at"},
		{Override{ID: "x", Subject: "user:1", Policy: "free", Burst: 5}, "expires_at"},
		{Override{ID: "x", Subject: "user 1", Policy: "free", Burst: 5, ExpiresAt: clk.Now().Add(time.Hour)}, "subject"},
		{Override{ID: "x", Subject: "user:1", Policy: "nope", Burst: 5, ExpiresAt: clk.Now().Add(time.Hour)}, "policy"},
		{Override{ID: "x", Subject: "user:42", Policy: "free", Burst: 5, ExpiresAt: clk.Now().Add(time.Hour)}, "subject"}, // vip exists
		{Override{ID: "x", Subject: "user:1", Policy: "free", ExpiresAt: clk.Now().Add(time.Hour)}, ""},
	}
	for _, tt := range bad {
		_, err := r.PutOverride(ctx, "ops", tt.o)
		var ve *ValidationError
		if !errors.As(err, &ve) || !slices.ContainsFunc(ve.Problems, func(p FieldError) bool { return p.Field == tt.field }) {
			t.Errorf("PutOverride(%+v) = %v, want a problem on %q", tt.o, err, tt.field)
		}
	}

	// Expired: ignored at once, pruned (and audited) by the next write.
	clk.Advance(time.Hour)
	if got := r.Match(q); got[1].Override != "" || got[1].Limit != got[1].Policy.Limit() {
		t.Errorf("Match after expiry = %+v, want the policy's limit", got[1])
	}
	if len(r.Overrides()) != 0 {
		t.Errorf("Overrides after expiry = %v, want none", r.Overrides())
	}
	n, err := r.PruneExpired(ctx, "system")
	if err != nil || n != 1 {
		t.Errorf("PruneExpired = %d, %v; want 1", n, err)
	}
	if n, _ := r.PruneExpired(ctx, "system"); n != 0 {
		t.Errorf("second PruneExpired = %d, want 0", n)
	}
	if last := audit.Last(1); len(last) != 1 || last[0].Action != "override.expire" || last[0].Target != "vip" {
		t.Errorf("last audit entry = %+v, want override.expire vip", last)
	}

	// An override that no longer fits a new version of its policy is
	// ignored rather than applied.
	o2 := Override{ID: "vip2", Subject: "user:7", Policy: "free", RatePerSec: 5, ExpiresAt: clk.Now().Add(time.Hour)}
	if _, err := r.PutOverride(ctx, "ops", o2); err != nil {
		t.Fatal(err)
	}
	mustPut(t, r, Policy{ID: "free", Match: Match{Tier: "free"}, Algorithm: "fixed_window", Count: 10, Window: 1})
	for _, a := range r.Match(Query{Tier: "free", Subject: "user:7", Method: "GET", Route: "/"}) {
		if a.Policy.ID == "free" && a.Override != "" {
			t.Errorf("override %s applied to an incompatible version", a.Override)
		}
	}
	if err := r.DeleteOverride(ctx, "ops", "vip2"); err != nil {
		t.Error(err)
	}
	if err := r.DeleteOverride(ctx, "ops", "vip2"); !errors.Is(err, ErrNotFound) {
		t.Errorf("second DeleteOverride = %v, want ErrNotFound", err)
	}
}

func TestRegistryKeysAndResolve(t *testing.T) {
	ctx := t.Context()
	audit, _ := OpenAuditLog("", 10)
	r := NewRegistry(RegistryConfig{Audit: audit})
	if err := r.PutKey(ctx, "ops", "sk_live_1", "pro"); err != nil {
		t.Fatal(err)
	}
	if err := r.PutKey(ctx, "ops", "bad key", "pro"); err == nil {
		t.Error("PutKey(key with a space) succeeded")
	}
	if err := r.PutKey(ctx, "ops", "k", "Pro"); err == nil {
		t.Error("PutKey(bad tier) succeeded")
	}
	for _, e := range audit.Last(10) {
		if string(e.After) != "" && (strings.Contains(string(e.After)+string(e.Before), "sk_live_1") || e.Target == "sk_live_1") {
			t.Errorf("audit entry %+v reveals the key", e)
		}
	}
	ip := Identity{IP: mustAddr("192.0.2.1")}
	tests := []struct {
		name string
		id   Identity
		want Principal
	}{
		{"registered key", Identity{APIKey: "sk_live_1", KeyID: KeyID("sk_live_1"), IP: ip.IP}, Principal{Subject: "key:" + KeyID("sk_live_1"), Tier: "pro"}},
		{"unknown key falls back to ip", Identity{APIKey: "made_up", KeyID: KeyID("made_up"), IP: ip.IP}, Principal{Subject: "ip:192.0.2.1", Tier: TierAnonymous, UnknownKey: true}},
		{"trusted tier vouches for key", Identity{APIKey: "made_up", KeyID: KeyID("made_up"), Tier: "free"}, Principal{Subject: "key:" + KeyID("made_up"), Tier: "free"}},
		{"ip only", ip, Principal{Subject: "ip:192.0.2.1", Tier: TierAnonymous}},
		{"unknown key falls back to user", Identity{KeyID: KeyID("made_up"), User: "u7", IP: ip.IP}, Principal{Subject: "user:u7", Tier: TierAnonymous, UnknownKey: true}},
		{"unknown key alone shares one bucket", Identity{APIKey: "made_up", KeyID: KeyID("made_up")}, Principal{Subject: UnknownKeySubject, Tier: TierAnonymous, UnknownKey: true}},
		{"another unknown key alone, the same bucket", Identity{APIKey: "other", KeyID: KeyID("other")}, Principal{Subject: UnknownKeySubject, Tier: TierAnonymous, UnknownKey: true}},
		{"invalid key counts by ip", Identity{KeyInvalid: true, IP: ip.IP}, Principal{Subject: "ip:192.0.2.1", Tier: TierAnonymous, UnknownKey: true}},
		{"invalid key alone shares one bucket", Identity{KeyInvalid: true}, Principal{Subject: UnknownKeySubject, Tier: TierAnonymous, UnknownKey: true}},
		{"invalid key beside a registered one is ignored", Identity{APIKey: "sk_live_1", KeyID: KeyID("sk_live_1")}, Principal{Subject: "key:" + KeyID("sk_live_1"), Tier: "pro"}},
		{"unknown key with raw subject keeps it", Identity{KeyID: KeyID("made_up"), Raw: "tenant:9"}, Principal{Subject: "tenant:9", Tier: TierAnonymous, UnknownKey: true}},
		{"raw subject", Identity{Raw: "tenant:9", Tier: "pro"}, Principal{Subject: "tenant:9", Tier: "pro"}},
	}
	for _, tt := range tests {
		if got := r.Resolve(tt.id); got != tt.want {
			t.Errorf("%s: Resolve = %+v, want %+v", tt.name, got, tt.want)
		}
	}
	if err := r.DeleteKey(ctx, "ops", "sk_live_1"); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.KeyTier(KeyID("sk_live_1")); ok {
		t.Error("KeyTier after DeleteKey found the key")
	}
	if err := r.DeleteKey(ctx, "ops", "sk_live_1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("second DeleteKey = %v, want ErrNotFound", err)
	}
}

func TestRegistrySeedIsIdempotent(t *testing.T) {
	ctx := t.Context()
	r := NewRegistry(RegistryConfig{})
	if err := r.Seed(ctx, "system", DefaultPolicies()); err != nil {
		t.Fatal(err)
	}
	if err := r.Seed(ctx, "system", DefaultPolicies()); err != nil {
		t.Fatal(err)
	}
	vs, _ := r.Versions("pro-default")
	if len(vs) != 1 {
		t.Errorf("seeding twice made %d versions, want 1", len(vs))
	}
	bad := append(DefaultPolicies(), tb("x", "", 0, 1))
	if err := r.Seed(ctx, "system", bad); !errors.Is(err, ErrInvalidPolicy) {
		t.Errorf("Seed(with an invalid policy) = %v, want ErrInvalidPolicy", err)
	}
	if _, ok := r.Get("x"); ok {
		t.Error("a rejected Seed installed a policy")
	}
}

// Readers never see a half-made change while writers publish.
func TestRegistryConcurrentMatch(t *testing.T) {
	ctx := t.Context()
	r := NewRegistry(RegistryConfig{})
	mustPut(t, r, tb("a", "", 1, 1))
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				got := r.Match(Query{Method: "GET", Route: "/x"})
				if len(got) != 1 || got[0].Limit.Rate != got[0].Limit.Burst {
					t.Errorf("Match saw %+v", got)
					return
				}
			}
		})
	}
	for i := 2; i < 200; i++ {
		if _, err := r.Put(ctx, "test", tb("a", "", float64(i), float64(i)), nil); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
}

func BenchmarkMatch(b *testing.B) {
	r := NewRegistry(RegistryConfig{})
	if err := r.Seed(b.Context(), "system", DefaultPolicies()); err != nil {
		b.Fatal(err)
	}
	if _, err := r.PutOverride(b.Context(), "b", Override{ID: "o", Subject: "key:abc", Policy: "pro-default", Burst: 400, ExpiresAt: time.Now().Add(time.Hour)}); err != nil {
		b.Fatal(err)
	}
	q := Query{Tier: "pro", Subject: "key:abc", Method: "POST", Route: "/v1/exports"}
	buf := make([]Applied, 0, MaxPoliciesPerRequest)
	b.ReportAllocs()
	for b.Loop() {
		buf = r.AppendMatch(buf[:0], q)
	}
}

func TestRegistrySyncKeys(t *testing.T) {
	ctx := t.Context()
	audit, _ := OpenAuditLog("", 20)
	r := NewRegistry(RegistryConfig{Audit: audit})
	for _, k := range []struct{ key, tier string }{{"sk_a", "pro"}, {"sk_b", "free"}, {"sk_c", "free"}} {
		if err := r.PutKey(ctx, "ops", k.key, k.tier); err != nil {
			t.Fatal(err)
		}
	}
	a, b, c, d := KeyID("sk_a"), KeyID("sk_b"), KeyID("sk_c"), KeyID("sk_d")
	// a unchanged, b re-tiered, c deleted, d added.
	want := []KeyEntry{{a, "pro"}, {b, "gold"}, {d, "free"}}
	if err := r.SyncKeys(ctx, "gossip:eu-1", want); err != nil {
		t.Fatal(err)
	}
	for id, tier := range map[string]string{a: "pro", b: "gold", d: "free"} {
		if got, ok := r.KeyTier(id); !ok || got != tier {
			t.Errorf("KeyTier(%s) = %q, %v; want %q", id, got, ok, tier)
		}
	}
	if _, ok := r.KeyTier(c); ok {
		t.Error("key c survived a sync without it")
	}
	var actions []string
	for _, e := range audit.Last(20) {
		if e.Who == "gossip:eu-1" {
			actions = append(actions, e.Action+" "+e.Target)
		}
	}
	slices.Sort(actions)
	wantActions := []string{"key.delete " + c, "key.put " + b, "key.put " + d}
	slices.Sort(wantActions)
	if !slices.Equal(actions, wantActions) {
		t.Errorf("audited %v, want %v", actions, wantActions)
	}
	// The same set again changes nothing and audits nothing.
	before := len(audit.Last(20))
	if err := r.SyncKeys(ctx, "gossip:eu-1", want); err != nil || len(audit.Last(20)) != before {
		t.Errorf("repeated sync: err %v, audit grew from %d to %d", err, before, len(audit.Last(20)))
	}

	for _, bad := range [][]KeyEntry{
		{{a, "pro"}, {"sk_live_raw_key", "pro"}}, // a raw key, not an id
		{{a, "pro"}, {b, "Gold"}},                // bad tier
		{{a, "pro"}, {a, "free"}},                // listed twice
		{{strings.ToUpper(a), "pro"}},            // ids are lower case
	} {
		err := r.SyncKeys(ctx, "gossip:eu-1", bad)
		var ve *ValidationError
		if !errors.As(err, &ve) {
			t.Errorf("SyncKeys(%v) = %v, want a *ValidationError", bad, err)
			continue
		}
		if strings.Contains(err.Error(), "sk_live_raw_key") {
			t.Errorf("error %q quotes the entry", err)
		}
		if got, _ := r.KeyTier(b); got != "gold" {
			t.Fatalf("a rejected sync changed key b to %q", got)
		}
	}
}

func TestKeyEntryValidate(t *testing.T) {
	id := KeyID("sk_a")
	tests := []struct {
		name  string
		in    KeyEntry
		field string // the field refused; "" for none
	}{
		{"valid", KeyEntry{id, "pro"}, ""},
		{"a raw key, not an id", KeyEntry{"sk_live_raw_key", "pro"}, "key_id"},
		{"upper-case hex", KeyEntry{strings.ToUpper(id), "pro"}, "key_id"},
		{"short id", KeyEntry{id[:31], "pro"}, "key_id"},
		{"not hex", KeyEntry{strings.Repeat("g", 32), "pro"}, "key_id"},
		{"empty tier", KeyEntry{id, ""}, "tier"},
		{"upper-case tier", KeyEntry{id, "Pro"}, "tier"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.in.Validate()
			if tt.field == "" {
				if err != nil {
					t.Errorf("Validate() = %v, want nil", err)
				}
				return
			}
			var ve *ValidationError
			if !errors.As(err, &ve) || len(ve.Problems) != 1 || ve.Problems[0].Field != tt.field {
				t.Fatalf("Validate() = %v, want one problem naming %s", err, tt.field)
			}
			if strings.Contains(err.Error(), tt.in.KeyID) {
				t.Errorf("Validate() = %q quotes the entry", err)
			}
		})
	}
}
