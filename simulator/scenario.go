// Package simulator runs n regions of Sluice on virtual time: each region
// runs the daemon's coordinator core (coordinator.Core) and decides every
// arrival with the real engine memory store at the scale a daemon uses
// (share.Scale, share.QuotaScale); the simulator delivers the cores'
// messages through a simulated gossip layer (delay, jitter, loss,
// partitions, clock skew, crashes and restarts), and one central engine
// store fed the same arrivals (the oracle) says what a single limiter would
// have admitted. Runs are deterministic for a seed.
package simulator

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/sluice-rl/sluice/share"
)

// Duration is a time.Duration written in JSON as a Go duration string
// ("10s", "1m30s").
type Duration time.Duration

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads a duration string or a number of seconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		*d = Duration(v)
		return nil
	}
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return fmt.Errorf("duration must be a string like \"10s\" or a number of seconds")
	}
	*d = Duration(f * float64(time.Second))
	return nil
}

// D returns the time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// Scenario describes one simulation. Rates are multiples of the global
// limit L (Limit.Rate); splits are per-region fractions, normalised.
type Scenario struct {
	Name        string   `json:"name"`
	Description string   `json:"description,omitempty"`
	Regions     int      `json:"regions"`
	Duration    Duration `json:"duration"`
	// Warmup is excluded from error statistics (default two intervals):
	// every region starts at L/n and learns demand from the first report.
	Warmup Duration `json:"warmup,omitempty"`
	// Tick is the step of virtual time at which arrivals are generated and
	// events fire (default 10ms).
	Tick  Duration  `json:"tick,omitempty"`
	Limit LimitSpec `json:"limit"`
	// Keys is the number of keys (subjects) of the global policy; Zipf > 1
	// draws each arrival's key from a Zipf(Zipf) distribution over them.
	Keys int     `json:"keys,omitempty"`
	Zipf float64 `json:"zipf,omitempty"`

	Traffic Traffic    `json:"traffic"`
	Gossip  Gossip     `json:"gossip,omitempty"`
	Share   ShareSpec  `json:"share,omitempty"`
	Quota   *QuotaSpec `json:"quota,omitempty"`
	// Charge, with a Quota, charges each request's cost after the fact.
	Charge *ChargeSpec `json:"charge,omitempty"`
	// LimitSteps change L during the run (e.g. halve it).
	LimitSteps []LimitStep `json:"limit_steps,omitempty"`
	// ChangeAt is the moment convergence is measured from (default 0).
	ChangeAt Duration `json:"change_at,omitempty"`
	// Targets are the scenario's pass/fail goals, each checked against
	// one of the run's figures.
	Targets []Target `json:"targets,omitempty"`
}

// LimitSpec is the global limit of every key.
type LimitSpec struct {
	Algorithm string  `json:"algorithm,omitempty"` // default token_bucket
	Rate      float64 `json:"rate"`                // units/s (L)
	Burst     float64 `json:"burst,omitempty"`     // default Rate (1 s)
}

// LimitStep multiplies the original L by Factor from At on.
type LimitStep struct {
	At     Duration `json:"at"`
	Factor float64  `json:"factor"`
}

// Traffic is the offered load: Rate·L split across regions by Split, then
// modified by steps, bursts and a diurnal rotation. Arrivals are Poisson
// when Poisson is set, evenly spaced otherwise.
type Traffic struct {
	Rate    float64   `json:"rate"`
	Split   []float64 `json:"split,omitempty"` // default even
	Poisson bool      `json:"poisson,omitempty"`
	// Steps replace Rate and/or Split from At on (step shift, flash crowd,
	// idle region waking).
	Steps []TrafficStep `json:"steps,omitempty"`
	// Bursts add Rate·L for Length every Every (on-off), split by Split.
	Bursts *Bursts `json:"bursts,omitempty"`
	// Diurnal rotates demand between regions with period Period (follow
	// the sun): region i's weight is 1 + Depth·cos(2π(t/Period − i/n)).
	Diurnal *Diurnal `json:"diurnal,omitempty"`
}

// TrafficStep changes the base traffic at At.
type TrafficStep struct {
	At    Duration  `json:"at"`
	Rate  float64   `json:"rate,omitempty"`
	Split []float64 `json:"split,omitempty"`
}

