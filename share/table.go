package share

// Table is an immutable snapshot of one region's shares: a fraction of
// L_global per coordinated key, a default fraction for every other key, and
// the loans (Loan) in force, as an overlay added to the base share. It is
// never modified after it is built, so any number of goroutines may read it
// without locks; swap whole tables (e.g. through an atomic.Pointer[Table])
// to publish new shares.
type Table struct {
	shares map[Key]float64
	def    float64
	// loans is the net loan per key (+ borrowed, − lent), fractions of
	// L_global; nil when there are none. Small: only keys with loans.
	loans map[Key]float64
}

// NewTable returns a table giving def to every key not in shares. It copies
// shares.
func NewTable(def float64, shares map[Key]float64) *Table {
	m := make(map[Key]float64, len(shares))
	for k, v := range shares {
		m[k] = v
	}
	return &Table{shares: m, def: def}
}

// Share returns this region's fraction of L_global for the key: the engine's
// Scale, loans included, in [MinShare, 1] (Scale) whatever the table was
// built from. A nil table means a single region: 1.
func (t *Table) Share(policy, subject string) float64 {
	if t == nil {
		return 1
	}
	return Scale(t.Unclamped(policy, subject))
}

// Unclamped is the key's base share plus its net loan, before Share clamps
// it: it may exceed 1 (several lenders answering one request) or fall
// below MinShare. A caller that subtracts further cuts from it (another
// node's loans) clamps the result with Scale.
func (t *Table) Unclamped(policy, subject string) float64 {
	if t == nil {
		return 1
	}
	k := Key{Policy: policy, Subject: subject}
	s, ok := t.shares[k]
	if !ok {
		s = t.def
	}
	if t.loans != nil {
		s += t.loans[k]
	}
	return s
}

// Default returns the fraction used for keys nobody reported: L_global/n of
// the live regions (less when this region is isolated).
func (t *Table) Default() float64 {
	if t == nil {
		return 1
	}
	return t.def
}

// Len returns the number of coordinated keys.
func (t *Table) Len() int {
	if t == nil {
		return 0
	}
	return len(t.shares)
}
