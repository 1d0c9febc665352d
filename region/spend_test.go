package region

import (
	"context"
	"testing"

	"github.com/sluice-rl/sluice/region/globalshare"
	"github.com/sluice-rl/sluice/share"
)

// halfShare is a ShareSource that enforces half of every global limit.
type halfShare struct{}

func (halfShare) Share(string, string) float64 { return 0.5 }

// TestSpendTokens: a token spend takes its units out of the very bucket
// the check path decides the subject with (the policy's state, its limit
// after an override in force, the share the region enforces), and takes
// nothing from a bucket that holds no more than it keeps, for a subject an
// override exempts, or for a policy that is unknown or not global.
func TestSpendTokens(t *testing.T) {
	h := poolingHarness(t)
	spend := func(policy, subject string, max float64) globalshare.Spend {
		return globalshare.Spend{Key: share.Key{Policy: policy, Subject: subject}, Max: max, Keep: 3, Part: 1, Limit: 20,
			Loan: share.Loan{Version: share.TokenVersion, Lender: "us", Borrower: "eu"}}
	}
	for _, tt := range []struct {
		name string
		sp   globalshare.Spend
		want int64
		// remaining is what the subject's next check of /t leaves, -1 to
		// skip the check.
		remaining int64
	}{
		// Half of a 20-unit bucket holds 10: 7 go, 3 stay, the check spends 1.
		{"full bucket", spend("g", "k", 10), 7, 2},
		{"a bucket at its keep", spend("g", "k", 10), 0, -1},
		// The override's 40-unit bucket at half holds 20: at most Max go.
		{"override's limit", spend("g", "o", 12), 12, 7},
		{"exempt subject", spend("g", "x", 10), 0, -1},
		{"unknown policy", spend("nope", "k", 10), 0, -1},
		{"policy not global", spend("local", "k", 10), 0, -1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := h.d.spendTokens(context.Background(), tt.sp)
			if err != nil || got != tt.want {
				t.Fatalf("spendTokens(%s, %s) = %d, %v, want %d, nil", tt.sp.Key.Policy, tt.sp.Key.Subject, got, err, tt.want)
			}
			if tt.remaining < 0 {
				return
			}
			r := h.do("POST", "/v1/check", `{"subject":"`+tt.sp.Key.Subject+`","route":"/t"}`)
			if m := r.json(t); m["allowed"] != true || m["remaining"] != float64(tt.remaining) {
				t.Errorf("check after the spend = %s, want allowed with %d remaining", r.body, tt.remaining)
			}
		})
	}
}

// TestDepositTokens: a token deposit puts its units into the bucket the
// check path decides the subject with, up to its capacity at the share the
// region enforces (the override's, if one is in force), and puts none for a
// subject an override exempts or a policy that is unknown or not global.
func TestDepositTokens(t *testing.T) {
	h := poolingHarness(t)
	ctx := context.Background()
	drain := func(subject string, n int) {
		t.Helper()
		for range n {
			h.do("POST", "/v1/check", `{"subject":"`+subject+`","route":"/t"}`)
		}
	}
	for _, tt := range []struct {
		name    string
		policy  string
		subject string
		drained int   // checks of /t before the deposit
		units   int64 // deposited
		// remaining is what the next check of /t leaves.
		remaining int64
	}{
		// A half share of 20 holds 10: 8 spent, 5 back, the check spends 1.
		{"into a drained bucket", "g", "k", 8, 5, 6},
		// Up to the capacity: 2 left, 30 back fill it to 10.
		{"up to the capacity", "g", "m", 8, 30, 9},
		// The override's 40 at half holds 20.
		{"override's capacity", "g", "o", 18, 30, 19},
	} {
		t.Run(tt.name, func(t *testing.T) {
			drain(tt.subject, tt.drained)
			dp := globalshare.Deposit{Key: share.Key{Policy: tt.policy, Subject: tt.subject}, Units: tt.units}
			if err := h.d.depositTokens(ctx, dp); err != nil {
				t.Fatalf("depositTokens = %v", err)
			}
			r := h.do("POST", "/v1/check", `{"subject":"`+tt.subject+`","route":"/t"}`)
			if m := r.json(t); m["allowed"] != true || m["remaining"] != float64(tt.remaining) {
				t.Errorf("check after the deposit = %s, want allowed with %d remaining", r.body, tt.remaining)
			}
		})
	}
	// An exempt subject's bucket is not touched: the check of /t exempts it.
	if err := h.d.depositTokens(ctx, globalshare.Deposit{Key: share.Key{Policy: "g", Subject: "x"}, Units: 3}); err != nil {
		t.Errorf("depositTokens for an exempt subject = %v, want nil", err)
	}
	for _, p := range []string{"nope", "local"} {
		if err := h.d.depositTokens(ctx, globalshare.Deposit{Key: share.Key{Policy: p, Subject: "k"}, Units: 3}); err != nil {
			t.Errorf("depositTokens for policy %s = %v, want nil", p, err)
		}
	}
	if r := h.do("POST", "/v1/check", `{"subject":"k","route":"/l"}`); r.json(t)["remaining"] != float64(19) {
		t.Errorf("a local policy's bucket after a deposit named it: %s, want 19 remaining (untouched)", r.body)
	}
}

// poolingHarness is a daemon enforcing half of every global share, with a
// global token bucket "g" of 20/s, a local one "local", an override "big"
// (40/s) for subject o and an exemption for subject x.
func poolingHarness(t *testing.T) *harness {
	t.Helper()
	h := newHarness(t, func(c *Config) { c.Shares = halfShare{} })
	h.putPolicy("g", `{"algorithm":"token_bucket","rate_per_sec":20,"burst":20,"scope":"global","mode":"enforce","match":{"routes":["/t"]}}`)
	h.putPolicy("local", `{"algorithm":"token_bucket","rate_per_sec":20,"burst":20,"mode":"enforce","match":{"routes":["/l"]}}`)
	for _, o := range []string{
		`{"id":"big","subject":"o","policy":"g","rate_per_sec":40,"burst":40,"expires_at":"2999-01-01T00:00:00Z"}`,
		`{"id":"free","subject":"x","policy":"g","unlimited":true,"expires_at":"2999-01-01T00:00:00Z"}`,
	} {
		if r := h.admin("POST", "/v1/overrides", o); r.status != 201 {
			t.Fatalf("override = %d %s", r.status, r.body)
		}
	}
	return h
}
