package engine

import (
	"context"
	"fmt"
	"hash/maphash"
	"math/bits"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// MemoryConfig configures a MemoryStore.
type MemoryConfig struct {
	// Clock supplies time; nil means real time.
	Clock Clock
	// MaxKeys bounds the number of (subject, policy) states kept in the
	// whole store, whichever shards hold them: one subject may hold them
	// all. Past it an insertion evicts a state, approximately the least
	// recently used (see MemoryStore). Zero means DefaultMaxKeys; it is at
	// least MaxChecks, so that one check's states always fit.
	MaxKeys int
	// Shards is the number of independently locked partitions, rounded up
	// to a power of two. Zero means 256.
	Shards int
}

// DefaultMaxKeys bounds a MemoryStore that was given no MaxKeys: about
// 250 MB of state at the measured bytes per key.
const DefaultMaxKeys = 4 << 20

// MemoryStore keeps limiter state in process. It decides exactly as the
// Redis store does, and is what `sluice serve` uses when nothing else is
// installed, what the simulator runs on virtual time, and the fallback
// when Redis is down.
//
// State is partitioned by subject into shards; each shard is an
// open-addressing table of 48-byte entries stored inline and keyed by a
// 64-bit hash of (subject, policy): no allocation per key, no pointers for
// the garbage collector to chase. Each entry carries its own spin lock, in
// the cache line that holds its state, and a check locks only the entries
// of its subject's policies (in table order, so two checks cannot
// deadlock): all policies of a subject are decided atomically, and a check
// touches one cache line per policy. A shard-wide lock used to cost a
// second line, written by every check on every core. The shard's mutex now
// guards only changes to the table's shape (insertions, growth, eviction,
// sweeping); those lock every entry they move, and a check that finds the
// table changed under it retries under the mutex.
//
// MaxKeys bounds the whole store, not each shard: a store-wide count of
// states is reserved on every insertion (the check path that finds its
// states never touches it), and an insertion that takes it past MaxKeys
// evicts one state first. It evicts from its own shard when that holds at
// least its share of the states (count / shards), else from the next
// shard that does and whose mutex is free, so that a subject holding many
// states (a rate limit service keeps a whole domain's descriptors under
// one subject) is not trimmed while the store is nearly empty, and a
// small shard is not emptied for a big one. Within a shard, eviction
// approximates LRU by sampling, as Redis does; the recency it compares has
// millisecond resolution.
//
// Because each insertion reserves its own count, insertions racing in
// different shards cannot jointly overshoot: at rest the store holds at
// most MaxKeys states. It holds more only while insertions are in flight
// (at most one per shard, each under its shard's mutex, and each holding
// its reservation before it evicts) or after an insertion found nothing to
// evict: every state of its shard belonged to its own check and every
// shard holding more was busy. Each later insertion past MaxKeys then
// evicts a second state until that is paid back. Either way the excess
// is bounded by the shard count in practice, not by the states one
// subject holds.
//
// Two keys colliding in 64 bits would share a state; with a million keys
// the odds are about one in 10^7.
type MemoryStore struct {
	clock     Clock
	seed      maphash.Seed
	shards    []memShard
	mask      uint64 // len(shards) - 1
	base      int64  // µs; expiry and use times are stored relative to it
	max       int64  // MaxKeys
	evictions atomic.Uint64
	// Written by insertions and removals only: kept off the line that
	// every check reads.
	_     [64]byte
	count atomic.Int64  // states held or reserved, in all shards
	hand  atomic.Uint32 // the shard the last cross-shard eviction used
	resv  reservations
}

// NewMemoryStore returns an empty store.
func NewMemoryStore(cfg MemoryConfig) *MemoryStore {
	n := cfg.Shards
	if n <= 0 {
		n = 256
	}
	n = 1 << bits.Len(uint(n-1))
	maxKeys := cfg.MaxKeys
	if maxKeys <= 0 {
		maxKeys = DefaultMaxKeys
	}
	s := &MemoryStore{
		clock:  ClockOrReal(cfg.Clock),
		seed:   maphash.MakeSeed(),
		shards: make([]memShard, n),
		mask:   uint64(n - 1),
	}
	s.max = int64(min(max(maxKeys, MaxChecks), 1<<30))
	s.base = s.clock.Now().UnixMicro()
	s.resv.init(s.max)
	for i := range s.shards {
		s.shards[i].init(&s.count)
	}
	return s
}

// pending is one check in flight: what it found and what it will store.
type pending struct {
	key   uint64
	idx   int // entry index, -1 if the key is not in the table
	stale bool
	keep  bool // store next even if the request is rejected (keepRejected)
	drop  int  // expired log timestamps a commit removes
	lim   Limit
	next  counters
	// sh and tab are the shard and table of a check of a request whose
	// states lie in several shards (checkAcross); nil otherwise, the
	// request's one shard then holding every state.
	sh   *memShard
	tab  *memTable
	key0 uint64 // the subject's hash, whose low bits name the shard
}

// in is the shard and table holding q's state: its own, or the request's.
func (q *pending) in(sh *memShard, tab *memTable) (*memShard, *memTable) {
	if q.sh != nil {
		return q.sh, q.tab
	}
	return sh, tab
}

// Check decides a request: all of its policies or none.
func (s *MemoryStore) Check(_ context.Context, req Request) (d Decision, err error) {
	if err := req.Validate(); err != nil {
		return Decision{Decider: -1}, err
	}
	now := s.clock.Now().UnixMicro()
	sh, sub := s.shardFor(req.Subject)
	// d is the named result, filled in place: returning a local copied
	// its 344 bytes once more per check.
	d.N = len(req.Checks)
	// Most requests name one policy: zeroing room for MaxChecks of them
	// was a measurable part of a check.
	var p []pending
	if len(req.Checks) == 1 {
		var one [1]pending
		p = one[:]
	} else {
		var all [MaxChecks]pending
		p = all[:len(req.Checks)]
	}
	for i := range p {
		p[i].key = s.key(sub, req.Checks[i].Policy)
		p[i].lim = req.Checks[i].Effective()
	}
	if req.Spans() {
		if sh = s.spread(req, p); sh == nil {
			s.checkAcross(req.Checks, p, now, &d)
			return d, nil
		}
	}
	if tab, ok := sh.acquire(req.Checks, p); ok {
		s.decide(sh, tab, now, req.Checks, p, &d)
		tab.releaseUsed(p, s.recency(now))
		return d, nil
	}
	// Slow path: a state must be created, a log read or written, or the
	// table changed shape under us. Under the mutex nothing else moves
	// entries, so the lock order of the fast path is all that remains.
	sh.mu.Lock()
	tab := sh.tab.Load()
	for i := range p {
		if req.Checks[i].Cost != 0 && tab.find(p[i].key) < 0 {
			s.insert(sh, p[i].key, p, s.recency(now), expirySeconds(now, s.base))
			tab = sh.tab.Load()
		}
	}
	for i := range p {
		p[i].idx = tab.find(p[i].key)
	}
	tab.lockAll(p)
	s.decide(sh, tab, now, req.Checks, p, &d)
	tab.releaseUsed(p, s.recency(now))
	sh.mu.Unlock()
	return d, nil
}

// spread keys each check of a request that spans subjects by its own
// subject (placeAll) and returns the one shard they all fall in, the
// checks then decided as that shard's, or nil when they fall in several.
func (s *MemoryStore) spread(req Request, p []pending) *memShard {
	s.placeAll(req.Subject, req.Checks, p)
	one := p[0].sh
	for i := range p {
		if p[i].sh != one {
			return nil
		}
	}
	for i := range p {
		p[i].sh = nil
	}
	return one
}

// checkAcross decides checks whose states lie in several shards (p[i].sh),
// all or nothing, under lockAcross.
func (s *MemoryStore) checkAcross(checks []Check, p []pending, now int64, d *Decision) {
	var buf [MaxChecks]*memShard
	shards := s.lockAcross(buf[:0], checks, p, now, func(i int) bool { return checks[i].Cost != 0 })
	s.decide(nil, nil, now, checks, p, d)
	s.releaseAcross(shards, p, s.recency(now))
}

// placeAll keys each check by its own subject (Check.SubjectOf) and notes
// its shard in p.
func (s *MemoryStore) placeAll(subject string, checks []Check, p []pending) {
	for i := range p {
		c := &checks[i]
		h := maphash.String(s.seed, c.SubjectOf(subject)) // as shardFor
		p[i].key, p[i].sh, p[i].key0 = s.key(h, c.Policy), &s.shards[h&s.mask], h
		p[i].lim = c.Effective()
	}
}

// lockAcross takes the mutexes of the shards of p (placeAll) in the order
// of the shards, so that two such calls cannot deadlock; creates the
// states that need(i) asks for and are missing; and then, shard by shard,
// locks the entries in table order, as the slow path of one shard does.
// A check of one shard takes no mutex but its own shard's, and never
// waits for one while it holds an entry, so it cannot close a cycle with
// this one. It returns the shards, into buf, for releaseAcross.
func (s *MemoryStore) lockAcross(buf []*memShard, checks []Check, p []pending, now int64, need func(int) bool) []*memShard {
	var order [MaxChecks]uint64
	idx := order[:0]
	for i := range p {
		if j := p[i].key0 & s.mask; !slices.Contains(idx, j) {
			idx = append(idx, j)
		}
	}
	slices.Sort(idx)
	shards := buf[:0]
	for _, j := range idx {
		shards = append(shards, &s.shards[j])
		s.shards[j].mu.Lock()
	}
	used, nowSec := s.recency(now), expirySeconds(now, s.base)
	for i := range p {
		if need(i) && p[i].sh.tab.Load().find(p[i].key) < 0 {
			s.insert(p[i].sh, p[i].key, p, used, nowSec)
		}
	}
	for i := range p {
		p[i].tab = p[i].sh.tab.Load()
		p[i].idx = p[i].tab.find(p[i].key)
	}
	var one [MaxChecks]pending
	for _, sh := range shards {
		n := 0
		for i := range p {
			if p[i].sh == sh {
				one[n].idx = p[i].idx
				n++
			}
		}
		sh.tab.Load().lockAll(one[:n])
	}
	return shards
}

// releaseAcross unlocks what lockAcross locked, recording the use.
func (s *MemoryStore) releaseAcross(shards []*memShard, p []pending, used uint32) {
	for i := range p {
		if j := p[i].idx; j >= 0 {
			atomic.StoreUint32(&p[i].tab.e[j].lw, used<<1)
		}
	}
	for _, sh := range shards {
		sh.mu.Unlock()
	}
}

// Reset forgets subject's state under each of policies: its next check
// finds a full bucket or empty windows, as for a subject never seen.
func (s *MemoryStore) Reset(_ context.Context, subject string, policies []string) error {
	if subject == "" {
		return fmt.Errorf("%w: empty subject", ErrBadRequest)
	}
	sh, sub := s.shardFor(subject)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for _, p := range policies {
		tab := sh.tab.Load()
		if i := tab.find(s.key(sub, p)); i >= 0 {
			sh.remove(tab, i)
		}
	}
	return nil
}

// decide runs every policy on its locked entry and commits them all if all
// allow. The logs map may be touched only on the slow path, which holds
// the shard's mutex; acquire sends every check that needs it there.
func (s *MemoryStore) decide(sh *memShard, tab *memTable, now int64, checks []Check, p []pending, d *Decision) {
	nowSec := expirySeconds(now, s.base)
	for i := range p {
		c, q := &checks[i], &p[i]
		q.stale, q.next = true, counters{}
		sh, tab := q.in(sh, tab)
		var e *memEntry
		if q.idx >= 0 {
			e = &tab.e[q.idx]
			q.stale = e.meta>>algShift != uint32(q.lim.Algorithm) || e.expiry() < nowSec
		}
		if q.lim.Algorithm == SlidingWindowLog {
			var log []int64
			if !q.stale {
				log = sh.logs[q.key]
			}
			d.Results[i], q.drop = decideLog(now, log, &q.lim, float64(c.Cost))
			continue
		}
		var oldT int64
		if !q.stale {
			q.next = counters{a: e.a, b: e.b, t: e.t}
			oldT = e.t
		}
		decide(now, &q.next, &q.lim, float64(c.Units()), &d.Results[i])
		q.keep = !d.Results[i].Allowed && keepRejected(oldT, &q.next, &q.lim)
	}
	d.Finish(checks)
	if !d.Allowed {
		for i := range p {
			if q := &p[i]; q.keep {
				sh, tab := q.in(sh, tab)
				e := &tab.e[q.idx]
				if e.meta>>algShift == uint32(SlidingWindowLog) {
					delete(sh.logs, q.key) // only on the slow path: acquire refuses logs
				}
				e.a, e.b, e.t = q.next.a, q.next.b, q.next.t
				e.meta = packMeta(expirySeconds(now+ttl(now, &q.next, nil, &q.lim, checks[i].ScaleFactor()), s.base), q.lim.Algorithm)
			}
		}
		return
	}
	for i := range p {
		c, q := &checks[i], &p[i]
		if c.Cost == 0 {
			continue
		}
		sh, tab := q.in(sh, tab)
		var log []int64
		if q.lim.Algorithm == SlidingWindowLog {
			old := sh.logs[q.key]
			if q.stale {
				old = old[:0]
			}
			log = commitLog(old, q.drop, now, c.Cost)
			sh.logs[q.key] = log
		}
		e := &tab.e[q.idx]
		if q.lim.Algorithm != SlidingWindowLog && e.meta>>algShift == uint32(SlidingWindowLog) {
			delete(sh.logs, q.key) // only on the slow path: acquire refuses logs
		}
		e.a, e.b, e.t = q.next.a, q.next.b, q.next.t
		e.meta = packMeta(expirySeconds(now+ttl(now, &q.next, log, &q.lim, c.ScaleFactor()), s.base), q.lim.Algorithm)
	}
}

// recency is a check's time as stored in memEntry.lw: milliseconds after
// the store's base, wrapping every 24 days.
func (s *MemoryStore) recency(now int64) uint32 { return uint32((now-s.base)/1000) & (1<<31 - 1) }

// Evictions counts states dropped to respect MaxKeys.
func (s *MemoryStore) Evictions() uint64 { return s.evictions.Load() }

// Len counts the states held, expired or not.
func (s *MemoryStore) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += int(sh.n)
		sh.mu.Unlock()
	}
	return n
}

