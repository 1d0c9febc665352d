package decide

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
)

// Answer is what POST /v1/check answers for a decided check: the status,
// the decision, the header fields and, when limited, the problem members
// of the body.
type Answer struct {
	// Status is 200 (allowed), 429 (limited) or 503 (the store could not
	// decide and a policy fails closed).
	Status int
	// Decision is the body's decision.
	Decision Decision
	// Header holds RateLimit-Policy and RateLimit (when an enforced policy
	// that is not class security applied) and, when Status is not 200,
	// Retry-After in whole seconds, under their canonical keys.
	Header http.Header
	// Problem is nil when allowed; else the 429 or 503 body's problem
	// members. As in the daemon's answer, which goes to the gateway and
	// not to the client, ViolatedPolicies names every violated policy,
	// class security ones too, and RetryAfterMS is the decision's.
	// Instance is empty: there is no request path.
	Problem *Problem
}

// Check validates in and decides it exactly as a daemon's POST /v1/check
// decides its body. Bad input is a 400 problem naming the field; a
// cancelled context is a 503 problem. A limited request is an answer, not
// a problem.
func (dc *Decider) Check(ctx context.Context, in CheckRequest) (Answer, *Problem) {
	t, p := in.Target("")
	if p != nil {
		return Answer{}, p
	}
	v, p := dc.Decide(ctx, t)
	if p != nil {
		return Answer{}, p
	}
	out := Answer{Status: v.Status, Decision: v.Decision, Header: http.Header{}}
	SetRateLimitHeaders(out.Header, &v)
	if v.Status != http.StatusOK {
		prob := Rejection(&v)
		ms := v.RetryAfterMS
		out.Problem = &Problem{Type: prob.Type, Title: prob.Title, Status: prob.Status, Detail: prob.Detail,
			ViolatedPolicies: v.Violated, RetryAfterMS: &ms}
	}
	return out, nil
}

// SetRateLimitHeaders writes v's RateLimit-Policy, RateLimit and, when
// rejected, Retry-After (whole seconds, rounded up) into h.
func SetRateLimitHeaders(h http.Header, v *Verdict) {
	SetRateLimitFields(h, v.Headers)
	if v.Status != http.StatusOK {
		h["Retry-After"] = []string{strconv.FormatInt(max(ceilSeconds(v.RetryAfter), 1), 10)}
	}
}

// Rejection is the problem document of a 429 or 503 verdict, with the
// RateLimit draft's problem types. Security policies are never named.
func Rejection(v *Verdict) *Problem {
	retry := max(ceilSeconds(v.RetryAfter), 1)
	ms := ceilMS(v.RetryAfter)
	p := &Problem{Status: v.Status, RetryAfterMS: &ms, ViolatedPolicies: v.ViolatedPublic}
	switch {
	case v.Status == http.StatusServiceUnavailable:
		p.Type = ProblemReducedCapacity
		p.Title = "Service Unavailable"
		p.Detail = fmt.Sprintf("The rate limit could not be decided and this route fails closed; retry in %d s.", retry)
	case v.SecurityOnly:
		p.Type = ProblemAbnormalUsage
		p.Title = "Too Many Requests"
		p.Detail = fmt.Sprintf("Too many attempts; retry in %d s.", retry)
	default:
		id := v.ViolatedPublic[0]
		it := v.header(id)
		p.Type = ProblemQuotaExceeded
		p.Title = "Too Many Requests"
		p.Detail = fmt.Sprintf("Policy %q allows %d requests per %d s for this client; retry in %d s.",
			id, it.Quota, it.Window, retry)
	}
	return p
}

// header is the first RateLimit item of policy id; zero if there is none.
func (v *Verdict) header(id string) HeaderItem {
	for _, h := range v.Headers {
		if h.Name == id {
			return h
		}
	}
	return HeaderItem{}
}
