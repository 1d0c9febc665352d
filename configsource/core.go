// Package configsource keeps policies in force from configuration the
// daemon watches: files and directories of envoyproxy/ratelimit YAML
// (--envoy-config) or of policy documents (--policies), polled, and a
// configuration server (package configsource/xds).
//
// Each source owns the policies it put in force: when its configuration
// changes, the policies it configures are published and those it owned
// and configures no more are deleted; a policy it never configured (one
// published through the admin API, or by another source) is never
// touched. A configuration that does not parse or validate is refused as
// a whole and the last good one stays in force.
//
// The core is pure: Diff (configuration wanted, policies in force,
// ownership → the writes) and Settle (what was read → whether to apply
// it). Applier writes a Diff into a quota.Registry; Watcher reads files
// on a ticker.
package configsource

import (
	"fmt"
	"slices"

	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/region/policyset"
)

// Plan is the writes that make the policies a source owns exactly the
// ones it configures: Put (new or changed, in the configuration's order)
// as one all-or-none publish, then Delete (ids, sorted).
type Plan struct {
	Put    []quota.Policy
	Delete []string
}

// Empty reports whether there is nothing to write.
func (p Plan) Empty() bool { return len(p.Put)+len(p.Delete) == 0 }

// OwnerError is a policy that two sources configure.
type OwnerError struct {
	ID, Source, Owner string
}

func (e *OwnerError) Error() string {
	return fmt.Sprintf("policy %s is configured by %s already", e.ID, e.Owner)
}

// Diff returns the writes that make source's policies want, where owners
// maps each policy id a source owns to that source and inForce returns
// the policy in force under an id. A policy of want equal to the one in
// force (but for its version) is not written again; a policy in force
// that no source owns (published through the admin API) is taken over
// when want configures its id, and left alone otherwise. A policy of want
// owned by another source is an *OwnerError.
func Diff(source string, owners map[string]string, inForce func(id string) (quota.Policy, bool), want []quota.Policy) (Plan, error) {
	var p Plan
	wanted := make(map[string]bool, len(want))
	for _, w := range want {
		if o, ok := owners[w.ID]; ok && o != source {
			return Plan{}, &OwnerError{ID: w.ID, Source: source, Owner: o}
		}
		wanted[w.ID] = true
		if cur, ok := inForce(w.ID); ok && policyset.SamePolicy(cur, w.Normalize()) {
			continue
		}
		p.Put = append(p.Put, w)
	}
	for id, o := range owners {
		if o == source && !wanted[id] {
			if _, ok := inForce(id); ok {
				p.Delete = append(p.Delete, id)
			}
		}
	}
	slices.Sort(p.Delete)
	return p, nil
}

// Settle decides, from successive reads of a source, when one is to be
// parsed: a read is taken only when the read before it had the same
// fingerprint (a file being written changes between two reads, so a
// half-written file is not taken for the configuration), and only once.
// The zero Settle has taken nothing.
type Settle struct {
	prev  string
	taken string
	any   bool
}

// Taken starts s as having taken fp: the configuration read at start.
func (s *Settle) Taken(fp string) { s.prev, s.taken, s.any = fp, fp, true }

// Observe records a read of fingerprint fp and reports whether to parse
// and apply it now.
func (s *Settle) Observe(fp string) bool {
	stable := fp == s.prev
	s.prev = fp
	return stable && (!s.any || fp != s.taken)
}

// Done records that the read fp was handled: applied, or refused for
// what it says (a refusal is not retried until the configuration
// changes). A read whose apply failed for want of the store is not
// Done, and the next Observe of it retries.
func (s *Settle) Done(fp string) { s.taken, s.any = fp, true }