// Sweep removes expired states, one shard at a time.
func (s *MemoryStore) Sweep() {
	now := s.clock.Now().UnixMicro()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		sh.sweep(expirySeconds(now, s.base))
		sh.mu.Unlock()
	}
	s.resv.sweep(now)
}

// Run sweeps expired states every interval until ctx ends. Lookups ignore
// expired states anyway; sweeping only returns their memory.
func (s *MemoryStore) Run(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		interval = 10 * time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			s.Sweep()
		}
	}
}

func (s *MemoryStore) shardFor(subject string) (*memShard, uint64) {
	h := maphash.String(s.seed, subject)
	// Low bits pick the shard; the tables inside use the high bits.
	return &s.shards[h&s.mask], h
}

// key mixes the subject's hash with the policy's into the state's key.
func (s *MemoryStore) key(sub uint64, policy string) uint64 {
	p := maphash.String(s.seed, policy)
	k := sub ^ bits.RotateLeft64(p*0x9E3779B97F4A7C15, 29)
	if k == 0 {
		k = 1 // zero marks an empty slot; keep it out of the table
	}
	return k
}

// expirySeconds converts a µs time to whole seconds after base, rounded
// up. It saturates at maxExpiry: a state meant to live longer than that
// (17 years after the process started) simply never expires.
func expirySeconds(us, base int64) uint32 {
	d := us - base
	if d <= 0 {
		return 0
	}
	sec := (d + usPerSec - 1) / usPerSec
	if sec > maxExpiry {
		return maxExpiry
	}
	return uint32(sec)
}

