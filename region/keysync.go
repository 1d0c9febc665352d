package region

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/quota/redispolicy"
)

// keyIDPattern is the form of quota.KeyID: 128 bits in lower-case hex.
var keyIDPattern = regexp.MustCompile(`^[0-9a-f]{32}$`)

// validKeys checks a received key registry as the admin API checks a
// registration: each entry's tier must be a valid tier, and its key id must
// be one quota.KeyID can produce (the admin API's check of the key itself,
// visible ASCII, cannot be made on a hash; a key id of another form could
// never match a request). A key id may be listed once. It returns the
// entries sorted by key id, or the index of the first invalid one and why;
// the error never quotes the entry, which may hold anything.
func validKeys(keys []quota.KeyEntry) ([]quota.KeyEntry, int, error) {
	out := make([]quota.KeyEntry, 0, len(keys))
	seen := make(map[string]bool, len(keys))
	for i, k := range keys {
		switch {
		case !keyIDPattern.MatchString(k.KeyID):
			return nil, i, errors.New("key_id must be 32 lower-case hex digits")
		case !tierPattern.MatchString(k.Tier):
			return nil, i, errors.New("tier must match ^[a-z0-9][a-z0-9._-]{0,63}$")
		case seen[k.KeyID]:
			return nil, i, errors.New("key_id listed twice")
		}
		seen[k.KeyID] = true
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b quota.KeyEntry) int { return strings.Compare(a.KeyID, b.KeyID) })
	return out, 0, nil
}

// keyRecord is how a key registry change appears in the audit log, as the
// registry itself records it: by key id, never the key.
type keyRecord struct {
	KeyID string `json:"key_id"`
	Tier  string `json:"tier"`
}

// syncKeys makes the registry hold exactly the keys want (valid, sorted by
// validKeys): missing and changed ones are put, absent ones deleted,
// identical ones left alone, and when nothing differs nothing is written,
// so daemons sharing one Redis apply a set once. The caller holds regMu.
//
// The registry can register a key only from the key itself, which a
// receiver never has, so the change is made on the registry's snapshot:
// checked whole as a store load would check it, saved to the store (a
// Redis compare-and-set, so a sibling's change since this daemon's last
// load is an ErrConcurrentChange, not lost), then restored locally and
// audited as key.put and key.delete by who. regMu keeps this daemon's
// other writes from landing between the snapshot and the restore.
func (d *Daemon) syncKeys(ctx context.Context, who string, want []quota.KeyEntry) error {
	snap := d.reg.Snapshot()
	have := make(map[string]string, len(snap.Keys))
	for _, k := range snap.Keys {
		have[k.KeyID] = k.Tier
	}
	var changes []quota.AuditEntry
	now := time.Now().UTC()
	record := func(action, id string, before, after *keyRecord) {
		e := quota.AuditEntry{Time: now, Who: who, Action: action, Target: id}
		if before != nil {
			e.Before, _ = json.Marshal(before)
		}
		if after != nil {
			e.After, _ = json.Marshal(after)
		}
		changes = append(changes, e)
	}
	wanted := make(map[string]bool, len(want))
	for _, k := range want {
		wanted[k.KeyID] = true
		old, had := have[k.KeyID]
		switch {
		case !had:
			record("key.put", k.KeyID, nil, &keyRecord{k.KeyID, k.Tier})
		case old != k.Tier:
			record("key.put", k.KeyID, &keyRecord{k.KeyID, old}, &keyRecord{k.KeyID, k.Tier})
		}
	}
	for _, k := range snap.Keys {
		if !wanted[k.KeyID] {
			record("key.delete", k.KeyID, &keyRecord{k.KeyID, k.Tier}, nil)
		}
	}
	if len(changes) == 0 {
		return nil
	}
	snap.Keys = slices.Clone(want)
	if err := quota.NewRegistry(quota.RegistryConfig{}).Restore(snap); err != nil {
		return fmt.Errorf("key registry: %w", err)
	}
	if d.pstore != nil {
		if err := d.pstore.Save(ctx, snap); err != nil {
			return fmt.Errorf("key registry: %w: %w", quota.ErrStore, err)
		}
	}
	if err := d.reg.Restore(snap); err != nil { // checked above: cannot fail
		return fmt.Errorf("key registry: %w", err)
	}
	for _, e := range changes {
		if err := d.audit.Append(e); err != nil {
			// Saved and in force; as in the registry, losing the audit
			// record is reported but does not undo the change.
			d.log.Error("audit append failed", "action", e.Action, "target", e.Target, "err", err)
		}
	}
	return nil
}

// serialRestorer is the Redis watcher's target: it restores the state a
// sibling daemon saved under regMu, so a reload cannot land inside a key
// sync. A reload that waited for regMu while this daemon saved or loaded
// a newer state (the store's applied revision moved) is dropped: restoring
// it would put older state back, and the newer one is held already.
type serialRestorer struct {
	d *Daemon
	s *redispolicy.Store
}

func (r serialRestorer) Restore(snap quota.Snapshot) error {
	before := r.s.Applied()
	r.d.regMu.Lock()
	defer r.d.regMu.Unlock()
	if r.s.Applied() != before {
		return nil
	}
	return r.d.reg.Restore(snap)
}
