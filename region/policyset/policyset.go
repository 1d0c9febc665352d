// Package policyset is how regions keep one policy set: the set a region
// sends (its policies, per-subject overrides and API-key registry), its
// revision number and content hash, the checks a receiver runs before it
// applies a set, and the difference between the set a registry holds and
// the one it should hold.
//
// Everything here is pure: no clock (times are arguments), no I/O, no
// goroutines. The daemon's adapter (package region) reads the clock, takes
// sets off gossip and writes the Changes into its quota.Registry. Every
// check of a received set is a check that package quota makes and exports
// (quota.Policy.Validate, quota.KeyEntry.Validate, and Registry.Seed and
// Registry.PutOverride on a scratch registry), so a set is refused for what
// the admin API would refuse, never for a copy of its rules.
package policyset

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/quota"
)

// Set is what one region sends the others when its policies, overrides or
// API keys change: the policies in force (the newest version of each), the
// overrides in force and the key registry, as JSON so that a newer build's
// fields survive (and an older build ignores the fields it does not know).
//
// Overrides is a pointer so that its absence is visible: a set from a build
// that predates override replication has none, and applying it leaves the
// receiver's overrides alone (only those of policies the set deletes go,
// as with a local delete). A present but empty list means "no overrides".
// Each override keeps its absolute expires_at; the sender lists only those
// not yet expired, and a receiver skips any that have expired by its own
// clock (Validate), so an expired override is never brought back.
//
// Keys is a pointer for the same reason: absent (an older build), the
// receiver's key registry stays as it is; present, the receiver holds
// exactly these keys. It carries what the registry stores, key ids
// (quota.KeyID, a SHA-256 prefix) and tiers, never an API key.
type Set struct {
	Origin    string            `json:"origin"`
	Policies  []quota.Policy    `json:"policies"`
	Overrides *[]quota.Override `json:"overrides,omitempty"`
	Keys      *[]quota.KeyEntry `json:"keys,omitempty"`
}

// New returns the set of node origin holding ps, ovs and keys, all three
// present: a nil list is sent as an empty one, so that a receiver deletes
// what it holds beyond them.
func New(origin string, ps []quota.Policy, ovs []quota.Override, keys []quota.KeyEntry) Set {
	if ps == nil {
		ps = []quota.Policy{}
	}
	if ovs == nil {
		ovs = []quota.Override{}
	}
	if keys == nil {
		keys = []quota.KeyEntry{}
	}
	return Set{Origin: origin, Policies: ps, Overrides: &ovs, Keys: &keys}
}

// Decode reads a received set. It checks only that the bytes are a set;
// Validate checks what they say.
func Decode(data []byte) (Set, error) {
	var s Set
	if err := json.Unmarshal(data, &s); err != nil {
		return Set{}, fmt.Errorf("policy set: %w", err)
	}
	return s, nil
}

// Encode is the form Decode reads.
func (s Set) Encode() ([]byte, error) { return json.Marshal(s) }

// overrides and keys are the lists the set carries, nil when it does not
// carry them.
func (s Set) overrides() []quota.Override {
	if s.Overrides == nil {
		return nil
	}
	return *s.Overrides
}

func (s Set) keys() []quota.KeyEntry {
	if s.Keys == nil {
		return nil
	}
	return *s.Keys
}

// NextRevision returns the revision of a change made by node at now, when
// last is the largest revision it has made or applied.
//
// Revisions are hybrid logical clocks: the high 48 bits are milliseconds
// since the Unix epoch, advanced past every revision seen, and the low 16
// bits a hash of the node that made the change. So revisions made anywhere
// are totally ordered as integers, a later change (by wall clock, or
// causally after one it has seen) is larger, and two changes made in the
// same millisecond are ordered by node. A receiver applies a set only if
// its revision is larger than the one it holds.
func NextRevision(now time.Time, last uint64, node string) uint64 {
	ms := uint64(now.UnixMilli())
	if prev := last >> 16; ms <= prev {
		ms = prev + 1
	}
	h := fnv.New32a()
	h.Write([]byte(node))
	return ms<<16 | uint64(h.Sum32()&0xffff)
}

// Hash is a short content hash (12 hex digits) of the set's policies,
// overrides and keys, independent of the per-region version numbers the
// registries assign, of the order of any list, of the time zone an expiry
// is written in and of Origin, so that two regions holding the same set
// show the same hash. With no overrides and no keys it is the hash of the
// policies alone, as builds before override and key replication compute
// it, so a mixed cluster without either shows no skew; with them, nodes
// that differ only in them do.
func (s Set) Hash() string {
	ps := slices.Clone(s.Policies)
	slices.SortFunc(ps, func(a, b quota.Policy) int { return strings.Compare(a.ID, b.ID) })
	h := sha256.New()
	line := func(v any) {
		b, _ := json.Marshal(v)
		h.Write(b)
		h.Write([]byte{'\n'})
	}
	for _, p := range ps {
		p.Version = 0
		line(p)
	}
	if ovs := s.overrides(); len(ovs) > 0 {
		ovs = slices.Clone(ovs)
		slices.SortFunc(ovs, func(a, b quota.Override) int { return strings.Compare(a.ID, b.ID) })
		h.Write([]byte("overrides\n"))
		for _, o := range ovs {
			o.ExpiresAt = o.ExpiresAt.UTC()
			line(o)
		}
	}
	if keys := s.keys(); len(keys) > 0 {
		keys = slices.Clone(keys)
		slices.SortFunc(keys, func(a, b quota.KeyEntry) int { return strings.Compare(a.KeyID, b.KeyID) })
		h.Write([]byte("keys\n"))
		for _, k := range keys {
			line(k)
		}
	}
	return hex.EncodeToString(h.Sum(nil)[:6])
}

// SamePolicy reports whether a and b are the same policy but for the
// version number, which each region's registry assigns on its own.
func SamePolicy(a, b quota.Policy) bool {
	a.Version, b.Version = 0, 0
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

// SameOverride compares overrides field by field, expiry as an instant (a
// time zone or monotonic reading picked up on the way does not count).
func SameOverride(a, b quota.Override) bool {
	if !a.ExpiresAt.Equal(b.ExpiresAt) {
		return false
	}
	a.ExpiresAt, b.ExpiresAt = time.Time{}, time.Time{}
	return a == b
}
