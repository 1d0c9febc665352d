package decide_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/decide"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/engine/limiter"
	"github.com/sluice-rl/sluice/internal/manualclock"
	"github.com/sluice-rl/sluice/quota"
)

func (r *recorder) Charge(ctx context.Context, req engine.ChargeRequest) (engine.Outcome, error) {
	return r.lim.Charge(ctx, req)
}

func (r *recorder) Reserve(ctx context.Context, subject, id string, checks []engine.Check, ttl time.Duration) error {
	return r.lim.Reserve(ctx, subject, id, checks, ttl)
}

// The check before and the charge after, as a rate limit service would
// make them for Envoy's apply_on_stream_done: the charge's hits count
// even over the limit, and the next check is refused.
func TestChargeStatesCountsHitsOverTheLimit(t *testing.T) {
	reg := newRegistry(t, quota.Policy{ID: "tokens", Algorithm: "token_bucket", RatePerSec: 1, Burst: 100, Mode: quota.ModeEnforce})
	clock := manualclock.New()
	dc := decide.New(decide.Config{Limiter: &recorder{lim: limiter.New(limiter.Config{Clock: clock})}, Registry: reg, Clock: clock})
	p, _ := reg.Get("tokens")
	applied := func(cost int64) []quota.Applied {
		return []quota.Applied{{Policy: &p, Cost: cost, Limit: engine.Limit{Algorithm: engine.TokenBucket, Rate: 1, Burst: 100}}}
	}
	ctx := context.Background()
	if v, err := dc.DecideStates(ctx, "s", applied(0)); err != nil || !v.Allowed {
		t.Fatalf("check before = %+v, %v; want allowed", v, err)
	}
	ans, err := dc.ChargeStates(ctx, "s", applied(160))
	if err != nil || !ans.OverLimit || ans.RetryAfterMS != 60000 {
		t.Fatalf("charge of 160 into a bucket of 100 = %+v, %v; want over the limit for 60 s", ans, err)
	}
	if v, err := dc.DecideStates(ctx, "s", applied(1)); err != nil || v.Allowed || v.RetryAfter != 61*time.Second {
		t.Fatalf("check after = %+v, %v; want refused for 61 s", v, err)
	}
}

// A charge without a cost, or to a sliding window log, is a problem
// naming the field, and charges nothing.
func TestChargeProblems(t *testing.T) {
	reg := newRegistry(t,
		quota.Policy{ID: "tokens", Algorithm: "token_bucket", RatePerSec: 1, Burst: 100, Mode: quota.ModeEnforce},
		quota.Policy{ID: "log", Algorithm: "sliding_window_log", Count: 10, Window: 60, Mode: quota.ModeEnforce, Match: quota.Match{Routes: []string{"/logged"}}})
	dc := decide.New(decide.Config{Limiter: newRecorder(), Registry: reg})
	ctx := context.Background()
	five := int64(5)
	for _, tc := range []struct {
		in    decide.ChargeRequest
		field string
	}{
		{decide.ChargeRequest{SubjectFields: quota.SubjectFields{User: "u"}, Route: "/v1/orders"}, "cost"},
		{decide.ChargeRequest{SubjectFields: quota.SubjectFields{User: "u"}, Route: "/logged", Cost: &five}, "route"},
		{decide.ChargeRequest{SubjectFields: quota.SubjectFields{User: "u"}, Route: "/v1/orders", Cost: &five, Reservation: "none"}, "reservation"},
	} {
		if _, p := dc.Charge(ctx, tc.in); p == nil || p.Status != http.StatusBadRequest || len(p.Errors) != 1 || p.Errors[0].Field != tc.field {
			t.Errorf("Charge(%+v) problem %+v, want 400 on %s", tc.in, p, tc.field)
		}
	}
	a, p := dc.Check(ctx, user("u"))
	if p != nil || a.Decision.Policies[0].Remaining != 99 {
		t.Errorf("after refused charges a check of 1 leaves %+v, want 99 (nothing charged)", a.Decision)
	}
}

// A global token rate divided by shares counts tokens in the usage the
// share coordinator drains and reports, not requests: a check of an
// estimate counts the estimate (as demand even when refused, so that a
// starved region still shows its demand), its settlement what it charged
// beyond the estimate, a charge without a reservation its whole cost, past
// the region's share of the burst; and each is scaled by the share.
func TestTokenRateSharesTrackTokens(t *testing.T) {
	pol := quota.Policy{ID: "tokens-minute", Algorithm: "token_bucket", RatePerSec: 100, Burst: 100, Mode: quota.ModeEnforce,
		Scope: quota.ScopeGlobal, Match: quota.Match{Routes: []string{"/v1/complete"}}}
	reg := newRegistry(t, pol)
	clock := manualclock.New()
	ks := &keyedShare{shares: map[[2]string]float64{{"tokens-minute", "user:u"}: 0.5}}
	r := &recorder{lim: limiter.New(limiter.Config{Clock: clock})}
	dc := decide.New(decide.Config{Limiter: r, Registry: reg, Shares: ks, Track: true, Clock: clock})
	ctx := context.Background()
	n := func(v int64) *int64 { return &v }
	req := quota.SubjectFields{User: "u"}
	check := func(cost int64, resv string) int {
		t.Helper()
		a, p := dc.Check(ctx, decide.CheckRequest{SubjectFields: req, Route: "/v1/complete", Cost: n(cost), Reservation: resv})
		if p != nil {
			t.Fatalf("check of %d: %+v", cost, p)
		}
		return a.Status
	}
	charge := func(cost int64, resv string) decide.ChargeAnswer {
		t.Helper()
		ans, p := dc.Charge(ctx, decide.ChargeRequest{SubjectFields: req, Route: "/v1/complete", Cost: n(cost), Reservation: resv})
		if p != nil {
			t.Fatalf("charge of %d: %+v", cost, p)
		}
		if sc := ans.Policies[0].Scale; sc != 0.5 {
			t.Errorf("charge of %d scaled by %v, want the share 0.5", cost, sc)
		}
		return ans
	}
	if s := check(10, "a"); s != http.StatusOK {
		t.Fatalf("check of the estimate 10 = %d, want 200", s)
	}
	charge(17, "a") // 7 beyond the estimate
	if s := check(10, "b"); s != http.StatusOK {
		t.Fatalf("check of the estimate 10 = %d, want 200", s)
	}
	charge(4, "b")                             // a refund of 6, not taken back from the usage
	if ans := charge(60, ""); !ans.OverLimit { // 50 of burst at a share of 0.5, 21 spent before
		t.Errorf("charge of 60 into the share's burst of 50 = %+v, want over the limit", ans)
	}
	if s := check(10, "c"); s != http.StatusTooManyRequests {
		t.Errorf("check of 10 in debt = %d, want 429", s)
	}
	u := r.lim.DrainUsage()[engine.UsageKey{Subject: "user:u", Policy: "tokens-minute"}]
	if want := (engine.Usage{Demand: 10 + 7 + 10 + 60 + 10, Admitted: 10 + 7 + 10 + 60}); u.Demand != want.Demand || u.Admitted != want.Admitted {
		t.Errorf("tracked usage %+v, want demand %d and admitted %d tokens", u, want.Demand, want.Admitted)
	}
	for i, c := range r.reqs {
		if c.Checks[0].Scale != 0.5 || !c.Checks[0].Track {
			t.Errorf("check %d: %+v, want scaled by the share 0.5 and tracked", i, c.Checks[0])
		}
	}
}
