package quota

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/internal/strictjson"
)

// MaxPoliciesPerRequest is the most policies that may apply to one request.
// The engine decides all of a request's policies in one atomic store call
// and accepts at most this many (it equals engine.MaxChecks).
const MaxPoliciesPerRequest = engine.MaxChecks

// Bounds on a policy's lists, so that validation and matching stay cheap.
const (
	maxRoutes      = 64
	maxMethods     = 16
	maxCostEntries = 64
)

// MaxPolicyBytes bounds a policy document; MaxPoliciesBytes bounds a seed
// file of many documents.
const (
	MaxPolicyBytes   = 64 << 10
	MaxPoliciesBytes = 16 << 20
)

// Enumerated values of a policy document.
const (
	FailOpen   = "open"   // admit when the store is unreachable
	FailClosed = "closed" // reject when the store is unreachable
	FailLocal  = "local"  // decide from a local in-process bucket

	ModeShadow  = "shadow"  // evaluated and recorded, never rejects
	ModeEnforce = "enforce" // rejects

	ClassQuota    = "quota"    // a commercial allowance; shown in headers
	ClassCapacity = "capacity" // protects a backend; shown in headers
	ClassSecurity = "security" // anti-abuse (e.g. login); never shown in headers, fails closed by default

	ScopeRegion = "region" // each region enforces the whole limit
	ScopeGlobal = "global" // the limit is shared across regions
)

// Policy is one version of a policy document. The JSON field
// names are the document's; ParsePolicy decodes strictly and validates.
//
// A Policy held by a Registry is immutable: callers must not modify the
// slices and maps of a Policy they receive from it.
type Policy struct {
	// ID names the policy across versions: ^[a-z0-9][a-z0-9._-]{0,63}$.
	ID string `json:"id"`
	// Version is assigned by the Registry (1, 2, ...). A version in a
	// submitted document is ignored; use Put's ifMatch for concurrency.
	Version int `json:"version,omitempty"`
	// Match selects the requests the policy applies to.
	Match Match `json:"match"`
	// Algorithm is one of engine's names, e.g. "token_bucket".
	Algorithm string `json:"algorithm"`
	// RatePerSec and Burst parameterise token_bucket and leaky_bucket:
	// units per second (may be fractional) and capacity (whole units).
	RatePerSec float64 `json:"rate_per_sec,omitempty"`
	Burst      float64 `json:"burst,omitempty"`
	// Count ("limit") and Window parameterise the window algorithms: whole
	// units per window, window length in seconds (may be fractional, whole
	// milliseconds).
	Count  float64 `json:"limit,omitempty"`
	Window float64 `json:"window,omitempty"`
	// Cost maps "METHOD /route-glob" to the units a matching request spends
	// (1 to the policy's capacity). Requests matching no entry cost 1; see
	// CostFor for precedence.
	Cost map[string]int64 `json:"cost,omitempty"`
	// OnStoreFailure is "open", "closed" or "local"; it defaults to
	// "closed" for class security and "open" otherwise.
	OnStoreFailure string `json:"on_store_failure,omitempty"`
	// Mode is "shadow" or "enforce". Every version a Registry publishes
	// from a document without a mode starts in shadow.
	Mode string `json:"mode,omitempty"`
	// Class is "quota" (default), "capacity" or "security".
	Class string `json:"class,omitempty"`
	// Scope is "region" (default) or "global".
	Scope string `json:"scope,omitempty"`
	// Description is free text for operators (UTF-8, at most 1024 bytes).
	Description string `json:"description,omitempty"`
	// Unlimited, only on a descriptor policy, makes the descriptors it
	// matches not limited at all; it then has no algorithm.
	Unlimited bool `json:"unlimited,omitempty"`
	// Replaces, only on a descriptor policy, names the policies that do
	// not apply to a request when this one applies to any of its
	// descriptors (envoyproxy/ratelimit's replaces).
	Replaces []string `json:"replaces,omitempty"`
	// CountOverLimit, only on a descriptor policy, counts a request's
	// hits in this policy even when the request is over the limit, as
	// envoyproxy/ratelimit counts them: the state goes past its limit (a
	// token bucket into debt, a window past its count) and later requests
	// are refused until it is back. Without it a request over the limit
	// spends nothing. It is what makes Envoy's second call on stream done
	// (apply_on_stream_done) a charge.
	CountOverLimit bool `json:"count_over_limit,omitempty"`
	// Lease, on a token_bucket policy of a high rate, serves it from each
	// daemon's local leases (see Lease). Absent, the default, is off.
	Lease *Lease `json:"lease,omitempty"`
}

