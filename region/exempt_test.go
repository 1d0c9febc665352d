package region

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testwait"
	"github.com/sluice-rl/sluice/quota"
)

// TestExemption: a subject exempt from policy a passes more than a's limit,
// still limited by policy b; a is in no header and the verdict lists it as
// exempt; another subject is still limited by a; deleting the override
// restores a.
func TestExemption(t *testing.T) {
	h := newHarness(t, nil)
	// Token buckets that refill one unit in 1000 s: no window boundary can
	// fall inside the test.
	h.putPolicy("a", `{"algorithm":"token_bucket","rate_per_sec":0.001,"burst":3,"mode":"enforce"}`)
	h.putPolicy("b", `{"algorithm":"token_bucket","rate_per_sec":0.001,"burst":10,"mode":"enforce"}`)
	exp := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	r := h.admin("POST", "/v1/overrides", fmt.Sprintf(`{"id":"svc","subject":"user:svc","policy":"a","unlimited":true,"expires_at":%q}`, exp.Format(time.RFC3339)))
	if r.status != 201 {
		t.Fatalf("POST exemption = %d %s", r.status, r.body)
	}
	if m := r.json(t); m["unlimited"] != true {
		t.Errorf("created override = %s, want unlimited", r.body)
	}

	check := func(user string) (resp, Decision) {
		t.Helper()
		r := h.do("POST", "/v1/check", fmt.Sprintf(`{"user":%q,"route":"/x"}`, user))
		var d Decision
		if err := json.Unmarshal(r.body, &d); err != nil {
			t.Fatalf("check body %s: %v", r.body, err)
		}
		return r, d
	}

	// Past a's limit of 3, up to b's of 10.
	for i := 1; i <= 10; i++ {
		r, d := check("svc")
		if r.status != 200 {
			t.Fatalf("exempt check %d = %d %s, want 200", i, r.status, r.body)
		}
		if len(d.Policies) != 1 || d.Policies[0].ID != "b" || d.Policy != "b" {
			t.Fatalf("exempt check %d policies = %+v, want only b", i, d.Policies)
		}
		if len(d.Exempt) != 1 || d.Exempt[0].ID != "a" || d.Exempt[0].Override != "svc" || !d.Exempt[0].ExpiresAt.Equal(exp) {
			t.Fatalf("exempt check %d exempt = %+v, want a by svc until %s", i, d.Exempt, exp)
		}
		for _, name := range []string{"RateLimit-Policy", "RateLimit"} {
			v := r.header.Get(name)
			if !strings.Contains(v, `"b"`) || strings.Contains(v, `"a"`) {
				t.Fatalf("exempt check %d %s = %q, want b and not a", i, name, v)
			}
		}
	}
	r, d := check("svc")
	if r.status != 429 || len(d.Exempt) != 1 || !strings.Contains(string(r.body), `"violated-policies":["b"]`) {
		t.Fatalf("exempt check 11 = %d %s, want 429 by b with a exempt", r.status, r.body)
	}

	// Another subject is limited by a.
	for i := 1; i <= 3; i++ {
		if r, d := check("other"); r.status != 200 || len(d.Exempt) != 0 || len(d.Policies) != 2 {
			t.Fatalf("other check %d = %d %s, want 200 under a and b", i, r.status, r.body)
		}
	}
	if r, _ := check("other"); r.status != 429 || !strings.Contains(string(r.body), `"violated-policies":["a"]`) {
		t.Fatalf("other check 4 = %d %s, want 429 by a", r.status, r.body)
	}

	// The exempt subject's usage on the route lists a as exempt.
	r = h.admin("GET", "/v1/keys/user:svc/usage?route=/x", "")
	var u Usage
	if err := json.Unmarshal(r.body, &u); err != nil || r.status != 200 || len(u.Policies) != 1 || len(u.Exempt) != 1 || u.Exempt[0].ID != "a" {
		t.Fatalf("usage = %d %s, want b with a exempt", r.status, r.body)
	}

	// Deleting the override restores a, and no state was kept for a
	// while exempt: a zero-cost check shows a's whole burst of 3 left.
	if r := h.admin("DELETE", "/v1/overrides/svc", ""); r.status != 204 {
		t.Fatalf("DELETE override = %d %s", r.status, r.body)
	}
	r = h.do("POST", "/v1/check", `{"user":"svc","route":"/x","cost":0}`)
	d = Decision{}
	if err := json.Unmarshal(r.body, &d); err != nil || len(d.Exempt) != 0 || len(d.Policies) != 2 || d.Policies[0].ID != "a" || d.Policies[0].Remaining != 3 {
		t.Fatalf("zero-cost check after delete = %d %s, want a with 3 remaining", r.status, r.body)
	}
	if !strings.Contains(r.header.Get("RateLimit-Policy"), `"a"`) {
		t.Fatalf("RateLimit-Policy after delete = %q, want a", r.header.Get("RateLimit-Policy"))
	}
	// With b's state forgotten, a alone limits the subject again.
	if r := h.admin("DELETE", "/v1/keys/user:svc/state?policy=b", ""); r.status != 200 {
		t.Fatalf("reset b = %d %s", r.status, r.body)
	}
	for i := 1; i <= 3; i++ {
		if r, _ := check("svc"); r.status != 200 {
			t.Fatalf("check %d after delete = %d %s, want 200", i, r.status, r.body)
		}
	}
	if r, _ := check("svc"); r.status != 429 || !strings.Contains(string(r.body), `"violated-policies":["a"]`) {
		t.Fatalf("check 4 after delete = %d %s, want 429 by a", r.status, r.body)
	}
}