const (
	algShift  = 29
	maxExpiry = 1<<algShift - 1
)

// packMeta puts an expiry (seconds after the store's base) and the
// algorithm that wrote the state into one word.
func packMeta(exp uint32, alg Algorithm) uint32 { return exp | uint32(alg)<<algShift }

// memEntry is one (subject, policy) state, stored inline in its shard's
// table: 48 bytes, no pointers, laid out so that what a bucket or fixed
// window check reads and writes lies in the first 32 bytes (one cache
// line more often than not). key is read without the entry's lock while
// probing, so it is only ever accessed atomically; it changes only under
// the shard's mutex with the entry locked. lw holds the entry's spin lock
// and its recency; everything else is guarded by the lock.
type memEntry struct {
	key  uint64 // 0 marks an empty slot
	a    float64
	t    int64
	meta uint32 // expiry in seconds after the store's base | algorithm << algShift
	lw   uint32 // recency << 1 | locked; see MemoryStore.recency
	b    float64
	_    uint64
}

func (e *memEntry) expiry() uint32 { return e.meta & maxExpiry }

func (e *memEntry) lock() {
	for spins := 0; atomic.OrUint32(&e.lw, 1)&1 != 0; spins++ {
		// Entries are held for a few dozen nanoseconds; a holder that
		// does not let go soon has been descheduled.
		if spins >= 32 {
			runtime.Gosched()
		}
	}
}

