package share

import (
	"fmt"
	"slices"
	"time"
)

// MinShare is the smallest share a Table returns, so that no caller passes
// a zero engine Scale (which means the whole limit).
const MinShare = 1e-9

// Allocator holds one region's view of the allocation: the known regions,
// when each was last heard from, the shares of every coordinated key and
// this region's smoothed demand. It is not safe for concurrent use; the
// owner calls Report, Rebalance and SetMembers from one goroutine and
// publishes Table results to readers.
type Allocator struct {
	cfg       Config
	self      string
	regions   []string // sorted, self included
	index     map[string]int
	lastHeard map[string]uint64
	keys      map[Key]*keyState
	demand    map[Key]float64 // own smoothed demand, units/s
	ownReport Report
	haveOwn   bool
	isolated  bool
	down      int // regions currently treated as Down

	prev, next *Table // before and after the last rebalance
	cut        *Table // min(prev, next), enforced until raiseAt
	raiseAt    time.Time

	// Generation and loans (borrow.go): gen is the epoch of the last
	// Rebalance; loans, asked and pending belong to it and are cleared by
	// the next one.
	gen             uint64
	loans           map[Key]float64
	asked           map[Key]time.Time
	tokenAsked      map[Key]time.Time // token requests (tokens.go)
	pending         map[pendKey]int   // index into pendList
	pendList        []pending
	accepted        map[loanID]bool // loans applied this generation
	lendSeq         uint64
	bursts          map[Key]burst   // tokens received with loans
	effCut, effNext *Table          // cut and next with the loans overlay
	dead            map[string]bool // regions whose shares were reclaimed (SetDead)
	silent          map[string]bool // regions out of contact (SetSilent)
	live            map[string]bool // membership: regions with a node answering probes (SetLive)
}

type keyState struct {
	limit  float64
	shares []float64 // indexed like regions
	// offered is the key's offered rate over the regions at the last
	// rebalance, a fraction of L_global: each reporting region's larger
	// of its interval rate and its smoothed demand, and the share of the
	// others.
	offered float64
}

// NewAllocator returns the allocator of region self. members lists the
// regions of the cluster (self is added if absent); epoch is the current
// epoch, from which every member is given K epochs' grace.
func NewAllocator(cfg Config, self string, members []string, epoch uint64) (*Allocator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if self == "" {
		return nil, fmt.Errorf("share: region name must not be empty")
	}
	a := &Allocator{
		cfg:        cfg,
		self:       self,
		lastHeard:  map[string]uint64{},
		keys:       map[Key]*keyState{},
		demand:     map[Key]float64{},
		loans:      map[Key]float64{},
		asked:      map[Key]time.Time{},
		tokenAsked: map[Key]time.Time{},
		pending:    map[pendKey]int{},
		accepted:   map[loanID]bool{},
		bursts:     map[Key]burst{},
		dead:       map[string]bool{},
		silent:     map[string]bool{},
		live:       map[string]bool{},
		gen:        startGeneration(epoch),
	}
	a.SetMembers(epoch, members)
	a.next = NewTable(a.defaultShare(), nil)
	a.prev, a.cut = a.next, a.next
	a.refresh()
	return a, nil
}

// startGeneration is the generation of an allocator created in epoch,
// before its first Rebalance: the epoch before it. No Rebalance of this
// allocator produces it (the first is of epoch or later), so a loan of
// the start generation can never be taken for one of the first rebalanced
// generation; and regions started in the same epoch, all still at the
// default 1/n, share it and may lend to each other until their first
// rebalance, which ends it for all of them at the same boundary.
func startGeneration(epoch uint64) uint64 {
	if epoch == 0 {
		return 0
	}
	return epoch - 1
}

// Regions returns the known regions, sorted.
func (a *Allocator) Regions() []string { return slices.Clone(a.regions) }

// Isolated reports whether this region has fallen back to the safe share
// because it cannot reach a majority of the known regions.
func (a *Allocator) Isolated() bool { return a.isolated }

