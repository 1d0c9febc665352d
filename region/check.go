package region

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/share"
)

// ShareSource gives the fraction of a global-scope policy's limit that this
// region enforces for a subject, in (0, 1]. The global-shares machinery
// supplies one; until then every region enforces the whole limit. Share is
// called on every check and must return at once, without I/O.
type ShareSource interface {
	Share(policy, subject string) float64
}

// QuotaSource gives, for a global quota (a scope: global fixed_window
// policy, e.g. a daily quota across regions), the units spent in window w
// (share.WindowIndex) that this daemon's engine state does not hold: the
// other regions' last known counts (and, with a per-daemon store, the
// region's other daemons'). The check admits while the engine's count plus
// that plus the cost stay within the limit. QuotaOthers is called on every
// check and must return at once, without I/O.
type QuotaSource interface {
	QuotaOthers(policy, subject string, w int64) uint64
}

// quotaScale is share.QuotaScale: the daemon and the simulator scale a
// global quota with one function.
func quotaScale(count float64, others uint64) float64 { return share.QuotaScale(count, others) }

// WholeShare is the default ShareSource: every region enforces the whole
// limit.
type WholeShare struct{}

// Share returns 1.
func (WholeShare) Share(string, string) float64 { return 1 }

// CheckRequest is the body of POST /v1/check and one element of a batch.
// Exactly one of api_key, user, ip, subject names the requester; ip may
// also accompany api_key or user, to count an unknown key by address.
type CheckRequest struct {
	quota.SubjectFields
	// Tier is the requester's tier as the calling gateway knows it; empty
	// means the key registry decides (or "anonymous").
	Tier string `json:"tier,omitempty"`
	// Method is the HTTP method of the request being limited; default GET.
	Method string `json:"method,omitempty"`
	// Route is its path (a query string is ignored); required. It is
	// matched in quota.NormalizeRoute's canonical form.
	Route string `json:"route"`
	// Cost, when given, replaces every policy's cost-table cost; zero
	// reads the state without spending.
	Cost *int64 `json:"cost,omitempty"`
}

// Decision is the JSON body of a check: the verdict, the deciding policy's
// figures and each policy's own.
type Decision struct {
	Allowed bool   `json:"allowed"`
	Subject string `json:"subject"`
	Tier    string `json:"tier"`
	// Policy is the deciding policy: the enforced one that rejected with
	// the longest retry, or, when allowed, the one with least remaining.
	// Empty when no policy applies.
	Policy       string `json:"policy,omitempty"`
	Mode         string `json:"mode,omitempty"`
	Limit        int64  `json:"limit"`
	Remaining    int64  `json:"remaining"`
	ResetMS      int64  `json:"reset_ms"`
	RetryAfterMS int64  `json:"retry_after_ms"`
	// WouldReject is true when a shadow policy would have rejected.
	WouldReject bool `json:"would_reject"`
	// Degraded is true when the store could not decide and the policies'
	// on_store_failure did.
	Degraded bool `json:"degraded"`
	// Source is store, deny_cache, fallback or none (no enforced policy).
	Source   string         `json:"source"`
	Policies []PolicyResult `json:"policies"`
	// Exempt lists the policies that matched the request but that the
	// subject is exempt from (an unlimited override in force), so that an
	// operator can see why they did not limit it. They were not evaluated:
	// no state was read or written for them and they are in no header.
	Exempt []ExemptResult `json:"exempt,omitempty"`
}

// ExemptResult is a policy a Decision's subject is exempt from.
type ExemptResult struct {
	ID      string `json:"id"`
	Version int    `json:"version"`
	Mode    string `json:"mode"`
	Class   string `json:"class"`
	Scope   string `json:"scope"`
	// Override is the id of the unlimited override that exempts the
	// subject; it applies until ExpiresAt (RFC 3339, UTC).
	Override  string    `json:"override"`
	ExpiresAt time.Time `json:"expires_at"`
}

func exemptResults(ex []quota.Exemption) []ExemptResult {
	if len(ex) == 0 {
		return nil
	}
	out := make([]ExemptResult, len(ex))
	for i, e := range ex {
		p := e.Policy
		out[i] = ExemptResult{ID: p.ID, Version: p.Version, Mode: p.Mode, Class: p.Class, Scope: p.Scope, Override: e.Override, ExpiresAt: e.ExpiresAt.UTC()}
	}
	return out
}

