package region

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/manualclock"
	"github.com/sluice-rl/sluice/internal/redistest"
)

// TestChargeGoesIntoDebt charges a request's cost after the fact past the
// policy's limit: the answer says the subject is over it and for how
// long, and the next check is refused.
func TestChargeGoesIntoDebt(t *testing.T) {
	h := newHarness(t, nil)
	h.putPolicy("tokens", `{"algorithm":"token_bucket","rate_per_sec":10,"burst":100,"mode":"enforce","match":{"routes":["/v1/complete"]}}`)
	r := h.do("POST", "/v1/charge", `{"api_key":"k1","route":"/v1/complete","method":"POST","cost":150}`)
	if r.status != 200 {
		t.Fatalf("charge = %d %s", r.status, r.body)
	}
	m := r.json(t)
	if m["over_limit"] != true || m["retry_after_ms"] != float64(5000) {
		t.Fatalf("charge of 150 into a bucket of 100 at 10/s = %s, want over_limit, retry_after_ms 5000", r.body)
	}
	if c := h.do("POST", "/v1/check", `{"api_key":"k1","route":"/v1/complete","method":"POST"}`); c.status != 429 {
		t.Fatalf("check after the debt = %d %s, want 429", c.status, c.body)
	}
}

// TestChargeSettlesReservation checks with an estimate held as a
// reservation and settles it with the real cost: the difference comes
// back, and the reservation settles once.
func TestChargeSettlesReservation(t *testing.T) {
	h := newHarness(t, nil)
	h.putPolicy("tokens", `{"algorithm":"fixed_window","limit":1000,"window":3600,"mode":"enforce"}`)
	if r := h.do("POST", "/v1/check", `{"user":"u","route":"/x","cost":300,"reservation":"req-1","reservation_ttl_ms":60000}`); r.status != 200 {
		t.Fatalf("check of the estimate = %d %s", r.status, r.body)
	}
	settle := `{"user":"u","route":"/x","cost":120,"reservation":"req-1"}`
	r := h.do("POST", "/v1/charge", settle)
	if r.status != 200 {
		t.Fatalf("settle = %d %s", r.status, r.body)
	}
	pols, _ := r.json(t)["policies"].([]any)
	if len(pols) != 1 || pols[0].(map[string]any)["remaining"] != float64(880) {
		t.Fatalf("settled 300 estimated at 120: %s, want remaining 880", r.body)
	}
	r = h.do("POST", "/v1/charge", settle)
	if r.status != 400 || !strings.Contains(string(r.body), `"field":"reservation"`) {
		t.Fatalf("second settle = %d %s, want 400 naming reservation", r.status, r.body)
	}
}

// TestChargeBadInputChargesNothing: every bad charge is a 400 problem
// naming its field, and the state is as it was.
func TestChargeBadInputChargesNothing(t *testing.T) {
	h := newHarness(t, nil)
	h.putPolicy("tokens", `{"algorithm":"token_bucket","rate_per_sec":1,"burst":100,"mode":"enforce","match":{"routes":["/v1/complete"]}}`)
	h.putPolicy("log", `{"algorithm":"sliding_window_log","limit":10,"window":60,"mode":"enforce","match":{"routes":["/v1/logged"]}}`)
	for _, tc := range []struct{ body, field string }{
		{`{"api_key":"k","route":"/v1/complete"}`, "cost"},
		{`{"api_key":"k","route":"/v1/complete","cost":-1}`, "cost"},
		{`{"api_key":"k","route":"/v1/complete","cost":1.5}`, "cost"},
		{`{"api_key":"k","route":"/v1/complete","cost":1e300}`, "cost"},
		{`{"api_key":"k","route":"/v1/complete","cost":2000000000000}`, "cost"},
		{`{"api_key":"k","route":"/v1/complete","cost":5,"reservation":"nope"}`, "reservation"},
		{fmt.Sprintf(`{"api_key":"k","route":"/v1/complete","cost":5,"reservation":%q}`, strings.Repeat("r", 129)), "reservation"},
		{`{"api_key":"k","route":"/v1/other","cost":5}`, "route"},
		{`{"api_key":"k","route":"/v1/logged","cost":5}`, "route"},
		{`{"api_key":"k","cost":5}`, "route"},
		{`{"api_key":"k","route":"/v1/complete","cost":5,"costs":1}`, "costs"},
	} {
		r := h.do("POST", "/v1/charge", tc.body)
		if r.status != 400 || r.header.Get("Content-Type") != "application/problem+json" ||
			!strings.Contains(string(r.body), fmt.Sprintf(`"field":%q`, tc.field)) {
			t.Errorf("POST /v1/charge %s = %d %s, want a 400 problem naming %s", tc.body, r.status, r.body, tc.field)
		}
	}
	r := h.do("POST", "/v1/check", `{"api_key":"k","route":"/v1/complete","cost":0}`)
	if m := r.json(t); m["remaining"] != float64(100) {
		t.Errorf("after bad charges the bucket holds %v, want 100 (nothing charged)", m["remaining"])
	}
}