// SetMembers sets the known regions: every region of the cluster, failed or
// partitioned ones included, but not those that left gracefully. A region
// removed here is forgotten at once and its shares redistributed at the
// next Rebalance; a new region is given K epochs' grace from epoch and holds
// a zero share of coordinated keys until its first report.
// Failures must not be reported by removal: they are detected by missing
// reports, which is what keeps the two sides of a partition from both
// claiming the whole limit.
func (a *Allocator) SetMembers(epoch uint64, members []string) {
	regions := slices.Clone(members)
	if !slices.Contains(regions, a.self) {
		regions = append(regions, a.self)
	}
	slices.Sort(regions)
	regions = slices.Compact(regions)
	if slices.Equal(regions, a.regions) {
		return
	}
	index := make(map[string]int, len(regions))
	for i, r := range regions {
		index[r] = i
		if _, ok := a.lastHeard[r]; !ok {
			a.lastHeard[r] = epoch
		}
	}
	for r := range a.lastHeard {
		if _, ok := index[r]; !ok {
			delete(a.lastHeard, r)
		}
	}
	for _, ks := range a.keys {
		shares := make([]float64, len(regions))
		for i, r := range regions {
			if j, ok := a.index[r]; ok {
				shares[i] = ks.shares[j]
			}
		}
		ks.shares = shares
	}
	a.regions, a.index = regions, index
}

// Report turns this region's measurements for epoch into its Report:
// updates the smoothed demand, and lists every key under pressure (offered
// more than Config.Pressure times its current share) or already
// coordinated. usage may contain any keys, in any order.
func (a *Allocator) Report(epoch uint64, usage []Usage) Report {
	seen := make(map[Key]bool, len(usage))
	r := Report{Version: ReportVersion, Region: a.self, Epoch: epoch}
	for _, u := range usage {
		if u.Limit <= 0 || seen[u.Key] {
			continue
		}
		seen[u.Key] = true
		d, ok := a.demand[u.Key]
		switch {
		case a.cfg.risen(u.Offered, u.Recent):
			// A rise beyond counting noise: follow it at once.
			d = u.Recent
		case !ok:
			d = u.Offered
		default:
			// An interval rate within counting noise of the demand is
			// mostly noise: average it in more slowly.
			w := a.cfg.Smoothing
			if a.cfg.NoiseSmoothing > 0 && a.cfg.withinNoise(d, u.Offered) {
				w = a.cfg.NoiseSmoothing
			}
			d = w*u.Offered + (1-w)*d
		}
		a.demand[u.Key] = d
		own := a.next.Share(u.Policy, u.Subject)
		_, coordinated := a.keys[u.Key]
		if !coordinated && max(u.Offered, u.Recent) <= a.cfg.Pressure*own*u.Limit {
			continue
		}
		r.Keys = append(r.Keys, KeyReport{Key: u.Key, Limit: u.Limit, Offered: u.Offered,
			Recent: u.Recent, Demand: d, Admitted: u.Admitted, Share: own})
	}
	for k, ks := range a.keys {
		if !seen[k] {
			delete(a.demand, k)
			r.Keys = append(r.Keys, KeyReport{Key: k, Limit: ks.limit, Share: a.next.Share(k.Policy, k.Subject)})
		}
	}
	for k := range a.demand {
		if !seen[k] {
			delete(a.demand, k)
		}
	}
	slices.SortFunc(r.Keys, func(x, y KeyReport) int { return compareKeys(x.Key, y.Key) })
	a.ownReport, a.haveOwn = r, true
	return r
}

func compareKeys(x, y Key) int {
	if x.Policy != y.Policy {
		if x.Policy < y.Policy {
			return -1
		}
		return 1
	}
	switch {
	case x.Subject < y.Subject:
		return -1
	case x.Subject > y.Subject:
		return 1
	}
	return 0
}

