package decide_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/decide"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/engine/limiter"
	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/share"
)

// recorder is a Limiter that records each request and hands it to an
// in-process memory limiter, and an Observer that records each decision.
type recorder struct {
	lim *limiter.Limiter
	err error // when set, every Check fails with it

	mu       sync.Mutex
	reqs     []engine.Request
	decided  []decide.Verdict
	shadowed []string // the shadow source of each decision
	took     int
}

func newRecorder() *recorder { return &recorder{lim: limiter.New(limiter.Config{})} }

func (r *recorder) Check(ctx context.Context, req engine.Request) (limiter.Outcome, error) {
	r.mu.Lock()
	r.reqs = append(r.reqs, engine.Request{Subject: req.Subject, Checks: slices.Clone(req.Checks)})
	r.mu.Unlock()
	if r.err != nil {
		return limiter.Outcome{Decision: engine.Decision{Decider: -1}}, r.err
	}
	return r.lim.Check(ctx, req)
}

func (r *recorder) Decided(v decide.Verdict, method, route, shadowSource string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.decided = append(r.decided, v)
	r.shadowed = append(r.shadowed, shadowSource)
}

func (r *recorder) Took(time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.took++
}

// halfShare enforces half of every global limit.
type halfShare struct{}

func (halfShare) Share(string, string) float64 { return 0.5 }

// othersSpent says the other regions spent n of every global quota.
type othersSpent uint64

func (n othersSpent) QuotaOthers(string, string, int64) uint64 { return uint64(n) }

// fixedClock is a Clock that stands still.
type fixedClock time.Time

func (c fixedClock) Now() time.Time { return time.Time(c) }

func newRegistry(t *testing.T, ps ...quota.Policy) *quota.Registry {
	t.Helper()
	reg := quota.NewRegistry(quota.RegistryConfig{})
	if err := reg.Seed(context.Background(), "test", ps); err != nil {
		t.Fatal(err)
	}
	return reg
}

func user(u string) decide.CheckRequest {
	return decide.CheckRequest{SubjectFields: quota.SubjectFields{User: u}, Route: "/v1/orders"}
}

// An enforced rejection leaves the shadow policies undecided: one limiter
// call, the shadow result not evaluated, and the observer told so.
func TestShadowNotDecidedAfterRejection(t *testing.T) {
	reg := newRegistry(t,
		quota.Policy{ID: "burst", Algorithm: "token_bucket", RatePerSec: 0.01, Burst: 1, Mode: quota.ModeEnforce},
		quota.Policy{ID: "preview", Algorithm: "token_bucket", RatePerSec: 0.01, Burst: 1, Mode: quota.ModeShadow})
	r := newRecorder()
	dc := decide.New(decide.Config{Limiter: r, Registry: reg, Observer: r})
	ctx := context.Background()
	first, p := dc.Check(ctx, user("1"))
	if p != nil || first.Status != http.StatusOK || len(r.reqs) != 2 {
		t.Fatalf("first Check = %+v, %v after %d limiter calls, want 200 after 2", first, p, len(r.reqs))
	}
	second, p := dc.Check(ctx, user("1"))
	if p != nil || second.Status != http.StatusTooManyRequests || len(r.reqs) != 3 {
		t.Fatalf("second Check = %+v, %v after %d limiter calls, want 429 after 3", second, p, len(r.reqs))
	}
	for _, pr := range second.Decision.Policies {
		if pr.ID == "preview" && pr.Evaluated {
			t.Errorf("shadow policy after a rejection = %+v, want not evaluated", pr)
		}
	}
	if len(r.decided) != 2 || r.took != 2 || r.shadowed[1] != "none" || !slices.Equal(r.decided[1].Violated, []string{"burst"}) {
		t.Errorf("observed %d decisions, %d timings, shadow sources %v, want 2, 2 and none last, burst violated", len(r.decided), r.took, r.shadowed)
	}
	if second.Problem == nil || second.Problem.Type != decide.ProblemQuotaExceeded || second.Header.Get("Retry-After") != "100" {
		t.Errorf("second Check problem %+v, Retry-After %q, want quota-exceeded and 100", second.Problem, second.Header.Get("Retry-After"))
	}
}

// The scale stage divides a global policy by the region's share and a
// global quota by the other regions' counts, and marks both for tracking.
func TestScaleGlobalPolicies(t *testing.T) {
	reg := newRegistry(t,
		quota.Policy{ID: "shared", Algorithm: "token_bucket", RatePerSec: 1, Burst: 10, Mode: quota.ModeEnforce, Scope: quota.ScopeGlobal},
		quota.Policy{ID: "daily", Algorithm: "fixed_window", Count: 100, Window: 86400, Mode: quota.ModeEnforce, Scope: quota.ScopeGlobal},
		quota.Policy{ID: "local", Algorithm: "token_bucket", RatePerSec: 1, Burst: 10, Mode: quota.ModeEnforce})
	r := newRecorder()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	dc := decide.New(decide.Config{Limiter: r, Registry: reg, Shares: halfShare{}, Quotas: othersSpent(40), Track: true, Clock: fixedClock(now)})
	ans, p := dc.Check(context.Background(), user("1"))
	if p != nil || ans.Status != http.StatusOK {
		t.Fatalf("Check = %+v, %v, want 200", ans, p)
	}
	want := map[string]struct {
		scale float64
		track bool
	}{"shared": {0.5, true}, "daily": {share.QuotaScale(100, 40), true}, "local": {1, false}}
	if len(r.reqs) != 1 || len(r.reqs[0].Checks) != 3 {
		t.Fatalf("limiter requests %+v, want one of 3 checks", r.reqs)
	}
	for _, c := range r.reqs[0].Checks {
		w := want[c.Policy]
		if c.Scale != w.scale || c.Track != w.track {
			t.Errorf("check %s: scale %v, track %v, want %v, %v", c.Policy, c.Scale, c.Track, w.scale, w.track)
		}
	}
}

