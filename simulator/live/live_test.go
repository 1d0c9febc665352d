package live

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/simulator"
)

// TestLiveSmoke is the live run make test keeps (the comparisons with
// the virtual run, and their tight bounds, are measurements: make
// sim-live): three regions of two daemons, each region on its own
// redis-server, so node usage is summed into the regional report and both
// daemons share the region's buckets; real memberlist and HTTP checks; 60
// scenario seconds (6 live) offered 2·L split 70/20/10 at a live L of
// 200/s. A run the machine fell behind on (ErrBehind: checks answered
// late, bunched at the daemons) still counts, for a loaded CI machine
// does fall behind, so the bounds are generous and chosen to tell a
// working share exchange from a broken one, not to measure it. After the
// warm-up (two intervals):
//   - r1, offered 70% of the demand, admits at least half of what is
//     admitted: negotiated shares give it 70%, static thirds 38%;
//   - the regions together admit between 0.5 and 1.1·L·W: a region that
//     enforced the whole L would let 1.6·L through, shares that sum far
//     under one let far less than L through.
//
// The run's error figures are logged, not bounded: they measure the
// machine as much as the limiter. Beside a CPU hog on 2 cores, checks
// answered up to 0.5 s late, global_error_p99_pct was 21 (unloaded 0.25,
// the virtual run 0.04); beside the live measurements and another
// package's tests, checks 1.3 s late, 40 with 72% of L·W admitted, r1
// still 70% of it.
func TestLiveSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("live run with redis-server; skipped under -short")
	}
	sc := simulator.Scenario{Name: "smoke", Regions: 3, Duration: simulator.Duration(60 * time.Second),
		Limit: simulator.LimitSpec{Rate: 1000}, Traffic: simulator.Traffic{Rate: 2, Split: []float64{70, 20, 10}}}
	var st Stats
	res, err := Run(context.Background(), sc, Options{Seed: 1, Store: "redis", NodesPerRegion: 2, Limit: 200, Stats: &st})
	if errors.Is(err, ErrBehind) {
		t.Log(err)
	} else if err != nil {
		t.Fatal(err)
	}
	t.Logf("live smoke: checks answered %v (p50), %v (p99) late; %+v", st.LateP50, st.LateP99, res.Summary)
	if len(res.Windows) != 6 {
		t.Fatalf("%d windows, want 6", len(res.Windows))
	}
	var r1, adm int64
	var lw float64
	for _, w := range res.Windows {
		if w.StartS < 20 {
			continue
		}
		r1 += w.Regions[0].Admitted
		adm += w.Admitted
		lw += w.Limit
	}
	t.Logf("after the warm-up: admitted %d of L·W %.0f, r1 %d", adm, lw, r1)
	if adm == 0 || float64(r1) < 0.5*float64(adm) {
		t.Errorf("r1 admitted %d of %d, want at least half (negotiated shares: 70%%)", r1, adm)
	}
	if float64(adm) > 1.1*lw || float64(adm) < 0.5*lw {
		t.Errorf("admitted %d, want between 0.5·L·W = %.0f and 1.1·L·W = %.0f", adm, 0.5*lw, 1.1*lw)
	}
}

// uneven is a short scenario like steady-uneven: 3 regions offered 2·L
// split 70/20/10, Poisson.
func uneven(name string, d time.Duration) simulator.Scenario {
	return simulator.Scenario{Name: name, Regions: 3, Duration: simulator.Duration(d),
		Limit: simulator.LimitSpec{Rate: 1000}, Traffic: simulator.Traffic{Rate: 2, Poisson: true, Split: []float64{70, 20, 10}}}
}

// stepLogger passes the runner's own records ("live: ...") to t.Log and
// drops the daemons'.
type stepLogger struct{ t *testing.T }

func (h stepLogger) Enabled(context.Context, slog.Level) bool { return true }
func (h stepLogger) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, "live:") {
		var b strings.Builder
		r.Attrs(func(a slog.Attr) bool { b.WriteString(" " + a.String()); return true })
		h.t.Log(r.Message + b.String())
	}
	return nil
}
func (h stepLogger) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h stepLogger) WithGroup(string) slog.Handler      { return h }

