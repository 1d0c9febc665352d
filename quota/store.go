package quota

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
)

// Store persists a Registry's whole state. Save must be atomic: after a
// crash at any point, Load returns either the previous or the new snapshot,
// whole. A Redis-backed Store (for daemons sharing policies) implements the
// same two methods.
type Store interface {
	// Load returns the last saved snapshot, or an error wrapping
	// ErrNoSnapshot when nothing was ever saved.
	Load(ctx context.Context) (Snapshot, error)
	// Save replaces the saved snapshot.
	Save(ctx context.Context, s Snapshot) error
}

// ErrNoSnapshot means the store holds no state yet: seed it.
var ErrNoSnapshot = errors.New("no saved policy state")

// SnapshotFormat is the current Snapshot.Format.
const SnapshotFormat = 1

// Snapshot is the persistent form of a Registry: every kept version of
// every policy, the overrides and the key registry (by key id).
type Snapshot struct {
	Format    int             `json:"format"`
	Policies  []PolicyHistory `json:"policies"`
	Overrides []Override      `json:"overrides"`
	Keys      []KeyEntry      `json:"keys"`
}

// PolicyHistory is the kept versions of one policy, oldest first.
type PolicyHistory struct {
	ID string `json:"id"`
	// NextVersion is the version number the next change gets; it is above
	// every kept version even after old ones were dropped.
	NextVersion int      `json:"next_version"`
	Deleted     bool     `json:"deleted,omitempty"`
	Versions    []Policy `json:"versions"`
}

// KeyEntry maps an API key id (KeyID) to a tier.
type KeyEntry struct {
	KeyID string `json:"key_id"`
	Tier  string `json:"tier"`
}

func exportState(s *state) Snapshot {
	snap := Snapshot{Format: SnapshotFormat, Policies: []PolicyHistory{}, Overrides: []Override{}, Keys: []KeyEntry{}}
	for _, id := range slices.Sorted(maps.Keys(s.policies)) {
		h := s.policies[id]
		snap.Policies = append(snap.Policies, PolicyHistory{ID: id, NextVersion: h.next, Deleted: h.deleted, Versions: slices.Clone(h.versions)})
	}
	for _, id := range slices.Sorted(maps.Keys(s.overrides)) {
		snap.Overrides = append(snap.Overrides, s.overrides[id])
	}
	for _, id := range slices.Sorted(maps.Keys(s.keys)) {
		snap.Keys = append(snap.Keys, KeyEntry{KeyID: id, Tier: s.keys[id]})
	}
	return snap
}

// importSnapshot validates a snapshot as a whole and turns it into a state.
func importSnapshot(snap Snapshot) (*state, error) {
	if snap.Format != SnapshotFormat {
		return nil, fmt.Errorf("snapshot format %d, this build reads %d", snap.Format, SnapshotFormat)
	}
	s := newState()
	ve := &ValidationError{}
	for i, ph := range snap.Policies {
		at := fmt.Sprintf("policies[%d]", i)
		if !idPattern.MatchString(ph.ID) || s.policies[ph.ID] != nil {
			ve.add(at+".id", "invalid or duplicate id %q", clip(ph.ID))
			continue
		}
		if len(ph.Versions) == 0 {
			ve.add(at+".versions", "must not be empty")
			continue
		}
		h := &history{versions: slices.Clone(ph.Versions), next: ph.NextVersion, deleted: ph.Deleted}
		prev := 0
		for j, p := range ph.Versions {
			if err := p.Validate(); err != nil {
				for _, fe := range err.(*ValidationError).Problems {
					ve.add(fmt.Sprintf("%s.versions[%d].%s", at, j, fe.Field), "%s", fe.Reason)
				}
			}
			if p.ID != ph.ID || p.Version <= prev {
				ve.add(fmt.Sprintf("%s.versions[%d]", at, j), "id %q version %d out of order", clip(p.ID), p.Version)
			}
			prev = p.Version
		}
		if h.next <= prev {
			ve.add(at+".next_version", "must be above the last version %d", prev)
		}
		if !h.deleted {
			h.current = compile(h.versions[len(h.versions)-1])
		}
		s.policies[ph.ID] = h
	}
	for i, o := range snap.Overrides {
		if err := o.validateShape(); err != nil {
			ve.add(fmt.Sprintf("overrides[%d]", i), "%v", err)
			continue
		}
		s.overrides[o.ID] = o
	}
	for i, k := range snap.Keys {
		if !idPattern.MatchString(k.Tier) || len(k.KeyID) != keyIDLen {
			ve.add(fmt.Sprintf("keys[%d]", i), "invalid entry")
			continue
		}
		s.keys[k.KeyID] = k.Tier
	}
	if err := ve.err(); err != nil {
		return nil, err
	}
	for id := range s.policies {
		if err := checkFanout(s, id); err != nil {
			return nil, fmt.Errorf("policy %s: %w", id, err)
		}
	}
	return s, nil
}