// Match selects requests. An empty field matches everything: no Tier means
// every tier, no Routes every route, no Methods every method.
//
// With a Domain, the policy limits rate limit descriptors (Envoy's rate
// limit service) instead of HTTP requests: it applies to a descriptor of
// that domain whose entries Descriptors matches (Registry.
// AppendMatchDescriptor), and never to an HTTP check.
type Match struct {
	Tier        string            `json:"tier,omitempty"`
	Routes      []string          `json:"routes,omitempty"`
	Methods     []string          `json:"methods,omitempty"`
	Domain      string            `json:"domain,omitempty"`
	Descriptors []DescriptorEntry `json:"descriptors,omitempty"`
	// Order, only on a descriptor policy, ranks the value patterns of
	// its Descriptors against the other patterns of its domain at the
	// same level: where several patterns match one entry, the one that a
	// policy of the lowest Order passes through is taken, as
	// envoyproxy/ratelimit takes the first in file order. Patterns that
	// only policies without an Order (0) pass through come after, the
	// one with the most literal characters first. At most MaxOrder.
	Order int `json:"order,omitempty"`
}

// ErrInvalidPolicy is wrapped by every *ValidationError, for errors.Is.
var ErrInvalidPolicy = errors.New("invalid policy")

// FieldError is one problem in a document: the JSON path of the field,
// e.g. "match.routes[1]" or `cost["POST /x"]`, and why it is wrong.
type FieldError struct {
	Field  string `json:"field"`
	Reason string `json:"reason"`
}

func (e FieldError) String() string { return e.Field + ": " + e.Reason }

// ValidationError lists every problem found in a document. The HTTP layer
// turns it into a problem+json body naming each field.
type ValidationError struct {
	Problems []FieldError
}

func (e *ValidationError) Error() string {
	var b strings.Builder
	b.WriteString("invalid policy: ")
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(p.String())
	}
	return b.String()
}

// Unwrap makes errors.Is(err, ErrInvalidPolicy) true.
func (e *ValidationError) Unwrap() error { return ErrInvalidPolicy }

func (e *ValidationError) add(field, format string, args ...any) {
	e.Problems = append(e.Problems, FieldError{Field: field, Reason: fmt.Sprintf(format, args...)})
}

func (e *ValidationError) err() error {
	if e == nil || len(e.Problems) == 0 {
		return nil
	}
	return e
}

// IDPattern is what ids of policies and overrides, and tiers, look like.
const IDPattern = `^[a-z0-9][a-z0-9._-]{0,63}$`

var (
	idPattern     = regexp.MustCompile(IDPattern)
	methodPattern = regexp.MustCompile(`^[A-Z]{1,32}$`)
)

// ValidID reports whether s matches IDPattern: a policy or override id, or
// a tier.
func ValidID(s string) bool { return idPattern.MatchString(s) }

// ParsePolicy decodes one policy document strictly (unknown fields, trailing
// data and wrong types are errors), fills in defaults (see Normalize) and
// validates it. Every error is a *ValidationError naming the field.
func ParsePolicy(data []byte) (Policy, error) {
	var p Policy
	if len(data) > MaxPolicyBytes {
		return p, &ValidationError{Problems: []FieldError{{Field: "", Reason: fmt.Sprintf("document is %d bytes, at most %d allowed", len(data), MaxPolicyBytes)}}}
	}
	if err := decodeStrict(data, &p); err != nil {
		return Policy{}, err
	}
	p = p.Normalize()
	if err := p.Validate(); err != nil {
		return Policy{}, err
	}
	return p, nil
}

