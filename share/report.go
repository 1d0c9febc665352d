package share

// ReportVersion is the version of the Report layout. A decoder keeps
// reading older versions during a rolling upgrade; fields are only added.
const ReportVersion = 1

// Key names a global policy applied to one subject.
type Key struct {
	Policy  string `msgpack:"p" json:"policy"`
	Subject string `msgpack:"s" json:"subject"`
}

// Report is what one region publishes per epoch. It is a plain struct (no
// pointers, no maps) so the gossip layer can msgpack it as is; Keys and
// Quotas are sorted, so equal reports encode to equal bytes.
type Report struct {
	Version uint8  `msgpack:"v" json:"version"`
	Region  string `msgpack:"r" json:"region"`
	// Epoch is Config.Epoch of the interval the figures describe.
	Epoch  uint64         `msgpack:"e" json:"epoch"`
	Keys   []KeyReport    `msgpack:"k" json:"keys,omitempty"`
	Quotas []QuotaCounter `msgpack:"q" json:"quotas,omitempty"`
}

// KeyReport holds one region's figures for one key. Rates are in units per
// second; Share is a fraction of Limit.
type KeyReport struct {
	Key
	// Limit is L_global in units per second, so all regions normalise
	// alike.
	Limit float64 `msgpack:"l" json:"limit"`
	// Offered is x̄: the rate offered over the interval, rejected included.
	Offered float64 `msgpack:"o" json:"offered"`
	// Recent is x: the rate offered over the last Config.Recent.
	Recent float64 `msgpack:"x" json:"recent"`
	// Demand is the region's smoothed demand D.
	Demand float64 `msgpack:"d" json:"demand"`
	// Admitted is the rate admitted over the interval.
	Admitted float64 `msgpack:"a" json:"admitted"`
	// Share is the fraction of Limit the region enforced at the end of the
	// interval.
	Share float64 `msgpack:"f" json:"share"`
}

// Usage is what a region measured for one key over one interval; the
// Allocator turns it into a KeyReport.
type Usage struct {
	Key
	Limit    float64 // L_global, units per second
	Offered  float64 // units per second over the interval, rejected included
	Recent   float64 // units per second over the last Config.Recent
	Admitted float64 // units per second over the interval
}

// EncodedSizeEstimate returns an upper estimate of the msgpack size of r in
// bytes (short field names as tagged above, float64 values), for bandwidth
// accounting without an encoder.
func (r Report) EncodedSizeEstimate() int {
	// map header + version + region + epoch + 2 array headers.
	n := 1 + 3 + 3 + len(r.Region) + 3 + 9 + 2*5
	for _, k := range r.Keys {
		// map(8) header, 8 one-char keys (2 B each), 6 float64 (9 B each),
		// 2 strings with up to 5 B headers.
		n += 1 + 8*2 + 6*9 + len(k.Policy) + len(k.Subject) + 2*5
	}
	for _, q := range r.Quotas {
		n += 1 + 4*2 + len(q.Policy) + len(q.Subject) + 2*5 + 9 + 5
		for _, c := range q.Counts {
			n += 1 + 2*2 + len(c.Region) + 5 + 9
		}
	}
	return n
}
