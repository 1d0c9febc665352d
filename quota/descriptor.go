package quota

import (
	"fmt"
	"slices"
	"strings"

	"github.com/sluice-rl/sluice/engine"
)

// Bounds on descriptors, in policies and in the requests matched against
// them, so that matching stays cheap and a state's name stays short.
const (
	// MaxDescriptorEntries is the most entries one descriptor may have.
	MaxDescriptorEntries = 8
	// MaxDescriptorKeyBytes and MaxDescriptorValueBytes bound an entry.
	MaxDescriptorKeyBytes   = 128
	MaxDescriptorValueBytes = 1024
	// MaxDomainBytes bounds a domain name.
	MaxDomainBytes = 255
	// MaxOrder bounds Match.Order.
	MaxOrder    = 1 << 20
	maxReplaces = 16
)

// DescriptorEntry is one key/value pair of a rate limit descriptor, as
// Envoy's rate limit service API sends them. In a policy, an empty Value
// matches any value of Key, and a Value with '*' matches values of that
// shape, each '*' standing for any run of characters; the values a
// request sends are part of the state a policy counts, so an entry without
// a value counts each value apart.
type DescriptorEntry struct {
	Key   string `json:"key"`
	Value string `json:"value,omitempty"`
}

// ValidDescriptorText reports why s cannot be a descriptor domain, key or
// value of at most max bytes, or nil. Control characters are refused: they
// separate the parts of a state's name.
func ValidDescriptorText(s string, max int) error {
	if len(s) > max {
		return fmt.Errorf("longer than %d bytes", max)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == 0x7f {
			return fmt.Errorf("must not contain control characters")
		}
	}
	return nil
}

// StateSep separates a descriptor state's name, as the rate limit service
// names it, from the policy id before it: the policy id, then for each
// entry StateSep, the key, 0x1e and the value. No policy id, key or value
// contains a control character.
const StateSep = "\x1f"

// PolicyOfState is the id of the policy whose engine state is named state
// (Applied.StateName): the policy id itself, or the part of a descriptor
// state's name before the first StateSep. The global-shares machinery
// keys a descriptor's share by its state's name (one share per descriptor
// value) and resolves it to the policy with PolicyOfState.
func PolicyOfState(state string) string {
	id, _, _ := strings.Cut(state, StateSep)
	return id
}

// IsDescriptorPolicy reports whether p limits rate limit descriptors (it
// has a match.domain) rather than HTTP requests.
func (p Policy) IsDescriptorPolicy() bool { return p.Match.Domain != "" }

// DeniesAll reports whether p is a descriptor policy with a fixed window
// of limit 0: every descriptor it matches that spends anything is over
// the limit (Envoy's requests_per_unit: 0). The engine has no such limit;
// the caller answers it without a check.
func (p Policy) DeniesAll() bool {
	return p.IsDescriptorPolicy() && !p.Unlimited && p.Algorithm == engine.FixedWindow.String() && p.Count == 0
}