func (e *memEntry) unlock() { atomic.AndUint32(&e.lw, ^uint32(1)) }

// used and setUsed read and write the recency of a locked entry.
func (e *memEntry) used() uint32     { return atomic.LoadUint32(&e.lw) >> 1 }
func (e *memEntry) setUsed(u uint32) { atomic.StoreUint32(&e.lw, u<<1|1) }

func (e *memEntry) loadKey() uint64 { return atomic.LoadUint64(&e.key) }

// moveFrom copies src's state into e, keeping e's lock as it is; src is
// locked, and so is e unless it is in a table not yet published.
func (e *memEntry) moveFrom(src *memEntry) {
	e.a, e.b, e.t, e.meta = src.a, src.b, src.t, src.meta
	atomic.StoreUint32(&e.lw, atomic.LoadUint32(&src.lw)&^1|atomic.LoadUint32(&e.lw)&1)
	atomic.StoreUint64(&e.key, src.loadKey())
}

// clear empties e, which is locked.
func (e *memEntry) clear() {
	atomic.StoreUint64(&e.key, 0)
	e.a, e.b, e.t, e.meta = 0, 0, 0, 0
	e.setUsed(0)
}

// memTable is one generation of a shard's table. Growing replaces it
// whole, so a check that loaded the old one can tell.
type memTable struct {
	e []memEntry
}