// TestChargeToAStoreThatIsDown: a charge that cannot reach the store is
// sent once and counted; for a policy that fails open it is dropped (200,
// degraded, sluice_charges_dropped_total), for one that fails closed it is
// a 503 problem; neither is retried (one error counted per charge).
func TestChargeToAStoreThatIsDown(t *testing.T) {
	srv := redistest.Start(t)
	h := newHarness(t, func(c *Config) {
		c.Store = "redis://" + srv.Addr()
		c.StoreTimeout = 50 * time.Millisecond
	})
	h.putPolicy("open", `{"algorithm":"token_bucket","rate_per_sec":1,"burst":100,"mode":"enforce","on_store_failure":"open","match":{"routes":["/v1/open"]}}`)
	h.putPolicy("closed", `{"algorithm":"token_bucket","rate_per_sec":1,"burst":100,"mode":"enforce","on_store_failure":"closed","match":{"routes":["/v1/closed"]}}`)
	if r := h.do("POST", "/v1/charge", `{"user":"u","route":"/v1/open","cost":5}`); r.status != 200 || r.json(t)["degraded"] != false {
		t.Fatalf("charge with the store up = %d %s, want 200, not degraded", r.status, r.body)
	}
	srv.Kill()
	r := h.do("POST", "/v1/charge", `{"user":"u","route":"/v1/open","cost":5}`)
	if r.status != 200 || r.json(t)["degraded"] != true {
		t.Errorf("fail-open charge with the store down = %d %s, want 200, degraded (dropped)", r.status, r.body)
	}
	r = h.do("POST", "/v1/charge", `{"user":"u","route":"/v1/closed","cost":5}`)
	if r.status != 503 || r.header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("fail-closed charge with the store down = %d %s, want a 503 problem", r.status, r.body)
	}
	s := h.d.lim.Stats()
	if s.ChargeErrors != 2 || s.ChargesDropped != 1 {
		t.Errorf("after two charges to a dead store: %d charge errors, %d dropped; want 2 and 1 (each sent once, the fail-open one dropped)", s.ChargeErrors, s.ChargesDropped)
	}
	m := string(h.do("GET", "/metrics", "").body)
	for _, want := range []string{"sluice_charge_errors_total 2", "sluice_charges_dropped_total 1"} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// TestChargeSettlesExpiredReservation: a reservation past its ttl cannot
// be settled: a 400 naming reservation, and nothing is charged.
func TestChargeSettlesExpiredReservation(t *testing.T) {
	clock := afterClock{manualclock.New()}
	h := newHarness(t, func(c *Config) { c.Clock = clock })
	h.putPolicy("tokens", `{"algorithm":"fixed_window","limit":1000,"window":86400,"mode":"enforce"}`)
	if r := h.do("POST", "/v1/check", `{"user":"u","route":"/x","cost":300,"reservation":"r1","reservation_ttl_ms":1000}`); r.status != 200 {
		t.Fatalf("check of the estimate = %d %s", r.status, r.body)
	}
	clock.Advance(2 * time.Second)
	r := h.do("POST", "/v1/charge", `{"user":"u","route":"/x","cost":900,"reservation":"r1"}`)
	if r.status != 400 || !strings.Contains(string(r.body), `"field":"reservation"`) {
		t.Fatalf("settling an expired reservation = %d %s, want 400 naming reservation", r.status, r.body)
	}
	if m := h.do("POST", "/v1/check", `{"user":"u","route":"/x","cost":0}`).json(t); m["remaining"] != float64(700) {
		t.Errorf("remaining after the refused settlement = %v, want 700 (the estimate spent, nothing more)", m["remaining"])
	}
}

// afterClock is a manual clock whose timers never fire: the daemon's
// decisions read it, and nothing in these tests waits on it.
type afterClock struct{ *manualclock.Clock }

func (afterClock) After(time.Duration) <-chan time.Time { return nil }