// validateDescriptors checks the descriptor fields of a policy: match.domain,
// match.descriptors, unlimited and replaces. It reports whether the limit
// fields are to be skipped (an unlimited policy has none) or checked with
// a limit of 1 (a policy that denies all has limit 0).
func (p Policy) validateDescriptors(ve *ValidationError) (skipLimit, denyAll bool) {
	m := p.Match
	if m.Order < 0 || m.Order > MaxOrder {
		ve.add("match.order", "must be from 0 to %d, got %d", MaxOrder, m.Order)
	}
	if m.Domain == "" {
		if len(m.Descriptors) > 0 {
			ve.add("match.descriptors", "needs match.domain")
		}
		if m.Order != 0 {
			ve.add("match.order", "needs match.domain")
		}
		if p.Unlimited {
			ve.add("unlimited", "only a descriptor policy (with match.domain) may be unlimited")
		}
		if len(p.Replaces) > 0 {
			ve.add("replaces", "only a descriptor policy (with match.domain) may replace others")
		}
		if p.CountOverLimit {
			ve.add("count_over_limit", "only a descriptor policy (with match.domain) counts hits over the limit; charge an HTTP policy with POST /v1/charge")
		}
		return false, false
	}
	if err := ValidDescriptorText(m.Domain, MaxDomainBytes); err != nil {
		ve.add("match.domain", "%v", err)
	}
	if m.Tier != "" || len(m.Routes) > 0 || len(m.Methods) > 0 || len(p.Cost) > 0 {
		ve.add("match", "a descriptor policy (with match.domain) matches descriptors, not tiers, routes, methods or costs")
	}
	if p.Scope == ScopeGlobal && p.Unlimited {
		ve.add("scope", "an unlimited policy has no limit to share across regions: scope must be region")
	}
	switch n := len(m.Descriptors); {
	case n == 0:
		ve.add("match.descriptors", "at least one entry is required with match.domain")
	case n > MaxDescriptorEntries:
		ve.add("match.descriptors", "at most %d entries, got %d", MaxDescriptorEntries, n)
	}
	for i, e := range m.Descriptors {
		if i >= MaxDescriptorEntries {
			break
		}
		f := fmt.Sprintf("match.descriptors[%d]", i)
		if e.Key == "" {
			ve.add(f+".key", "required")
		} else if err := ValidDescriptorText(e.Key, MaxDescriptorKeyBytes); err != nil {
			ve.add(f+".key", "%v", err)
		}
		if err := ValidDescriptorText(e.Value, MaxDescriptorValueBytes); err != nil {
			ve.add(f+".value", "%v", err)
		}
	}
	if len(p.Replaces) > maxReplaces {
		ve.add("replaces", "at most %d policies, got %d", maxReplaces, len(p.Replaces))
	}
	for i, id := range p.Replaces {
		if i >= maxReplaces {
			break
		}
		f := fmt.Sprintf("replaces[%d]", i)
		switch {
		case !idPattern.MatchString(id):
			ve.add(f, "must be a policy id, got %q", clip(id))
		case id == p.ID:
			ve.add(f, "a policy cannot replace itself")
		case slices.Index(p.Replaces, id) < i:
			ve.add(f, "duplicate %q", id)
		}
	}
	switch {
	case p.Unlimited && p.CountOverLimit:
		ve.add("count_over_limit", "an unlimited policy counts nothing")
	case p.CountOverLimit && p.Algorithm == engine.SlidingWindowLog.String():
		ve.add("count_over_limit", "a sliding_window_log cannot count past its limit (it keeps one timestamp per unit, at most its count): use sliding_window_counter")
	}
	if p.Unlimited {
		if p.Algorithm != "" || p.RatePerSec != 0 || p.Burst != 0 || p.Count != 0 || p.Window != 0 {
			ve.add("unlimited", "an unlimited policy has no algorithm, rate_per_sec, burst, limit or window")
		}
		return true, false
	}
	return false, p.Algorithm == engine.FixedWindow.String() && p.Count == 0
}

// descNode is one level of a domain's descriptor tree: the entries that
// lead on from here, and the policies whose descriptors end here.
type descNode struct {
	exact    map[DescriptorEntry]*descNode // key and value
	wild     []wildEdge                    // key and a value with '*'
	any      map[string]*descNode          // key only
	policies []*compiled
}

type wildEdge struct {
	key   string
	parts []string // the value split at '*'
	node  *descNode
	// rank is the lowest Match.Order of the policies through this edge,
	// 0 when none has one.
	rank int
}

func (n *descNode) leaf() bool { return len(n.exact) == 0 && len(n.wild) == 0 && len(n.any) == 0 }

// child returns the node for entry e, creating it; order is the
// Match.Order of the policy being added.
func (n *descNode) child(e DescriptorEntry, order int) *descNode {
	switch {
	case e.Value == "":
		if n.any == nil {
			n.any = map[string]*descNode{}
		}
		if n.any[e.Key] == nil {
			n.any[e.Key] = &descNode{}
		}
		return n.any[e.Key]
	case strings.Contains(e.Value, "*"):
		for i := range n.wild {
			if w := &n.wild[i]; w.key == e.Key && strings.Join(w.parts, "*") == e.Value {
				if order > 0 && (w.rank == 0 || order < w.rank) {
					w.rank = order
				}
				return w.node
			}
		}
		w := wildEdge{key: e.Key, parts: strings.Split(e.Value, "*"), node: &descNode{}, rank: order}
		n.wild = append(n.wild, w)
		return w.node
	default:
		if n.exact == nil {
			n.exact = map[DescriptorEntry]*descNode{}
		}
		if n.exact[e] == nil {
			n.exact[e] = &descNode{}
		}
		return n.exact[e]
	}
}

