// Package decide is Sluice's decision as a library: a Decider resolves the
// subject of a check, matches its policies, scales the global ones by the
// region's share, decides the enforced policies and then the shadow ones
// with a limiter, and shapes the answer: the decision, the RateLimit
// fields and the problem documents. The daemon's HTTP API (package
// region), the Envoy rate limit service (package rls) and the in-process
// client (package client/local) are its front ends; none of them holds
// the decision itself.
//
// A Decider does no I/O but its limiter's, dates global quotas' windows by
// its Config's Clock, and reports what it decided to an Observer, so that
// it links no metrics library and no transport.
package decide

import (
	"context"
	"net/http"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/quota"
)

// Limiter decides a request's checks in one all-or-nothing call; a
// *limiter.Limiter (engine/limiter) is one.
type Limiter interface {
	Check(ctx context.Context, req engine.Request) (engine.Outcome, error)
}

// ShareSource gives the fraction of a global-scope policy's limit that this
// region enforces for a subject, in (0, 1]. The global-shares machinery
// supplies one; until then every region enforces the whole limit. policy
// is the name of the state the check counts in (quota.Applied.StateName):
// the policy id, or for a descriptor policy that a caller matched, the
// descriptor's state (quota.PolicyOfState gives its policy). It is the
// name the limiter tracks the check's usage under (Config.Track). Share is
// called on every check and must return at once, without I/O.
type ShareSource interface {
	Share(policy, subject string) float64
}

// QuotaSource gives, for a global quota (a scope: global fixed_window
// policy, e.g. a daily quota across regions), the units spent in window w
// (share.WindowIndex) that this daemon's engine state does not hold: the
// other regions' last known counts (and, with a per-daemon store, the
// region's other daemons'). policy is the state's name, as for
// ShareSource. The check admits while the engine's count plus that plus
// the cost stay within the limit. QuotaOthers is called on every check and
// must return at once, without I/O.
type QuotaSource interface {
	QuotaOthers(policy, subject string, w int64) uint64
}

// WholeShare is the default ShareSource: every region enforces the whole
// limit.
type WholeShare struct{}

// Share returns 1.
func (WholeShare) Share(string, string) float64 { return 1 }

// Observer hears of every decided check, for metrics and decision events.
// Its methods are called on the check path and must return at once,
// without I/O; they must not keep v's slices, which the front end still
// answers with.
type Observer interface {
	// Decided is called once per decided check with its verdict, the
	// limited request's method and route (empty when the policies were
	// matched by the caller) and the source of the shadow policies'
	// decision ("none" when they were not decided).
	Decided(v Verdict, method, route, shadowSource string)
	// Took is the time the limiter calls of one check took, with the
	// Decided call; it is called also when the limiter failed.
	Took(d time.Duration)
}

// Clock tells the time; nil is real time. It dates global quotas' windows.
type Clock interface{ Now() time.Time }

// Config configures a Decider.
type Config struct {
	// Limiter decides the checks; required.
	Limiter Limiter
	// Registry holds the policies, overrides and keys; required.
	Registry *quota.Registry
	// Shares scales global-scope policies; nil is WholeShare.
	Shares ShareSource
	// Quotas, when set, counts global quotas (global fixed-window
	// policies) across regions instead of scaling them by Shares.
	Quotas QuotaSource
	// Track marks the checks of global-scope policies for the limiter to
	// record their usage, which a share coordinator drains.
	Track bool
	// Observer hears of every decided check; nil hears nothing.
	Observer Observer
	// Clock is the time source; nil is real time.
	Clock Clock
}

// Decider decides checks: the same validation, policy matching,
// exemptions, overrides, enforced then shadow evaluation, failure modes,
// rejection problems and RateLimit fields for every front end. A Decider
// is safe for concurrent use.
type Decider struct {
	lim    Limiter
	reg    *quota.Registry
	shares ShareSource
	quotas QuotaSource
	track  bool
	obs    Observer
	clock  Clock
}

// New returns a Decider configured by cfg.
func New(cfg Config) *Decider {
	dc := &Decider{lim: cfg.Limiter, reg: cfg.Registry, shares: cfg.Shares, quotas: cfg.Quotas,
		track: cfg.Track, obs: cfg.Observer, clock: cfg.Clock}
	if dc.shares == nil {
		dc.shares = WholeShare{}
	}
	if dc.obs == nil {
		dc.obs = nopObserver{}
	}
	return dc
}

// nopObserver is the Observer of a Config without one.
type nopObserver struct{}

// Decided does nothing.
func (nopObserver) Decided(Verdict, string, string, string) {}

// Took does nothing.
func (nopObserver) Took(time.Duration) {}

// now is the time on the Decider's clock.
func (dc *Decider) now() time.Time {
	if dc.clock != nil {
		return dc.clock.Now()
	}
	return time.Now()
}

// Decide resolves t to its policies and decides them. Enforced and shadow
// policies are decided in two separate limiter calls: the enforced ones
// first, atomically, as the verdict; then, only if they allowed, the
// shadow ones, which spend their own state exactly as enforcing them
// would have and can never turn an admission into a rejection or stop an
// enforced policy from spending. When the enforced set rejects, the
// request would have spent nothing under a shadow policy either, so the
// shadow policies are not evaluated (Evaluated false) and their state
// stays as it was. Policies the subject is exempt from are not decided at
// all: they are listed in Exempt and nowhere else. A limited request is a
// Verdict; a problem is an input the limiter refuses (400) or a cancelled
// context (503).
func (dc *Decider) Decide(ctx context.Context, t Target) (Verdict, *Problem) {
	who := dc.resolve(t.ID)
	var buf [2 * engine.MaxChecks]quota.Applied
	var exBuf [engine.MaxChecks]quota.Exemption
	applied, exempt := dc.match(buf[:0], exBuf[:0], who, t)
	return dc.decideApplied(ctx, who, applied, exempt, t)
}

// decideApplied decides the policies matched for who (see Decide) in its
// stages: scale, enforce, shadow, answer. t gives the cost override, the
// field prefix of problems and, for the Observer, the method and route.
func (dc *Decider) decideApplied(ctx context.Context, who quota.Principal, applied []quota.Applied, exempt []quota.Exemption, t Target) (Verdict, *Problem) {
	v := newVerdict(who, applied, exempt)
	var pl plan
	if p := dc.scale(&pl, &v, who, applied, t.Cost, t.Field); p != nil {
		return Verdict{}, p
	}
	start := time.Now()
	defer func() { dc.obs.Took(time.Since(start)) }()
	decider, p := dc.enforce(ctx, &pl, &v, who, applied, t.Field)
	if p != nil {
		return Verdict{}, p
	}
	shadowSource := dc.shadow(ctx, &pl, &v, who, &decider)
	if t.Reservation != "" && v.Allowed && v.Status == http.StatusOK && !v.Degraded {
		held := append(append([]engine.Check(nil), pl.enforced[:pl.ne]...), pl.shadow[:pl.ns]...)
		if p := dc.reserve(ctx, t, who, held); p != nil {
			return Verdict{}, p
		}
	}
	dc.answer(&v, decider)
	dc.obs.Decided(v, t.Method, t.Route, shadowSource)
	return v, nil
}
