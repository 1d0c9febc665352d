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
// table of 48-byte entries keyed by a 64-bit hash of (subject, policy),
// with an intrusive LRU list: no per-key allocation, no pointers for the
// garbage collector to chase. Two keys colliding in 64 bits would share a
// state; with a million keys the odds are about one in 10^7.
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
	for i := range req.Checks {
		c := &req.Checks[i]
		l := &lims[i]
		*l = c.effective()
		keys[i] = s.key(sub, c.Policy)
		idx[i], stale[i] = sh.lookup(keys[i], now, s.base, l.Algorithm)
		live := idx[i] >= 0 && !stale[i]
		if l.Algorithm == SlidingWindowLog {
			var log []int64
			if live {
				log = sh.logs[idx[i]]
			}
			d.Results[i], drops[i] = decideLog(now, log, l, float64(c.Cost))
			continue
		}
		if live {
			e := &sh.entries[idx[i]]
			next[i] = counters{a: e.a, b: e.b, t: e.t}
		}
		decide(now, &next[i], l, float64(c.Cost), &d.Results[i])
	}
	d.finish(req.Checks)
	if d.Allowed {
		// Existing states first move to the head of the LRU list, so that
		// inserting the new ones cannot evict them.
		for i := range req.Checks {
			if idx[i] >= 0 {
				sh.touch(idx[i])
			}
		}
		for i := range req.Checks {
			c := &req.Checks[i]
			if c.Cost == 0 {
				continue
			}
			l := &lims[i]
			if idx[i] < 0 {
				idx[i] = sh.insert(keys[i], &s.evictions)
			}
			var log []int64
			if l.Algorithm == SlidingWindowLog {
				old := sh.logs[idx[i]]
				if stale[i] {
					old = old[:0]
				}
				log = commitLog(old, drops[i], now, c.Cost)
				sh.logs[idx[i]] = log
			} else if stale[i] {
				delete(sh.logs, idx[i])
			}
			e := &sh.entries[idx[i]]
			st := &next[i]
			e.a, e.b, e.t, e.alg = st.a, st.b, st.t, uint8(l.Algorithm)
			e.exp = expirySeconds(now+ttl(now, st, log, l, c.scale()), s.base)
			sh.touch(idx[i])
		}
	}
	sh.mu.Unlock()
	return d, nil
}

// Evictions counts states dropped to respect MaxKeys.
func (s *MemoryStore) Evictions() uint64 { return s.evictions.Load() }

// Len counts the states held, expired or not.
func (s *MemoryStore) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.n
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
	// High bits pick the shard; the tables inside use the low bits.
	return &s.shards[(h>>40)&s.mask], h
}

// key mixes the subject's hash with the policy's into the state's key.
func (s *MemoryStore) key(sub uint64, policy string) uint64 {
	p := maphash.String(s.seed, policy)
	k := sub ^ bits.RotateLeft64(p*0x9E3779B97F4A7C15, 29)
	if k == 0 {
		k = 1 // zero marks nothing; keep it out of the table
	}
	return k
}

// expirySeconds converts a µs time to whole seconds after base, rounded up.
func expirySeconds(us, base int64) uint32 {
	d := us - base
	if d <= 0 {
		return 0
	}
	sec := (d + usPerSec - 1) / usPerSec
	if sec > 1<<32-1 {
		return 1<<32 - 1
	}
	return uint32(sec)
}

// memEntry is one (subject, policy) state: 48 bytes.
type memEntry struct {
	key        uint64
	a, b       float64
	t          int64
	prev, next int32 // LRU links; -1 ends the list; next also links free entries
	exp        uint32
	alg        uint8
}

type memShard struct {
	mu      sync.Mutex
	slots   []int32 // entry index + 1; 0 is empty
	entries []memEntry
	logs    map[int32][]int64 // sliding window logs, by entry index
	free    int32             // head of the free list, -1 if none
	head    int32             // most recently used
	tail    int32             // least recently used
	n       int
	max     int
	_       [40]byte // keep neighbouring shards' locks off one cache line
}

func (sh *memShard) init(max int) {
	sh.max = max
	sh.free, sh.head, sh.tail = -1, -1, -1
	sh.slots = make([]int32, 8)
	sh.logs = make(map[int32][]int64)
}

