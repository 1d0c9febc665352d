// Package httplimit is net/http middleware that limits a handler with
// Sluice: through a daemon (a *client.Client) or in-process (a
// *local.Limiter). An admitted request reaches the handler with the
// RateLimit and RateLimit-Policy fields (draft-ietf-httpapi-ratelimit-
// headers-11) set on its response; a limited one is answered 429 (or 503
// when the limit could not be decided and the route fails closed) with
// those fields, Retry-After and an RFC 9457 problem+json body, and never
// reaches the handler.
//
// What happens when the daemon cannot be asked is the client's
// client.Config.OnFailure: FailOpen lets the request through without
// rate-limit fields, FailClosed answers 503 with Retry-After, and
// FailError answers 503 too, after passing the error to Config.OnError.
package httplimit

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/sluice-rl/sluice/client"
	"github.com/sluice-rl/sluice/quota"
)

// Checker decides one request: *client.Client and *local.Limiter.
type Checker interface {
	Check(ctx context.Context, req client.CheckRequest) (*client.Decision, error)
}

// Config configures the middleware.
type Config struct {
	// Checker decides; required.
	Checker Checker
	// Subject names the requester (an API key, a user, an address or a
	// subject string); required. An error answers 400 with its text: the
	// request does not say who sends it.
	Subject func(r *http.Request) (quota.SubjectFields, error)
	// Tier, when set, names the requester's tier; empty lets the
	// Checker's key registry decide.
	Tier func(r *http.Request) string
	// Route is the path the policies are matched against; nil is
	// r.URL.Path.
	Route func(r *http.Request) string
	// Cost, when set and returning true, replaces the policies' cost.
	Cost func(r *http.Request) (int64, bool)
	// OnError is told of every error the Checker returns (the daemon
	// could not be asked under client.FailError, or it refused the check
	// as bad input), and of the fallback cause of a decision made by a
	// client.FailureMode. Nil ignores them.
	OnError func(r *http.Request, err error)

	// Charge, when set, is called after the handler returned, with the
	// response's status and header, and returns what the request cost,
	// to be charged after the fact to the policies that apply to it (see
	// POST /v1/charge); false charges nothing. The check before the
	// handler then spends nothing (it is refused while the requester is
	// past a limit), or, when Cost gives an estimate, spends the estimate
	// as a reservation that the charge settles: the real cost less the
	// estimate is charged, or the difference refunded.
	Charge func(r *http.Request, status int, h http.Header) (int64, bool)
	// ChargeHeader, when Charge is nil, names a response header that
	// holds the request's cost as a decimal integer, read after the
	// handler returned: a handler may set it after writing the body (it is
	// then not sent, but still read). A missing or malformed value
	// charges nothing and is told to OnError.
	ChargeHeader string
	// Charger charges; nil is the Checker, which must then charge
	// (*client.Client and *local.Limiter do).
	Charger Charger
	// ReservationTTL bounds the time from the check of an estimate to its
	// charge; zero is the daemon's default (5 minutes).
	ReservationTTL time.Duration
}

// Charger charges after the fact: *client.Client and *local.Limiter.
type Charger interface {
	Charge(ctx context.Context, req client.ChargeRequest) (*client.ChargeAnswer, error)
}

// ChargeStatus is a Config.Charge that charges cost to a request whose
// response has one of statuses, and nothing to any other: counting failed
// logins (401) only, so that successful ones never lock anyone out.
func ChargeStatus(cost int64, statuses ...int) func(*http.Request, int, http.Header) (int64, bool) {
	return func(_ *http.Request, status int, _ http.Header) (int64, bool) {
		return cost, slices.Contains(statuses, status)
	}
}

// charging reports whether the middleware charges after the handler.
func (c *Config) charging() bool { return c.Charge != nil || c.ChargeHeader != "" }

// charger is the Charger the middleware uses, nil for none.
func (c *Config) charger() Charger {
	if c.Charger != nil {
		return c.Charger
	}
	ch, _ := c.Checker.(Charger)
	return ch
}

// Validate reports a Config that cannot work.
func (c Config) Validate() error {
	if c.Checker == nil {
		return errors.New("httplimit: Checker is required")
	}
	if c.Subject == nil {
		return errors.New("httplimit: Subject is required")
	}
	if c.charging() && c.charger() == nil {
		return errors.New("httplimit: Charge or ChargeHeader needs a Charger (the Checker does not charge)")
	}
	return nil
}

// New returns middleware limiting the handlers it wraps.
func New(cfg Config) (func(http.Handler) http.Handler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { cfg.serve(w, r, next) })
	}, nil
}

func (c *Config) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	sf, err := c.Subject(r)
	if err != nil {
		writeProblem(w, r, &client.Problem{Type: "https://sluice-rl.github.io/problems/invalid-request", Title: "Bad Request",
			Status: http.StatusBadRequest, Detail: err.Error()})
		return
	}
	req := client.CheckRequest{SubjectFields: sf, Method: r.Method, Route: r.URL.Path}
	if c.Route != nil {
		req.Route = c.Route(r)
	}
	if c.Tier != nil {
		req.Tier = c.Tier(r)
	}
	if c.Cost != nil {
		if n, ok := c.Cost(r); ok {
			req.Cost = &n
		}
	}
	if c.charging() {
		c.reserve(&req)
	}
	d, err := c.Checker.Check(r.Context(), req)
	if err != nil {
		if c.OnError != nil {
			c.OnError(r, err)
		}
		writeProblem(w, r, &client.Problem{Type: "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity",
			Title: "Service Unavailable", Status: http.StatusServiceUnavailable, Detail: "The rate limit could not be decided."})
		return
	}
	if d.Fallback && c.OnError != nil {
		c.OnError(r, d.Err)
	}
	h := w.Header()
	for k, vs := range d.Header {
		h[k] = vs
	}
	if d.Status == http.StatusOK || d.Allowed {
		if !c.charging() {
			next.ServeHTTP(w, r)
			return
		}
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		c.chargeAfter(r, &req, d, sw)
		return
	}
	p := client.Problem{Title: http.StatusText(d.Status), Status: d.Status}
	if d.Problem != nil {
		p = *d.Problem
		p.ViolatedPolicies = public(d, p.ViolatedPolicies)
	}
	writeProblem(w, r, &p)
}

// public leaves out of violated the class security policies, which a
// client is never told of (they bound guessing, and naming them helps the
// guesser).
func public(d *client.Decision, violated []string) []string {
	var out []string
	for _, id := range violated {
		secret := true // unknown to the decision: not named either
		for _, pr := range d.Policies {
			if pr.ID == id {
				secret = pr.Class == quota.ClassSecurity
				break
			}
		}
		if !secret {
			out = append(out, id)
		}
	}
	return out
}

// writeProblem answers p as application/problem+json, its instance the
// request's path.
func writeProblem(w http.ResponseWriter, r *http.Request, p *client.Problem) {
	body := *p
	body.Instance = r.URL.Path
	if body.Type == "" {
		body.Type = "about:blank"
	}
	b, err := json.Marshal(&body)
	if err != nil {
		b = []byte(`{"type":"about:blank","status":` + strconv.Itoa(p.Status) + `}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	w.Write(append(b, '\n'))
}
