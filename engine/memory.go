package engine

import (
	"context"
	"hash/maphash"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

// MemoryConfig configures a MemoryStore.
type MemoryConfig struct {
	// Clock supplies time; nil means real time.
	Clock Clock
	// MaxKeys bounds the number of (subject, policy) states kept; the
	// least recently used is evicted past it. Zero means DefaultMaxKeys.
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
// State is partitioned by subject into shards, each behind its own mutex,
// so all policies of one subject are decided under one lock (atomically)
// and unrelated subjects rarely contend. Each shard is an open-addressing
// table of 40-byte entries stored inline and keyed by a 64-bit hash of
// (subject, policy): a check reads one entry, nothing is allocated per
// key, and there are no pointers for the garbage collector to chase.
// Eviction past MaxKeys approximates LRU by sampling, as Redis does. Two
// keys colliding in 64 bits would share a state; with a million keys the
// odds are about one in 10^7.
type MemoryStore struct {
	clock     Clock
	seed      maphash.Seed
	shards    []memShard
	mask      uint64 // len(shards) - 1
	base      int64  // µs; expiry times are stored as seconds after it
	evictions atomic.Uint64
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
		clock:  clockOrReal(cfg.Clock),
		seed:   maphash.MakeSeed(),
		shards: make([]memShard, n),
		mask:   uint64(n - 1),
	}
	s.base = s.clock.Now().UnixMicro()
	per := max((maxKeys+n-1)/n, MaxChecks)
	for i := range s.shards {
		s.shards[i].init(per)
	}
	return s
}

// Check decides a request: all of its policies or none.
func (s *MemoryStore) Check(_ context.Context, req Request) (d Decision, err error) {
	if err := req.validate(); err != nil {
		return Decision{Decider: -1}, err
	}
	now := s.clock.Now().UnixMicro()
	nowSec := expirySeconds(now, s.base)
	sh, sub := s.shardFor(req.Subject)
	// d is the named result, filled in place: returning a local copied
	// its 344 bytes once more per check.
	d.N = len(req.Checks)
	var next [MaxChecks]counters
	var lims [MaxChecks]Limit
	var idx [MaxChecks]int32
	var keys [MaxChecks]uint64
	var drops [MaxChecks]int
	var stale [MaxChecks]bool

	sh.mu.Lock()
	sh.tick++
	for i := range req.Checks {
		c := &req.Checks[i]
		l := &lims[i]
		*l = c.effective()
		keys[i] = s.key(sub, c.Policy)
		idx[i], stale[i] = sh.lookup(keys[i], nowSec, l.Algorithm)
		live := idx[i] >= 0 && !stale[i]
		if live {
			// Every check is a use, rejected ones included: the state of a
			// subject being refused is the last one to give up.
			sh.tab[idx[i]].used = sh.tick
		}
		if l.Algorithm == SlidingWindowLog {
			var log []int64
			if live {
				log = sh.logs[keys[i]]
			}
			d.Results[i], drops[i] = decideLog(now, log, l, float64(c.Cost))
			continue
		}
		if live {
			e := &sh.tab[idx[i]]
			next[i] = counters{a: e.a, b: e.b, t: e.t}
		}
		decide(now, &next[i], l, float64(c.Cost), &d.Results[i])
	}
	d.finish(req.Checks)
	if d.Allowed {
		// States that exist are written first, while the indexes found
		// above still hold: inserting may grow the table or evict, and
		// both move entries.
		for i := range req.Checks {
			if req.Checks[i].Cost != 0 && idx[i] >= 0 {
				s.commit(sh, idx[i], keys[i], stale[i], now, &req.Checks[i], &lims[i], &next[i], drops[i])
			}
		}
		for i := range req.Checks {
			if req.Checks[i].Cost != 0 && idx[i] < 0 {
				j := sh.insert(keys[i], nowSec, &s.evictions)
				s.commit(sh, j, keys[i], true, now, &req.Checks[i], &lims[i], &next[i], drops[i])
			}
		}
	}
	sh.mu.Unlock()
	return d, nil
}

// commit stores one policy's new state in entry i. fresh marks an entry
// whose old contents (stale or just inserted) must not carry over.
func (s *MemoryStore) commit(sh *memShard, i int32, key uint64, fresh bool, now int64, c *Check, l *Limit, st *counters, drop int) {
	var log []int64
	if l.Algorithm == SlidingWindowLog {
		old := sh.logs[key]
		if fresh {
			old = old[:0]
		}
		log = commitLog(old, drop, now, c.Cost)
		sh.logs[key] = log
	} else if fresh && len(sh.logs) > 0 {
		delete(sh.logs, key)
	}
	e := &sh.tab[i]
	e.a, e.b, e.t = st.a, st.b, st.t
	e.meta = packMeta(expirySeconds(now+ttl(now, st, log, l, c.scale()), s.base), l.Algorithm)
	e.used = sh.tick
}

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
// table: 40 bytes, no pointers, so a check touches one entry and the
// garbage collector never looks inside.
type memEntry struct {
	key  uint64 // 0 marks an empty slot
	a, b float64
	t    int64
	meta uint32 // expiry in seconds after the store's base | algorithm << algShift
	used uint32 // the shard's tick at the last check that read this state
}

func (e *memEntry) expiry() uint32 { return e.meta & maxExpiry }

// evictSample is how many states an eviction compares: it evicts the least
// recently used of them (an expired one at once). Redis approximates LRU
// the same way; a shard of at most this many states gets exact LRU.
const evictSample = 16

// memShard is one lock's worth of states: an open-addressing table with
// linear probing, indexed by the high bits of the key (multiply-shift, so
// the table can grow by a quarter at a time and stay between 60% and 75%
// full), with backward-shift deletion so that no tombstones accumulate.
// Recency is a per-shard tick rather than a linked list: keeping a list
// in order wrote to two unrelated entries on every check.
type memShard struct {
	mu   sync.Mutex
	tab  []memEntry
	logs map[uint64][]int64 // sliding window logs, by key
	n    int32              // states held
	max  int32              // states allowed before evicting
	hand int32              // where the next eviction starts looking
	tick uint32             // counts checks; stamps memEntry.used
	_    [8]byte            // one cache line per shard: locks do not share lines
}

const minTable = 8

func (sh *memShard) init(max int) {
	sh.max = int32(min(max, 1<<30))
	sh.tab = make([]memEntry, minTable)
	sh.logs = make(map[uint64][]int64)
}

// home is where key's probe sequence starts.
func (sh *memShard) home(key uint64) int {
	hi, _ := bits.Mul64(key, uint64(len(sh.tab)))
	return int(hi)
}

// lookup finds the entry for key, or -1. A state that expired or was kept
// for another algorithm is stale: it reads as a subject never seen, and a
// commit overwrites it. Nothing is changed here, so a rejected or
// zero-cost check leaves the state as it was, as the Redis store does.
func (sh *memShard) lookup(key uint64, nowSec uint32, alg Algorithm) (idx int32, stale bool) {
	tab := sh.tab
	for i := sh.home(key); ; {
		e := &tab[i]
		if e.key == key {
			return int32(i), e.meta>>algShift != uint32(alg) || e.expiry() < nowSec
		}
		if e.key == 0 {
			return -1, false
		}
		if i++; i == len(tab) {
			i = 0
		}
	}
}

// insert adds an entry for key, which must not be in the table, evicting
// when the shard is full, and returns its index.
func (sh *memShard) insert(key uint64, nowSec uint32, evictions *atomic.Uint64) int32 {
	if sh.n >= sh.max && sh.evict(nowSec) {
		evictions.Add(1)
	}
	if int(sh.n+1)*4 > len(sh.tab)*3 {
		sh.grow()
	}
	i := sh.place(key)
	sh.tab[i] = memEntry{key: key, used: sh.tick}
	sh.n++
	return int32(i)
}

// place finds the empty slot where key belongs.
func (sh *memShard) place(key uint64) int {
	i := sh.home(key)
	for sh.tab[i].key != 0 {
		if i++; i == len(sh.tab) {
			i = 0
		}
	}
	return i
}

func (sh *memShard) grow() {
	old := sh.tab
	sh.tab = make([]memEntry, len(old)+len(old)/4)
	for i := range old {
		if old[i].key != 0 {
			sh.tab[sh.place(old[i].key)] = old[i]
		}
	}
}

// evict removes one state: the first expired one met, or else the least
// recently used of evictSample states, never one the current check uses.
// It reports whether it found one.
func (sh *memShard) evict(nowSec uint32) bool {
	victim, oldest, seen := -1, uint32(0), 0
	i := int(sh.hand)
	if i >= len(sh.tab) {
		i = 0
	}
	for range sh.tab {
		e := &sh.tab[i]
		if e.key != 0 && e.used != sh.tick {
			if e.expiry() < nowSec {
				victim = i
				break
			}
			if age := sh.tick - e.used; victim < 0 || age > oldest {
				victim, oldest = i, age
			}
			if seen++; seen == evictSample {
				break
			}
		}
		if i++; i == len(sh.tab) {
			i = 0
		}
	}
	sh.hand = int32(i)
	if victim < 0 {
		return false
	}
	sh.remove(victim)
	return true
}

// remove deletes entry i and shifts back the entries after it that may
// move, so every probe sequence stays unbroken without tombstones.
func (sh *memShard) remove(i int) {
	if len(sh.logs) > 0 {
		delete(sh.logs, sh.tab[i].key)
	}
	n := len(sh.tab)
	hole := i
	for k := i + 1; ; k++ {
		if k == n {
			k = 0
		}
		e := &sh.tab[k]
		if e.key == 0 {
			break
		}
		// The entry at k may fill the hole unless its home lies
		// cyclically in (hole, k].
		h := sh.home(e.key)
		var stays bool
		if hole <= k {
			stays = hole < h && h <= k
		} else {
			stays = hole < h || h <= k
		}
		if !stays {
			sh.tab[hole] = *e
			hole = k
		}
	}
	sh.tab[hole] = memEntry{}
	sh.n--
}

func (sh *memShard) sweep(nowSec uint32) {
	for i := 0; i < len(sh.tab); {
		if e := &sh.tab[i]; e.key != 0 && e.expiry() < nowSec {
			sh.remove(i) // may shift a later entry into i: look again
			continue
		}
		i++
	}
}