// TestExemptionProblems: refused exemptions are problem+json naming the
// field.
func TestExemptionProblems(t *testing.T) {
	h := newHarness(t, nil)
	h.putPolicy("a", `{"algorithm":"token_bucket","rate_per_sec":1,"burst":3,"mode":"enforce"}`)
	h.putPolicy("login", `{"match":{"routes":["/login"]},"algorithm":"sliding_window_counter","limit":5,"window":900,"class":"security","mode":"enforce"}`)
	const exp = `"expires_at":"2999-01-01T00:00:00Z"`
	tests := []struct {
		name, body string
		fields     []string
	}{
		{"limit with unlimited", `{"id":"o","subject":"u","policy":"a","unlimited":true,"limit":5,` + exp + `}`, []string{"limit"}},
		{"rate and burst with unlimited", `{"id":"o","subject":"u","policy":"a","unlimited":true,"rate_per_sec":1,"burst":5,` + exp + `}`, []string{"rate_per_sec", "burst"}},
		{"no expiry", `{"id":"o","subject":"u","policy":"a","unlimited":true}`, []string{"expires_at"}},
		{"expired", `{"id":"o","subject":"u","policy":"a","unlimited":true,"expires_at":"2000-01-01T00:00:00Z"}`, []string{"expires_at"}},
		{"security policy", `{"id":"o","subject":"u","policy":"login","unlimited":true,` + exp + `}`, []string{"unlimited"}},
		{"not a boolean", `{"id":"o","subject":"u","policy":"a","unlimited":"yes",` + exp + `}`, []string{"unlimited"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := h.admin("POST", "/v1/overrides", tt.body)
			if r.status != 400 || r.header.Get("Content-Type") != "application/problem+json" {
				t.Fatalf("POST %s = %d %s, want a 400 problem", tt.body, r.status, r.body)
			}
			var p Problem
			if err := json.Unmarshal(r.body, &p); err != nil {
				t.Fatal(err)
			}
			for _, f := range tt.fields {
				found := false
				for _, e := range p.Errors {
					found = found || e.Field == f
				}
				if !found {
					t.Errorf("errors %+v do not name %q", p.Errors, f)
				}
			}
		})
	}
}

