package msg

import "time"

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

// QuotaStat is the size of one global quota's G-counter state on this
// node, for GET /v1/regions.
type QuotaStat struct {
	Policy string `json:"policy"`
	// Counters is the number of (subject, window) G-counters held, with a
	// component per region that spent; a counter is dropped when its window
	// ends.
	Counters int `json:"counters"`
	// NodeCounters is the number of (subject, window) counters of this
	// region's nodes' spend (a component per node), from which this
	// region's component is summed.
	NodeCounters int `json:"node_counters"`
	// Entries is the number of components (region or node counts) in both.
	Entries int `json:"entries"`
	// ApproxBytes estimates the memory both take: the subject, policy and
	// region or node names, 8 bytes per window and per count, and
	// a fixed allowance per counter for the map entry and slice header.
	ApproxBytes int64 `json:"approx_bytes"`
}