// ParsePolicies decodes a JSON array of policy documents, as given to
// `sluice serve --policies FILE`; "[]" means no policies. Problems are
// reported with the element's index, e.g. "[2].burst". Two documents with
// the same id are an error.
func ParsePolicies(data []byte) ([]Policy, error) {
	if len(data) > MaxPoliciesBytes {
		return nil, &ValidationError{Problems: []FieldError{{Field: "", Reason: fmt.Sprintf("file is %d bytes, at most %d allowed", len(data), MaxPoliciesBytes)}}}
	}
	var raws []json.RawMessage
	if err := decodeStrict(data, &raws); err != nil {
		return nil, err
	}
	if raws == nil {
		return nil, &ValidationError{Problems: []FieldError{{Field: "", Reason: "want a JSON array of policy documents"}}}
	}
	out := make([]Policy, 0, len(raws))
	ve := &ValidationError{}
	seen := map[string]int{}
	for i, raw := range raws {
		p, err := ParsePolicy(raw)
		if err != nil {
			var pe *ValidationError
			if errors.As(err, &pe) {
				for _, fe := range pe.Problems {
					f := fmt.Sprintf("[%d]", i)
					if fe.Field != "" {
						f += "." + fe.Field
					}
					ve.Problems = append(ve.Problems, FieldError{Field: f, Reason: fe.Reason})
				}
				continue
			}
			return nil, err
		}
		if j, dup := seen[p.ID]; dup {
			ve.add(fmt.Sprintf("[%d].id", i), "duplicate id %q (also at [%d])", p.ID, j)
			continue
		}
		seen[p.ID] = i
		out = append(out, p)
	}
	if err := ve.err(); err != nil {
		return nil, err
	}
	return out, nil
}

// decodeStrict decodes exactly one JSON value, rejecting unknown fields,
// and reports decoding problems as a *ValidationError with the field path.
func decodeStrict(data []byte, v any) error {
	if e := strictjson.Decode(data, v); e != nil {
		return &ValidationError{Problems: []FieldError{{Field: e.Field, Reason: e.Reason}}}
	}
	return nil
}

// Normalize returns p with defaults filled in: on_store_failure ("closed"
// for class security, else "open"), mode ("shadow"), class ("quota"),
// scope ("region"). Empty lists and maps become nil, so a normalized policy
// survives a JSON round trip unchanged.
func (p Policy) Normalize() Policy {
	if p.Class == "" {
		p.Class = ClassQuota
	}
	if p.OnStoreFailure == "" {
		if p.Class == ClassSecurity {
			p.OnStoreFailure = FailClosed
		} else {
			p.OnStoreFailure = FailOpen
		}
	}
	if p.Mode == "" {
		p.Mode = ModeShadow
	}
	if p.Scope == "" {
		p.Scope = ScopeRegion
	}
	if len(p.Match.Routes) == 0 {
		p.Match.Routes = nil
	}
	if len(p.Match.Methods) == 0 {
		p.Match.Methods = nil
	}
	if len(p.Cost) == 0 {
		p.Cost = nil
	}
	if len(p.Match.Descriptors) == 0 {
		p.Match.Descriptors = nil
	}
	if len(p.Replaces) == 0 {
		p.Replaces = nil
	}
	return p
}

// windowDuration converts a window in seconds, saturating so that an absurd
// value is reported by engine validation instead of overflowing.
func windowDuration(sec float64) time.Duration {
	if math.IsNaN(sec) || sec <= 0 {
		return 0
	}
	ns := sec * 1e9
	if ns >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(math.Round(ns))
}

// Limit returns the engine parameters of the policy. It is meaningful only
// for a valid policy; an unknown algorithm yields a zero Algorithm.
func (p Policy) Limit() engine.Limit {
	a, _ := engine.ParseAlgorithm(p.Algorithm)
	return engine.Limit{
		Algorithm: a,
		Rate:      p.RatePerSec,
		Burst:     p.Burst,
		Count:     p.Count,
		Window:    windowDuration(p.Window),
	}
}

// jsonField maps an engine.LimitError field to the document's field.
func jsonField(engineField string) string {
	switch engineField {
	case "rate":
		return "rate_per_sec"
	case "count":
		return "limit"
	}
	return engineField // burst, window, algorithm, cost
}

