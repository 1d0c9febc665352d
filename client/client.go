// Package client talks to a Sluice daemon (`sluice serve`) over HTTP: the
// check API, which a service asks once per request, and the admin API,
// which the `sluice` CLI uses.
//
// A Client reuses its connections and puts a deadline on every call. What
// a check answers when the daemon cannot be asked (down, too slow, or
// answering 5xx without a decision) is the caller's choice: the error
// itself, an admission (fail open) or a rejection (fail closed); see
// FailureMode.
//
// The wire types are the daemon's own, not mirrors: the check types are
// package decide's and the admin bodies package adminapi's, leaf packages
// that link no store, gossip, metrics or gRPC, so that a service can import
// this package without the daemon's dependencies; the policy, override and
// subject types are package quota's (which brings package engine). Only
// Decision and BatchItem are the client's: Decision embeds decide.Decision
// and adds what the client learns beside the body (status, header, problem,
// fallback), and TestWireTypesMatchDaemon holds their JSON fields equal to
// the daemon's.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/decide"
)

// FailureMode is what Check answers when the daemon could not decide.
type FailureMode int

const (
	// FailError returns the error: the caller decides.
	FailError FailureMode = iota
	// FailOpen admits the request: a Decision with Allowed, Fallback and
	// Err set, Status 200.
	FailOpen
	// FailClosed rejects it as unavailable: a Decision with Fallback and
	// Err set, Status 503 and a Retry-After of FallbackRetryAfter.
	FailClosed
)

// String is "error", "open" or "closed".
func (m FailureMode) String() string {
	switch m {
	case FailOpen:
		return "open"
	case FailClosed:
		return "closed"
	case FailError:
		return "error"
	}
	return "FailureMode(" + strconv.Itoa(int(m)) + ")"
}

// ParseFailureMode reads "error", "open" or "closed".
func ParseFailureMode(s string) (FailureMode, error) {
	switch s {
	case "error":
		return FailError, nil
	case "open":
		return FailOpen, nil
	case "closed":
		return FailClosed, nil
	}
	return 0, fmt.Errorf("failure mode must be error, open or closed, got %q", s)
}

// FallbackRetryAfter is the Retry-After of a fail-closed fallback decision.
const FallbackRetryAfter = time.Second

// DefaultTimeout is the deadline of a call when Config.Timeout is zero.
const DefaultTimeout = time.Second

// Config configures a Client.
type Config struct {
	// Server is the daemon's base URL, e.g. "http://127.0.0.1:8080"; a
	// bare host:port means http.
	Server string
	// Token is the admin API's bearer token, sent with admin calls only.
	Token string
	// Timeout bounds every call, on top of the context's own deadline;
	// zero is DefaultTimeout.
	Timeout time.Duration
	// OnFailure is what Check answers when the daemon cannot decide.
	OnFailure FailureMode
	// HTTPClient, when set, is used instead of the Client's own, which
	// keeps up to 64 idle connections to the daemon.
	HTTPClient *http.Client
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	if c.Server == "" {
		return errors.New("server: required, e.g. http://127.0.0.1:8080")
	}
	if _, err := baseURL(c.Server); err != nil {
		return err
	}
	if c.Timeout < 0 {
		return fmt.Errorf("timeout: must not be negative, got %v", c.Timeout)
	}
	if c.OnFailure < FailError || c.OnFailure > FailClosed {
		return fmt.Errorf("on failure: unknown mode %d", int(c.OnFailure))
	}
	if strings.ContainsAny(c.Token, "\r\n") {
		return errors.New("token: must be one line")
	}
	return nil
}

func baseURL(s string) (*url.URL, error) {
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("server: want a URL such as http://127.0.0.1:8080, got %q", s)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawQuery, u.Fragment = "", ""
	return u, nil
}

// Client is safe for concurrent use; make one per daemon and keep it.
type Client struct {
	base    *url.URL
	token   string
	timeout time.Duration
	mode    FailureMode
	hc      *http.Client
}

// New returns a Client for cfg.
func New(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	u, _ := baseURL(cfg.Server)
	c := &Client{base: u, token: cfg.Token, timeout: cfg.Timeout, mode: cfg.OnFailure, hc: cfg.HTTPClient}
	if c.timeout == 0 {
		c.timeout = DefaultTimeout
	}
	if c.hc == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConns = 64
		t.MaxIdleConnsPerHost = 64
		t.Proxy = nil // a rate limiter on loopback or in the cluster, never through a proxy
		c.hc = &http.Client{Transport: t}
	}
	return c, nil
}

