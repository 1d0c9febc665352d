package decide

import (
	"time"

	"github.com/sluice-rl/sluice/quota"
)

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

// ExemptResults lists ex as a Decision does; nil when ex is empty.
func ExemptResults(ex []quota.Exemption) []ExemptResult {
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

// Verdict is a decided check with what a front end needs to answer it.
type Verdict struct {
	Decision
	// Status is 200 (allowed), 429 (limited) or 503 (the store could not
	// decide and a policy fails closed).
	Status int
	// RetryAfter is the deciding enforced policy's; zero when allowed.
	RetryAfter time.Duration
	// Headers holds the RateLimit items of the enforced policies that are
	// not class security, one per policy in order.
	Headers []HeaderItem
	// Violated lists the enforced policies that rejected;
	// ViolatedPublic leaves out the security ones, for client-facing
	// bodies.
	Violated, ViolatedPublic []string
	// SecurityOnly is true when every violated policy is class security.
	SecurityOnly bool
}

// Outcome is 0 when v allowed, 1 when it limited (429) and 2 when the
// store could not decide (503): the index of its decision label.
func (v *Verdict) Outcome() int {
	switch v.Status {
	case 429:
		return 1
	case 503:
		return 2
	}
	return 0
}
