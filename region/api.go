package region

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/sluice-rl/sluice/decide"
	"github.com/sluice-rl/sluice/internal/strictjson"
	"github.com/sluice-rl/sluice/quota"
)

// MaxBatch is the most checks one POST /v1/check/batch may carry.
const MaxBatch = 100

// decodeJSON reads a JSON body strictly: at most max bytes, exactly one
// value, no unknown fields. Every failure is a 4xx problem naming the field
// where one is known.
func decodeJSON(w http.ResponseWriter, r *http.Request, max int64, v any) *Problem {
	in := stdData(r)
	return decodeData(w, &in, max, func(b []byte) *Problem { return decodeBytes(b, v) })
}

// checkMediaType accepts a body without Content-Type (ct is ""), or with
// application/json or a +json type (with any parameters).
func checkMediaType(ct string) *Problem {
	if ct == "" || ct == "application/json" {
		return nil
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
		return &Problem{Type: ProblemInvalid, Title: "Unsupported Media Type", Status: http.StatusUnsupportedMediaType,
			Detail: fmt.Sprintf("Content-Type must be application/json, got %q", clipStr(ct)),
			Errors: []quota.FieldError{{Field: "Content-Type", Reason: "must be application/json"}}}
	}
	return nil
}

// decodeBytes is decodeJSON's parser, separate so that it can be fuzzed.
// A *CheckRequest goes through decodeCheck, as POST /v1/check's does.
func decodeBytes(body []byte, v any) *Problem {
	if in, ok := v.(*CheckRequest); ok {
		return decodeCheck(body, in)
	}
	if e := strictjson.Decode(body, v); e != nil {
		return invalid(e.Field, "%s", e.Reason)
	}
	return nil
}

// BatchRequest is the body of POST /v1/check/batch.
type BatchRequest struct {
	Checks []CheckRequest `json:"checks"`
}

// BatchItem is one answer of a batch: the status the single check would
// have had, and either its decision or its problem.
type BatchItem struct {
	Status   int       `json:"status"`
	Decision *Decision `json:"decision,omitempty"`
	Problem  *Problem  `json:"problem,omitempty"`
}

// BatchResponse answers a batch, one item per check, in order.
type BatchResponse struct {
	Results []BatchItem `json:"results"`
}

// checkRejection is the 429/503 body of POST /v1/check: the problem
// members of a rejection (decide.Rejection) and the decision in one object.
type checkRejection struct {
	Type             string   `json:"type"`
	Title            string   `json:"title"`
	Status           int      `json:"status"`
	Detail           string   `json:"detail"`
	Instance         string   `json:"instance,omitempty"`
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
	Decision
}

// check is the route core of POST /v1/check: it decodes the body, decides
// it and answers the decision with its RateLimit fields, or a 429 or 503
// problem with the decision in it.
func (d *Daemon) check(ctx context.Context, w http.ResponseWriter, in *dataRequest) {
	var req CheckRequest
	if p := decodeData(w, in, d.cfg.MaxBodyBytes, func(b []byte) *Problem { return decodeCheck(b, &req) }); p != nil {
		d.failData(w, in, p)
		return
	}
	t, p := req.Target("")
	if p != nil {
		d.failData(w, in, p)
		return
	}
	v, p := d.dec.Decide(ctx, t)
	if p != nil {
		d.failData(w, in, p)
		return
	}
	decide.SetRateLimitHeaders(w.Header(), &v)
	if v.Status == http.StatusOK {
		writeDecision(w, http.StatusOK, &v.Decision)
		return
	}
	prob := decide.Rejection(&v)
	body := checkRejection{Type: prob.Type, Title: prob.Title, Status: prob.Status, Detail: prob.Detail,
		Instance: checkPath, ViolatedPolicies: v.Violated, Decision: v.Decision}
	bp := bodyBufs.Get().(*[]byte)
	defer putBody(bp)
	b, ok := appendRejection((*bp)[:0], &body)
	*bp = b
	if !ok {
		var err error
		if b, err = json.Marshal(body); err != nil {
			d.failData(w, in, newProblem(http.StatusInternalServerError, ProblemInternal, "encoding the decision failed"))
			return
		}
	}
	h := w.Header()
	h["Content-Type"] = hdrProblem
	h["Cache-Control"] = hdrNoStore
	w.WriteHeader(v.Status)
	w.Write(append(b, '\n'))
}