// Rebalance computes the shares of epoch from the reports received for it
// (reports of other epochs and of unknown regions are ignored; this
// region's own report from Report is used whether or not it is in reports).
// Cuts take effect at once, raises at now + Config.RaiseDelay; see Table.
func (a *Allocator) Rebalance(now time.Time, epoch uint64, reports []Report) {
	n := len(a.regions)
	got := make([]*Report, n)
	if a.haveOwn && a.ownReport.Epoch == epoch {
		got[a.index[a.self]] = &a.ownReport
	}
	for i := range reports {
		r := &reports[i]
		j, ok := a.index[r.Region]
		if !ok || r.Epoch != epoch || r.Region == a.self {
			continue
		}
		got[j] = r
		a.lastHeard[r.Region] = max(a.lastHeard[r.Region], epoch)
	}
	a.lastHeard[a.self] = max(a.lastHeard[a.self], epoch)

	// Reachability and quorum. A region is down when its report is missing
	// and it has been unreachable for more than K epochs, or membership
	// declared it dead (SetDead).
	k := uint64(a.cfg.PartitionIntervals)
	missed := make([]uint64, n)
	downI := make([]bool, n)
	reachable := 0
	for i, r := range a.regions {
		if h := a.lastHeard[r]; epoch > h {
			missed[i] = epoch - h
		}
		dead := a.dead[r] && got[i] == nil
		if missed[i] < k && !dead && !(a.silent[r] && got[i] == nil) {
			reachable++
		}
		// Reclaiming is a raise for the others, so silence alone is
		// trusted less while membership still sees a node of the region
		// alive: reports lost at random (one in ten, say) then go missing
		// K+1 times in a row often enough over many region pairs to hand
		// out a share still in use, where 2K+2 in a row practically never
		// does. Cutting (reachable, above) keeps the short fuse.
		silence := k
		if a.live[r] {
			silence = 2*k + 1
		}
		downI[i] = got[i] == nil && (missed[i] > silence || dead)
	}
	quorum := 2*reachable > n || (2*reachable == n && missed[0] < k && !((a.dead[a.regions[0]] || a.silent[a.regions[0]]) && got[0] == nil))
	a.isolated = !quorum
	a.down = 0
	if quorum {
		for i := range a.regions {
			if downI[i] {
				a.down++
			}
		}
	}
	def := a.defaultShare()

	// Every key anyone reported, plus every coordinated key.
	byKey := map[Key][]*KeyReport{}
	for j, r := range got {
		if r == nil {
			continue
		}
		for i := range r.Keys {
			kr := &r.Keys[i]
			if kr.Limit <= 0 {
				continue
			}
			v := byKey[kr.Key]
			if v == nil {
				v = make([]*KeyReport, n)
				byKey[kr.Key] = v
			}
			v[j] = kr
		}
	}
	for key := range a.keys {
		if _, ok := byKey[key]; !ok {
			byKey[key] = make([]*KeyReport, n)
		}
	}

	slots := make([]Slot, n)
	self := a.index[a.self]
	shares := make(map[Key]float64, len(byKey))
	for key, krs := range byKey {
		ks := a.keys[key]
		limit := 0.0
		for _, kr := range krs {
			if kr != nil {
				limit = kr.Limit
				break
			}
		}
		if ks == nil {
			ks = &keyState{limit: limit, shares: make([]float64, n)}
			for i := range ks.shares {
				ks.shares[i] = a.defaultFor(i, downI, quorum)
			}
			a.keys[key] = ks
		}
		if limit > 0 {
			ks.limit = limit
		}
		allReported, pressured := true, false
		ks.offered = 0
		for i := range slots {
			kr := krs[i]
			if kr != nil {
				ks.offered += max(kr.Offered, kr.Demand) / ks.limit
			} else {
				ks.offered += ks.shares[i]
			}
			switch {
			case kr != nil:
				slots[i] = Slot{State: Reported, Demand: kr.Demand / ks.limit, Recent: kr.Recent / ks.limit,
					RecentHigh: a.cfg.recentHigh(kr.Recent) / ks.limit}
				if max(kr.Offered, kr.Recent) > a.cfg.Pressure*def*ks.limit {
					pressured = true
				}
			case got[i] != nil:
				// The region reported but left this key out: its demand is
				// below the pressure threshold of its share.
				x := a.cfg.Pressure * ks.shares[i]
				slots[i] = Slot{State: Reported, Demand: x, Recent: x}
			case downI[i] && quorum:
				slots[i] = Slot{State: Down}
				allReported = false
			default:
				slots[i] = Slot{State: Held, Last: ks.shares[i]}
				allReported = false
			}
		}
		if allReported && !pressured {
			delete(a.keys, key)
			continue
		}
		Allocate(a.cfg, slots, ks.shares)
		s := ks.shares[self]
		if a.isolated {
			s = min(s, a.cfg.safe(n))
		}
		// Never zero: the engine reads a Scale of zero as the whole limit.
		shares[key] = max(s, MinShare)
	}
	// Loans expire with their generation: the enforced table before this
	// rebalance (loans included) is what the cuts compare against. Tokens
	// received with loans are a passing extra, not a level: they end here
	// and do not count as the share a raise may start from.
	clear(a.bursts)
	a.refresh()
	a.prev = a.Table(now)
	a.next = &Table{shares: shares, def: def}
	a.cut = cutTable(a.prev, a.next)
	a.raiseAt = now.Add(a.cfg.RaiseDelay)
	a.gen = epoch
	clear(a.loans)
	clear(a.asked)
	clear(a.tokenAsked)
	clear(a.accepted)
	clear(a.bursts)
	clear(a.pending)
	a.pendList = a.pendList[:0]
	a.refresh()
}

// refresh marks the enforced tables stale after the loans or the base
// tables changed; Table rebuilds them once, however many loans changed.
func (a *Allocator) refresh() { a.effCut, a.effNext = nil, nil }