// PolicyResult is one policy's figures in a Decision.
type PolicyResult struct {
	ID      string `json:"id"`
	Version int    `json:"version"`
	Mode    string `json:"mode"`
	Class   string `json:"class"`
	Scope   string `json:"scope"`
	// Allowed is this policy's own verdict. For a shadow policy it is
	// what enforcing it would have answered; it never rejects.
	Allowed bool `json:"allowed"`
	// WouldReject is set on shadow policies that would have rejected.
	WouldReject bool `json:"would_reject,omitempty"`
	// Evaluated is false for a shadow policy that was not decided because
	// an enforced policy rejected the request (see docs/api.md).
	Evaluated    bool    `json:"evaluated"`
	Cost         int64   `json:"cost"`
	Limit        int64   `json:"limit"`
	Remaining    int64   `json:"remaining"`
	ResetMS      int64   `json:"reset_ms"`
	RetryAfterMS int64   `json:"retry_after_ms"`
	Scale        float64 `json:"scale,omitempty"`
	Override     string  `json:"override,omitempty"`
	Degraded     bool    `json:"degraded,omitempty"`
}

// verdict is a decided check with what the HTTP layer needs.
type verdict struct {
	Decision
	status     int           // 200, 429 or 503
	retryAfter time.Duration // of the deciding enforced policy; zero when allowed
	headers    []headerItem  // enforced, non-security policies
	violated   []string      // enforced policies that rejected
	// violatedPublic leaves out security policies, for client-facing bodies.
	violatedPublic []string
	securityOnly   bool // every violated policy is class security
}

var (
	methodPattern = regexp.MustCompile(`^[A-Za-z]{1,32}$`)
)

// validMethod reports whether m matches methodPattern, without the
// regular expression: it is on the path of every check.
func validMethod(m string) bool {
	if m == "" || len(m) > 32 {
		return false
	}
	for i := 0; i < len(m); i++ {
		if c := m[i] | 0x20; c < 'a' || c > 'z' {
			return false
		}
	}
	return true
}

const maxRouteLen = 4096

func validRoute(route string) error {
	switch {
	case route == "":
		return errors.New("required: the path of the request being limited, e.g. /v1/orders")
	case len(route) > maxRouteLen:
		return fmt.Errorf("longer than %d bytes", maxRouteLen)
	case route[0] != '/':
		return fmt.Errorf("must start with /, got %q", clipStr(route))
	}
	for i := 0; i < len(route); i++ {
		if c := route[i]; c < 0x20 || c == 0x7f {
			return errors.New("must not contain control characters")
		}
	}
	return nil
}

