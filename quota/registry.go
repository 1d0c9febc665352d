package quota

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice/engine"
)

// Clock tells the time. A nil Clock means real time.
type Clock interface{ Now() time.Time }

// Auditor records changes. *AuditLog implements it. Append is called with
// the Registry's write lock held, so it must not call back into the
// Registry.
type Auditor interface {
	Append(AuditEntry) error
}

// Errors returned by Registry methods, for errors.Is.
var (
	ErrNotFound          = errors.New("not found")
	ErrConflict          = errors.New("version conflict")
	ErrNoPreviousVersion = errors.New("no previous version to roll back to")
	ErrStore             = errors.New("policy store failed")
)

// ConflictError is returned when ifMatch names a version other than the one
// in force. Have is 0 when the policy does not exist or is deleted.
type ConflictError struct {
	ID         string
	Want, Have int
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("policy %s: If-Match version %d, but the version in force is %d", e.ID, e.Want, e.Have)
}

// Unwrap makes errors.Is(err, ErrConflict) true.
func (e *ConflictError) Unwrap() error { return ErrConflict }

// RegistryConfig configures a Registry. The zero value is an in-memory
// registry on real time with no audit log.
type RegistryConfig struct {
	// Store persists every change before it takes effect; nil keeps state
	// in memory only.
	Store Store
	// Audit records every change; nil records nothing.
	Audit Auditor
	// Clock decides override expiry and audit times; nil is real time.
	Clock Clock
	// Logger receives warnings (an override that no longer fits its
	// policy, an audit append that failed); nil discards them.
	Logger *slog.Logger
	// MaxVersions is how many versions of each policy are kept; older ones
	// are dropped. Zero means 100.
	MaxVersions int
}

// Registry holds the policies (with their version history), the
// per-subject overrides and the API-key tier registry.
//
// Reads (Match, Resolve, KeyTier and the listing methods) take no lock: they
// load an immutable view that writers replace atomically. Writers are
// serialized; each change is validated as a whole, saved to the Store, then
// published, then audited. A change that fails validation or cannot be
// saved leaves everything as it was.
type Registry struct {
	cfg  RegistryConfig
	mu   sync.Mutex // serializes writers
	view atomic.Pointer[view]
}

