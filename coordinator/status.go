package coordinator

import (
	"time"

	"github.com/sluice-rl/sluice/coordinator/msg"
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

// The coordinator's view for GET /v1/regions; the types live in msg so that
// a client can read them without linking the coordinator.
type (
	Status     = msg.Status
	RegionInfo = msg.RegionInfo
	QuotaStat  = msg.QuotaStat
)

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
