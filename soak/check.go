package soak

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"time"
)

// Request is one request as its client saw it: when it was sent and
// answered, where to, and the answer. Nothing in it comes from a daemon's
// own account of what it did.
type Request struct {
	Start   time.Time `json:"start"`
	End     time.Time `json:"end"`
	Region  string    `json:"region"`
	Daemon  string    `json:"daemon,omitempty"` // the daemon asked; "" through a gateway
	Via     string    `json:"via"`              // "check", "nginx" or "rls"
	Policy  string    `json:"policy"`           // the one policy the request's route or descriptor matches
	Subject string    `json:"subject"`
	Status  int       `json:"status"` // HTTP status (RLS: 200 OK, 429 OVER_LIMIT); 0 with Err
	Err     string    `json:"err,omitempty"`
	// Decided is false for an answer a gateway gave without the limiter
	// (nginx failing open: no RateLimit header), which no bound covers.
	Decided bool `json:"decided"`
	// Degraded is an answer that says the store did not decide and the
	// policy's on_store_failure did: the check API's "degraded" in the
	// body, through a gateway X-Sluice-Degraded as its access log has it,
	// and an RLS answer X-Sluice-Degraded in request_headers_to_add.
	Degraded bool `json:"degraded,omitempty"`
	// URI is the request's URI through a gateway, unique per request, by
	// which the gateway's access log is matched to it.
	URI string `json:"uri,omitempty"`
}

// Admitted reports whether the request was let through.
func (r Request) Admitted() bool { return r.Err == "" && r.Status == 200 }

// PolicyState is a policy as it is in force from At on, as the admin API
// acknowledged it. Enforced false is a policy in shadow or not defined.
type PolicyState struct {
	At             time.Time `json:"at"`
	ID             string    `json:"id"`
	Limit          float64   `json:"limit"`
	Window         float64   `json:"window"` // seconds; windows are aligned to the Unix epoch
	Global         bool      `json:"global"`
	OnStoreFailure string    `json:"on_store_failure"` // "open", "local" or "closed"
	Enforced       bool      `json:"enforced"`
}

// Span is a fault as it happened: when the nemesis began it and when what
// it broke was whole again (a killed daemon answering, a failover done).
type Span struct {
	Kind   Kind      `json:"kind"`
	Region string    `json:"region"`
	Daemon string    `json:"daemon,omitempty"`
	Detail string    `json:"detail,omitempty"`
	Start  time.Time `json:"start"`
	End    time.Time `json:"end"`
}

func (s Span) String() string {
	d := s.Region
	if s.Daemon != "" {
		d = s.Daemon
	}
	if s.Detail != "" {
		d += " " + s.Detail
	}
	return fmt.Sprintf("%s %s", s.Kind, d)
}

// Bounds are the margins the documentation states, for a deployment of
// DaemonsPerRegion daemons per region.
type Bounds struct {
	DaemonsPerRegion int
	// ReportDelay is D, how late a region learns what the others admitted
	// of a global policy: up to the gossip interval T plus Collect plus
	// delivery, taken as 2·T (docs/architecture.md, "the report delay").
	ReportDelay time.Duration
	// Settle is how long after a store fault ends its effects may last:
	// the circuit breaker probes Redis again at most 5 s after it is back
	// (docs/architecture.md, on the daemon starting while Redis is down).
	Settle time.Duration
	// PolicySlack is how long a policy change takes to reach every daemon
	// of every region (pub/sub within a region, gossip across them).
	PolicySlack time.Duration
	// Latency is the slowest answer allowed: the store deadline, the
	// queue wait and the margin at the gateway.
	Latency time.Duration
	// ChartSubject is the subject whose windows Check returns for the
	// report's charts.
	ChartSubject string
	// DegradedHealthy is the share of a region's answers, with its stores
	// and daemons up, that may say the store did not decide them: on a
	// busy machine a store call misses its deadline now and then, and the
	// policy's on_store_failure decides it (a fail-closed policy's 503).
	DegradedHealthy float64
}

// DegradedFigure is how many of a region's answers, while no store or
// daemon of the region was down, said that the store had not decided them.
type DegradedFigure struct {
	Region   string `json:"region"`
	Answers  int    `json:"answers"`
	Degraded int    `json:"degraded"`
}

// WindowFigure is what one window admitted against its bound.
type WindowFigure struct {
	Key      string    `json:"key"`
	From     time.Time `json:"from"`
	Admitted int       `json:"admitted"`
	Bound    float64   `json:"bound"`
}