// batch is the route core of POST /v1/check/batch: each check is decided
// as POST /v1/check would decide it, and answered with its status and its
// decision or problem.
func (d *Daemon) batch(ctx context.Context, w http.ResponseWriter, in *dataRequest) {
	var req BatchRequest
	if p := decodeData(w, in, d.cfg.MaxBodyBytes, func(b []byte) *Problem { return decodeBytes(b, &req) }); p != nil {
		d.failData(w, in, p)
		return
	}
	if req.Checks == nil {
		d.failData(w, in, invalid("checks", "required: an array of checks"))
		return
	}
	if len(req.Checks) > MaxBatch {
		d.failData(w, in, invalid("checks", "at most %d checks per batch, got %d", MaxBatch, len(req.Checks)))
		return
	}
	out := BatchResponse{Results: make([]BatchItem, len(req.Checks))}
	for i := range req.Checks {
		t, p := req.Checks[i].Target(fmt.Sprintf("checks[%d]", i))
		if p == nil {
			var v decide.Verdict
			v, p = d.dec.Decide(ctx, t)
			if p == nil {
				dec := v.Decision
				out.Results[i] = BatchItem{Status: v.Status, Decision: &dec}
				continue
			}
		}
		p.Instance = in.path
		out.Results[i] = BatchItem{Status: p.Status, Problem: p}
	}
	writeJSON(w, http.StatusOK, out)
}

// The values of Config.ForwardAuthHeaders.
const (
	// ForwardAuthOriginal reads X-Original-Method and X-Original-URI, the
	// pair nginx's auth_request configuration sets.
	ForwardAuthOriginal = "original"
	// ForwardAuthForwarded reads X-Forwarded-Method and X-Forwarded-Uri,
	// the pair Traefik's ForwardAuth and Caddy's forward_auth set.
	ForwardAuthForwarded = "forwarded"
)

// authzHeaders is the header pair a plain /v1/authz call carries the
// limited request's method and URI in: each as problems name it (the
// spelling the gateways document) and as its key in an http.Header (the
// canonical form, which Header.Values would compute on every call).
type authzHeaders struct{ method, uri, methodKey, uriKey string }

var (
	originalHeaders  = authzHeaders{"X-Original-Method", "X-Original-URI", "X-Original-Method", "X-Original-Uri"}
	forwardedHeaders = authzHeaders{"X-Forwarded-Method", "X-Forwarded-Uri", "X-Forwarded-Method", "X-Forwarded-Uri"}
)

// forwardAuthHeaders returns the pair mode names ("" is
// ForwardAuthOriginal). Only that pair is read: the other one may come from
// the client, passed on by a gateway that does not clear it.
func forwardAuthHeaders(mode string) authzHeaders {
	if mode == ForwardAuthForwarded {
		return forwardedHeaders
	}
	return originalHeaders
}

// identityConfig is the quota.IdentityConfig of the configuration. The key
// headers are given in canonical form, which Identify then looks up as is
// instead of canonicalising them on every request; their names appear in
// no problem. The user and tier headers keep the configured spelling,
// which problems name.
func (c Config) identityConfig() quota.IdentityConfig {
	keys := c.KeyHeaders
	if keys == nil {
		keys = quota.DefaultKeyHeaders()
	} else {
		keys = slices.Clone(keys)
	}
	for i, k := range keys {
		keys[i] = http.CanonicalHeaderKey(k)
	}
	return quota.IdentityConfig{KeyHeaders: keys, TrustedProxies: c.TrustedProxies, TierHeader: c.TierHeader,
		UserHeader: c.UserHeader, ClientIPHeader: c.ClientIPHeader}
}

