package storetest

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/internal/manualclock"
)

// Charging is a store that charges after the fact and keeps reservations,
// as both the memory store and the Redis store do.
type Charging interface {
	Checker
	engine.Charger
	engine.Reserver
}

// ChargeableLimits are the limits of AlgorithmLimits that can be charged
// after the fact: every algorithm but the sliding window log.
func ChargeableLimits() []engine.Limit {
	var out []engine.Limit
	for _, l := range AlgorithmLimits {
		if l.Algorithm != engine.SlidingWindowLog {
			out = append(out, l)
		}
	}
	return out
}

// chargeTests are Run's tests of charges after the fact.
var chargeTests = []struct {
	name string
	run  func(*testing.T, []Case)
}{
	{"ChargeGoesIntoDebtAndIsPaidBack", chargeGoesIntoDebtAndIsPaidBack},
	{"ChargeRefusesTheSlidingLog", chargeRefusesTheSlidingLog},
	{"SettleChargesOrRefundsTheDifference", settleChargesOrRefundsTheDifference},
	{"SettleRefusesUnknownAndExpiredReservations", settleRefusesUnknownAndExpiredReservations},
	{"ChargesMatchThePureFunctions", chargesMatchThePureFunctions},
}

func charging(t *testing.T, sc Case, clock engine.Clock) Charging {
	t.Helper()
	c, ok := sc.New(t, clock).(Charging)
	if !ok {
		t.Fatalf("store %s does not charge after the fact", sc.Name)
	}
	return c
}

// MustCharge charges req and fails the test on an error.
func MustCharge(t *testing.T, s engine.Charger, req engine.ChargeRequest) engine.Decision {
	t.Helper()
	d, err := s.Charge(context.Background(), req)
	if err != nil {
		t.Fatalf("Charge(%+v): %v", req, err)
	}
	return d
}

func oneCharge(subject, policy string, l engine.Limit, cost int64) engine.ChargeRequest {
	return engine.ChargeRequest{Subject: subject, Checks: []engine.Check{{Policy: policy, Limit: l, Cost: cost}}}
}

// chargeGoesIntoDebtAndIsPaidBack charges three times a policy's capacity
// after the fact: the state goes past its limit, every check is refused
// until the RetryAfter the charge reported, and admitted from then on.
func chargeGoesIntoDebtAndIsPaidBack(t *testing.T, storeCases []Case) {
	for _, sc := range storeCases {
		for _, l := range ChargeableLimits() {
			t.Run(sc.Name+"/"+l.Algorithm.String(), func(t *testing.T) {
				clock := manualclock.New()
				clock.Advance(250 * time.Millisecond)
				s := charging(t, sc, clock)
				capacity := int64(l.Capacity())
				d := MustCharge(t, s, oneCharge("debtor", "p", l, 3*capacity))
				r := d.Results[0]
				if d.Allowed || r.Allowed || r.Remaining != 0 || r.RetryAfter <= 0 {
					t.Fatalf("Charge(3 x capacity) = %+v, want past the limit: not allowed, nothing remaining, a RetryAfter", d)
				}
				// A window is paid back when it ends: charged past its
				// count in this one, the next may still weigh it.
				wait := r.RetryAfter
				if d := MustCheck(t, s, One("debtor", "p", l, 1)); d.Allowed {
					t.Fatalf("a check right after the charge was allowed: %+v", d)
				}
				clock.Advance(wait - time.Millisecond)
				if d := MustCheck(t, s, One("debtor", "p", l, 1)); d.Allowed {
					t.Fatalf("a check 1ms before the debt is paid (RetryAfter %v) was allowed", wait)
				}
				clock.Advance(time.Millisecond)
				d2 := MustCheck(t, s, One("debtor", "p", l, 0))
				if !d2.Allowed {
					t.Fatalf("at RetryAfter %v the state is still past its limit: %+v", wait, d2)
				}
				clock.Advance(d2.Results[0].RetryAfter + time.Second)
				if d := MustCheck(t, s, One("debtor", "p", l, 1)); !d.Allowed {
					t.Fatalf("a second after the debt was paid a check was refused: %+v", d)
				}
			})
		}
	}
}