// NewRegistry returns an empty Registry. Call Load to restore the state
// from cfg.Store, or Seed to install initial policies.
func NewRegistry(cfg RegistryConfig) *Registry {
	if cfg.MaxVersions <= 0 {
		cfg.MaxVersions = 100
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	r := &Registry{cfg: cfg}
	v, _ := buildView(newState())
	r.view.Store(v)
	return r
}

func (r *Registry) now() time.Time {
	if r.cfg.Clock != nil {
		return r.cfg.Clock.Now()
	}
	return time.Now()
}

// ---- state: the mutable form, copied on write ----

type history struct {
	versions []Policy // oldest first; the last one is in force unless deleted
	next     int      // the version number the next Put gets
	deleted  bool
	current  *compiled // nil when deleted
}

type state struct {
	policies  map[string]*history
	overrides map[string]Override // by id
	keys      map[string]string   // key id -> tier
}

func newState() *state {
	return &state{policies: map[string]*history{}, overrides: map[string]Override{}, keys: map[string]string{}}
}

func (s *state) clone() *state {
	return &state{policies: maps.Clone(s.policies), overrides: maps.Clone(s.overrides), keys: maps.Clone(s.keys)}
}

func (s *state) inForce(id string) (*history, int) {
	h := s.policies[id]
	if h == nil || h.deleted {
		return h, 0
	}
	return h, h.versions[len(h.versions)-1].Version
}

// publish appends p as the next version of its policy.
func (s *state) publish(p Policy, maxVersions int) (before *Policy, after Policy) {
	old := s.policies[p.ID]
	h := &history{next: 1}
	if old != nil {
		h.next = old.next
		h.versions = slices.Clone(old.versions)
		if !old.deleted {
			b := old.versions[len(old.versions)-1]
			before = &b
		}
	}
	p.Version = h.next
	h.next++
	h.versions = append(h.versions, p)
	if len(h.versions) > maxVersions {
		h.versions = slices.Clone(h.versions[len(h.versions)-maxVersions:])
	}
	h.current = compile(p)
	s.policies[p.ID] = h
	return before, p
}

// ---- compiled policies and the published view ----

type compiled struct {
	p       Policy
	limit   engine.Limit
	routes  []*glob // nil: every route
	methods []string
	costs   []costRule
}

func compile(p Policy) *compiled {
	c := &compiled{p: p, limit: p.Limit(), methods: p.Match.Methods, costs: compileCosts(p.Cost)}
	for _, r := range p.Match.Routes {
		if g, err := compileGlob(r); err == nil {
			c.routes = append(c.routes, g)
		}
	}
	return c
}

func (c *compiled) matchRoute(route string) bool {
	if c.routes == nil {
		return true
	}
	for _, g := range c.routes {
		if g.match(route) {
			return true
		}
	}
	return false
}

func (c *compiled) matchMethod(m string) bool {
	return c.methods == nil || slices.Contains(c.methods, m)
}

type ovKey struct{ subject, policy string }

type activeOverride struct {
	id      string
	expires time.Time
	limit   engine.Limit
	exempt  bool // an unlimited override: the policy is left out
}

// view is an immutable, compiled picture of a state.
type view struct {
	st        *state
	byTier    map[string][]*compiled // tier -> its policies and the every-tier ones, by id
	anyTier   []*compiled            // every-tier policies only, by id
	overrides map[ovKey]activeOverride
	// domains holds the descriptor policies (match.domain), which are in
	// neither byTier nor anyTier: they never apply to an HTTP check.
	domains map[string]*descNode
}

// buildView compiles s. Overrides that do not fit their policy in force are
// left out and returned as warnings.
func buildView(s *state) (*view, []string) {
	v := &view{st: s, byTier: map[string][]*compiled{}, overrides: map[ovKey]activeOverride{}}
	ids := slices.Sorted(maps.Keys(s.policies))
	var described []*compiled
	for _, id := range ids {
		c := s.policies[id].current
		if c == nil {
			continue
		}
		if c.p.IsDescriptorPolicy() {
			described = append(described, c)
			continue
		}
		if c.p.Match.Tier == "" {
			v.anyTier = append(v.anyTier, c)
		}
	}
	v.domains = buildDomains(described)
	for _, id := range ids {
		c := s.policies[id].current
		if c == nil || c.p.Match.Tier == "" || c.p.IsDescriptorPolicy() {
			continue
		}
		t := c.p.Match.Tier
		if _, ok := v.byTier[t]; !ok {
			v.byTier[t] = slices.Clone(v.anyTier)
		}
		v.byTier[t] = append(v.byTier[t], c)
	}
	for t, cs := range v.byTier {
		sort.Slice(cs, func(i, j int) bool { return cs[i].p.ID < cs[j].p.ID })
		v.byTier[t] = cs
	}
	var warnings []string
	for _, o := range s.overrides {
		h := s.policies[o.Policy]
		if h == nil || h.current == nil {
			warnings = append(warnings, fmt.Sprintf("override %s: policy %s is not in force; ignored", o.ID, o.Policy))
			continue
		}
		if o.Unlimited {
			if err := exemptable(h.current.p); err != nil {
				warnings = append(warnings, fmt.Sprintf("override %s no longer fits policy %s version %d (%v); ignored", o.ID, o.Policy, h.current.p.Version, err))
				continue
			}
			v.overrides[ovKey{o.Subject, o.Policy}] = activeOverride{id: o.ID, expires: o.ExpiresAt, exempt: true}
			continue
		}
		l := o.apply(h.current.limit)
		err := l.Validate()
		if err == nil && !o.fits(l.Algorithm) {
			err = fmt.Errorf("it sets parameters %s does not use", l.Algorithm)
		}
		if err != nil {
			warnings = append(warnings, fmt.Sprintf("override %s no longer fits policy %s version %d (%v); ignored", o.ID, o.Policy, h.current.p.Version, err))
			continue
		}
		v.overrides[ovKey{o.Subject, o.Policy}] = activeOverride{id: o.ID, expires: o.ExpiresAt, limit: l}
	}
	return v, warnings
}

// ---- the hot path ----

// Query describes one request to Match.
type Query struct {
	// Tier is the requester's tier (see Resolve); "" matches only policies
	// that apply to every tier.
	Tier string
	// Subject selects overrides; it may be empty.
	Subject string
	// Method is the HTTP method; lower case is accepted.
	Method string
	// Route is the request path; a query string ("?…") is ignored.
	Route string
}

// Applied is one policy that applies to a request.
type Applied struct {
	// Policy is the version in force. It is shared: do not modify it.
	Policy *Policy
	// Cost is the units this request spends against the policy.
	Cost int64
	// Limit is the policy's limit after any override for the subject.
	Limit engine.Limit
	// Override is the id of the override applied, or "".
	Override string
	// State names the engine state the policy counts in for the
	// subject; empty means the policy id. A descriptor policy counts each
	// descriptor's values apart under one subject.
	State string
	// Subject, when set, is the engine subject whose store state the
	// policy spends (engine.Check.Subject): where the state lives, so a
	// caller can spread states over memory shards and Redis hash tags
	// while one call still decides them all. Empty is the request's.
	Subject string
}

// StateName is the engine state name of a: State, or the policy id.
func (a *Applied) StateName() string {
	if a.State != "" {
		return a.State
	}
	return a.Policy.ID
}

// Exemption is a policy that matched a request but that an unlimited
// override in force takes out of it for the request's subject.
type Exemption struct {
	// Policy is the version in force. It is shared: do not modify it.
	Policy *Policy
	// Override is the id of the unlimited override.
	Override string
	// ExpiresAt is when the override stops applying and the policy
	// applies to the subject again.
	ExpiresAt time.Time
}

// Match returns the policies that apply to q, ordered by policy id, with
// each one's cost and effective limit. A policy the subject is exempt from
// (an unlimited override in force) does not apply and is left out; see
// MatchExempt to learn which. At most MaxPoliciesPerRequest policies can
// match (Put refuses changes that would allow more). Match takes no lock.
func (r *Registry) Match(q Query) []Applied {
	return r.AppendMatch(nil, q)
}

// AppendMatch is Match appending to dst, so that a caller can reuse a
// buffer and match without allocating.
func (r *Registry) AppendMatch(dst []Applied, q Query) []Applied {
	dst, _ = r.appendMatch(dst, nil, q, false)
	return dst
}

// MatchExempt is Match that also returns the policies that matched q but
// that the subject is exempt from, ordered by policy id. Together the two
// lists hold at most MaxPoliciesPerRequest policies.
func (r *Registry) MatchExempt(q Query) ([]Applied, []Exemption) {
	return r.AppendMatchExempt(nil, nil, q)
}

// AppendMatchExempt is MatchExempt appending to dst and ex, so that a
// caller can reuse buffers and match without allocating.
func (r *Registry) AppendMatchExempt(dst []Applied, ex []Exemption, q Query) ([]Applied, []Exemption) {
	return r.appendMatch(dst, ex, q, true)
}

func (r *Registry) appendMatch(dst []Applied, ex []Exemption, q Query, wantExempt bool) ([]Applied, []Exemption) {
	v := r.view.Load()
	list, ok := v.byTier[q.Tier]
	if !ok {
		list = v.anyTier
	}
	if i := strings.IndexByte(q.Route, '?'); i >= 0 {
		q.Route = q.Route[:i]
	}
	q.Method = upperASCII(q.Method)
	var now time.Time
	for _, c := range list {
		if !c.matchMethod(q.Method) || !c.matchRoute(q.Route) {
			continue
		}
		a := Applied{Policy: &c.p, Cost: costOf(c.costs, q.Method, q.Route), Limit: c.limit}
		if len(v.overrides) > 0 && q.Subject != "" {
			if o, ok := v.overrides[ovKey{q.Subject, c.p.ID}]; ok {
				if now.IsZero() {
					now = r.now()
				}
				if now.Before(o.expires) {
					if o.exempt {
						if wantExempt {
							ex = append(ex, Exemption{Policy: &c.p, Override: o.id, ExpiresAt: o.expires})
						}
						continue
					}
					a.Limit, a.Override = o.limit, o.id
				}
			}
		}
		dst = append(dst, a)
	}
	return dst, ex
}

// SubjectLimit is the limit of policy p for subject as a check applies
// it: an override in force for the pair replaces p's limit (override names
// it), and an unlimited one exempts the subject (exempt is not nil; the
// policy is then not decided at all).
func (r *Registry) SubjectLimit(p *Policy, subject string) (l engine.Limit, override string, exempt *Exemption) {
	v := r.view.Load()
	if o, ok := v.overrides[ovKey{subject, p.ID}]; ok && r.now().Before(o.expires) {
		if o.exempt {
			return engine.Limit{}, "", &Exemption{Policy: p, Override: o.id, ExpiresAt: o.expires}
		}
		return o.limit, o.id, nil
	}
	return p.Limit(), "", nil
}

func upperASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if 'a' <= s[i] && s[i] <= 'z' {
			return strings.ToUpper(s)
		}
	}
	return s
}

