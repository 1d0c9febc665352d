package region

import (
	"context"

	"github.com/sluice-rl/sluice/quota"
)

// SourceWriter writes the policies of watched configuration sources
// (files, xDS) into the daemon's registry as the admin API does: a write
// is a local change that the daemon broadcasts to the other regions with
// a new policy-set revision. Written into the registry alone, a source's
// change would carry no revision, and a daemon that started after it
// would take the older set it finds in gossip over what its own file
// says; its watcher, seeing the file unchanged, would never put it back.
type SourceWriter struct{ d *Daemon }

// SourceWriter returns the writer for the daemon's watched sources.
func (d *Daemon) SourceWriter() SourceWriter { return SourceWriter{d: d} }

// Get returns the policy id in force.
func (s SourceWriter) Get(id string) (quota.Policy, bool) { return s.d.reg.Get(id) }

// Seed puts ps in force as one change, as quota.Registry.Seed does.
func (s SourceWriter) Seed(ctx context.Context, who string, ps []quota.Policy) error {
	if err := s.d.reg.Seed(ctx, who, ps); err != nil {
		return err
	}
	s.d.policiesChanged()
	return nil
}

// Delete deletes policy id, as quota.Registry.Delete does.
func (s SourceWriter) Delete(ctx context.Context, who, id string, ifMatch *int) error {
	if err := s.d.reg.Delete(ctx, who, id, ifMatch); err != nil {
		return err
	}
	s.d.policiesChanged()
	return nil
}