// Bursts describe on-off traffic on top of the base.
type Bursts struct {
	Every  Duration  `json:"every"`
	Length Duration  `json:"length"`
	Rate   float64   `json:"rate"`
	Split  []float64 `json:"split,omitempty"`
}

// Diurnal is the follow-the-sun modulation.
type Diurnal struct {
	Period Duration `json:"period"`
	Depth  float64  `json:"depth"`
}

// Gossip describes how reports travel.
type Gossip struct {
	Delay  Duration `json:"delay,omitempty"`  // default 100ms
	Jitter Duration `json:"jitter,omitempty"` // uniform extra delay
	Loss   float64  `json:"loss,omitempty"`   // probability a report to one peer is lost
	// Skew is the largest clock offset of a region (uniform in ±Skew).
	Skew       Duration    `json:"skew,omitempty"`
	Partitions []Partition `json:"partitions,omitempty"`
	Crashes    []Crash     `json:"crashes,omitempty"`
	// Detect is how long membership (memberlist) takes to declare an
	// unreachable region dead: a crashed region, and the smaller side of a
	// partition as the larger side sees it (default 5s, about memberlist's
	// LAN preset, whose suspicion of a node is confirmed by the others'
	// probes; its WAN preset takes ~25s). DetectIsolated is how long the
	// smaller side takes to declare the larger one dead (default 4 ×
	// Detect): its suspicions have no confirmers, so memberlist's Lifeguard
	// waits up to SuspicionMaxTimeoutMult (6) times as long, and slows the
	// probes of a node whose probes fail. NoMembership turns the membership
	// signal off, verdicts and pings, leaving only missing reports.
	Detect         Duration `json:"detect,omitempty"`
	DetectIsolated Duration `json:"detect_isolated,omitempty"`
	NoMembership   bool     `json:"no_membership,omitempty"`
	// ContactEvery is how often every region pings every other (the gossip
	// layer's gossip.Config.ContactEvery; default Interval/40) and
	// PingTimeout how long a ping waits for its answer (memberlist's probe
	// timeout; default Detect/10, 500ms, the LAN preset's). A ping is answered at once
	// unless a crash or a partition is in the way. NoContact turns the
	// pings off, leaving membership's verdicts (an owner that feeds only
	// those).
	ContactEvery Duration `json:"contact_every,omitempty"`
	PingTimeout  Duration `json:"ping_timeout,omitempty"`
	NoContact    bool     `json:"no_contact,omitempty"`
}

// Partition cuts Regions (indices) off from the rest from Start to End.
// Their own traffic keeps arriving at them.
type Partition struct {
	Start   Duration `json:"start"`
	End     Duration `json:"end"`
	Regions []int    `json:"regions"`
}

// Crash stops Region at At (its traffic fails over to the others evenly);
// with Restart > At it comes back empty at Restart.
type Crash struct {
	Region  int      `json:"region"`
	At      Duration `json:"at"`
	Restart Duration `json:"restart,omitempty"`
}

// ShareSpec overrides share.DefaultConfig.
type ShareSpec struct {
	Interval   Duration `json:"interval,omitempty"`
	Settle     Duration `json:"settle,omitempty"` // default Delay+Jitter+400ms
	RaiseDelay Duration `json:"raise_delay,omitempty"`
	Pressure   float64  `json:"pressure,omitempty"`
	// NoBorrow turns borrowing between regions off; LendFraction overrides the
	// part of its slack a lender gives (default 1).
	NoBorrow     bool    `json:"no_borrow,omitempty"`
	LendFraction float64 `json:"lend_fraction,omitempty"`
}

// QuotaSpec turns the scenario into a global quota (fixed window G-counter)
// of Limit units per Window; Limit.Rate is then ignored except as the unit
// of Traffic.Rate.
type QuotaSpec struct {
	Limit  uint64   `json:"limit"`
	Window Duration `json:"window"`
}