// Server is the daemon's base URL.
func (c *Client) Server() string { return c.base.String() }

// Problem is an RFC 9457 problem details object as the daemon answers it:
// every 4xx and 5xx of the admin API, and a check's bad input. It has the
// daemon's fields (decide.Problem); its Error leads with the status.
type Problem decide.Problem

// Error is the status, title and detail on one line.
func (p *Problem) Error() string {
	s := strconv.Itoa(p.Status) + " " + p.Title
	if p.Detail != "" {
		s += ": " + p.Detail
	}
	return s
}

// ErrUnavailable is wrapped by every error of a daemon that could not be
// asked or could not answer: a transport error, a timeout, a 5xx without a
// problem body.
var ErrUnavailable = errors.New("daemon unavailable")

// unavailableError is an ErrUnavailable with its cause.
type unavailableError struct {
	server string
	err    error
}

func (e *unavailableError) Error() string {
	return fmt.Sprintf("sluice daemon at %s: %v", e.server, e.err)
}

func (e *unavailableError) Unwrap() []error { return []error{ErrUnavailable, e.err} }

// response is a daemon's answer, read whole.
type response struct {
	status int
	header http.Header
	body   []byte
}

// maxResponse bounds what a client reads of one answer.
const maxResponse = 8 << 20

// do sends one request and reads its answer; path is escaped already. Transport failures, a
// deadline and answers that are not from a Sluice daemon are
// unavailableErrors; any HTTP status is returned as is.
func (c *Client) do(ctx context.Context, method, path string, query url.Values, body []byte, admin bool, hdr ...string) (*response, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	target := c.base.String() + path
	if len(query) > 0 {
		target += "?" + query.Encode()
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, rd)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json, application/problem+json")
	if admin && c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := c.hc.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		var oe *net.OpError
		if errors.As(err, &oe) && oe.Op == "dial" {
			err = fmt.Errorf("cannot connect: %w", oe.Err)
		}
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
			err = fmt.Errorf("no answer within the deadline: %w", err)
		}
		return nil, &unavailableError{c.base.Host, err}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, maxResponse))
	if err != nil {
		return nil, &unavailableError{c.base.Host, fmt.Errorf("reading the answer to %s %s: %w", method, path, err)}
	}
	return &response{status: res.StatusCode, header: res.Header, body: b}, nil
}

// problemOf reads a 4xx or 5xx answer's problem. An answer without a
// problem body is a 5xx ErrUnavailable or a plain *Problem from its status.
func (c *Client) problemOf(method, path string, r *response) error {
	var p Problem
	if isJSON(r.header) && json.Unmarshal(r.body, &p) == nil && p.Status != 0 {
		return &p
	}
	if r.status >= 500 {
		return &unavailableError{c.base.Host, fmt.Errorf("%s %s: %d %s", method, path, r.status, http.StatusText(r.status))}
	}
	detail := strings.TrimSpace(string(r.body))
	if len(detail) > 200 {
		detail = detail[:200] + "..."
	}
	return &Problem{Status: r.status, Title: http.StatusText(r.status), Detail: detail}
}

func isJSON(h http.Header) bool {
	ct := h.Get("Content-Type")
	return strings.HasPrefix(ct, "application/json") || strings.HasPrefix(ct, "application/problem+json")
}

// call sends a JSON request (in, unless nil) and decodes a 2xx answer into
// out (unless nil); anything else is problemOf's error.
func (c *Client) call(ctx context.Context, method, path string, query url.Values, in, out any, hdr ...string) (*response, error) {
	var body []byte
	switch v := in.(type) {
	case nil:
	case []byte:
		body = v
	case json.RawMessage:
		body = v
	default:
		b, err := json.Marshal(in)
		if err != nil {
			return nil, fmt.Errorf("%s %s: encoding the body: %w", method, path, err)
		}
		body = b
	}
	r, err := c.do(ctx, method, path, query, body, true, hdr...)
	if err != nil {
		return nil, err
	}
	if r.status < 200 || r.status > 299 {
		return r, c.problemOf(method, path, r)
	}
	if out != nil && r.status != http.StatusNoContent {
		if err := json.Unmarshal(r.body, out); err != nil {
			return r, &unavailableError{c.base.Host, fmt.Errorf("%s %s: the answer is not the expected JSON: %w", method, path, err)}
		}
	}
	return r, nil
}