// chargeRefusesTheSlidingLog: the log cannot hold a debt, so a charge to
// it fails naming the algorithm, and charges nothing, not even to the
// other policies of the request.
func chargeRefusesTheSlidingLog(t *testing.T, storeCases []Case) {
	for _, sc := range storeCases {
		t.Run(sc.Name, func(t *testing.T) {
			s := charging(t, sc, manualclock.New())
			logL := engine.Limit{Algorithm: engine.SlidingWindowLog, Count: 10, Window: time.Second}
			bucket := AlgorithmLimits[0]
			req := engine.ChargeRequest{Subject: "l", Checks: []engine.Check{
				{Policy: "bucket", Limit: bucket, Cost: 5}, {Policy: "log", Limit: logL, Cost: 1}}}
			_, err := s.Charge(context.Background(), req)
			var le *engine.LimitError
			if !errors.Is(err, engine.ErrChargeUnsupported) || !errors.As(err, &le) || le.Field != "algorithm" {
				t.Fatalf("Charge of a sliding window log = %v, want ErrChargeUnsupported naming the algorithm", err)
			}
			if r := MustCheck(t, s, One("l", "bucket", bucket, 0)).Results[0]; r.Remaining != int64(bucket.Burst) {
				t.Fatalf("after a refused charge the bucket holds %d, want it full (%v)", r.Remaining, bucket.Burst)
			}
		})
	}
}

// settleChargesOrRefundsTheDifference checks with an estimate, reserves
// it, and settles with the real cost: more is charged, less refunded.
func settleChargesOrRefundsTheDifference(t *testing.T, storeCases []Case) {
	ctx := context.Background()
	for _, sc := range storeCases {
		for _, l := range ChargeableLimits() {
			t.Run(sc.Name+"/"+l.Algorithm.String(), func(t *testing.T) {
				clock := manualclock.New()
				clock.Advance(100 * time.Millisecond)
				s := charging(t, sc, clock)
				if !l.Algorithm.Windowed() {
					l.Burst = 100 // room for the three settlements below
				}
				capacity := int64(l.Capacity())
				remaining := func() int64 { return MustCheck(t, s, One("u", "p", l, 0)).Results[0].Remaining }
				for _, real := range []int64{2, 6, 4} {
					const estimate = 4
					c := engine.Check{Policy: "p", Limit: l, Cost: estimate}
					before := remaining()
					if d := MustCheck(t, s, engine.Request{Subject: "u", Checks: []engine.Check{c}}); !d.Allowed {
						t.Fatalf("estimate refused: %+v", d)
					}
					if err := s.Reserve(ctx, "u", "r1", []engine.Check{c}, time.Minute); err != nil {
						t.Fatal(err)
					}
					c.Cost = real
					other := engine.Check{Policy: "q", Limit: l, Cost: 1}
					held := []int64{-1, -1}
					MustCharge(t, s, engine.ChargeRequest{Subject: "u", Checks: []engine.Check{c, other}, Reservation: "r1", Held: held})
					if held[0] != estimate || held[1] != 0 {
						t.Errorf("settlement reports held %v, want [%d 0] (the estimate, none for a policy not reserved)", held, estimate)
					}
					if got := remaining(); got != before-real {
						t.Errorf("estimate %d settled at %d: remaining %d, want %d", estimate, real, got, before-real)
					}
				}
				if got := remaining(); got != capacity-12 {
					t.Errorf("after settling 2+6+4, remaining %d, want %d", got, capacity-12)
				}
			})
		}
	}
}

// settleRefusesUnknownAndExpiredReservations: a settlement of a
// reservation never made, already settled or expired fails and charges
// nothing.
func settleRefusesUnknownAndExpiredReservations(t *testing.T, storeCases []Case) {
	ctx := context.Background()
	for _, sc := range storeCases {
		t.Run(sc.Name, func(t *testing.T) {
			clock := manualclock.New()
			s := charging(t, sc, clock)
			l := AlgorithmLimits[0]
			c := engine.Check{Policy: "p", Limit: l, Cost: 3}
			settle := func(id string) error {
				_, err := s.Charge(ctx, engine.ChargeRequest{Subject: "x", Checks: []engine.Check{c}, Reservation: id})
				return err
			}
			if err := settle("never"); !errors.Is(err, engine.ErrUnknownReservation) {
				t.Fatalf("settle unknown = %v, want ErrUnknownReservation", err)
			}
			if err := s.Reserve(ctx, "x", "once", []engine.Check{c}, time.Second); err != nil {
				t.Fatal(err)
			}
			if err := settle("once"); err != nil {
				t.Fatalf("settle = %v", err)
			}
			if err := settle("once"); !errors.Is(err, engine.ErrUnknownReservation) {
				t.Fatalf("second settle = %v, want ErrUnknownReservation", err)
			}
			if err := s.Reserve(ctx, "x", "late", []engine.Check{c}, time.Second); err != nil {
				t.Fatal(err)
			}
			clock.Advance(999 * time.Millisecond)
			if err := s.Reserve(ctx, "x", "onTime", []engine.Check{c}, time.Second); err != nil {
				t.Fatal(err)
			}
			clock.Advance(time.Millisecond)
			if err := settle("late"); !errors.Is(err, engine.ErrUnknownReservation) {
				t.Fatalf("settle at expiry = %v, want ErrUnknownReservation", err)
			}
			if err := settle("onTime"); err != nil {
				t.Fatalf("settle 1ms after reserving = %v", err)
			}
			// Two settlements charged 3 less 3; nothing else was charged.
			if r := MustCheck(t, s, One("x", "p", l, 0)).Results[0]; r.Remaining != int64(l.Burst) {
				t.Errorf("remaining %d after refused settlements, want %v", r.Remaining, l.Burst)
			}
			for _, bad := range []struct {
				id  string
				ttl time.Duration
			}{{"", time.Second}, {"x", 0}, {"x", 25 * time.Hour}, {string(make([]byte, engine.MaxReservationID+1)), time.Second}} {
				if err := s.Reserve(ctx, "x", bad.id, []engine.Check{c}, bad.ttl); !errors.Is(err, engine.ErrBadRequest) {
					t.Errorf("Reserve(id of %d bytes, ttl %v) = %v, want ErrBadRequest", len(bad.id), bad.ttl, err)
				}
			}
		})
	}
}

