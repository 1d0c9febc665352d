package coordinator

import (
	"time"

	"github.com/sluice-rl/sluice/share"
)

// Saved is a region's shares as persisted: the epoch they were computed
// for and this region's fraction of L_global per coordinated key.
type Saved struct {
	Region string       `json:"region"`
	Epoch  uint64       `json:"epoch"`
	Shares []SavedShare `json:"shares"`
}

// SavedShare is one key's share in Saved.
type SavedShare struct {
	share.Key
	Share float64 `json:"share"`
}

type regionShares struct {
	regions []string
	shares  []float64
}

type reportInfo struct {
	At    time.Time
	Epoch uint64
	Bytes int
	Keys  int
}

// RegionInfo describes one region for GET /v1/regions.
type RegionInfo struct {
	Region string   `json:"region"`
	Nodes  []string `json:"nodes"` // live nodes
	Live   bool     `json:"live"`
	// LastReport is when this node last received (or, for its own region,
	// built) the region's report; zero if never.
	LastReport      time.Time `json:"last_report,omitzero"`
	LastReportEpoch uint64    `json:"last_report_epoch,omitempty"`
	LastReportBytes int       `json:"last_report_bytes,omitempty"`
	LastReportKeys  int       `json:"last_report_keys"`
}

// Status is the coordinator's view for GET /v1/regions.
type Status struct {
	Region   string        `json:"region"`
	Node     string        `json:"node"`
	Interval time.Duration `json:"interval"`
	Epoch    uint64        `json:"epoch"` // last rebalanced epoch
	Isolated bool          `json:"isolated"`
	// CoordinatedKeys is the number of keys with negotiated shares.
	CoordinatedKeys int          `json:"coordinated_keys"`
	DefaultShare    float64      `json:"default_share"`
	Regions         []RegionInfo `json:"regions"`
}