// ---- reads ----

// Get returns the version of a policy in force.
func (r *Registry) Get(id string) (Policy, bool) {
	h := r.view.Load().st.policies[id]
	if h == nil || h.current == nil {
		return Policy{}, false
	}
	return h.current.p, true
}

// Versions returns the kept versions of a policy, oldest first, including
// those of a deleted policy. It returns ErrNotFound for an unknown id.
func (r *Registry) Versions(id string) ([]Policy, error) {
	h := r.view.Load().st.policies[id]
	if h == nil {
		return nil, fmt.Errorf("policy %s: %w", id, ErrNotFound)
	}
	return slices.Clone(h.versions), nil
}

// List returns the policies in force, ordered by id. With a tier, it
// returns those that apply to that tier: the tier's own and the every-tier
// ones.
func (r *Registry) List(tier string) []Policy {
	v := r.view.Load()
	var out []Policy
	for _, id := range slices.Sorted(maps.Keys(v.st.policies)) {
		c := v.st.policies[id].current
		if c == nil {
			continue
		}
		if tier == "" || c.p.Match.Tier == "" || c.p.Match.Tier == tier {
			out = append(out, c.p)
		}
	}
	return out
}

// Overrides returns the overrides that have not expired, ordered by id.
func (r *Registry) Overrides() []Override {
	v := r.view.Load()
	now := r.now()
	var out []Override
	for _, id := range slices.Sorted(maps.Keys(v.st.overrides)) {
		if o := v.st.overrides[id]; now.Before(o.ExpiresAt) {
			out = append(out, o)
		}
	}
	return out
}