func TestValidateRejectsWhatLiveCannotRun(t *testing.T) {
	for _, sc := range simulator.Builtins() {
		err := Validate(sc)
		switch {
		case sc.Charge != nil && (err == nil || !strings.Contains(err.Error(), "charge")):
			t.Errorf("Validate(%s) = %v, want a scenario of charges after the fact refused, naming charge", sc.Name, err)
		case sc.Charge == nil && err != nil:
			t.Errorf("Validate(%s) = %v, want every built-in scenario without charges to run live", sc.Name, err)
		}
	}
	sec := func(s float64) simulator.Duration { return simulator.Duration(s * float64(time.Second)) }
	runs := []func(*simulator.Scenario){
		func(sc *simulator.Scenario) {
			sc.LimitSteps = []simulator.LimitStep{{At: simulator.Duration(time.Minute), Factor: 0.5}}
		},
		func(sc *simulator.Scenario) {
			sc.Gossip.Crashes = []simulator.Crash{{Region: 1, At: sec(60), Restart: sec(90)}}
		},
		func(sc *simulator.Scenario) {
			sc.Gossip.Partitions = []simulator.Partition{{Start: sec(1), End: sec(2), Regions: []int{0}}}
		},
		func(sc *simulator.Scenario) { sc.Gossip.Skew, sc.Gossip.Loss = sec(0.5), 0.1 },
		func(sc *simulator.Scenario) { sc.Quota = &simulator.QuotaSpec{Limit: 100, Window: sec(60)} },
	}
	for _, a := range []string{"token_bucket", "leaky_bucket", "sliding_window_log", "sliding_window_counter"} {
		runs = append(runs, func(sc *simulator.Scenario) { sc.Limit.Algorithm = a })
	}
	for i, mod := range runs {
		sc, _ := simulator.Builtin("steady-uneven")
		mod(&sc)
		if err := Validate(sc); err != nil {
			t.Errorf("case %d: Validate = %v, want nil", i, err)
		}
	}
	for _, c := range []struct {
		want string
		mod  func(*simulator.Scenario)
	}{
		{"fixed_window", func(sc *simulator.Scenario) { sc.Limit.Algorithm = "fixed_window" }},
		{"no_membership", func(sc *simulator.Scenario) { sc.Gossip.NoMembership = true }},
		{"no_contact", func(sc *simulator.Scenario) { sc.Gossip.NoContact = true }},
		{"detect_isolated", func(sc *simulator.Scenario) { sc.Gossip.DetectIsolated = sec(20) }},
		{"contact_every", func(sc *simulator.Scenario) { sc.Gossip.ContactEvery = sec(0.5) }},
		{"ping_timeout", func(sc *simulator.Scenario) { sc.Gossip.PingTimeout = sec(1) }},
		{"unknown algorithm", func(sc *simulator.Scenario) { sc.Limit.Algorithm = "gcra" }},
	} {
		sc, _ := simulator.Builtin("steady-uneven")
		c.mod(&sc)
		err := Validate(sc)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(with %s) = %v, want an error naming %s", c.want, err, c.want)
		}
		if c.want != "unknown algorithm" && (err == nil || !strings.Contains(err.Error(), "not supported live")) {
			t.Errorf("Validate(with %s) = %v, want it to say \"not supported live\"", c.want, err)
		}
	}
}

// TestSlidingWindowLogCountBeyondMax: a log's count above the engine's
// maximum is refused before any daemon starts.
func TestSlidingWindowLogCountBeyondMax(t *testing.T) {
	sc := uneven("big-log", 30*time.Second)
	sc.Limit.Algorithm = "sliding_window_log"
	sc.Limit.Burst = 20 * sc.Limit.Rate // a 20 s window: 2 live s of L = 1000/s, a count of 2000
	_, err := Run(context.Background(), sc, Options{})
	if err == nil || !strings.Contains(err.Error(), "sliding_window_log") {
		t.Errorf("Run(log of count 2000) = %v, want the engine's refusal", err)
	}
}

// TestBurstHoldsChecksPerRegion checks the grain of a live run: zipf-keys
// offers 1000·L, so its live L is 4/s, and at the default 1 s interval a
// key's burst (one second of L, 100 ms live) would be 0.4 checks, rounded
// up to one that no region's share of it can hold. The runner's default
// interval is long enough for the scenario's own grain (a burst of 20
// units, 20 checks), and a run asked for a coarser one is refused before
// any daemon starts.
func TestBurstHoldsChecksPerRegion(t *testing.T) {
	sc, ok := simulator.Builtin("zipf-keys")
	if !ok {
		t.Fatal("no built-in zipf-keys")
	}
	_, err := Run(context.Background(), sc, Options{Limit: 4, Interval: time.Second})
	if err == nil || !strings.Contains(err.Error(), "burst holds 1 checks") {
		t.Errorf("Run(zipf-keys, L = 4/s, 1 s interval) = %v, want a refusal naming the burst", err)
	}
	sc = sc.WithDefaults()
	opt := Options{Limit: 4, NodesPerRegion: 1}
	if got, want := defaultInterval(sc, opt, []float64{1}), 50*time.Second; got != want {
		t.Errorf("defaultInterval(zipf-keys at L = 4/s) = %v, want %v (a burst of 4·5 = 20 checks)", got, want)
	}
	if got := defaultInterval(sc, Options{Limit: 1000, NodesPerRegion: 1}, []float64{1, 0.5}); got != time.Second {
		t.Errorf("defaultInterval(zipf-keys at L = 1000/s) = %v, want 1s", got)
	}
	for _, b := range simulator.Builtins() {
		if Validate(b) != nil {
			continue
		}
		b = b.WithDefaults()
		lim := 1000.0
		if p := peakRate(b); p*lim > MaxLoad {
			lim = math.Floor(MaxLoad / p)
		}
		iv := defaultInterval(b, Options{Limit: lim, NodesPerRegion: 1}, append([]float64{1}, stepFactors(b)...))
		want := time.Duration((b.Regions+3)/4) * time.Second // a second per four daemons
		if b.Name != "zipf-keys" && iv != want {
			t.Errorf("defaultInterval(%s, %d daemons) = %v, want %v", b.Name, b.Regions, iv, want)
		}
	}
}