func clipStr(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// target is a resolved request to limit.
type target struct {
	id     quota.Identity
	method string
	route  string
	cost   *int64
	field  string // prefix for field names in problems ("" or "checks[3]")
}

// checkRequest validates a CheckRequest into a target.
func (in *CheckRequest) target(prefix string) (target, *Problem) {
	at := func(f string) string {
		if prefix == "" {
			return f
		}
		if f == "" {
			return prefix
		}
		return prefix + "." + f
	}
	id, err := in.SubjectFields.Identity()
	if err != nil {
		if p, ok := fromValidation(err, prefix); ok {
			return target{}, p
		}
		return target{}, invalid(at(""), "%v", err)
	}
	if in.Tier != "" {
		if !quota.ValidID(in.Tier) {
			return target{}, invalid(at("tier"), "must match %s, got %q", quota.IDPattern, clipStr(in.Tier))
		}
		id.Tier = in.Tier
	}
	method := in.Method
	if method == "" {
		method = http.MethodGet
	} else if !validMethod(method) {
		return target{}, invalid(at("method"), "must be an HTTP method such as GET, got %q", clipStr(method))
	}
	if err := validRoute(in.Route); err != nil {
		return target{}, invalid(at("route"), "%v", err)
	}
	if in.Cost != nil && *in.Cost < 0 {
		return target{}, invalid(at("cost"), "must not be negative, got %d", *in.Cost)
	}
	return target{id: id, method: strings.ToUpper(method), route: quota.NormalizeRoute(in.Route), cost: in.Cost, field: prefix}, nil
}

func failureOf(s string) engine.Failure {
	switch s {
	case quota.FailClosed:
		return engine.FailClosed
	case quota.FailLocal:
		return engine.FailLocal
	}
	return engine.FailOpen
}

// decide resolves t to policies and asks the engine. Enforced and shadow
// policies are decided in two separate engine calls: the enforced ones
// first, atomically, as the verdict; then, only if they allowed, the shadow
// ones, which spend their own state exactly as enforcing them would have
// and can never turn an admission into a rejection or stop an enforced
// policy from spending. When the enforced set rejects, the request would
// have spent nothing under a shadow policy either, so the shadow policies
// are not evaluated (Evaluated false) and their state stays as it was.
// Policies the subject is exempt from are not decided at all: they are
// listed in Exempt and nowhere else.
func (d *Daemon) decide(ctx context.Context, t target) (verdict, *Problem) {
	who := d.reg.Resolve(t.id)
	var buf [2 * engine.MaxChecks]quota.Applied
	var exBuf [engine.MaxChecks]quota.Exemption
	applied, exempt := d.reg.AppendMatchExempt(buf[:0], exBuf[:0], quota.Query{Tier: who.Tier, Subject: who.Subject, Method: t.method, Route: t.route})
	return d.decideApplied(ctx, who, applied, exempt, t.cost, t.field, t.method, t.route)
}

// decideApplied decides the policies matched for who (see decide); cost,
// when not nil, replaces every policy's cost, and field prefixes the
// fields named in problems. method and route only describe the request
// in decision events.
func (d *Daemon) decideApplied(ctx context.Context, who quota.Principal, applied []quota.Applied, exempt []quota.Exemption, costOverride *int64, field, method, route string) (verdict, *Problem) {
	v := verdict{status: http.StatusOK}
	v.Allowed = true
	v.Subject, v.Tier = who.Subject, who.Tier
	v.Source = "none"
	v.Policies = make([]PolicyResult, len(applied))
	v.Exempt = exemptResults(exempt)

	// The engine keeps its request's checks beyond the stack (they go
	// through the store interface), so both sets share one allocation of
	// exactly their size: the enforced checks first, then the shadow ones.
	var checks []engine.Check
	nEnforced := 0
	for i := range applied {
		if applied[i].Policy.Mode == quota.ModeEnforce {
			nEnforced++
		}
	}
	if len(applied) > 0 {
		checks = make([]engine.Check, len(applied))
	}
	enforced, shadow := checks[:nEnforced:nEnforced], checks[nEnforced:]
	var enfIdx, shIdx [engine.MaxChecks]int
	var quotaAt [engine.MaxChecks]bool // enforced global quotas
	ne, ns := 0, 0
	for i, a := range applied {
		p := a.Policy
		cost := a.Cost
		if costOverride != nil {
			cost = *costOverride
			if err := a.Limit.ValidateCost(cost); err != nil {
				reason := err.Error()
				var le *engine.LimitError
				if errors.As(err, &le) {
					reason = le.Reason
				}
				f := "cost"
				if field != "" {
					f = field + ".cost"
				}
				return verdict{}, invalid(f, "policy %s cannot admit it: %s", p.ID, reason)
			}
		}
		scale := 1.0
		track := false
		isQuota := false
		if p.Scope == quota.ScopeGlobal {
			if d.quotas != nil && a.Limit.Algorithm == engine.FixedWindow {
				// A global quota: the G-counter rule, not a share.
				isQuota = true
				others := d.quotas.QuotaOthers(p.ID, who.Subject, share.WindowIndex(d.now(), a.Limit.Window))
				scale = share.QuotaScale(a.Limit.Count, others)
			} else {
				scale = share.Scale(d.shares.Share(p.ID, who.Subject))
			}
			track = d.cl != nil // only a coordinator drains usage
		}
		c := engine.Check{Policy: a.StateName(), Limit: a.Limit, Cost: cost, Scale: scale, Version: uint64(p.Version), OnFailure: failureOf(p.OnStoreFailure)}
		v.Policies[i] = PolicyResult{ID: p.ID, Version: p.Version, Mode: p.Mode, Class: p.Class, Scope: p.Scope, Cost: cost, Override: a.Override, Allowed: true}
		if p.Scope == quota.ScopeGlobal {
			v.Policies[i].Scale = scale
		}
		// Shadow policies are tracked too: a global one previews what
		// enforcement would do, which depends on what every region admits
		// (its share, or its quota's count), so the others must hear of it.
		c.Track = track
		if p.Mode == quota.ModeEnforce {
			quotaAt[ne] = isQuota
			enforced[ne], enfIdx[ne] = c, i
			ne++
		} else {
			shadow[ns], shIdx[ns] = c, i
			ns++
		}
	}

	start := time.Now()
	defer func() { d.m.duration.Observe(time.Since(start).Seconds()) }()

	decider := -1
	if ne > 0 {
		out, err := d.lim.Check(ctx, engine.Request{Subject: who.Subject, Checks: enforced[:ne]})
		if err != nil {
			if ctx.Err() != nil {
				return verdict{}, newProblem(http.StatusServiceUnavailable, ProblemUnavailable, "the request was cancelled before it was decided")
			}
			return verdict{}, invalid(field, "%v", err)
		}
		for j := 0; j < ne; j++ {
			// A global quota never needs more than its window's end: the
			// others' counts start again from zero in the next window.
			if r := &out.Results[j]; quotaAt[j] && !r.Allowed && r.RetryAfter > r.ResetAfter {
				r.RetryAfter = r.ResetAfter
			}
		}
		v.Source = out.Source.String()
		v.Degraded = out.Degraded
		v.Allowed = out.Allowed
		for j := 0; j < ne; j++ {
			r := out.Results[j]
			pr := &v.Policies[enfIdx[j]]
			fill(pr, r)
			pr.Degraded = out.Degraded
			p := applied[enfIdx[j]].Policy
			if !r.Allowed && !out.Allowed {
				if v.violated == nil {
					// One allocation for both lists, each of at most ne.
					ids := make([]string, 0, 2*ne)
					v.violated, v.violatedPublic = ids[:0:ne], ids[ne:ne]
				}
				v.violated = append(v.violated, p.ID)
				if p.Class != quota.ClassSecurity {
					v.violatedPublic = append(v.violatedPublic, p.ID)
				}
			}
			if p.Class != quota.ClassSecurity {
				l := a(applied, enfIdx[j]).Limit.Scale(enforced[j].Scale)
				tSec := ceilSeconds(r.ResetAfter)
				if !r.Allowed {
					// Retry-After must not point before the end of the
					// effective window (draft -11 §6), so a rejecting
					// policy's window ends when it would admit.
					tSec = max(ceilSeconds(r.RetryAfter), 1)
				}
				v.headers = append(v.headers, headerItem{
					Name: p.ID, Quota: r.Limit,
					Window:    windowSeconds(l.Algorithm.Windowed(), l.Window, l.Rate, l.Burst),
					Available: r.Remaining, T: tSec,
				})
			}
		}
		if out.Decider >= 0 {
			decider = enfIdx[out.Decider]
		}
		if !out.Allowed {
			v.retryAfter = out.RetryAfter()
			v.status = http.StatusTooManyRequests
			if out.Unavailable {
				v.status = http.StatusServiceUnavailable
			}
			v.securityOnly = len(v.violatedPublic) == 0
		}
	}

	shadowSource := "none"
	if ns > 0 && v.Allowed {
		out, err := d.lim.Check(ctx, engine.Request{Subject: who.Subject, Checks: shadow[:ns]})
		if err == nil {
			shadowSource = out.Source.String()
			for j := 0; j < ns; j++ {
				r := out.Results[j]
				pr := &v.Policies[shIdx[j]]
				fill(pr, r)
				pr.Degraded = out.Degraded
				pr.Allowed = true
				if !r.Allowed && !out.Unavailable {
					pr.WouldReject = true
					v.WouldReject = true
					d.m.wouldReject.WithLabelValues(pr.ID).Inc()
				}
			}
			if decider < 0 && out.Decider >= 0 {
				decider = shIdx[out.Decider]
			}
		}
	}

	if decider >= 0 {
		pr := v.Policies[decider]
		v.Policy, v.Mode = pr.ID, pr.Mode
		v.Limit, v.Remaining, v.ResetMS, v.RetryAfterMS = pr.Limit, pr.Remaining, pr.ResetMS, pr.RetryAfterMS
		if pr.Mode != quota.ModeEnforce {
			v.RetryAfterMS = 0
		}
	}
	decision := 0 // allowed
	switch v.status {
	case http.StatusTooManyRequests:
		decision = 1
	case http.StatusServiceUnavailable:
		decision = 2
	}
	d.observe(&v, method, route, decision, shadowSource)
	return v, nil
}

// checkSeries holds the series of sluice_checks_total as they are first
// used, so that a check counts itself without hashing its labels: by
// decision (allowed, rejected, unavailable) and source.
type checkSeries struct {
	c [3][len(checkSources)]atomic.Pointer[prometheus.Counter]
}

var (
	checkDecisions = [3]string{"allowed", "rejected", "unavailable"}
	checkSources   = [...]string{"store", "deny_cache", "fallback", "none"}
)

// counter is the series of checkDecisions[decision] and source.
func (cs *checkSeries) counter(vec *prometheus.CounterVec, decision int, source string) prometheus.Counter {
	si := slices.Index(checkSources[:], source)
	if si < 0 {
		return vec.WithLabelValues(checkDecisions[decision], source)
	}
	p := &cs.c[decision][si]
	if c := p.Load(); c != nil {
		return *c
	}
	c := vec.WithLabelValues(checkDecisions[decision], source)
	p.Store(&c)
	return c
}

func a(applied []quota.Applied, i int) quota.Applied { return applied[i] }

func fill(pr *PolicyResult, r engine.Result) {
	pr.Evaluated = true
	pr.Allowed = r.Allowed
	pr.Limit, pr.Remaining = r.Limit, r.Remaining
	pr.ResetMS = ceilMS(r.ResetAfter)
	pr.RetryAfterMS = ceilMS(r.RetryAfter)
}

func ceilMS(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// setRateLimitHeaders writes RateLimit-Policy, RateLimit and, when
// rejected, Retry-After (whole seconds, rounded up).
func setRateLimitHeaders(h http.Header, v *verdict) {
	setRateLimitFields(h, v.headers)
	if v.status != http.StatusOK {
		h["Retry-After"] = []string{strconv.FormatInt(max(ceilSeconds(v.retryAfter), 1), 10)}
	}
}

// rejection is the problem+json of a 429 or 503 verdict (design 4.2 with
// the draft's problem types). Security policies are never named.
func rejection(v *verdict) *Problem {
	retry := max(ceilSeconds(v.retryAfter), 1)
	ms := ceilMS(v.retryAfter)
	p := &Problem{Status: v.status, RetryAfterMS: &ms, ViolatedPolicies: v.violatedPublic}
	switch {
	case v.status == http.StatusServiceUnavailable:
		p.Type = ProblemReducedCapacity
		p.Title = "Service Unavailable"
		p.Detail = fmt.Sprintf("The rate limit could not be decided and this route fails closed; retry in %d s.", retry)
	case v.securityOnly:
		p.Type = ProblemAbnormalUsage
		p.Title = "Too Many Requests"
		p.Detail = fmt.Sprintf("Too many attempts; retry in %d s.", retry)
	default:
		p.Type = ProblemQuotaExceeded
		p.Title = "Too Many Requests"
		p.Detail = fmt.Sprintf("Policy %q allows %d requests per %d s for this client; retry in %d s.",
			v.violatedPublic[0], headerQuota(v, v.violatedPublic[0]), headerWindow(v, v.violatedPublic[0]), retry)
	}
	return p
}

func headerQuota(v *verdict, id string) int64 {
	for _, h := range v.headers {
		if h.Name == id {
			return h.Quota
		}
	}
	return 0
}

func headerWindow(v *verdict, id string) int64 {
	for _, h := range v.headers {
		if h.Name == id {
			return h.Window
		}
	}
	return 0
}