// Violation is one broken promise, with the request that shows it.
type Violation struct {
	Rule     string    `json:"rule"`
	Time     time.Time `json:"time"`
	Key      string    `json:"key,omitempty"`
	Admitted int       `json:"admitted,omitempty"`
	Bound    float64   `json:"bound,omitempty"`
	Request  *Request  `json:"request,omitempty"`
	Faults   []string  `json:"faults"`
	Detail   string    `json:"detail"`
}

// The rules a Violation names.
const (
	RuleOverAdmission = "over-admission"
	RuleServerError   = "server-error"
	RuleUnexpected    = "unexpected-status"
	RuleTransport     = "transport-error"
	RuleLatency       = "latency"
	RuleLeak          = "leak"
	RuleDegraded      = "degraded-healthy"
	// RuleFalsePartition: a daemon found another region out of contact
	// that no fault cut off (FalsePartitions).
	RuleFalsePartition = "false-partition"
)

// Check judges reqs against the policies in force (policies, in the order
// they were acknowledged) and the faults that happened, and returns every
// violation, sorted by time, with the windows of b.ChartSubject.
func Check(reqs []Request, policies []PolicyState, faults []Span, b Bounds) ([]Violation, []WindowFigure) {
	c := checker{policies: policies, faults: faults, b: b}
	var out []Violation
	for i := range reqs {
		out = append(out, c.answer(&reqs[i])...)
	}
	out = append(out, c.admissions(reqs)...)
	for _, f := range c.degradedShares(reqs) {
		if share := float64(f.Degraded) / float64(f.Answers); share > b.DegradedHealthy {
			out = append(out, Violation{Rule: RuleDegraded, Time: reqs[0].Start, Key: f.Region, Admitted: f.Degraded, Bound: b.DegradedHealthy * float64(f.Answers),
				Faults: []string{}, Detail: fmt.Sprintf("%d of %d answers in region %s decided without the store while it was up (%.3f%%, bound %.3f%%)",
					f.Degraded, f.Answers, f.Region, 100*share, 100*b.DegradedHealthy)})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Time.Before(out[j].Time) })
	sort.SliceStable(c.charted, func(i, j int) bool { return c.charted[i].From.Before(c.charted[j].From) })
	return out, c.charted
}

type checker struct {
	policies []PolicyState
	faults   []Span
	b        Bounds
	charted  []WindowFigure
}

// active returns the faults that overlap [from, to], widened by slack, of
// region (any region when region is "") and of the kinds given (any kind
// when none are).
func (c *checker) active(from, to time.Time, slack time.Duration, region string, kinds ...Kind) []Span {
	var out []Span
	for _, f := range c.faults {
		if region != "" && f.Region != region {
			continue
		}
		if len(kinds) > 0 && !slices.Contains(kinds, f.Kind) {
			continue
		}
		if f.Start.Before(to.Add(slack)) && f.End.Add(slack).After(from) {
			out = append(out, f)
		}
	}
	return out
}

func names(fs []Span) []string {
	out := []string{}
	for _, f := range fs {
		out = append(out, f.String())
	}
	return out
}

// versions returns the states of policy id in force at some time in
// [from, to]: the last acknowledged before from, and every one after.
func (c *checker) versions(id string, from, to time.Time) []PolicyState {
	var out []PolicyState
	var before *PolicyState
	for i, p := range c.policies {
		if p.ID != id {
			continue
		}
		if !p.At.After(from) {
			before = &c.policies[i]
			continue
		}
		if p.At.Before(to) {
			out = append(out, p)
		}
	}
	if before != nil {
		out = append([]PolicyState{*before}, out...)
	}
	return out
}

// DegradedShares returns, per region in order of name, the answers
// with the region's stores and daemons up and not starved (b.Settle
// after a fault included in the fault) and how many of them were degraded:
// a daemon stopped in the middle of a store call misses its deadline.
func DegradedShares(reqs []Request, faults []Span, b Bounds) []DegradedFigure {
	c := checker{faults: faults, b: b}
	return c.degradedShares(reqs)
}

func (c *checker) degradedShares(reqs []Request) []DegradedFigure {
	by := map[string]*DegradedFigure{}
	var regions []string
	for i := range reqs {
		r := &reqs[i]
		if r.Err != "" || !r.Decided {
			continue
		}
		if len(c.active(r.Start, r.End, c.b.Settle, r.Region, append(append(slices.Clip(storeFaults), daemonFaults...), Starve)...)) > 0 {
			continue
		}
		f, ok := by[r.Region]
		if !ok {
			f = &DegradedFigure{Region: r.Region}
			by[r.Region] = f
			regions = append(regions, r.Region)
		}
		f.Answers++
		if r.Degraded {
			f.Degraded++
		}
	}
	slices.Sort(regions)
	out := make([]DegradedFigure, 0, len(regions))
	for _, r := range regions {
		out = append(out, *by[r])
	}
	return out
}

