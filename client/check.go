package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/sluice-rl/sluice/decide"
)

// CheckRequest is the body of POST /v1/check: exactly one of api_key,
// user, ip, subject names the requester (ip may accompany api_key or user),
// Route is the path of the request being limited; Cost, when set, replaces
// every policy's cost (zero reads the state without spending). It has the
// daemon's fields (decide.CheckRequest) and none of its methods.
type CheckRequest decide.CheckRequest

// Decision is a check's answer: the JSON body of POST /v1/check
// (decide.Decision: the verdict, the deciding policy's figures and each
// policy's own; Source is store, deny_cache, fallback or none as the daemon
// answers it, "client" when Fallback is set), plus the HTTP status and the
// rate-limit headers it came with.
type Decision struct {
	decide.Decision

	// Status is 200 (allowed), 429 (limited) or 503 (the limit could not
	// be decided and the route fails closed).
	Status int `json:"-"`
	// Header holds the answer's RateLimit-Policy, RateLimit and
	// Retry-After fields, to be copied onto the limited response as is.
	Header http.Header `json:"-"`
	// Problem is the 429 or 503 answer's problem members: type, title,
	// detail and the violated policies. Nil when allowed.
	Problem *Problem `json:"-"`
	// Fallback is true when the daemon could not be asked and the
	// Client's FailureMode decided; Err is why.
	Fallback bool  `json:"-"`
	Err      error `json:"-"`
}

// ResetAfter is the time until the deciding policy is full again.
func (d *Decision) ResetAfter() time.Duration { return time.Duration(d.ResetMS) * time.Millisecond }

// RetryAfter is the time after which a rejected request may be retried;
// zero when allowed.
func (d *Decision) RetryAfter() time.Duration {
	return time.Duration(d.RetryAfterMS) * time.Millisecond
}

// PolicyResult is one policy's figures in a Decision or a Usage.
type PolicyResult = decide.PolicyResult

// ExemptResult is a policy the subject is exempt from by an unlimited
// override, until ExpiresAt.
type ExemptResult = decide.ExemptResult

// rateLimitHeaders are the fields of a check's answer that a limited
// response carries.
var rateLimitHeaders = []string{"Ratelimit-Policy", "Ratelimit", "Retry-After"}

// Check asks the daemon whether req may proceed. A limited request is a
// Decision with Allowed false, not an error. Bad input is a *Problem
// naming the field, whatever the FailureMode. A daemon that cannot be
// asked is an error wrapping ErrUnavailable under FailError, and a
// fallback Decision under FailOpen and FailClosed.
func (c *Client) Check(ctx context.Context, req CheckRequest) (*Decision, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("check: %w", err)
	}
	r, err := c.do(ctx, http.MethodPost, "/v1/check", nil, body, false)
	if err != nil {
		return c.fallback(err)
	}
	switch r.status {
	case http.StatusOK, http.StatusTooManyRequests, http.StatusServiceUnavailable:
	default:
		if r.status >= 400 && r.status < 500 {
			return nil, c.problemOf("POST", "/v1/check", r) // bad input
		}
		if r.status >= 500 {
			return c.fallback(c.problemOf("POST", "/v1/check", r))
		}
		return c.fallback(&unavailableError{c.base.Host, fmt.Errorf("POST /v1/check: unexpected %d answer", r.status)})
	}
	d := &Decision{Status: r.status, Header: http.Header{}}
	if err := json.Unmarshal(r.body, d); err != nil || d.Source == "" {
		// A 503 from something in front of the daemon, without a decision.
		if r.status == http.StatusServiceUnavailable {
			return c.fallback(c.problemOf("POST", "/v1/check", r))
		}
		return c.fallback(&unavailableError{c.base.Host, fmt.Errorf("POST /v1/check: %d answer is not a decision", r.status)})
	}
	if r.status != http.StatusOK {
		var p Problem
		if json.Unmarshal(r.body, &p) == nil {
			d.Problem = &p
		}
	}
	for _, k := range rateLimitHeaders {
		if vs := r.header[k]; len(vs) > 0 {
			d.Header[k] = vs
		}
	}
	return d, nil
}

// fallback is Check's answer when the daemon could not decide: the error,
// or the FailureMode's Decision.
func (c *Client) fallback(err error) (*Decision, error) {
	switch c.mode {
	case FailOpen:
		return &Decision{Decision: decide.Decision{Allowed: true, Degraded: true, Source: "client"}, Status: http.StatusOK,
			Header: http.Header{}, Fallback: true, Err: err}, nil
	case FailClosed:
		retry := FallbackRetryAfter
		ms := retry.Milliseconds()
		return &Decision{Decision: decide.Decision{Degraded: true, Source: "client", RetryAfterMS: ms}, Status: http.StatusServiceUnavailable,
			Header: http.Header{"Retry-After": {strconv.FormatInt(int64(retry/time.Second), 10)}},
			Problem: &Problem{Type: "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity",
				Title: "Service Unavailable", Status: http.StatusServiceUnavailable,
				Detail: "The rate limit could not be decided and this route fails closed; retry in 1 s.", RetryAfterMS: &ms},
			Fallback: true, Err: err}, nil
	}
	return nil, err
}

// BatchItem is one answer of CheckBatch: the status the single check would
// have had and its decision, or its problem.
type BatchItem struct {
	Status   int       `json:"status"`
	Decision *Decision `json:"decision,omitempty"`
	Problem  *Problem  `json:"problem,omitempty"`
}

// CheckBatch decides up to 100 checks in one call (POST /v1/check/batch),
// each on its own, in order. Decisions in a batch carry no headers. A
// daemon that cannot be asked is an error whatever the FailureMode.
func (c *Client) CheckBatch(ctx context.Context, reqs []CheckRequest) ([]BatchItem, error) {
	var out struct {
		Results []BatchItem `json:"results"`
	}
	in := struct {
		Checks []CheckRequest `json:"checks"`
	}{reqs}
	if in.Checks == nil {
		in.Checks = []CheckRequest{}
	}
	body, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("check batch: %w", err)
	}
	r, err := c.do(ctx, http.MethodPost, "/v1/check/batch", nil, body, false)
	if err != nil {
		return nil, err
	}
	if r.status != http.StatusOK {
		return nil, c.problemOf("POST", "/v1/check/batch", r)
	}
	if err := json.Unmarshal(r.body, &out); err != nil {
		return nil, &unavailableError{c.base.Host, fmt.Errorf("POST /v1/check/batch: the answer is not the expected JSON: %w", err)}
	}
	for _, it := range out.Results {
		if it.Decision != nil {
			it.Decision.Status = it.Status
		}
	}
	return out.Results, nil
}