// lookup finds the entry for key, or -1. A state that expired or was kept
// for another algorithm is stale: it reads as a subject never seen, and a
// commit overwrites it. Nothing is changed here, so a rejected or
// zero-cost check leaves the entry as it was, as the Redis store does.
func (sh *memShard) lookup(key uint64, now, base int64, alg Algorithm) (idx int32, stale bool) {
	mask := uint64(len(sh.slots) - 1)
	for i := key & mask; ; i = (i + 1) & mask {
		v := sh.slots[i]
		if v == 0 {
			return -1, false
		}
		e := &sh.entries[v-1]
		if e.key == key {
			return v - 1, e.alg != uint8(alg) || e.exp < expirySeconds(now, base)
		}
	}
}

// insert adds a zeroed entry for key, evicting the least recently used one
// when the shard is full.
func (sh *memShard) insert(key uint64, evictions *atomic.Uint64) int32 {
	if sh.n >= sh.max && sh.tail >= 0 {
		sh.remove(sh.tail)
		evictions.Add(1)
	}
	if (sh.n+1)*4 > len(sh.slots)*3 {
		sh.grow()
	}
	var i int32
	if sh.free >= 0 {
		i = sh.free
		sh.free = sh.entries[i].next
		sh.entries[i] = memEntry{}
	} else {
		sh.entries = append(sh.entries, memEntry{})
		i = int32(len(sh.entries) - 1)
	}
	e := &sh.entries[i]
	e.key, e.prev, e.next = key, -1, -1
	sh.place(key, i)
	sh.n++
	// Link at the head.
	e.next = sh.head
	if sh.head >= 0 {
		sh.entries[sh.head].prev = i
	}
	sh.head = i
	if sh.tail < 0 {
		sh.tail = i
	}
	return i
}

func (sh *memShard) place(key uint64, i int32) {
	mask := uint64(len(sh.slots) - 1)
	j := key & mask
	for sh.slots[j] != 0 {
		j = (j + 1) & mask
	}
	sh.slots[j] = i + 1
}

func (sh *memShard) grow() {
	old := sh.slots
	sh.slots = make([]int32, len(old)*2)
	for _, v := range old {
		if v != 0 {
			sh.place(sh.entries[v-1].key, v-1)
		}
	}
}

// touch moves entry i to the head of the LRU list.
func (sh *memShard) touch(i int32) {
	if sh.head == i {
		return
	}
	sh.unlink(i)
	e := &sh.entries[i]
	e.prev, e.next = -1, sh.head
	if sh.head >= 0 {
		sh.entries[sh.head].prev = i
	}
	sh.head = i
	if sh.tail < 0 {
		sh.tail = i
	}
}

func (sh *memShard) unlink(i int32) {
	e := &sh.entries[i]
	if e.prev >= 0 {
		sh.entries[e.prev].next = e.next
	} else {
		sh.head = e.next
	}
	if e.next >= 0 {
		sh.entries[e.next].prev = e.prev
	} else {
		sh.tail = e.prev
	}
}

// remove deletes entry i: it leaves the LRU list and the table (with
// backward-shift deletion, so probes need no tombstones) and joins the
// free list.
func (sh *memShard) remove(i int32) {
	sh.unlink(i)
	key := sh.entries[i].key
	mask := uint64(len(sh.slots) - 1)
	j := key & mask
	for sh.slots[j] != i+1 {
		j = (j + 1) & mask
	}
	sh.slots[j] = 0
	for k := (j + 1) & mask; sh.slots[k] != 0; k = (k + 1) & mask {
		home := sh.entries[sh.slots[k]-1].key & mask
		// Move slot k back to the hole at j unless its home lies
		// cyclically in (j, k].
		if (k > j && (home <= j || home > k)) || (k < j && home <= j && home > k) {
			sh.slots[j] = sh.slots[k]
			sh.slots[k] = 0
			j = k
		}
	}
	delete(sh.logs, i)
	sh.entries[i] = memEntry{key: 0, next: sh.free, prev: -1}
	sh.free = i
	sh.n--
}

func (sh *memShard) sweep(nowSec uint32) {
	for i := sh.tail; i >= 0; {
		prev := sh.entries[i].prev
		if sh.entries[i].exp < nowSec {
			sh.remove(i)
		}
		i = prev
	}
}