// storeFaults are the faults that take a region's store away.
var storeFaults = []Kind{KillPrimary, PauseRedis, Failover}

// daemonFaults are the faults that take a daemon away.
var daemonFaults = []Kind{KillDaemon, RollRegion}

// answer judges one answer on its own: its status and its latency.
func (c *checker) answer(r *Request) []Violation {
	at := func(rule, detail string, fs []Span) Violation {
		return Violation{Rule: rule, Time: r.Start, Request: r, Faults: names(fs), Detail: detail}
	}
	all := c.active(r.Start, r.End, 0, "")
	if r.Err != "" {
		// A daemon killed or restarting refuses connections; the clients
		// of its region go on to the other one.
		if len(c.active(r.Start, r.End, c.b.Settle, r.Region, daemonFaults...)) > 0 {
			return nil
		}
		return []Violation{at(RuleTransport, r.Err, all)}
	}
	var out []Violation
	if lat := r.End.Sub(r.Start); lat > c.b.Latency {
		out = append(out, at(RuleLatency, fmt.Sprintf("answered in %v, bound %v", lat.Round(time.Millisecond), c.b.Latency), all))
	}
	switch {
	case r.Status == 200 || r.Status == 429:
	case r.Status == 503:
		// 503 is the answer of a fail-closed policy that could not be
		// decided (docs/architecture.md, "the answer"): while its store is
		// gone, or when the answer says its store call missed the deadline
		// (degraded), which DegradedHealthy bounds over the run. A
		// fail-open policy never turns into an outage.
		vs := c.versions(r.Policy, r.Start.Add(-c.b.PolicySlack), r.End)
		closed := slices.ContainsFunc(vs, func(p PolicyState) bool { return p.OnStoreFailure == "closed" })
		gone := c.active(r.Start, r.End, c.b.Settle, r.Region, storeFaults...)
		if !closed || (len(gone) == 0 && !r.Degraded) {
			out = append(out, at(RuleServerError, fmt.Sprintf("503 for %s (fail-closed: %v) with its store up", r.Policy, closed), all))
		}
	case r.Status >= 500:
		out = append(out, at(RuleServerError, fmt.Sprintf("status %d", r.Status), all))
	default:
		out = append(out, at(RuleUnexpected, fmt.Sprintf("status %d", r.Status), all))
	}
	return out
}

// windowKey is one window of one policy for one subject, in one region
// for a regional policy and across all for a global one.
type windowKey struct {
	region, policy, subject string
	index                   int64
}

// admissions counts, per window, the admitted requests the window surely
// holds (sent and answered inside it: the decision fell between the two)
// and compares each count with its bound.
func (c *checker) admissions(reqs []Request) []Violation {
	windows := map[windowKey][]*Request{}
	for i := range reqs {
		r := &reqs[i]
		if !r.Admitted() || !r.Decided {
			continue
		}
		ps := c.versions(r.Policy, r.Start, r.End)
		if len(ps) == 0 || ps[len(ps)-1].Window <= 0 {
			continue
		}
		p := ps[len(ps)-1]
		w := p.Window
		i0, i1 := math.Floor(unixSec(r.Start)/w), math.Floor(unixSec(r.End)/w)
		if i0 != i1 {
			continue // across a window's edge: which window is unknown
		}
		k := windowKey{region: r.Region, policy: r.Policy, subject: r.Subject, index: int64(i0)}
		if p.Global {
			k.region = ""
		}
		windows[k] = append(windows[k], r)
	}
	var out []Violation
	for k, rs := range windows {
		if v, bad := c.window(k, rs); bad {
			out = append(out, v)
		}
	}
	return out
}

func unixSec(t time.Time) float64 { return float64(t.UnixMicro()) / 1e6 }

