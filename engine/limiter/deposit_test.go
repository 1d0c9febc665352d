package limiter

import (
	"context"
	"errors"
	"testing"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/internal/manualclock"
)

// TestDeposit: a deposit puts units back into a token bucket up to its
// burst at the scale checked, is always allowed, tracks nothing, and lets
// the subject's next check spend the units even after a remembered
// rejection; a deposit that is not the only check, not of a token bucket,
// of nothing or tracked is a bad request.
func TestDeposit(t *testing.T) {
	ctx := context.Background()
	clock := manualclock.New()
	lim := New(Config{Store: engine.NewMemoryStore(engine.MemoryConfig{Clock: clock}), Clock: clock})
	bucket := engine.Limit{Algorithm: engine.TokenBucket, Rate: 20, Burst: 20}
	spend := func(cost int64) Outcome {
		t.Helper()
		out, err := lim.Check(ctx, engine.Request{Subject: "k", Checks: []engine.Check{{Policy: "g", Limit: bucket, Cost: cost, Scale: 0.5, Track: true}}})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	deposit := func(cost int64) Outcome {
		t.Helper()
		out, err := lim.Check(ctx, engine.Request{Subject: "k", Checks: []engine.Check{{Policy: "g", Limit: bucket, Cost: cost, Scale: 0.5, Deposit: true}}})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if out := spend(10); !out.Allowed || out.Results[0].Remaining != 0 {
		t.Fatalf("spending the 10 units of a half share = %+v, want allowed with 0 left", out.Results[0])
	}
	if out := spend(1); out.Allowed {
		t.Fatalf("an empty bucket admitted")
	}
	for _, tt := range []struct {
		cost, remaining int64
	}{{3, 3}, {4, 7}, {9, 10}} { // the last fills up to the burst of 10
		if out := deposit(tt.cost); !out.Allowed || out.Results[0].Remaining != tt.remaining {
			t.Errorf("deposit(%d) = %+v, want allowed with %d left", tt.cost, out.Results[0], tt.remaining)
		}
	}
	if out := spend(10); !out.Allowed || out.Source != FromStore {
		t.Errorf("spending the deposited units = %+v from %v, want allowed from the store (no remembered rejection)", out.Results[0], out.Source)
	}
	if u := lim.DrainUsage()[engine.UsageKey{Subject: "k", Policy: "g"}]; u.Demand != 21 || u.Admitted != 20 {
		t.Errorf("usage = %+v, want the spends only (21 demanded, 20 admitted)", u)
	}
	for _, tt := range []struct {
		name string
		req  engine.Request
	}{
		{"not alone", engine.Request{Subject: "k", Checks: []engine.Check{{Policy: "g", Limit: bucket, Cost: 1, Deposit: true}, {Policy: "h", Limit: bucket, Cost: 1}}}},
		{"not a token bucket", engine.Request{Subject: "k", Checks: []engine.Check{{Policy: "g", Limit: engine.Limit{Algorithm: engine.LeakyBucket, Rate: 20, Burst: 20}, Cost: 1, Deposit: true}}}},
		{"of nothing", engine.Request{Subject: "k", Checks: []engine.Check{{Policy: "g", Limit: bucket, Deposit: true}}}},
		{"tracked", engine.Request{Subject: "k", Checks: []engine.Check{{Policy: "g", Limit: bucket, Cost: 1, Deposit: true, Track: true}}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := lim.Check(ctx, tt.req); !errors.Is(err, engine.ErrBadRequest) {
				t.Errorf("Check(deposit %s) error = %v, want engine.ErrBadRequest", tt.name, err)
			}
		})
	}
}