// home is where key's probe sequence starts: the high bits of the key,
// scaled to the table by multiplication, so tables need not be powers of
// two.
func (t *memTable) home(key uint64) int {
	hi, _ := bits.Mul64(key, uint64(len(t.e)))
	return int(hi)
}

// find returns key's index, or -1.
func (t *memTable) find(key uint64) int {
	for i := t.home(key); ; {
		switch t.e[i].loadKey() {
		case key:
			return i
		case 0:
			return -1
		}
		if i++; i == len(t.e) {
			i = 0
		}
	}
}

// lockAll locks the entries of p that exist, in table order.
func (t *memTable) lockAll(p []pending) {
	if len(p) == 1 {
		if p[0].idx >= 0 {
			t.e[p[0].idx].lock()
		}
		return
	}
	var order [MaxChecks]int
	n := 0
	for i := range p {
		if p[i].idx >= 0 {
			order[n] = p[i].idx
			n++
		}
	}
	slices.Sort(order[:n])
	for _, j := range order[:n] {
		t.e[j].lock()
	}
}

// evictSample is how many states an eviction compares: it evicts the least
// recently used of them (an expired one at once). Redis approximates LRU
// the same way; a shard of at most this many states gets exact LRU.
const evictSample = 16

// memShard is one partition of the states: an open-addressing table with
// linear probing, growing by a quarter at a time so that it stays between
// 60% and 75% full, with backward-shift deletion so that no tombstones
// accumulate.
type memShard struct {
	mu    sync.Mutex // changes to the table's shape, and the logs
	tab   atomic.Pointer[memTable]
	logs  map[uint64][]int64 // sliding window logs, by key
	total *atomic.Int64      // the store's count of states, less one per removal
	n     int32              // states held
	hand  int32              // where the next eviction starts looking
	_     [24]byte           // one cache line per shard
}