// window compares the admissions of one window with its bound.
func (c *checker) window(k windowKey, rs []*Request) (Violation, bool) {
	last := rs[0].Start
	for _, r := range rs {
		if r.Start.After(last) {
			last = r.Start
		}
	}
	ps := c.versions(k.policy, last, last)
	if len(ps) == 0 {
		return Violation{}, false
	}
	w := time.Duration(ps[len(ps)-1].Window * float64(time.Second))
	from := time.UnixMicro(k.index * w.Microseconds())
	to := from.Add(w)
	bound, faults, ok := c.bound(k, from, to, rs)
	if ok && k.subject == c.b.ChartSubject {
		c.charted = append(c.charted, WindowFigure{Key: k.region + "/" + k.policy, From: from, Admitted: len(rs), Bound: bound})
	}
	if !ok || float64(len(rs)) <= bound {
		return Violation{}, false
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].Start.Before(rs[j].Start) })
	first := rs[int(bound)] // the first admission past the bound
	return Violation{
		Rule: RuleOverAdmission, Time: first.Start, Key: fmt.Sprintf("%s/%s/%s@%s", k.region, k.policy, k.subject, from.UTC().Format(time.RFC3339)),
		Admitted: len(rs), Bound: bound, Request: first, Faults: names(faults),
		Detail: fmt.Sprintf("%d admitted in the window [%s, %s), bound %.1f", len(rs), from.UTC().Format("15:04:05"), to.UTC().Format("15:04:05"), bound),
	}, true
}

// bound is the most a window may admit, with the faults that widened it;
// ok is false when no bound holds (the policy out of force during it).
func (c *checker) bound(k windowKey, from, to time.Time, rs []*Request) (float64, []Span, bool) {
	vs := c.versions(k.policy, from.Add(-c.b.PolicySlack), to)
	limit := 0.0
	for _, v := range vs {
		if !v.Enforced {
			return 0, nil, false
		}
		limit = max(limit, v.Limit)
	}
	mode := vs[len(vs)-1].OnStoreFailure
	n := float64(max(c.b.DaemonsPerRegion, 1))
	if k.region != "" {
		// Within a region with its store healthy a window admits exactly
		// its limit (docs/algorithms.md, "fixed_window ... exact per window").
		// A daemon starting decides by on_store_failure until it reaches
		// Redis, and a check that waited too long for the store is decided
		// by it too, "degraded" (docs/architecture.md): both widen the
		// bound as a store failure does.
		gone := c.active(from, to, c.b.Settle, k.region, append(storeFaults, daemonFaults...)...)
		if len(gone) == 0 && !slices.ContainsFunc(rs, func(r *Request) bool { return r.Degraded }) {
			return limit, nil, true
		}
		return limit * (1 + storeExtra(mode, n)), gone, true
	}
	// A global policy: the regions' shares sum to at most 1, and the
	// overshoot is what the others admit within the report delay D of the
	// last admission (docs/architecture.md, "the bound on overshoot").
	bound := limit + float64(within(rs, c.b.ReportDelay))
	var faults []Span
	for _, region := range regionsOf(c.faults) {
		if gone := c.active(from, to, c.b.Settle, region, storeFaults...); len(gone) > 0 {
			bound += limit * storeExtra(mode, n)
			faults = append(faults, gone...)
		}
	}
	// A partitioned or paused region may enforce its share while the
	// others have reclaimed it, until the next rebalance: at most its share
	// more (docs/architecture.md, "losing a region: crash and partition").
	if cut := c.active(from, to, c.b.Settle, "", Partition, KillDaemon, RollRegion, PauseRedis); len(cut) > 0 {
		bound += limit
		faults = append(faults, cut...)
	}
	return bound, faults, true
}

// storeExtra is how many limits a window may admit beyond its own when
// its store failed during it (docs/architecture.md, the store failure and
// failover paragraphs): the writes a failover loses or a Redis restarted
// empty forgets, at most one limit more, plus what the fallback admits,
// by on_store_failure: open through an in-process limit at twice its rate
// per daemon, local at its rate divided among the region's daemons (each
// daemon counted alone, in case it sees no other alive), closed nothing.
func storeExtra(mode string, daemons float64) float64 {
	switch mode {
	case "open":
		return 1 + 2*daemons
	case "local":
		return 1 + daemons
	}
	return 1
}

// within is the most the other regions admitted of rs within d before
// one region's last admission of them.
func within(rs []*Request, d time.Duration) int {
	last := map[string]time.Time{}
	for _, r := range rs {
		if r.Start.After(last[r.Region]) {
			last[r.Region] = r.Start
		}
	}
	most := 0
	for region, l := range last {
		n := 0
		for _, r := range rs {
			if r.Region != region && !r.Start.Before(l.Add(-d)) && !r.Start.After(l) {
				n++
			}
		}
		most = max(most, n)
	}
	return most
}

func regionsOf(fs []Span) []string {
	var out []string
	for _, f := range fs {
		if !slices.Contains(out, f.Region) {
			out = append(out, f.Region)
		}
	}
	return out
}