// TestExemptionReplicates: an unlimited override survives the policy
// set's JSON and the receiver's validation; an exemption of a security
// policy refuses the set.
func TestExemptionReplicates(t *testing.T) {
	now := time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)
	ps := []quota.Policy{
		{ID: "tb", Algorithm: "token_bucket", RatePerSec: 10, Burst: 10, Mode: quota.ModeEnforce},
		{ID: "login", Algorithm: "sliding_window_counter", Count: 5, Window: 900, Class: quota.ClassSecurity, Mode: quota.ModeEnforce},
	}
	ex := quota.Override{ID: "svc", Subject: "user:svc", Policy: "tb", Unlimited: true, ExpiresAt: now.Add(time.Hour)}
	ovs := []quota.Override{ex}
	data, err := json.Marshal(policySet{Origin: "a1", Policies: ps, Overrides: &ovs})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"unlimited":true`) {
		t.Fatalf("set %s does not carry unlimited", data)
	}
	var set policySet
	if err := json.Unmarshal(data, &set); err != nil || set.Overrides == nil || len(*set.Overrides) != 1 {
		t.Fatalf("decoded set = %+v, %v", set, err)
	}
	if got := (*set.Overrides)[0]; !sameOverride(got, ex) {
		t.Fatalf("received %+v, want %+v", got, ex)
	}
	live, bad, err := validOverrides(context.Background(), set.Policies, *set.Overrides, now)
	if err != nil || len(live) != 1 || !live[0].Unlimited {
		t.Fatalf("validOverrides = %+v, %q, %v; want the exemption kept", live, bad, err)
	}

	// The hash tells an exemption from an ordinary override.
	plain := ex
	plain.Unlimited, plain.Burst = false, 50
	if policyHash(ps, []quota.Override{ex}, nil) == policyHash(ps, []quota.Override{plain}, nil) {
		t.Error("policyHash does not see unlimited")
	}

	sec := quota.Override{ID: "pw", Subject: "user:svc", Policy: "login", Unlimited: true, ExpiresAt: now.Add(time.Hour)}
	if _, bad, err := validOverrides(context.Background(), ps, []quota.Override{ex, sec}, now); err == nil || bad != "pw" {
		t.Errorf("validOverrides with a security exemption = %q, %v; want pw refused", bad, err)
	}
	withLimit := ex
	withLimit.Count = 5
	if _, bad, err := validOverrides(context.Background(), ps, []quota.Override{withLimit}, now); err == nil || bad != "svc" || !strings.Contains(err.Error(), "limit") {
		t.Errorf("validOverrides with a limit beside unlimited = %q, %v; want svc refused naming limit", bad, err)
	}
}

// TestExemptionSync: an exemption made in one region exempts the subject
// in the other; deleting it there restores the policy.
func TestExemptionSync(t *testing.T) {
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
	exempt := func(l *liveDaemon) bool {
		code, body := l.admin(t, "POST", "/v1/check", `{"subject":"tenant-7","route":"/x","cost":0}`)
		var d Decision
		if code != 200 || json.Unmarshal([]byte(body), &d) != nil {
			t.Fatalf("POST /v1/check = %d %s", code, body)
		}
		return len(d.Policies) == 0 && len(d.Exempt) == 1 && d.Exempt[0].ID == "q"
	}
	expires := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	doc := fmt.Sprintf(`{"id":"svc","subject":"tenant-7","policy":"q","unlimited":true,"expires_at":%q}`, expires)
	if code, body := a.admin(t, "POST", "/v1/overrides", doc); code != 201 {
		t.Fatalf("POST /v1/overrides = %d %s", code, body)
	}
	testwait.For(t, 10*time.Second, "b to exempt tenant-7", func() bool { return exempt(b) })
	if code, body := a.admin(t, "DELETE", "/v1/overrides/svc", ""); code != 204 {
		t.Fatalf("DELETE /v1/overrides/svc = %d %s", code, body)
	}
	testwait.For(t, 10*time.Second, "b to limit tenant-7 again", func() bool { return !exempt(b) })
}

// TestUsageAppliesOverrides: the usage report of a subject, with or
// without ?route=, shows the limit an override gives it and lists the
// policies it is exempt from, as its checks apply them.
func TestUsageAppliesOverrides(t *testing.T) {
	h := newHarness(t, nil)
	h.putPolicy("a", `{"algorithm":"token_bucket","rate_per_sec":0.001,"burst":3,"mode":"enforce"}`)
	h.putPolicy("b", `{"algorithm":"token_bucket","rate_per_sec":0.001,"burst":10,"mode":"enforce"}`)
	exp := time.Now().Add(time.Hour).UTC().Truncate(time.Second).Format(time.RFC3339)
	for _, body := range []string{
		fmt.Sprintf(`{"id":"more","subject":"user:7","policy":"a","burst":50,"rate_per_sec":0.001,"expires_at":%q}`, exp),
		fmt.Sprintf(`{"id":"free","subject":"user:7","policy":"b","unlimited":true,"expires_at":%q}`, exp),
	} {
		if r := h.admin("POST", "/v1/overrides", body); r.status != 201 {
			t.Fatalf("POST override = %d %s", r.status, r.body)
		}
	}
	for _, path := range []string{"/v1/keys/user:7/usage", "/v1/keys/user:7/usage?route=/x"} {
		r := h.admin("GET", path, "")
		var u Usage
		if err := json.Unmarshal(r.body, &u); err != nil || r.status != 200 {
			t.Fatalf("GET %s = %d %s", path, r.status, r.body)
		}
		if len(u.Policies) != 1 || u.Policies[0].ID != "a" || u.Policies[0].Limit != 50 || u.Policies[0].Override != "more" {
			t.Errorf("GET %s policies = %+v, want a at the override's 50 by more", path, u.Policies)
		}
		if len(u.Exempt) != 1 || u.Exempt[0].ID != "b" || u.Exempt[0].Override != "free" {
			t.Errorf("GET %s exempt = %+v, want b by free", path, u.Exempt)
		}
	}
}