// share is this region's enforced share of key at now, loans included,
// without building a Table.
func (a *Allocator) share(now time.Time, key Key) float64 {
	base := a.next
	if now.Before(a.raiseAt) {
		base = a.cut
	}
	s := base.Share(key.Policy, key.Subject)
	d, ok := a.loans[key]
	if b, on := a.bursts[key]; on && now.Before(b.until) {
		d, ok = d+b.share, true
	}
	if ok {
		s = Scale(s + d)
	}
	return s
}

// defaultShare is this region's fraction for keys nobody reported.
func (a *Allocator) defaultShare() float64 {
	n := len(a.regions)
	if n == 0 {
		return 1
	}
	safe := a.cfg.safe(n)
	if a.isolated {
		return min(1/float64(n), safe)
	}
	if a.down > 0 && a.down < n {
		return (1 - float64(a.down)*safe) / float64(n-a.down)
	}
	return 1 / float64(n)
}

// defaultFor is region i's share of a key that was not coordinated before,
// as this region sees it.
func (a *Allocator) defaultFor(i int, down []bool, quorum bool) float64 {
	n := len(a.regions)
	if quorum && a.down > 0 {
		if down[i] {
			return a.cfg.safe(n)
		}
		return (1 - float64(a.down)*a.cfg.safe(n)) / float64(n-a.down)
	}
	return 1 / float64(n)
}

// Table returns the shares this region enforces at now: right after a
// Rebalance, the lower of the old and new share of each key (cuts at once);
// from Config.RaiseDelay later, the new shares. The result is immutable.
func (a *Allocator) Table(now time.Time) *Table {
	a.expireBursts(now)
	if a.effNext == nil {
		if len(a.loans) == 0 && len(a.bursts) == 0 {
			a.effCut, a.effNext = a.cut, a.next
		} else {
			loans := make(map[Key]float64, len(a.loans)+len(a.bursts))
			for k, v := range a.loans {
				loans[k] = v
			}
			for k, b := range a.bursts {
				loans[k] += b.share
			}
			a.effCut = &Table{shares: a.cut.shares, def: a.cut.def, loans: loans}
			a.effNext = &Table{shares: a.next.shares, def: a.next.def, loans: loans}
		}
	}
	if now.Before(a.raiseAt) {
		return a.effCut
	}
	return a.effNext
}

// cutTable is min(old, new) per key; new keys compare against old's default.
func cutTable(old, next *Table) *Table {
	m := make(map[Key]float64, len(next.shares))
	for k, v := range next.shares {
		m[k] = min(v, old.Share(k.Policy, k.Subject))
	}
	// Keys that were coordinated (or on loan) and are no longer fall back
	// to the new default, which may be a raise.
	for k := range old.shares {
		if _, ok := next.shares[k]; !ok {
			m[k] = min(old.Share(k.Policy, k.Subject), next.def)
		}
	}
	for k := range old.loans {
		if _, ok := m[k]; !ok {
			m[k] = min(old.Share(k.Policy, k.Subject), next.def)
		}
	}
	return &Table{shares: m, def: min(old.def, next.def)}
}

// Shares returns every known region's share of key (fractions of L_global,
// in Regions order) as this region computed them, or nil if the key is not
// coordinated.
func (a *Allocator) Shares(key Key) []float64 {
	ks, ok := a.keys[key]
	if !ok {
		return nil
	}
	return slices.Clone(ks.shares)
}

// Keys returns the number of coordinated keys.
func (a *Allocator) Keys() int { return len(a.keys) }

// SetLive records the regions membership sees with at least one node
// alive and answering its probes. Rebalance reclaims such a region's share only after 2K+2 missed
// reports rather than K+1 (see PartitionIntervals); membership
// declaring it dead (SetDead) still reclaims at once.
func (a *Allocator) SetLive(live []string) {
	clear(a.live)
	for _, r := range live {
		if r != a.self {
			a.live[r] = true
		}
	}
}

// SetSilent records the regions this region has been out of contact with
// for at least the coordinator's silence (no answered ping for that long:
// a crash or a partition, or a link too slow to answer); silent replaces
// the previous set. When the regions still in contact (this one included)
// are not a majority, this region is isolated and falls back to
// Config.Safe at once, a cut; it reports whether it did. A silent region
// also counts as unreachable for the quorum of the next Rebalance, so the
// fallback holds until its reports and contact are back. Silence never
// reclaims anything: that is SetDead's, later.
func (a *Allocator) SetSilent(now time.Time, silent []string) bool {
	clear(a.silent)
	for _, r := range silent {
		if _, ok := a.index[r]; ok && r != a.self {
			a.silent[r] = true
		}
	}
	if a.isolated || a.majority(a.silent) {
		return false
	}
	a.isolate(now)
	return true
}

