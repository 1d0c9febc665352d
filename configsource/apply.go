package configsource

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/sluice-rl/sluice/quota"
)

// Target is where an Applier writes: a *quota.Registry, or a daemon's
// region.SourceWriter, which also broadcasts each change to the other
// regions.
type Target interface {
	Get(id string) (quota.Policy, bool)
	Seed(ctx context.Context, who string, ps []quota.Policy) error
	Delete(ctx context.Context, who, id string, ifMatch *int) error
}

// Applier puts the policies of every source in force in one Target and
// keeps which source owns which policy. Ownership lives in the Applier:
// a policy dropped from a source while no daemon ran is not known to be
// the source's and stays until deleted through the admin API. It is safe
// for concurrent use by several sources.
type Applier struct {
	t      Target
	mu     sync.Mutex
	owners map[string]string // policy id → source
}

// NewApplier returns an Applier writing into t, owning nothing yet.
func NewApplier(t Target) *Applier {
	return &Applier{t: t, owners: map[string]string{}}
}

// Claim records that source owns ps, already in force (seeded at start).
// A policy another source claimed is an *OwnerError.
func (a *Applier) Claim(source string, ps []quota.Policy) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range ps {
		if o, ok := a.owners[p.ID]; ok && o != source {
			return &OwnerError{ID: p.ID, Source: source, Owner: o}
		}
	}
	for _, p := range ps {
		a.owners[p.ID] = source
	}
	return nil
}

// Owned returns how many policies source owns.
func (a *Applier) Owned(source string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, o := range a.owners {
		if o == source {
			n++
		}
	}
	return n
}

// RefusedError is a configuration the Target refused as invalid (e.g.
// more policies matching one request than allowed): like a parse error,
// retrying it cannot help.
type RefusedError struct{ Err error }

func (e *RefusedError) Error() string { return "refused: " + e.Err.Error() }
func (e *RefusedError) Unwrap() error { return e.Err }

// Apply makes the policies source owns exactly want (see Diff): the new
// and changed ones are published as one change, then those no longer
// configured are deleted. It returns what it wrote. An *OwnerError or a
// *RefusedError changes nothing; another error (the store failed) may
// leave some deletes undone, and applying want again finishes them.
func (a *Applier) Apply(ctx context.Context, source string, want []quota.Policy) (Plan, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	p, err := Diff(source, a.owners, a.t.Get, want)
	if err != nil {
		return Plan{}, err
	}
	who := "config:" + source
	if len(p.Put) > 0 {
		if err := a.t.Seed(ctx, who, p.Put); err != nil {
			if errors.Is(err, quota.ErrInvalidPolicy) {
				return Plan{}, &RefusedError{Err: err}
			}
			return Plan{}, fmt.Errorf("publishing %d policies: %w", len(p.Put), err)
		}
	}
	for _, w := range want {
		a.owners[w.ID] = source
	}
	for _, id := range p.Delete {
		if err := a.t.Delete(ctx, who, id, nil); err != nil && !errors.Is(err, quota.ErrNotFound) {
			return p, fmt.Errorf("deleting policy %s: %w", id, err)
		}
		delete(a.owners, id)
	}
	// Owned policies already gone (deleted through the admin API, or by
	// another daemon sharing the store) are no longer owned unless wanted.
	wanted := make(map[string]bool, len(want))
	for _, w := range want {
		wanted[w.ID] = true
	}
	for id, o := range a.owners {
		if o == source && !wanted[id] {
			delete(a.owners, id)
		}
	}
	return p, nil
}