const minTable = 8

func (sh *memShard) init(total *atomic.Int64) {
	sh.total = total
	sh.tab.Store(&memTable{e: make([]memEntry, minTable)})
	sh.logs = make(map[uint64][]int64)
}

// acquire is the fast path: it finds and locks the entry of every check
// without the shard's mutex. It fails, holding nothing, when a state must
// be created, a sliding window log is involved, or the table changed shape
// while it locked.
func (sh *memShard) acquire(checks []Check, p []pending) (*memTable, bool) {
	tab := sh.tab.Load()
	for i := range p {
		if p[i].lim.Algorithm == SlidingWindowLog {
			return nil, false
		}
		p[i].idx = tab.find(p[i].key)
		if p[i].idx < 0 && checks[i].Cost != 0 {
			return nil, false
		}
	}
	tab.lockAll(p)
	ok := sh.tab.Load() == tab
	for i := range p {
		if !ok {
			break
		}
		if j := p[i].idx; j >= 0 {
			// Moved away or removed while we waited for the lock; or
			// holding a log, which only the slow path may drop.
			e := &tab.e[j]
			ok = e.loadKey() == p[i].key && e.meta>>algShift != uint32(SlidingWindowLog)
		}
	}
	if !ok {
		for i := range p {
			if j := p[i].idx; j >= 0 {
				tab.e[j].unlock()
			}
		}
		return nil, false
	}
	return tab, true
}

// releaseUsed unlocks the entries of p, recording the check as their
// latest use in the same store. Every check is a use, rejected ones
// included: the state of a subject being refused is the last to give up.
func (t *memTable) releaseUsed(p []pending, used uint32) {
	for i := range p {
		if j := p[i].idx; j >= 0 {
			atomic.StoreUint32(&t.e[j].lw, used<<1)
		}
	}
}

// insert adds an empty state for key, which is not in sh's table. It
// reserves the state in the store's count first; past MaxKeys it evicts
// one state (makeRoom), never one of the checks in p, and a second one
// while the store is still over MaxKeys from an insertion that found
// nothing to evict. The caller holds sh's mutex.
func (s *MemoryStore) insert(sh *memShard, key uint64, p []pending, used, nowSec uint32) {
	if over := s.count.Add(1) - s.max; over > 0 {
		for range min(over, 2) {
			if !s.makeRoom(sh, p, used, nowSec) {
				break
			}
			s.evictions.Add(1)
		}
	}
	tab := sh.tab.Load()
	if int(sh.n+1)*4 > len(tab.e)*3 {
		tab = sh.grow(tab)
	}
	e := &tab.e[place(tab, key)]
	e.lock()
	e.clear() // meta 0: expired, so it reads as never seen until committed
	e.setUsed(used)
	atomic.StoreUint64(&e.key, key)
	e.unlock()
	sh.n++
}

// makeRoom evicts one state (see memShard.evict) and reports whether it
// found one: from sh when it holds at least its share of the store's
// states, else from the first other shard, starting where the last such
// eviction succeeded, that holds at least its share and whose mutex is
// free, else from sh anyway. It only tries other shards' mutexes: the
// caller holds sh's, and two insertions waiting for each other's shard
// would deadlock.
func (s *MemoryStore) makeRoom(sh *memShard, p []pending, used, nowSec uint32) bool {
	share := int32(s.count.Load() / int64(len(s.shards)))
	if sh.n >= share && sh.evict(p, used, nowSec) {
		return true
	}
	start := s.hand.Load()
	for k := range uint32(len(s.shards)) {
		i := (start + k) & uint32(s.mask)
		o := &s.shards[i]
		if o == sh || !o.mu.TryLock() {
			continue
		}
		// A state of another shard is never one of the checks in p:
		// they name sh's subject.
		ok := o.n >= share && o.n > 0 && o.evict(nil, used, nowSec)
		o.mu.Unlock()
		if ok {
			s.hand.Store(i)
			return true
		}
	}
	return sh.evict(p, used, nowSec)
}