// A cost no policy can admit, a limiter that refuses and a cancelled
// context are problems, not verdicts, and nothing is observed.
func TestDecideProblems(t *testing.T) {
	reg := newRegistry(t, quota.Policy{ID: "burst", Algorithm: "token_bucket", RatePerSec: 1, Burst: 5, Mode: quota.ModeEnforce})
	big := int64(6)
	in := user("1")
	in.Cost = &big
	r := newRecorder()
	dc := decide.New(decide.Config{Limiter: r, Registry: reg, Observer: r})
	if _, p := dc.Check(context.Background(), in); p == nil || p.Status != http.StatusBadRequest || len(p.Errors) != 1 || p.Errors[0].Field != "cost" {
		t.Errorf("Check(cost 6 over burst 5) problem %+v, want 400 on cost", p)
	}
	r.err = errors.New("refused")
	if _, p := dc.Check(context.Background(), user("1")); p == nil || p.Status != http.StatusBadRequest {
		t.Errorf("Check with a refusing limiter: problem %+v, want 400", p)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, p := dc.Check(ctx, user("1")); p == nil || p.Status != http.StatusServiceUnavailable || p.Type != decide.ProblemUnavailable {
		t.Errorf("Check(cancelled) problem %+v, want 503 %s", p, decide.ProblemUnavailable)
	}
	if len(r.decided) != 0 {
		t.Errorf("observed %d decisions, want none", len(r.decided))
	}
}

// DecideStates refuses more policies than one decision takes.
func TestDecideStatesBounds(t *testing.T) {
	dc := decide.New(decide.Config{Limiter: newRecorder(), Registry: newRegistry(t)})
	if _, err := dc.DecideStates(context.Background(), "s", make([]quota.Applied, quota.MaxPoliciesPerRequest+1)); err == nil {
		t.Error("DecideStates of too many policies succeeded")
	}
}

// keyedShare gives each (state, subject) its own share and records what
// it was asked; 1 for any other.
type keyedShare struct {
	mu     sync.Mutex
	shares map[[2]string]float64
	asked  [][2]string
}

func (k *keyedShare) Share(policy, subject string) float64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	key := [2]string{policy, subject}
	k.asked = append(k.asked, key)
	if s, ok := k.shares[key]; ok {
		return s
	}
	return 1
}

// DecideStates scales a global descriptor policy by the share of each
// descriptor's state, not of the policy: one share per descriptor value,
// looked up under the same (state, subject) as the limiter tracks its
// usage, which is what the share coordinator drains and reports.
func TestDecideStatesScalesEachDescriptorState(t *testing.T) {
	pol := quota.Policy{ID: "per-ip", Algorithm: "token_bucket", RatePerSec: 10, Burst: 10, Mode: quota.ModeEnforce,
		Scope: quota.ScopeGlobal, Match: quota.Match{Domain: "d", Descriptors: []quota.DescriptorEntry{{Key: "ip"}}}}
	reg := newRegistry(t, pol)
	p, ok := reg.Get("per-ip")
	if !ok {
		t.Fatal("policy not seeded")
	}
	a := quota.Applied{Policy: &p, Limit: p.Limit(), Cost: 1, State: "per-ip\x1fip\x1e192.0.2.7"}
	b := quota.Applied{Policy: &p, Limit: p.Limit(), Cost: 1, State: "per-ip\x1fip\x1e192.0.2.8"}
	ks := &keyedShare{shares: map[[2]string]float64{{a.State, "rls:d"}: 0.2}}
	r := newRecorder()
	dc := decide.New(decide.Config{Limiter: r, Registry: reg, Shares: ks, Track: true})
	v, err := dc.DecideStates(context.Background(), "rls:d", []quota.Applied{a, b})
	if err != nil || !v.Allowed {
		t.Fatalf("DecideStates = %+v, %v, want allowed", v, err)
	}
	if want := [][2]string{{a.State, "rls:d"}, {b.State, "rls:d"}}; !slices.Equal(ks.asked, want) {
		t.Errorf("shares asked for %q, want %q", ks.asked, want)
	}
	if got := r.reqs[0].Checks; got[0].Scale != 0.2 || got[1].Scale != 1 || !got[0].Track || !got[1].Track {
		t.Errorf("checks %+v, want scales 0.2 and 1, both tracked", got)
	}
	if v.Results[0].Scale != 0.2 || v.Results[0].Limit != 2 {
		t.Errorf("first result %+v, want scale 0.2 and a limit of 2 (10 × 0.2)", v.Results[0])
	}
	usage := r.lim.DrainUsage()
	for _, st := range []string{a.State, b.State} {
		u, ok := usage[engine.UsageKey{Subject: "rls:d", Policy: st}]
		if !ok || u.Demand != 1 || u.Admitted != 1 {
			t.Errorf("usage of %q = %+v (tracked %v), want 1 demanded and admitted", st, u, ok)
		}
		if quota.PolicyOfState(st) != "per-ip" {
			t.Errorf("PolicyOfState(%q) = %q, want per-ip", st, quota.PolicyOfState(st))
		}
	}
}