// ChargeSpec makes every request's cost known only after it is served,
// as an LLM completion's tokens are: a cost drawn uniformly from 1 to
// MaxCost, charged after the fact (engine.MemoryStore.Charge, past the
// limit if need be) and counted in the region's usage as the daemon's
// limiter counts a tracked charge. The oracle does the same against the
// whole limit.
//
// With a Quota, each arrival is checked at cost 0 (a read, refused once
// the quota is spent) and, when admitted, charged its cost at once;
// charged_vs_oracle_pct compares the units charged, and the windows count
// requests.
//
// Without one the policy is a token rate divided by shares (a global
// token bucket of Limit.Rate tokens a second): each arrival is checked at
// Estimate tokens, held as a reservation, and when admitted settled with
// its cost Latency later (the refund or the extra charge of a reservation;
// a settlement adds what it charged beyond the estimate to the region's
// usage, a refund takes nothing back). Traffic.Rate is then in requests,
// (1+MaxCost)/2 tokens each on average, and every figure of the windows
// counts tokens: offered (a refused request counts the cost it would have
// had), admitted and the oracle's.
type ChargeSpec struct {
	MaxCost int64 `json:"max_cost"`
	// Estimate is what a check of a token rate spends before the cost is
	// known (1 to MaxCost; required without a Quota, unused with one).
	Estimate int64 `json:"estimate,omitempty"`
	// Latency is how long an admitted request of a token rate is served
	// before it is settled (default 0: at once; at most 1 minute).
	Latency Duration `json:"latency,omitempty"`
}

// chargesRate reports whether s charges a share-limited token rate after
// the fact (a Charge without a Quota), whose figures count tokens.
func (s Scenario) chargesRate() bool { return s.Charge != nil && s.Quota == nil }

// Target is one goal: Metric (a summary field name) must lie in [Min, Max]
// (either bound may be omitted).
type Target struct {
	Metric string   `json:"metric"`
	Min    *float64 `json:"min,omitempty"`
	Max    *float64 `json:"max,omitempty"`
	Note   string   `json:"note,omitempty"`
}

// LoadScenario reads a scenario from a JSON file.
func LoadScenario(path string) (Scenario, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Scenario{}, err
	}
	return ParseScenario(b)
}

// ParseScenario decodes a JSON scenario, rejecting unknown fields.
func ParseScenario(b []byte) (Scenario, error) {
	var s Scenario
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return Scenario{}, fmt.Errorf("scenario: %w", err)
	}
	return s, s.Validate()
}

// Validate reports the first field that cannot run.
func (s Scenario) Validate() error {
	switch {
	case s.Name == "":
		return errors.New("scenario: name is required")
	case s.Regions < 1 || s.Regions > 64:
		return fmt.Errorf("scenario %s: regions must be 1..64, got %d", s.Name, s.Regions)
	case s.Duration.D() <= 0:
		return fmt.Errorf("scenario %s: duration must be positive", s.Name)
	case s.Limit.Rate <= 0:
		return fmt.Errorf("scenario %s: limit.rate must be positive", s.Name)
	case s.Keys < 0 || s.Keys > 10_000_000:
		return fmt.Errorf("scenario %s: keys must be 0..1e7", s.Name)
	case s.Zipf != 0 && s.Zipf <= 1:
		return fmt.Errorf("scenario %s: zipf exponent must be > 1", s.Name)
	case s.Gossip.Loss < 0 || s.Gossip.Loss > 1:
		return fmt.Errorf("scenario %s: gossip.loss must be in [0, 1]", s.Name)
	case s.Limit.Algorithm != "" && s.Limit.Algorithm != "token_bucket":
		return fmt.Errorf("scenario %s: only token_bucket limits are simulated, got %q", s.Name, s.Limit.Algorithm)
	}
	for _, sp := range append([][]float64{s.Traffic.Split}, splits(s)...) {
		if len(sp) != 0 && len(sp) != s.Regions {
			return fmt.Errorf("scenario %s: a split has %d entries for %d regions", s.Name, len(sp), s.Regions)
		}
	}
	if err := s.validateFaults(); err != nil {
		return err
	}
	if s.Quota != nil && (s.Quota.Limit == 0 || s.Quota.Window.D() <= 0) {
		return fmt.Errorf("scenario %s: quota needs a limit and a window", s.Name)
	}
	if err := s.validateCharge(); err != nil {
		return err
	}
	for _, t := range s.Targets {
		if _, ok := metricNames[t.Metric]; !ok {
			return fmt.Errorf("scenario %s: unknown target metric %q", s.Name, t.Metric)
		}
	}
	return nil
}