// validateEdge reports unusable identity and forward-auth settings: an
// invalid header name, an unknown client IP header or forward-auth mode,
// a trusted-proxy prefix that can never match.
func (c Config) validateEdge() error {
	if c.ForwardAuthHeaders != "" && c.ForwardAuthHeaders != ForwardAuthOriginal && c.ForwardAuthHeaders != ForwardAuthForwarded {
		return fmt.Errorf("forward-auth headers must be %s or %s, got %q", ForwardAuthOriginal, ForwardAuthForwarded, clipStr(c.ForwardAuthHeaders))
	}
	return c.identityConfig().Validate()
}

// forwardedTarget reads the limited request's method and route from a
// forward-auth call. A plain /v1/authz call (prefixed false) carries them
// in the configured header pair, each exactly once; a missing, repeated or
// malformed one is a problem naming it. An Envoy ext_authz call,
// /v1/authz/<path> (prefixed true), is the limited request's own method and
// escaped path, and no header is read. The route is normalised
// (quota.NormalizeRoute). It is separate from the handler so that it can be
// fuzzed.
func forwardedTarget(h http.Header, pair authzHeaders, method, path string, prefixed bool) (string, string, *Problem) {
	m, u := method, path
	fieldM, fieldU := "method", "path" // of the call itself
	if !prefixed {
		fieldM, fieldU = pair.method, pair.uri
		var p *Problem
		if m, p = oneHeader(h, pair.methodKey, pair.method); p != nil {
			return "", "", p
		}
		if u, p = oneHeader(h, pair.uriKey, pair.uri); p != nil {
			return "", "", p
		}
	}
	if !decide.ValidMethod(m) {
		return "", "", invalid(fieldM, "must be an HTTP method such as GET, got %q", clipStr(m))
	}
	if len(u) > decide.MaxRouteLen {
		return "", "", invalid(fieldU, "longer than %d bytes", decide.MaxRouteLen)
	}
	if !strings.HasPrefix(u, "/") {
		pu, err := url.Parse(u)
		if err != nil || !pu.IsAbs() || pu.Host == "" {
			return "", "", invalid(fieldU, "must be a path or an absolute URL, got %q", clipStr(u))
		}
		u = pu.EscapedPath()
		if u == "" {
			u = "/"
		}
	}
	if i := strings.IndexAny(u, "?#"); i >= 0 {
		u = u[:i]
	}
	if err := decide.ValidRoute(u); err != nil {
		return "", "", invalid(fieldU, "%v", err)
	}
	return strings.ToUpper(m), quota.NormalizeRoute(u), nil
}

// oneHeader returns the value of a header sent exactly once: key in
// canonical form, name as the problem names it.
func oneHeader(h http.Header, key, name string) (string, *Problem) {
	vs := h[key]
	switch {
	case len(vs) == 0 || strings.TrimSpace(vs[0]) == "":
		return "", invalid(name, "required: the gateway must set it on every /v1/authz call (or call /v1/authz/<path>)")
	case len(vs) > 1:
		return "", invalid(name, "sent %d times; the gateway must replace it, not append to it", len(vs))
	}
	return strings.TrimSpace(vs[0]), nil
}