// Snapshot returns the registry's state in its persistent form.
func (r *Registry) Snapshot() Snapshot {
	return exportState(r.view.Load().st)
}

// Restore replaces the registry's state with snap, which is validated as a
// whole first; on error nothing changes. It neither saves nor audits: it is
// for loading state that a store already holds.
func (r *Registry) Restore(snap Snapshot) error {
	s, err := importSnapshot(snap)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	v, warnings := buildView(s)
	r.view.Store(v)
	for _, w := range warnings {
		r.cfg.Logger.Warn(w)
	}
	return nil
}

// Load restores the state saved in the configured Store. It returns an
// error wrapping ErrNoSnapshot when the store is empty (then Seed it), and
// keeps the current state on any error, so a daemon that cannot reach its
// store keeps serving the last good set.
func (r *Registry) Load(ctx context.Context) error {
	if r.cfg.Store == nil {
		return fmt.Errorf("load: no store configured: %w", ErrNoSnapshot)
	}
	snap, err := r.cfg.Store.Load(ctx)
	if err != nil {
		return err
	}
	return r.Restore(snap)
}

// FileStore keeps a Snapshot in one JSON file. Save writes a temporary file
// in the same directory, fsyncs it, renames it over the file and fsyncs the
// directory, so a crash (even kill -9 mid-write) leaves the previous or the
// new file, never a torn one. Temporary files a crash leaves behind are
// named ".<name>.tmp-*" and are ignored.
type FileStore struct {
	path string
	mu   sync.Mutex
}

// NewFileStore returns a store for the file at path. The directory must
// exist.
func NewFileStore(path string) *FileStore { return &FileStore{path: path} }

// Path returns the file's path.
func (f *FileStore) Path() string { return f.path }

// Load reads and decodes the file. A missing file wraps ErrNoSnapshot; an
// unreadable or corrupt one is an error naming the file.
func (f *FileStore) Load(ctx context.Context) (Snapshot, error) {
	if err := ctx.Err(); err != nil {
		return Snapshot{}, err
	}
	data, err := os.ReadFile(f.path)
	if errors.Is(err, fs.ErrNotExist) {
		return Snapshot{}, fmt.Errorf("policy file %s: %w", f.path, ErrNoSnapshot)
	}
	if err != nil {
		return Snapshot{}, fmt.Errorf("policy file %s: %w", f.path, err)
	}
	var snap Snapshot
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&snap); err != nil {
		return Snapshot{}, fmt.Errorf("policy file %s is corrupt: %w", f.path, err)
	}
	if dec.More() {
		return Snapshot{}, fmt.Errorf("policy file %s is corrupt: data after the snapshot", f.path)
	}
	if snap.Format != SnapshotFormat {
		return Snapshot{}, fmt.Errorf("policy file %s: format %d, this build reads %d", f.path, snap.Format, SnapshotFormat)
	}
	return snap, nil
}

// Save atomically replaces the file with snap.
func (f *FileStore) Save(ctx context.Context, snap Snapshot) (err error) {
	if err := ctx.Err(); err != nil {
		return err
	}
	data, err := json.MarshalIndent(snap, "", " ")
	if err != nil {
		return err
	}
	data = append(data, '\n')
	f.mu.Lock()
	defer f.mu.Unlock()
	dir, name := filepath.Split(f.path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, "."+name+".tmp-*")
	if err != nil {
		return fmt.Errorf("save %s: %w", f.path, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(data); err != nil {
		return fmt.Errorf("save %s: %w", f.path, err)
	}
	if err = tmp.Sync(); err != nil {
		return fmt.Errorf("save %s: fsync: %w", f.path, err)
	}
	if err = tmp.Close(); err != nil {
		return fmt.Errorf("save %s: %w", f.path, err)
	}
	if err = os.Rename(tmp.Name(), f.path); err != nil {
		return fmt.Errorf("save %s: %w", f.path, err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("save %s: open dir: %w", f.path, err)
	}
	defer d.Close()
	if err = d.Sync(); err != nil {
		return fmt.Errorf("save %s: fsync dir: %w", f.path, err)
	}
	return nil
}