// place finds the empty slot where key belongs.
func place(tab *memTable, key uint64) int {
	i := tab.home(key)
	for tab.e[i].loadKey() != 0 {
		if i++; i == len(tab.e) {
			i = 0
		}
	}
	return i
}

// grow replaces the table by one a quarter larger. Every old entry stays
// locked until the new table is published, so no check can change a
// state after it was copied; a check that then locks an old entry sees
// the new table and retries.
func (sh *memShard) grow(old *memTable) *memTable {
	tab := &memTable{e: make([]memEntry, len(old.e)+len(old.e)/4)}
	for i := range old.e {
		src := &old.e[i]
		src.lock()
		if k := src.loadKey(); k != 0 {
			tab.e[place(tab, k)].moveFrom(src)
		}
	}
	sh.tab.Store(tab)
	for i := range old.e {
		old.e[i].unlock()
	}
	return tab
}

// evict removes one state: the first expired one met, or else the least
// recently used of evictSample states, never one of the checks in p. It
// reports whether it found one.
func (sh *memShard) evict(p []pending, now, nowSec uint32) bool {
	tab := sh.tab.Load()
	victim, oldest, seen := -1, uint32(0), 0
	i := int(sh.hand)
	if i >= len(tab.e) {
		i = 0
	}
scan:
	for range tab.e {
		e := &tab.e[i]
		if k := e.loadKey(); k != 0 {
			for j := range p {
				if p[j].key == k {
					goto next
				}
			}
			e.lock()
			exp, age := e.expiry(), (now-e.used())&(1<<31-1)
			e.unlock()
			if exp < nowSec {
				victim = i
				break scan
			}
			if victim < 0 || age > oldest {
				victim, oldest = i, age
			}
			if seen++; seen == evictSample {
				break
			}
		}
	next:
		if i++; i == len(tab.e) {
			i = 0
		}
	}
	sh.hand = int32(i)
	if victim < 0 {
		return false
	}
	sh.remove(tab, victim)
	return true
}

// remove deletes entry i and shifts back the entries after it that may
// move, so every probe sequence stays unbroken without tombstones. It
// locks the run of entries it may touch, in table order. The caller
// holds the mutex.
func (sh *memShard) remove(tab *memTable, i int) {
	n := len(tab.e)
	end := i // the empty slot that ends the run
	for {
		if end++; end == n {
			end = 0
		}
		if tab.e[end].loadKey() == 0 {
			break
		}
	}
	lockRange := func(lock bool) {
		f := (*memEntry).unlock
		if lock {
			f = (*memEntry).lock
		}
		if i < end {
			for j := i; j < end; j++ {
				f(&tab.e[j])
			}
			return
		}
		for j := 0; j < end; j++ {
			f(&tab.e[j])
		}
		for j := i; j < n; j++ {
			f(&tab.e[j])
		}
	}
	lockRange(true)
	if len(sh.logs) > 0 {
		delete(sh.logs, tab.e[i].loadKey())
	}
	hole := i
	for k := i + 1; ; k++ {
		if k == n {
			k = 0
		}
		if k == end {
			break
		}
		// The entry at k may fill the hole unless its home lies
		// cyclically in (hole, k].
		h := tab.home(tab.e[k].loadKey())
		var stays bool
		if hole <= k {
			stays = hole < h && h <= k
		} else {
			stays = hole < h || h <= k
		}
		if !stays {
			tab.e[hole].moveFrom(&tab.e[k])
			hole = k
		}
	}
	tab.e[hole].clear()
	lockRange(false)
	sh.n--
	sh.total.Add(-1)
}

func (sh *memShard) sweep(nowSec uint32) {
	tab := sh.tab.Load()
	for i := 0; i < len(tab.e); {
		e := &tab.e[i]
		e.lock()
		expired := e.loadKey() != 0 && e.expiry() < nowSec
		e.unlock()
		if expired {
			sh.remove(tab, i) // may shift a later entry into i: look again
			continue
		}
		i++
	}
}