// authzPrefixed serves /v1/authz/<path> itself, before next (the
// ServeMux), which would answer a path holding "//", "." or ".." segments
// with a redirect to its cleaned form instead of limiting it.
func (d *Daemon) authzPrefixed(next http.Handler) http.Handler {
	authz := d.stdRoute(routeAuthz)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.EscapedPath(), authzPrefix) {
			r.Pattern = authzPrefix + "{path...}"
			authz(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// authz is the route core of /v1/authz and /v1/authz/<path>: it decides
// the limited request the call describes and answers with the RateLimit
// fields and X-Sluice-Status, an empty 200 or the rejection's problem.
func (d *Daemon) authz(ctx context.Context, w http.ResponseWriter, in *dataRequest) {
	path, prefixed := strings.CutPrefix(in.escaped, authzPath)
	prefixed = prefixed && path != ""
	method, route, p := forwardedTarget(in.header, forwardAuthHeaders(d.cfg.ForwardAuthHeaders), in.method, path, prefixed)
	if p != nil {
		if !prefixed && d.misconfiguredAuthz(w, in, path) {
			return
		}
		d.failData(w, in, p)
		return
	}
	id, err := d.identity(in)
	if err != nil {
		var ie *quota.IdentityError
		switch {
		case errors.As(err, &ie):
			d.failData(w, in, invalid(ie.Header, "%s", ie.Reason))
		default:
			d.failData(w, in, invalid("", "%v", err))
		}
		return
	}
	v, p := d.dec.Decide(ctx, decide.Target{ID: id, Method: method, Route: route})
	if p != nil {
		d.failData(w, in, p)
		return
	}
	d.answerAuthz(w, in, prefixed, route, &v)
}

// answerAuthz answers a forward-auth call with verdict v on route: the
// RateLimit fields, X-Sluice-Status, X-Sluice-Degraded when the store did
// not decide, and an empty 200 or the rejection's problem.
func (d *Daemon) answerAuthz(w http.ResponseWriter, in *dataRequest, prefixed bool, route string, v *decide.Verdict) {
	h := w.Header()
	decide.SetRateLimitHeaders(h, v)
	h["X-Sluice-Status"] = sluiceStatus(v.Status)
	if v.Degraded {
		// The body a gateway drops is the only other place that says so:
		// the gateway can log it (deploy/nginx) or copy it.
		h["X-Sluice-Degraded"] = hdrTrue
	}
	if v.Status == http.StatusOK {
		w.WriteHeader(http.StatusOK)
		return
	}
	prob := decide.Rejection(v)
	prob.Instance = route
	// nginx auth_request understands only 2xx, 401 and 403: ?deny_status=403
	// makes a rejection a 403 that nginx can turn back into 429 or 503
	// with error_page (see deploy/nginx). X-Sluice-Status keeps the real one.
	// Only on plain /v1/authz: on /v1/authz/<path> the query is the
	// client's own.
	if ds := denyStatus(in.query, prefixed); ds == "403" || ds == "401" {
		if ds == "403" {
			prob.Status = http.StatusForbidden
		} else {
			prob.Status = http.StatusUnauthorized
		}
	}
	writeProblem(w, nil, prob)
}

// The values of X-Sluice-Status, shared like the header values of
// writeProblem: no code may write into them.
var (
	hdrStatus200 = []string{"200"}
	hdrStatus429 = []string{"429"}
	hdrStatus503 = []string{"503"}
	hdrTrue      = []string{"true"}
)

// sluiceStatus is the X-Sluice-Status value of a verdict's status.
func sluiceStatus(status int) []string {
	switch status {
	case http.StatusOK:
		return hdrStatus200
	case http.StatusTooManyRequests:
		return hdrStatus429
	case http.StatusServiceUnavailable:
		return hdrStatus503
	}
	return []string{strconv.Itoa(status)}
}

// denyStatus is the deny_status parameter of query, the raw query of a
// plain /v1/authz call; the query is parsed only when there is one.
func denyStatus(query string, prefixed bool) string {
	if prefixed || query == "" {
		return ""
	}
	v, _ := url.ParseQuery(query) // url.URL.Query
	return v.Get("deny_status")
}

// fail answers a problem and counts 4xx answers.
func (d *Daemon) fail(w http.ResponseWriter, r *http.Request, p *Problem) {
	d.failAt(w, r.Pattern, r.URL.Path, p)
}

// failData is fail for the request of a route core.
func (d *Daemon) failData(w http.ResponseWriter, in *dataRequest, p *Problem) {
	d.failAt(w, in.pattern, in.path, p)
}

// failAt is fail for a request of path that the mux routed to pattern
// ("" for none): path is the problem's instance unless it names one.
func (d *Daemon) failAt(w http.ResponseWriter, pattern, path string, p *Problem) {
	if p.Instance == "" {
		p.Instance = path
	}
	if p.Status >= 400 && p.Status < 500 {
		if pattern == "" {
			pattern = "unmatched"
		}
		d.m.badRequests.WithLabelValues(pattern).Inc()
	}
	writeProblem(w, nil, p)
}