// sortWild orders the value patterns of n and of every node below it in
// the order find tries them: by rank (Match.Order), those without one
// last; then the more literal characters a pattern has, the sooner; then
// by text, so that the order does not depend on the order policies were
// added in.
func (n *descNode) sortWild() {
	slices.SortStableFunc(n.wild, func(a, b wildEdge) int {
		if a.rank != b.rank {
			switch {
			case a.rank == 0:
				return 1
			case b.rank == 0:
				return -1
			}
			return a.rank - b.rank
		}
		if la, lb := literalLen(a.parts), literalLen(b.parts); la != lb {
			return lb - la
		}
		return strings.Compare(a.key+"\x00"+strings.Join(a.parts, "*"), b.key+"\x00"+strings.Join(b.parts, "*"))
	})
	for _, next := range n.exact {
		next.sortWild()
	}
	for _, w := range n.wild {
		w.node.sortWild()
	}
	for _, next := range n.any {
		next.sortWild()
	}
}

func literalLen(parts []string) int {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	return n
}

// wildMatch reports whether v has the shape of parts (a pattern split at
// '*'): it starts with the first part, ends with the last and holds the
// others in order between them.
func wildMatch(parts []string, v string) bool {
	if len(parts) == 1 {
		return parts[0] == v
	}
	first, last := parts[0], parts[len(parts)-1]
	if len(v) < len(first)+len(last) || !strings.HasPrefix(v, first) || !strings.HasSuffix(v, last) {
		return false
	}
	rest := v[len(first) : len(v)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}

// find walks the tree along entries, as envoyproxy/ratelimit walks its
// configuration: at each level the most specific step is taken, once and
// for good: the entry's key and value, else a value pattern (in the
// order of sortWild), else the key alone. It returns the policies of the node the last entry leads to, or
// nil when a step is missing or the request has more entries than the
// tree has levels there.
func (n *descNode) find(entries []DescriptorEntry) []*compiled {
	for i, e := range entries {
		next := n.exact[e]
		if next == nil {
			for j := range n.wild {
				if w := &n.wild[j]; w.key == e.Key && wildMatch(w.parts, e.Value) {
					next = w.node
					break
				}
			}
		}
		if next == nil {
			next = n.any[e.Key]
		}
		if next == nil {
			return nil
		}
		if i == len(entries)-1 {
			return next.policies
		}
		if next.leaf() {
			return nil
		}
		n = next
	}
	return nil
}

// DescriptorMatch is one policy that applies to one descriptor.
type DescriptorMatch struct {
	// Policy is the version in force. It is shared: do not modify it.
	Policy *Policy
	// Limit is the policy's limit; zero for an unlimited policy.
	Limit engine.Limit
}

// HasDomain reports whether any policy in force matches descriptors of
// domain. A rate limit service answers every descriptor of an unknown
// domain as not limited.
func (r *Registry) HasDomain(domain string) bool {
	_, ok := r.view.Load().domains[domain]
	return ok
}

// AppendMatchDescriptor appends to dst the policies that apply to one
// descriptor of domain, ordered by policy id, and returns it. The
// descriptor's entries are walked as envoyproxy/ratelimit walks its
// configuration (see docs/api.md): a policy applies when its
// match.descriptors has exactly as many entries as the descriptor, and
// each step, key and value first, then a value pattern (the pattern of
// the lowest Match.Order first), then the key alone, leads to it. Several policies may end on the same entries; all of
// them apply. It takes no lock.
func (r *Registry) AppendMatchDescriptor(dst []DescriptorMatch, domain string, entries []DescriptorEntry) []DescriptorMatch {
	root := r.view.Load().domains[domain]
	if root == nil || len(entries) == 0 {
		return dst
	}
	for _, c := range root.find(entries) {
		dst = append(dst, DescriptorMatch{Policy: &c.p, Limit: c.limit})
	}
	return dst
}

// buildDomains compiles the descriptor policies of cs into one tree per
// domain.
func buildDomains(cs []*compiled) map[string]*descNode {
	out := map[string]*descNode{}
	for _, c := range cs {
		root := out[c.p.Match.Domain]
		if root == nil {
			root = &descNode{}
			out[c.p.Match.Domain] = root
		}
		n := root
		for _, e := range c.p.Match.Descriptors {
			n = n.child(e, c.p.Match.Order)
		}
		n.policies = append(n.policies, c)
	}
	for _, root := range out {
		root.sortWild()
	}
	return out
}