// Validate checks a normalized policy and returns a *ValidationError that
// lists every problem, or nil. Call Normalize first: Validate does not fill
// defaults and rejects empty enumerations.
func (p Policy) Validate() error {
	ve := &ValidationError{}
	if !idPattern.MatchString(p.ID) {
		ve.add("id", "must match ^[a-z0-9][a-z0-9._-]{0,63}$, got %q", clip(p.ID))
	}
	if p.Version < 0 {
		ve.add("version", "must not be negative, got %d", p.Version)
	}
	if p.Match.Tier != "" && !idPattern.MatchString(p.Match.Tier) {
		ve.add("match.tier", "must match ^[a-z0-9][a-z0-9._-]{0,63}$ or be absent (every tier), got %q", clip(p.Match.Tier))
	}
	if len(p.Match.Routes) > maxRoutes {
		ve.add("match.routes", "at most %d routes, got %d", maxRoutes, len(p.Match.Routes))
	}
	if len(p.Match.Methods) > maxMethods {
		ve.add("match.methods", "at most %d methods, got %d", maxMethods, len(p.Match.Methods))
	}
	if len(p.Cost) > maxCostEntries {
		ve.add("cost", "at most %d entries, got %d", maxCostEntries, len(p.Cost))
	}
	for i, r := range p.Match.Routes {
		if i >= maxRoutes {
			break
		}
		if _, err := compileGlob(r); err != nil {
			ve.add(fmt.Sprintf("match.routes[%d]", i), "invalid route glob: %v", err)
		} else if slices.Index(p.Match.Routes, r) < i {
			ve.add(fmt.Sprintf("match.routes[%d]", i), "duplicate route %q", r)
		}
	}
	for i, m := range p.Match.Methods {
		if i >= maxMethods {
			break
		}
		if !methodPattern.MatchString(m) {
			ve.add(fmt.Sprintf("match.methods[%d]", i), "must be an upper-case HTTP method such as GET, got %q", clip(m))
		} else if slices.Index(p.Match.Methods, m) < i {
			ve.add(fmt.Sprintf("match.methods[%d]", i), "duplicate method %q", m)
		}
	}

	skipLimit, denyAll := p.validateDescriptors(ve)
	algo, err := engine.ParseAlgorithm(p.Algorithm)
	limitOK := false
	switch {
	case skipLimit: // an unlimited policy has no limit to check
	case err != nil:
		ve.add("algorithm", "%v", err)
	default:
		// Parameters that the algorithm does not use are mistakes: the
		// operator meant something the policy would not do.
		if algo.Windowed() {
			if p.RatePerSec != 0 {
				ve.add("rate_per_sec", "not used by %s (it uses limit and window)", algo)
			}
			if p.Burst != 0 {
				ve.add("burst", "not used by %s (it uses limit and window)", algo)
			}
		} else {
			if p.Count != 0 {
				ve.add("limit", "not used by %s (it uses rate_per_sec and burst)", algo)
			}
			if p.Window != 0 {
				ve.add("window", "not used by %s (it uses rate_per_sec and burst)", algo)
			}
		}
		l := p.Limit()
		if denyAll {
			l.Count = 1 // limit 0 denies all; the window must still be valid
		}
		limitOK = validateLimit(ve, "", l, p.Burst, p.Count)
	}

	costs := make([]string, 0, len(p.Cost))
	for k := range p.Cost {
		costs = append(costs, k)
	}
	sort.Strings(costs)
	costs = costs[:min(len(costs), maxCostEntries)]
	for _, k := range costs {
		field := fmt.Sprintf("cost[%q]", clip(k))
		if _, _, err := parseCostKey(k); err != nil {
			ve.add(field, "%v", err)
		}
		c := p.Cost[k]
		if c < 1 {
			ve.add(field, "must be a whole number of units of at least 1, got %d", c)
		} else if limitOK {
			if err := p.Limit().ValidateCost(c); err != nil {
				ve.add(field, "%s", limitReason(err))
			}
		}
	}

	p.validateLease(ve)
	checkEnum(ve, "on_store_failure", p.OnStoreFailure, FailOpen, FailClosed, FailLocal)
	checkEnum(ve, "mode", p.Mode, ModeShadow, ModeEnforce)
	checkEnum(ve, "class", p.Class, ClassQuota, ClassCapacity, ClassSecurity)
	checkEnum(ve, "scope", p.Scope, ScopeRegion, ScopeGlobal)
	if !utf8.ValidString(p.Description) {
		ve.add("description", "must be valid UTF-8")
	} else if len(p.Description) > 1024 {
		ve.add("description", "must be at most 1024 bytes, got %d", len(p.Description))
	}
	return ve.err()
}