// KeyTier returns the tier registered for an API key id (see KeyID).
func (r *Registry) KeyTier(keyID string) (string, bool) {
	t, ok := r.view.Load().st.keys[keyID]
	return t, ok
}

// ---- writes ----

// change is one audited effect of a write.
type change struct {
	action, target string
	before, after  any
}

// update applies fn to a copy of the state and, if it succeeds, saves,
// publishes and audits the result. Expired overrides are pruned first.
func (r *Registry) update(ctx context.Context, who string, fn func(s *state, now time.Time) ([]change, error)) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	next := r.view.Load().st.clone()
	changes := pruneExpired(next, now)
	more, err := fn(next, now)
	if err != nil {
		return err
	}
	changes = append(changes, more...)
	if len(changes) == 0 {
		return nil
	}
	v, warnings := buildView(next)
	if r.cfg.Store != nil {
		if err := r.cfg.Store.Save(ctx, exportState(next)); err != nil {
			return fmt.Errorf("%w: %w", ErrStore, err)
		}
	}
	r.view.Store(v)
	for _, w := range warnings {
		r.cfg.Logger.Warn(w)
	}
	if r.cfg.Audit != nil {
		for _, c := range changes {
			e := AuditEntry{Time: now.UTC(), Who: who, Action: c.action, Target: c.target, Before: rawJSON(c.before), After: rawJSON(c.after)}
			if err := r.cfg.Audit.Append(e); err != nil {
				// The change is saved and in force; losing its audit
				// record is reported loudly but does not undo it.
				r.cfg.Logger.Error("audit append failed", "action", c.action, "target", c.target, "err", err)
			}
		}
	}
	return nil
}

