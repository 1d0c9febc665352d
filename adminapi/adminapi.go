// Package adminapi holds the JSON bodies of the admin API: the daemon
// (package region) writes them and the Go client reads them, so both
// share one definition. It links no store, transport or coordinator.
package adminapi

import (
	"time"

	"github.com/sluice-rl/sluice/coordinator/msg"
	"github.com/sluice-rl/sluice/decide"
	"github.com/sluice-rl/sluice/quota"
)

// VersionList is the body of GET /v1/policies/{id}/versions.
type VersionList struct {
	ID string `json:"id"`
	// InForce is the version in force, 0 when the policy is deleted.
	InForce  int            `json:"in_force"`
	Versions []quota.Policy `json:"versions"`
}

// Current returns the version in force; false when the policy is deleted.
func (v *VersionList) Current() (quota.Policy, bool) { return v.Version(v.InForce) }

// Version returns version n of the policy, if it is kept.
func (v *VersionList) Version(n int) (quota.Policy, bool) {
	for _, p := range v.Versions {
		if p.Version == n && n > 0 {
			return p, true
		}
	}
	return quota.Policy{}, false
}

// Key names a registered API key by its id, never the key.
type Key struct {
	KeyID   string `json:"key_id"`
	Subject string `json:"subject"`
	Tier    string `json:"tier"`
}

// Usage is the body of GET /v1/keys/{subject}/usage: the subject's current
// state under each policy that applies to it, read without spending.
type Usage struct {
	Subject  string                `json:"subject"`
	Tier     string                `json:"tier"`
	Policies []decide.PolicyResult `json:"policies"`
	// Exempt lists the policies (with ?route=, those matching the route)
	// that the subject is exempt from (an unlimited override in force);
	// they are not in Policies and their state is not read.
	Exempt []decide.ExemptResult `json:"exempt,omitempty"`
	// GlobalShares gives each global-scope policy's division among the
	// regions (multi-region daemons only). Global quotas are not divided:
	// they are in GlobalQuotas instead.
	GlobalShares []GlobalShares `json:"global_shares,omitempty"`
	// GlobalQuotas gives each global quota's count across the regions
	// (multi-region daemons only).
	GlobalQuotas []GlobalQuota `json:"global_quotas,omitempty"`
}

// GlobalShares is one global policy's division among regions for a
// subject, in Usage.
type GlobalShares struct {
	Policy string `json:"policy"`
	// LimitPerSec is L_global in units per second.
	LimitPerSec float64 `json:"limit_per_sec"`
	// Coordinated is true when the regions negotiated shares for the key;
	// otherwise every live region runs at the default 1/n.
	Coordinated bool `json:"coordinated"`
	// Share is this region's fraction now; Regions every region's.
	Share   float64            `json:"share"`
	Regions map[string]float64 `json:"regions"`
}

// GlobalQuota is a global quota's (a scope: global fixed_window policy's)
// count for a subject in the current window, across regions, in Usage. It
// is what the check enforces: this daemon's engine count plus the other
// regions' counts as last reported, which lag by up to one report interval
// (plus delivery).
type GlobalQuota struct {
	Policy string `json:"policy"`
	// WindowS is the window's length in seconds; windows are aligned to
	// the Unix epoch (86400 is a UTC day) and start at WindowStart.
	WindowS     float64   `json:"window_s"`
	WindowStart time.Time `json:"window_start"`
	Limit       int64     `json:"limit"`
	// Used is what every region spent in the window as known here: this
	// region's count as the engine holds it (on the memory store, this
	// daemon's, plus its siblings' as last sent) plus the other regions'
	// last reported counts. It may exceed Limit by what the regions
	// admitted within one report delay of each other.
	Used int64 `json:"used"`
	// Remaining is max(0, Limit - Used).
	Remaining int64 `json:"remaining"`
	// Regions splits Used by region; a region with nothing known is 0.
	Regions map[string]int64 `json:"regions"`
}

// Regions is the body of GET /v1/regions.
type Regions struct {
	// MultiRegion is false when the daemon runs single-region (no
	// --region); the rest is then empty.
	MultiRegion bool `json:"multi_region"`
	msg.Status
	// IntervalS is the report interval in seconds.
	IntervalS float64 `json:"interval_s"`
	// PolicyRevision and PolicyHash are this node's policy set: the
	// cluster-wide revision it last made or applied (0: the seed set) and a
	// hash of its content.
	PolicyRevision uint64 `json:"policy_revision"`
	PolicyHash     string `json:"policy_hash"`
	// PolicySkew is true while the live nodes do not all advertise the
	// same policy hash; PolicyRevisions lists each region's revisions.
	PolicySkew      bool                `json:"policy_skew"`
	PolicyRevisions map[string][]uint64 `json:"policy_revisions"`
	Members         []msg.Member        `json:"members"`
	// GlobalQuotas is the size of this node's G-counter state per global
	// quota, sorted by policy: every global quota in force, and any other
	// policy whose counters are still held (until their window ends).
	GlobalQuotas []msg.QuotaStat `json:"global_quotas"`
}