// validateCharge reports the first field of Charge that cannot run.
func (s Scenario) validateCharge() error {
	c := s.Charge
	switch {
	case c == nil:
		return nil
	case c.MaxCost < 1 || c.MaxCost > 1_000_000:
		return fmt.Errorf("scenario %s: charge.max_cost must be from 1 to 1000000, got %d", s.Name, c.MaxCost)
	case s.Quota != nil && (c.Estimate != 0 || c.Latency != 0):
		return fmt.Errorf("scenario %s: charge.estimate and charge.latency are for a token rate, not a quota", s.Name)
	case s.Quota == nil && (c.Estimate < 1 || c.Estimate > c.MaxCost):
		return fmt.Errorf("scenario %s: charge.estimate must be from 1 to max_cost (%d), got %d", s.Name, c.MaxCost, c.Estimate)
	case c.Latency < 0 || c.Latency.D() > time.Minute:
		return fmt.Errorf("scenario %s: charge.latency must be from 0 to 1m, got %v", s.Name, c.Latency.D())
	case s.Quota == nil && len(s.Gossip.Crashes) > 0:
		return fmt.Errorf("scenario %s: a charged token rate is not simulated with crashes", s.Name)
	}
	return nil
}

// validateFaults reports the first gossip fault that cannot run, naming
// its field: a negative delay, a partition or crash naming a region that
// does not exist, times out of order.
func (s Scenario) validateFaults() error {
	g := s.Gossip
	for _, d := range []struct {
		field string
		d     Duration
	}{
		{"delay", g.Delay}, {"jitter", g.Jitter}, {"skew", g.Skew}, {"detect", g.Detect},
		{"detect_isolated", g.DetectIsolated}, {"contact_every", g.ContactEvery}, {"ping_timeout", g.PingTimeout},
	} {
		if d.d < 0 {
			return fmt.Errorf("scenario %s: gossip.%s must not be negative", s.Name, d.field)
		}
	}
	region := func(field string, r int) error {
		if r < 0 || r >= s.Regions {
			return fmt.Errorf("scenario %s: %s: region %d does not exist (regions are 0..%d)", s.Name, field, r, s.Regions-1)
		}
		return nil
	}
	for i, p := range g.Partitions {
		f := fmt.Sprintf("gossip.partitions[%d]", i)
		if len(p.Regions) == 0 {
			return fmt.Errorf("scenario %s: %s.regions must name at least one region", s.Name, f)
		}
		for j, r := range p.Regions {
			if err := region(fmt.Sprintf("%s.regions[%d]", f, j), r); err != nil {
				return err
			}
		}
		if p.Start < 0 || p.End <= p.Start {
			return fmt.Errorf("scenario %s: %s: end (%v) must come after start (%v) ≥ 0", s.Name, f, p.End.D(), p.Start.D())
		}
	}
	for i, c := range g.Crashes {
		f := fmt.Sprintf("gossip.crashes[%d]", i)
		if err := region(f+".region", c.Region); err != nil {
			return err
		}
		if c.At < 0 {
			return fmt.Errorf("scenario %s: %s.at must not be negative", s.Name, f)
		}
		if c.Restart != 0 && c.Restart <= c.At {
			return fmt.Errorf("scenario %s: %s.restart (%v) must come after at (%v)", s.Name, f, c.Restart.D(), c.At.D())
		}
	}
	return nil
}

// WithDefaults returns s with every default the simulator fills in (see
// the fields' documentation).
func (s Scenario) WithDefaults() Scenario { return s.withDefaults() }

// ShareConfig is the allocation config the simulator runs s with, its
// defaults filled in.
func (s Scenario) ShareConfig() share.Config { return s.withDefaults().shareConfig() }

func splits(s Scenario) [][]float64 {
	var out [][]float64
	for _, st := range s.Traffic.Steps {
		out = append(out, st.Split)
	}
	if s.Traffic.Bursts != nil {
		out = append(out, s.Traffic.Bursts.Split)
	}
	return out
}