// chargesMatchThePureFunctions drives a store through random checks,
// charges, reservations and settlements on a virtual clock and requires
// every result to be what engine.Decide and engine.Charge give on a state
// kept beside it, bit for bit: two stores that pass agree with each other.
func chargesMatchThePureFunctions(t *testing.T, storeCases []Case) {
	ctx := context.Background()
	for _, sc := range storeCases {
		for _, l := range ChargeableLimits() {
			t.Run(sc.Name+"/"+l.Algorithm.String(), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(7, uint64(l.Algorithm)))
				clock := manualclock.New()
				clock.Advance(time.Duration(rng.Int64N(int64(time.Hour))))
				s := charging(t, sc, clock)
				m := &model{l: l}
				for step := range 300 {
					clock.Advance(time.Duration(rng.Int64N(int64(300 * time.Millisecond))))
					now := clock.Now()
					cost := rng.Int64N(3 * int64(l.Capacity()) / 2)
					c := engine.Check{Policy: "p", Limit: l, Cost: cost}
					var got, want engine.Result
					var err error
					switch op := rng.IntN(4); op {
					case 0:
						var d engine.Decision
						d, err = s.Check(ctx, engine.Request{Subject: "m", Checks: []engine.Check{c}})
						got, want = d.Results[0], m.check(now, cost)
					case 1:
						var d engine.Decision
						d, err = s.Charge(ctx, oneCharge("m", "p", l, cost))
						got, want = d.Results[0], m.charge(now, cost, 0)
					case 2:
						err = s.Reserve(ctx, "m", "r", []engine.Check{c}, 500*time.Millisecond)
						m.reserve(now, cost, 500*time.Millisecond)
					default:
						var d engine.Decision
						d, err = s.Charge(ctx, engine.ChargeRequest{Subject: "m", Checks: []engine.Check{c}, Reservation: "r"})
						var ok bool
						want, ok = m.settle(now, cost)
						if !ok {
							if !errors.Is(err, engine.ErrUnknownReservation) {
								t.Fatalf("step %d: settle of an expired or settled reservation = %v", step, err)
							}
							continue
						}
						got = d.Results[0]
					}
					if err != nil {
						t.Fatalf("step %d (cost %d): %v", step, cost, err)
					}
					if got != want {
						t.Fatalf("step %d (cost %d): store %+v, pure functions %+v", step, cost, got, want)
					}
				}
			})
		}
	}
}

// model is one policy's state kept by the pure functions, with at most one
// reservation.
type model struct {
	l        engine.Limit
	st       engine.State
	resCost  int64
	resAt    int64
	resUntil int64 // µs; zero for none
}

func (m *model) check(now time.Time, cost int64) engine.Result {
	next, r := engine.Decide(now, m.st, m.l, cost)
	if (r.Allowed && cost > 0) || !r.Allowed {
		m.st = next
	}
	return r
}

func (m *model) charge(now time.Time, units, at int64) engine.Result {
	next, r := engine.Charge(now, m.st, m.l, units, at)
	m.st = next
	return r
}

func (m *model) reserve(now time.Time, cost int64, ttl time.Duration) {
	m.resCost, m.resAt, m.resUntil = cost, now.UnixMicro(), now.UnixMicro()+ttl.Microseconds()
}

func (m *model) settle(now time.Time, cost int64) (engine.Result, bool) {
	ok := m.resUntil != 0 && now.UnixMicro() < m.resUntil
	held, at := m.resCost, m.resAt
	m.resUntil = 0
	if !ok {
		return engine.Result{}, false
	}
	return m.charge(now, cost-held, at), true
}

// RunCharges runs only the tests of charges after the fact, for a store
// whose other semantics another test holds (a Redis Cluster).
func RunCharges(t *testing.T, cases ...Case) {
	for _, tt := range chargeTests {
		t.Run(tt.name, func(t *testing.T) { tt.run(t, cases) })
	}
}
