package policyset

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/quota"
)

// Part names what in a set an InvalidError is about.
type Part string

// The parts of a set.
const (
	PartPolicy   Part = "policy"
	PartPolicies Part = "policies" // the policies together, e.g. too many may apply to one request
	PartOverride Part = "override"
	PartKey      Part = "key entry"
)

// InvalidError is why Validate refused a set. It names the entry: a policy
// or override by id, a key entry by its index alone, since its content may
// be anything, even (by a sender's mistake) an API key.
type InvalidError struct {
	Part Part
	// ID is the policy's or override's id; empty for PartPolicies and
	// PartKey.
	ID string
	// Index is the entry's position in its list; 0 for PartPolicies.
	Index int
	Err   error
}

func (e *InvalidError) Error() string {
	switch e.Part {
	case PartKey:
		return fmt.Sprintf("%s %d: %v", e.Part, e.Index, e.Err)
	case PartPolicies:
		return fmt.Sprintf("%s: %v", e.Part, e.Err)
	}
	return fmt.Sprintf("%s %q: %v", e.Part, e.ID, e.Err)
}

func (e *InvalidError) Unwrap() error { return e.Err }

// errTwice is the refusal of an id listed twice in one list.
var errTwice = errors.New("listed twice")

// Validate checks a received set as the admin API would check its entries,
// at now, and returns the set to apply, or an *InvalidError naming the
// first entry refused. A set is applied whole or not at all, so one bad
// entry refuses it.
//
//   - Each policy must pass quota.Policy.Validate and its id appear once;
//     together they must be a set the registry accepts (quota.Registry.Seed:
//     no request may match too many of them).
//   - Each override must fit the set's policy it names (as
//     quota.Registry.PutOverride checks it), a subject may have one
//     override per policy, and an id may appear once. Overrides expired by
//     now are left out of the result: they would be pruned at once, and
//     skipping them keeps them from coming back.
//   - Each key entry must pass quota.KeyEntry.Validate and its key id
//     appear once. The result lists them sorted by key id.
//
// Overrides and Keys stay nil in the result when the set does not carry
// them.
func (s Set) Validate(now time.Time) (Set, error) {
	seen := make(map[string]bool, len(s.Policies))
	for i, p := range s.Policies {
		if err := p.Validate(); err != nil {
			return Set{}, &InvalidError{Part: PartPolicy, ID: p.ID, Index: i, Err: err}
		}
		if seen[p.ID] {
			return Set{}, &InvalidError{Part: PartPolicy, ID: p.ID, Index: i, Err: errTwice}
		}
		seen[p.ID] = true
	}
	// The registry's own checks, on a scratch registry: in memory, stopped
	// at now, saving and auditing nothing.
	scratch := quota.NewRegistry(quota.RegistryConfig{Clock: fixedClock(now)})
	ctx := context.Background() // the scratch registry does no I/O
	if err := scratch.Seed(ctx, "gossip", s.Policies); err != nil {
		return Set{}, &InvalidError{Part: PartPolicies, Err: err}
	}
	out := Set{Origin: s.Origin, Policies: s.Policies}
	if s.Overrides != nil {
		live, err := validOverrides(ctx, scratch, *s.Overrides, now)
		if err != nil {
			return Set{}, err
		}
		out.Overrides = &live
	}
	if s.Keys != nil {
		keys, err := validKeys(*s.Keys)
		if err != nil {
			return Set{}, err
		}
		out.Keys = &keys
	}
	return out, nil
}

// fixedClock is a quota.Clock stopped at one instant.
type fixedClock time.Time

func (c fixedClock) Now() time.Time { return time.Time(c) }

// validOverrides puts ovs into scratch, which holds the set's policies,
// and returns those in force at now.
func validOverrides(ctx context.Context, scratch *quota.Registry, ovs []quota.Override, now time.Time) ([]quota.Override, error) {
	seen := make(map[string]bool, len(ovs))
	for i, o := range ovs {
		if seen[o.ID] {
			return nil, &InvalidError{Part: PartOverride, ID: o.ID, Index: i, Err: errTwice}
		}
		seen[o.ID] = true
	}
	live := make([]quota.Override, 0, len(ovs))
	for i, o := range ovs {
		if !o.ExpiresAt.IsZero() && !o.ExpiresAt.After(now) {
			continue // expired (a zero expiry is refused by PutOverride)
		}
		if _, err := scratch.PutOverride(ctx, "gossip", o); err != nil {
			return nil, &InvalidError{Part: PartOverride, ID: o.ID, Index: i, Err: err}
		}
		live = append(live, o)
	}
	return live, nil
}

// validKeys checks each entry and returns them sorted by key id.
func validKeys(keys []quota.KeyEntry) ([]quota.KeyEntry, error) {
	seen := make(map[string]bool, len(keys))
	for i, k := range keys {
		if err := k.Validate(); err != nil {
			return nil, &InvalidError{Part: PartKey, Index: i, Err: err}
		}
		if seen[k.KeyID] {
			return nil, &InvalidError{Part: PartKey, Index: i, Err: errors.New("key_id listed twice")}
		}
		seen[k.KeyID] = true
	}
	out := slices.Clone(keys)
	slices.SortFunc(out, func(a, b quota.KeyEntry) int { return strings.Compare(a.KeyID, b.KeyID) })
	if out == nil {
		out = []quota.KeyEntry{}
	}
	return out, nil
}
