package policyset

import (
	"slices"
	"strings"

	"github.com/sluice-rl/sluice/quota"
)

// Changes are the registry writes that make a registry holding one set
// hold another, to be made in field order: policies put, then deleted;
// overrides deleted, then put; then keys. That order meets the registry's
// rules on the way:
//
//   - a changed policy is in force before its overrides are put, since an
//     override is checked against the policy in force;
//   - an override is deleted before another takes its subject and policy
//     (a subject has one override per policy);
//   - deleting a policy deletes its overrides too (quota.Registry.Delete),
//     so they are listed in DeleteOverrides as well and a writer takes
//     quota.ErrNotFound there as done.
//
// Policies are put before others are deleted, so for a moment both apply
// (more limiting, never less); a registry at its limit of policies per
// request may refuse such a moment even though the final set is valid.
//
// The keys are written in one call, quota.Registry.SyncKeys of the wanted
// list, since a region only ever holds key ids; PutKeys and DeleteKeys say
// whether that call changes anything and what.
type Changes struct {
	PutPolicies     []quota.Policy // new or changed, in the wanted set's order
	DeletePolicies  []string       // ids, sorted
	DeleteOverrides []string       // ids, sorted
	PutOverrides    []quota.Override
	PutKeys         []quota.KeyEntry // new or re-tiered, sorted by key id
	DeleteKeys      []string         // key ids, sorted
}

// Empty reports whether there is nothing to write.
func (c Changes) Empty() bool {
	return len(c.PutPolicies)+len(c.DeletePolicies)+len(c.DeleteOverrides)+len(c.PutOverrides)+len(c.PutKeys)+len(c.DeleteKeys) == 0
}

// Diff returns the changes that turn have, what a registry holds, into
// want, a set that passed Validate. Policies equal but for their version
// (SamePolicy) and overrides equal as SameOverride compares them are left
// alone, so applying a set twice, or on several daemons sharing one store,
// writes nothing the second time. When want does not carry overrides
// (or keys), those of have stay, except the overrides of the policies it
// deletes.
func Diff(have, want Set) Changes {
	var c Changes
	held := make(map[string]quota.Policy, len(have.Policies))
	for _, p := range have.Policies {
		held[p.ID] = p
	}
	keep := make(map[string]bool, len(want.Policies))
	for _, p := range want.Policies {
		keep[p.ID] = true
		if cur, ok := held[p.ID]; !ok || !SamePolicy(cur, p) {
			c.PutPolicies = append(c.PutPolicies, p)
		}
	}
	for id := range held {
		if !keep[id] {
			c.DeletePolicies = append(c.DeletePolicies, id)
		}
	}
	slices.Sort(c.DeletePolicies)

	if want.Overrides == nil {
		for _, o := range have.overrides() {
			if !keep[o.Policy] {
				c.DeleteOverrides = append(c.DeleteOverrides, o.ID)
			}
		}
	} else {
		c.DeleteOverrides, c.PutOverrides = diffOverrides(have.overrides(), *want.Overrides)
	}
	slices.Sort(c.DeleteOverrides)

	if want.Keys != nil {
		tiers := make(map[string]string, len(have.keys()))
		for _, k := range have.keys() {
			tiers[k.KeyID] = k.Tier
		}
		wanted := make(map[string]bool, len(*want.Keys))
		for _, k := range *want.Keys {
			wanted[k.KeyID] = true
			if t, ok := tiers[k.KeyID]; !ok || t != k.Tier {
				c.PutKeys = append(c.PutKeys, k)
			}
		}
		for id := range tiers {
			if !wanted[id] {
				c.DeleteKeys = append(c.DeleteKeys, id)
			}
		}
		slices.SortFunc(c.PutKeys, func(a, b quota.KeyEntry) int { return strings.Compare(a.KeyID, b.KeyID) })
		slices.Sort(c.DeleteKeys)
	}
	return c
}

// diffOverrides returns the overrides of have to delete and those of want
// to put. An override of have whose id want changes is replaced in place
// by the put, unless another override of want takes its subject and
// policy: it is deleted first, so that the other's put finds the pair free.
func diffOverrides(have, want []quota.Override) (del []string, put []quota.Override) {
	type pair struct{ subject, policy string }
	byID := make(map[string]quota.Override, len(want))
	claimed := make(map[pair]string, len(want))
	for _, o := range want {
		byID[o.ID] = o
		claimed[pair{o.Subject, o.Policy}] = o.ID
	}
	unchanged := map[string]bool{}
	for _, o := range have {
		w, ok := byID[o.ID]
		if ok && SameOverride(o, w) {
			unchanged[o.ID] = true
			continue
		}
		if id, taken := claimed[pair{o.Subject, o.Policy}]; ok && (!taken || id == o.ID) {
			continue // replaced in place by the put
		}
		del = append(del, o.ID)
	}
	for _, o := range want {
		if !unchanged[o.ID] {
			put = append(put, o)
		}
	}
	return del, put
}