// majority reports whether the known regions outside gone (this one
// included) are a majority; exactly half is one if it holds the first
// region in sorted order, so that of two halves only one is.
func (a *Allocator) majority(gone map[string]bool) bool {
	n := len(a.regions)
	live := 0
	for _, r := range a.regions {
		if !gone[r] {
			live++
		}
	}
	return 2*live > n || (2*live == n && !gone[a.regions[0]])
}

// isolate falls back to Config.Safe for every key at once, loans given up.
func (a *Allocator) isolate(now time.Time) {
	a.isolated = true
	safe := a.cfg.safe(len(a.regions))
	shares := make(map[Key]float64, len(a.next.shares))
	for k, v := range a.next.shares {
		shares[k] = max(min(v, safe), MinShare)
	}
	for k, v := range a.loans {
		if v > 0 {
			delete(a.loans, k) // a borrowed share would lift us above Safe
		}
	}
	clear(a.bursts)
	clear(a.pending)
	a.pendList = a.pendList[:0]
	a.install(now, &Table{shares: shares, def: min(a.next.def, safe)})
}

// SetDead records the regions whose shares may be reclaimed at now; dead
// replaces the previous set. The caller must only name a region that has
// been unable to admit above Config.Safe since before now: the
// coordinator names those it has been out of contact with for its hold,
// by which time a region cut off from the majority has cut itself
// (SetSilent on its side); see region/globalshare.
//
// A newly dead region is treated as Down at once instead of after K+1
// missed reports: its share of every coordinated key above Config.Safe is
// spread over the live regions in proportion to their shares, which every
// region computes alike from the same last shares. The raise applies at
// once, because the wait that made it safe has already passed; raises
// still pending from the last Rebalance keep their RaiseDelay. When the
// regions left are not a majority this region is isolated instead (as
// SetSilent). A region declared alive again counts from the next
// Rebalance: coming back is a raise, and raises wait for the reports.
func (a *Allocator) SetDead(now time.Time, dead []string) {
	set := make(map[string]bool, len(dead))
	newly := false
	for _, r := range dead {
		if _, ok := a.index[r]; ok && r != a.self {
			set[r] = true
			newly = newly || !a.dead[r]
		}
	}
	a.dead = set
	if !newly {
		return
	}
	if !a.majority(set) {
		if !a.isolated {
			a.isolate(now)
		}
		return
	}
	if a.isolated {
		return // reclaim only with a majority
	}
	n := len(a.regions)
	live := n - len(set)
	safe := a.cfg.safe(n)
	self := a.index[a.self]
	gain := make(map[Key]float64, len(a.keys))
	for key, ks := range a.keys {
		var freed, liveSum float64
		for i, r := range a.regions {
			switch {
			case set[r] && ks.shares[i] > safe:
				freed += ks.shares[i] - safe
				ks.shares[i] = safe
			case !set[r]:
				liveSum += ks.shares[i]
			}
		}
		if freed <= 0 {
			continue
		}
		for i, r := range a.regions {
			if set[r] {
				continue
			}
			add := freed / float64(live)
			if liveSum > 0 {
				add = freed * ks.shares[i] / liveSum
			}
			ks.shares[i] += add
			if i == self {
				gain[key] = add
			}
		}
	}
	a.down = max(a.down, len(set))
	def := a.defaultShare()
	a.next = withGain(a.next, gain, def)
	a.cut = withGain(a.cut, gain, max(a.cut.def, def))
	a.refresh()
}

// withGain is t with gain added to its keys' shares and def as default.
func withGain(t *Table, gain map[Key]float64, def float64) *Table {
	m := make(map[Key]float64, len(t.shares)+len(gain))
	for k, v := range t.shares {
		m[k] = v
	}
	for k, g := range gain {
		s, ok := m[k]
		if !ok {
			s = t.def
		}
		m[k] = max(s+g, MinShare)
	}
	return &Table{shares: m, def: def}
}

// Dead returns the regions SetDead last recorded, sorted.
func (a *Allocator) Dead() []string {
	var out []string
	for r := range a.dead {
		out = append(out, r)
	}
	slices.Sort(out)
	return out
}

// install makes next the base table between two rebalances: cuts at once,
// raises Config.RaiseDelay later; loans stay in force on top of it.
func (a *Allocator) install(now time.Time, next *Table) {
	base := a.next
	if now.Before(a.raiseAt) {
		base = a.cut
	}
	a.prev = base
	a.next = next
	a.cut = cutTable(base, next)
	a.raiseAt = now.Add(a.cfg.RaiseDelay)
	a.refresh()
}