func rawJSON(v any) json.RawMessage {
	if v == nil || (reflect.ValueOf(v).Kind() == reflect.Pointer && reflect.ValueOf(v).IsNil()) {
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	return b
}

func pruneExpired(s *state, now time.Time) []change {
	var out []change
	for _, id := range slices.Sorted(maps.Keys(s.overrides)) {
		if o := s.overrides[id]; !now.Before(o.ExpiresAt) {
			delete(s.overrides, id)
			out = append(out, change{action: "override.expire", target: id, before: o})
		}
	}
	return out
}

func checkIfMatch(s *state, id string, ifMatch *int) error {
	if ifMatch == nil {
		return nil
	}
	if _, have := s.inForce(id); have != *ifMatch {
		return &ConflictError{ID: id, Want: *ifMatch, Have: have}
	}
	return nil
}

// Put publishes p as the next version of policy p.ID, after Normalize and
// Validate (a document without a mode is published in shadow). The version
// in p is ignored. With ifMatch, the version in force must be *ifMatch (0:
// the policy must not exist or be deleted), or a *ConflictError is
// returned. It returns the published version. A rejected Put changes
// nothing.
func (r *Registry) Put(ctx context.Context, who string, p Policy, ifMatch *int) (Policy, error) {
	p = p.Normalize()
	if err := p.Validate(); err != nil {
		return Policy{}, err
	}
	var out Policy
	err := r.update(ctx, who, func(s *state, _ time.Time) ([]change, error) {
		if err := checkIfMatch(s, p.ID, ifMatch); err != nil {
			return nil, err
		}
		before, after := s.publish(p, r.cfg.MaxVersions)
		if err := checkFanout(s, p.ID); err != nil {
			return nil, err
		}
		out = after
		return []change{{action: "policy.put", target: p.ID, before: before, after: after}}, nil
	})
	return out, err
}

// Rollback publishes the content of the version before the one in force
// as a new version (with that version's mode). ifMatch works as in Put.
func (r *Registry) Rollback(ctx context.Context, who, id string, ifMatch *int) (Policy, error) {
	var out Policy
	err := r.update(ctx, who, func(s *state, _ time.Time) ([]change, error) {
		if err := checkIfMatch(s, id, ifMatch); err != nil {
			return nil, err
		}
		h, have := s.inForce(id)
		if h == nil || have == 0 {
			return nil, fmt.Errorf("policy %s: %w", id, ErrNotFound)
		}
		if len(h.versions) < 2 {
			return nil, fmt.Errorf("policy %s: %w", id, ErrNoPreviousVersion)
		}
		prev := h.versions[len(h.versions)-2]
		before, after := s.publish(prev, r.cfg.MaxVersions)
		if err := checkFanout(s, id); err != nil {
			return nil, err
		}
		out = after
		return []change{{action: "policy.rollback", target: id, before: before, after: after}}, nil
	})
	return out, err
}

// Delete takes a policy out of force. Its history is kept (Versions still
// lists it) and a later Put continues its version numbers. Overrides of it
// are deleted. ifMatch works as in Put.
func (r *Registry) Delete(ctx context.Context, who, id string, ifMatch *int) error {
	return r.update(ctx, who, func(s *state, _ time.Time) ([]change, error) {
		if err := checkIfMatch(s, id, ifMatch); err != nil {
			return nil, err
		}
		old, have := s.inForce(id)
		if have == 0 {
			return nil, fmt.Errorf("policy %s: %w", id, ErrNotFound)
		}
		h := &history{versions: old.versions, next: old.next, deleted: true}
		s.policies[id] = h
		before := old.versions[len(old.versions)-1]
		out := []change{{action: "policy.delete", target: id, before: before}}
		for _, oid := range slices.Sorted(maps.Keys(s.overrides)) {
			if o := s.overrides[oid]; o.Policy == id {
				delete(s.overrides, oid)
				out = append(out, change{action: "override.delete", target: oid, before: o})
			}
		}
		return out, nil
	})
}

// Seed publishes several policies as one change: all or none. A policy
// whose content equals the version in force (ignoring Version) is left
// alone, so seeding the same file at every start creates no new versions.
// Seed with DefaultPolicies, or with ParsePolicies of a --policies file.
func (r *Registry) Seed(ctx context.Context, who string, ps []Policy) error {
	return r.seed(ctx, who, ps, false)
}

// SeedAtStart is Seed for the set a daemon's configuration gives it at
// start, on a store that may hold changes made since that configuration
// was last seeded: it leaves alone a policy whose kept versions hold the
// seeded content below a later version, or before a deletion. The
// configuration has not changed since it put that version in force, and
// what replaced it (the admin API, a sibling daemon, another region) is
// the newer word: seeding it again would undo that change at every
// restart. A content no kept version holds (the file was edited meanwhile,
// or the version fell out of the kept history) is published as by Seed.
// A content edited back, while no daemon ran, to one the policy held
// before is taken for unchanged and not published: a file's past is not
// kept apart from the policy's.
func (r *Registry) SeedAtStart(ctx context.Context, who string, ps []Policy) error {
	return r.seed(ctx, who, ps, true)
}

// replacedSince reports whether h holds p's content (ignoring Version) in
// a version that a later one, or a deletion, replaced.
func replacedSince(h *history, p Policy) bool {
	for i, v := range h.versions {
		v.Version = p.Version
		if reflect.DeepEqual(v, p) {
			return h.deleted || i < len(h.versions)-1
		}
	}
	return false
}

func (r *Registry) seed(ctx context.Context, who string, ps []Policy, keepLater bool) error {
	normalized := make([]Policy, len(ps))
	ve := &ValidationError{}
	for i, p := range ps {
		p = p.Normalize()
		if err := p.Validate(); err != nil {
			for _, fe := range err.(*ValidationError).Problems {
				ve.add(fmt.Sprintf("[%d].%s", i, fe.Field), "%s", fe.Reason)
			}
		}
		normalized[i] = p
	}
	if err := ve.err(); err != nil {
		return err
	}
	return r.update(ctx, who, func(s *state, _ time.Time) ([]change, error) {
		var out []change
		var changed []string
		for _, p := range normalized {
			if h := s.policies[p.ID]; keepLater && h != nil && replacedSince(h, p) {
				continue
			}
			if h, have := s.inForce(p.ID); have != 0 {
				cur := h.versions[len(h.versions)-1]
				p.Version = cur.Version
				if reflect.DeepEqual(cur, p) {
					continue
				}
			}
			before, after := s.publish(p, r.cfg.MaxVersions)
			changed = append(changed, p.ID)
			out = append(out, change{action: "policy.seed", target: p.ID, before: before, after: after})
		}
		for _, id := range changed {
			if err := checkFanout(s, id); err != nil {
				return nil, err
			}
		}
		return out, nil
	})
}

// PutOverride creates or replaces (by id) an override. The policy must be
// in force, the effective limit valid (or, for an unlimited override, the
// policy not class security) and ExpiresAt in the future. A subject has at
// most one override per policy, exemption or not.
func (r *Registry) PutOverride(ctx context.Context, who string, o Override) (Override, error) {
	err := r.update(ctx, who, func(s *state, now time.Time) ([]change, error) {
		h, have := s.inForce(o.Policy)
		if have == 0 {
			if err := o.validateShape(); err != nil {
				return nil, err
			}
			return nil, &ValidationError{Problems: []FieldError{{Field: "policy", Reason: fmt.Sprintf("no policy %q is in force", o.Policy)}}}
		}
		if err := o.validateFor(h.current.p, now); err != nil {
			return nil, err
		}
		for _, other := range s.overrides {
			if other.ID != o.ID && other.Subject == o.Subject && other.Policy == o.Policy {
				return nil, &ValidationError{Problems: []FieldError{{Field: "subject", Reason: fmt.Sprintf("override %s already applies to this subject and policy", other.ID)}}}
			}
		}
		var before any
		if old, ok := s.overrides[o.ID]; ok {
			before = old
		}
		s.overrides[o.ID] = o
		return []change{{action: "override.put", target: o.ID, before: before, after: o}}, nil
	})
	if err != nil {
		return Override{}, err
	}
	return o, nil
}

// DeleteOverride removes an override; ErrNotFound if there is none.
func (r *Registry) DeleteOverride(ctx context.Context, who, id string) error {
	return r.update(ctx, who, func(s *state, _ time.Time) ([]change, error) {
		o, ok := s.overrides[id]
		if !ok {
			return nil, fmt.Errorf("override %s: %w", id, ErrNotFound)
		}
		delete(s.overrides, id)
		return []change{{action: "override.delete", target: id, before: o}}, nil
	})
}

// PruneExpired deletes expired overrides (Match already ignores them) and
// returns how many it deleted. Every other write prunes too; call this
// periodically to keep the store small.
func (r *Registry) PruneExpired(ctx context.Context, who string) (int, error) {
	n := 0
	err := r.update(ctx, who, func(s *state, now time.Time) ([]change, error) {
		// update has already pruned; count what went.
		n = len(r.view.Load().st.overrides) - len(s.overrides)
		return nil, nil
	})
	return n, err
}

// keyRecord is how a key registry entry appears in the audit log: by id,
// never the key itself.
type keyRecord struct {
	KeyID string `json:"key_id"`
	Tier  string `json:"tier"`
}

// PutKey registers an API key's tier. The registry keeps only KeyID(apiKey),
// never the key.
func (r *Registry) PutKey(ctx context.Context, who, apiKey, tier string) error {
	ve := &ValidationError{}
	if err := validKey(apiKey); err != nil {
		ve.add("api_key", "%v", err)
	}
	if !idPattern.MatchString(tier) {
		ve.add("tier", "must match ^[a-z0-9][a-z0-9._-]{0,63}$, got %q", clip(tier))
	}
	if err := ve.err(); err != nil {
		return err
	}
	id := KeyID(apiKey)
	return r.update(ctx, who, func(s *state, _ time.Time) ([]change, error) {
		old, had := s.keys[id]
		if had && old == tier {
			return nil, nil
		}
		var before any
		if had {
			before = keyRecord{id, old}
		}
		s.keys[id] = tier
		return []change{{action: "key.put", target: id, before: before, after: keyRecord{id, tier}}}, nil
	})
}

// DeleteKey forgets an API key; ErrNotFound if it was not registered.
func (r *Registry) DeleteKey(ctx context.Context, who, apiKey string) error {
	id := KeyID(apiKey)
	return r.update(ctx, who, func(s *state, _ time.Time) ([]change, error) {
		old, ok := s.keys[id]
		if !ok {
			return nil, fmt.Errorf("key %s: %w", id, ErrNotFound)
		}
		delete(s.keys, id)
		return []change{{action: "key.delete", target: id, before: keyRecord{id, old}}}, nil
	})
}

// SyncKeys makes the key registry hold exactly want, given by key id
// (KeyID), as another region's registry holds it: missing and re-tiered
// keys are put, absent ones deleted, identical ones left alone, all in one
// write (one save, so a Redis store's compare-and-set covers the whole
// change) audited as key.put and key.delete. A region receiving keys never
// sees the keys themselves, only their ids, so this is the by-id
// counterpart of PutKey and DeleteKey. An invalid or repeated entry
// rejects the whole call with a *ValidationError naming it by index (its
// content may be anything) and changes nothing.
func (r *Registry) SyncKeys(ctx context.Context, who string, want []KeyEntry) error {
	ve := &ValidationError{}
	seen := make(map[string]bool, len(want))
	for i, k := range want {
		if err := k.Validate(); err != nil {
			for _, fe := range err.(*ValidationError).Problems {
				ve.add(fmt.Sprintf("keys[%d].%s", i, fe.Field), "%s", fe.Reason)
			}
		} else if seen[k.KeyID] {
			ve.add(fmt.Sprintf("keys[%d].key_id", i), "listed twice")
		}
		seen[k.KeyID] = true
	}
	if err := ve.err(); err != nil {
		return err
	}
	return r.update(ctx, who, func(s *state, _ time.Time) ([]change, error) {
		var changes []change
		for _, k := range want {
			old, had := s.keys[k.KeyID]
			if had && old == k.Tier {
				continue
			}
			var before any
			if had {
				before = keyRecord{k.KeyID, old}
			}
			s.keys[k.KeyID] = k.Tier
			changes = append(changes, change{action: "key.put", target: k.KeyID, before: before, after: keyRecord{k.KeyID, k.Tier}})
		}
		for _, id := range slices.Sorted(maps.Keys(s.keys)) {
			if !seen[id] {
				changes = append(changes, change{action: "key.delete", target: id, before: keyRecord{id, s.keys[id]}})
				delete(s.keys, id)
			}
		}
		return changes, nil
	})
}

// Validate checks an entry as the registry stores it: KeyID must be one
// that KeyID can produce (a key id of another form could never match a
// request) and Tier a valid tier, ^[a-z0-9][a-z0-9._-]{0,63}$. The
// *ValidationError names the field and never quotes the entry, which, when
// it comes from elsewhere, may hold anything, even an API key.
func (k KeyEntry) Validate() error {
	ve := &ValidationError{}
	if !validKeyID(k.KeyID) {
		ve.add("key_id", "must be %d lower-case hex digits", keyIDLen)
	} else if !idPattern.MatchString(k.Tier) {
		ve.add("tier", "must match ^[a-z0-9][a-z0-9._-]{0,63}$")
	}
	return ve.err()
}

// validKeyID reports whether id is a KeyID: keyIDLen lower-case hex digits.
func validKeyID(id string) bool {
	if len(id) != keyIDLen {
		return false
	}
	for _, c := range []byte(id) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// ---- the fan-out limit ----

// checkFanout refuses a state in which policy id could apply to one
// request together with more than MaxPoliciesPerRequest-1 others.
//
// Tiers and methods are compared exactly: the check runs once per tier
// named by some policy (plus "any other tier") and per method (plus "any
// other method"). Routes are compared conservatively: two policies are
// taken to meet when their globs may overlap (glob.mayOverlap), and the
// policies that apply to one request must all meet each other, so the
// check looks for MaxPoliciesPerRequest others that all meet id and each
// other.
//
// Descriptor policies never meet HTTP ones and are left out: each
// descriptor of a request matches the policies of one tree node, and the
// rate limit service bounds a request's descriptors instead.
func checkFanout(s *state, id string) error {
	target := s.policies[id].current
	if target == nil || target.p.IsDescriptorPolicy() {
		return nil
	}
	var all []*compiled
	tiers := map[string]bool{"": true}
	methods := map[string]bool{"": true}
	for _, h := range s.policies {
		if h.current == nil || h.current.p.IsDescriptorPolicy() {
			continue
		}
		all = append(all, h.current)
		tiers[h.current.p.Match.Tier] = true
		for _, m := range h.current.p.Match.Methods {
			methods[m] = true
		}
	}
	if len(all) <= MaxPoliciesPerRequest {
		return nil
	}
	sort.Slice(all, func(i, j int) bool { return all[i].p.ID < all[j].p.ID })
	appliesTo := func(c *compiled, tier, method string) bool {
		if c.p.Match.Tier != "" && c.p.Match.Tier != tier {
			return false
		}
		if method == "" {
			return c.methods == nil
		}
		return c.matchMethod(method)
	}
	for tier := range tiers {
		for method := range methods {
			if !appliesTo(target, tier, method) {
				continue
			}
			var nbrs []*compiled
			for _, c := range all {
				if c != target && appliesTo(c, tier, method) && routesMayOverlap(c, target) {
					nbrs = append(nbrs, c)
				}
			}
			if len(nbrs) < MaxPoliciesPerRequest {
				continue
			}
			if clique := findClique(nbrs, MaxPoliciesPerRequest); clique != nil {
				ids := make([]string, len(clique))
				for i, c := range clique {
					ids[i] = c.p.ID
				}
				where := "every tier"
				if tier != "" {
					where = "tier " + tier
				}
				if method != "" {
					where += ", method " + method
				} else {
					where += ", any method"
				}
				return &ValidationError{Problems: []FieldError{{Field: "match", Reason: fmt.Sprintf(
					"this policy and %d others (%s) may all apply to one request (%s); at most %d policies may apply to one request: narrow match.tier, match.routes or match.methods, or delete a policy",
					len(ids), strings.Join(ids, ", "), where, MaxPoliciesPerRequest)}}}
			}
		}
	}
	return nil
}

func routesMayOverlap(a, b *compiled) bool {
	if a.routes == nil || b.routes == nil {
		return true
	}
	for _, g := range a.routes {
		for _, h := range b.routes {
			if g.mayOverlap(h) {
				return true
			}
		}
	}
	return false
}

// findClique returns k policies from cs that pairwise may overlap, or nil.
// cs is small (the neighbours of one policy) and the search stops at the
// first clique found.
func findClique(cs []*compiled, k int) []*compiled {
	n := len(cs)
	adj := make([][]bool, n)
	deg := make([]int, n)
	for i := range adj {
		adj[i] = make([]bool, n)
	}
	for i := 0; i < n; i++ {
		for j := i + 1; j < n; j++ {
			if routesMayOverlap(cs[i], cs[j]) {
				adj[i][j], adj[j][i] = true, true
				deg[i]++
				deg[j]++
			}
		}
	}
	var cand []int
	for i := range cs {
		if deg[i] >= k-1 {
			cand = append(cand, i)
		}
	}
	budget := 100000 // bounds pathological searches; on exhaustion, refuse
	var pick []int
	var rec func(from []int) bool
	rec = func(from []int) bool {
		if len(pick) == k {
			return true
		}
		budget--
		if budget < 0 {
			return true
		}
		for x, i := range from {
			if len(pick)+len(from)-x < k {
				return false
			}
			var next []int
			for _, j := range from[x+1:] {
				if adj[i][j] {
					next = append(next, j)
				}
			}
			pick = append(pick, i)
			if rec(next) {
				return true
			}
			pick = pick[:len(pick)-1]
		}
		return false
	}
	if !rec(cand) {
		return nil
	}
	if len(pick) < k { // budget exhausted: report the candidates
		pick = cand
	}
	out := make([]*compiled, len(pick))
	for i, j := range pick {
		out[i] = cs[j]
	}
	return out
}