// validateLimit checks l with the engine and requires whole-unit burst and
// limit; prefix is prepended to field names. It reports whether l is usable.
func validateLimit(ve *ValidationError, prefix string, l engine.Limit, burst, count float64) bool {
	ok := true
	if err := l.Validate(); err != nil {
		var le *engine.LimitError
		if errors.As(err, &le) {
			ve.add(prefix+jsonField(le.Field), "%s", le.Reason)
		} else {
			ve.add(prefix+"algorithm", "%v", err)
		}
		ok = false
	}
	if burst != math.Trunc(burst) {
		ve.add(prefix+"burst", "must be a whole number of units, got %v", burst)
		ok = false
	}
	if count != math.Trunc(count) {
		ve.add(prefix+"limit", "must be a whole number of units, got %v", count)
		ok = false
	}
	return ok
}

func limitReason(err error) string {
	var le *engine.LimitError
	if errors.As(err, &le) {
		return le.Reason
	}
	return err.Error()
}

func checkEnum(ve *ValidationError, field, v string, allowed ...string) {
	if !slices.Contains(allowed, v) {
		ve.add(field, "must be one of %s, got %q", strings.Join(allowed, ", "), clip(v))
	}
}

// clip shortens a string quoted in an error message.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// parseCostKey splits "METHOD /route-glob".
func parseCostKey(k string) (method string, g *glob, err error) {
	method, route, ok := strings.Cut(k, " ")
	if !ok {
		return "", nil, fmt.Errorf(`key must be "METHOD /route-glob", e.g. "POST /v1/exports"`)
	}
	if !methodPattern.MatchString(method) {
		return "", nil, fmt.Errorf("method must be an upper-case HTTP method such as POST, got %q", clip(method))
	}
	g, err = compileGlob(route)
	if err != nil {
		return "", nil, fmt.Errorf("invalid route glob: %v", err)
	}
	return method, g, nil
}

// costRule is one compiled entry of a cost table.
type costRule struct {
	method string
	route  *glob
	cost   int64
}

// compileCosts orders a cost table so that the first matching rule wins:
// routes without a wildcard first, then longer patterns before shorter
// ones, then lexical order. Invalid keys are skipped (Validate reports them).
func compileCosts(m map[string]int64) []costRule {
	rules := make([]costRule, 0, len(m))
	for k, c := range m {
		method, g, err := parseCostKey(k)
		if err != nil {
			continue
		}
		rules = append(rules, costRule{method: method, route: g, cost: c})
	}
	sort.Slice(rules, func(i, j int) bool {
		a, b := rules[i], rules[j]
		aw, bw := strings.Contains(a.route.src, "*"), strings.Contains(b.route.src, "*")
		if aw != bw {
			return !aw
		}
		if len(a.route.src) != len(b.route.src) {
			return len(a.route.src) > len(b.route.src)
		}
		if a.route.src != b.route.src {
			return a.route.src < b.route.src
		}
		return a.method < b.method
	})
	return rules
}

func costOf(rules []costRule, method, route string) int64 {
	for i := range rules {
		r := &rules[i]
		if r.method == method && r.route.match(route) {
			return r.cost
		}
	}
	return 1
}

// CostFor returns the units a request with this method and route (path,
// without query) spends against the policy: the cost of the most specific
// matching cost-table entry (an exact route before any glob, then the
// longest pattern), or 1. It compiles the table on each call; Registry.Match
// uses a precompiled table.
func (p Policy) CostFor(method, route string) int64 {
	return costOf(compileCosts(p.Cost), method, route)
}
