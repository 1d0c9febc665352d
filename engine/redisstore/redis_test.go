package redisstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/engine/internal/quant"
	"github.com/sluice-rl/sluice/engine/storetest"
	"github.com/sluice-rl/sluice/internal/manualclock"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/internal/testwait"
)

// Both go-redis clients satisfy the store's interface.
var (
	_ Scripter = (*redis.Client)(nil)
	_ Scripter = (*redis.ClusterClient)(nil)
	_ Scripter = redis.UniversalClient(nil)
)

// virtualTTLPad is how much longer than its TTL a key lives when a test
// runs the store on virtual time: Redis expires keys on real time, and a
// test may spend seconds of it within a virtual millisecond.
const virtualTTLPad = int64(time.Hour / time.Millisecond)

// newTestRedisStore returns a store on a fresh redis-server whose time
// comes from clock (Redis' own TIME when clock is nil).
func newTestRedisStore(t testing.TB, clock engine.Clock) (*Store, *redistest.Server) {
	t.Helper()
	srv := redistest.Start(t)
	s := New(srv.Client(t), Config{Timeout: time.Second})
	setVirtualClock(s, clock)
	return s, srv
}

// daemonClient returns a client to srv built as the daemon builds one
// (NewClient: its pool and timeouts), closed when the test ends.
func daemonClient(t testing.TB, srv *redistest.Server) redis.UniversalClient {
	t.Helper()
	c, err := NewClient("redis://" + srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// setVirtualClock makes s read time from clock instead of Redis' TIME.
func setVirtualClock(s *Store, clock engine.Clock) {
	if clock != nil {
		s.clock, s.ttlPad = clock, virtualTTLPad
	}
}

// TestRedisStoreShared holds the Redis store to the semantics every store
// shares (engine/storetest), as the memory store is.
func TestRedisStoreShared(t *testing.T) {
	storetest.Run(t, storetest.Case{Name: "redis", New: func(t *testing.T, clock engine.Clock) storetest.Checker {
		s, _ := newTestRedisStore(t, clock)
		return s
	}})
}

func TestRedisKey(t *testing.T) {
	s := New(nil, Config{})
	tests := []struct{ subject, policy, want string }{
		{"alice", "p", "rl:{alice}:p"},
		{"user:42", "daily", "rl:{user:42}:daily"},
		{"a{b}c", "p", "rl:{=YXtifWM}:p"},
		{"}", "p", "rl:{=fQ}:p"},
		{"=x", "p", "rl:{=PXg}:p"},
		{"x=", "p", "rl:{x=}:p"},
	}
	for _, tt := range tests {
		if got := s.Key(tt.subject, tt.policy); got != tt.want {
			t.Errorf("Key(%q, %q) = %q, want %q", tt.subject, tt.policy, got, tt.want)
		}
	}
}

func TestRedisConfigValidate(t *testing.T) {
	if err := (Config{Prefix: "a{b}:"}).Validate(); err == nil {
		t.Error("Validate(prefix with braces) = nil, want an error")
	}
	s := New(nil, Config{Prefix: "{x}"})
	if _, err := s.Check(context.Background(), storetest.One("a", "p", engine.Limit{Algorithm: engine.TokenBucket, Rate: 1, Burst: 1}, 1)); err == nil {
		t.Error("Check on a store with a braced prefix = nil error, want one")
	}
}

func TestNewRedisClient(t *testing.T) {
	c, err := NewClient("redis://127.0.0.1:6379/2")
	if err != nil {
		t.Fatal(err)
	}
	rc, ok := c.(*redis.Client)
	if !ok {
		t.Fatalf("NewRedisClient(redis://) = %T, want *redis.Client", c)
	}
	if o := rc.Options(); !o.ContextTimeoutEnabled || o.DB != 2 || o.PoolSize < 64 || o.MaxRetries != 1 {
		t.Errorf("options = timeout-enabled %v, db %d, pool %d, retries %d; want true, 2, >= 64, 1",
			o.ContextTimeoutEnabled, o.DB, o.PoolSize, o.MaxRetries)
	}
	_ = c.Close()
	c, err = NewClient("redis-cluster://u:pw@127.0.0.1:7000,127.0.0.1:7001")
	if err != nil {
		t.Fatal(err)
	}
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		t.Fatalf("NewRedisClient(redis-cluster://) = %T, want *redis.ClusterClient", c)
	}
	if o := cc.Options(); !o.ContextTimeoutEnabled || len(o.Addrs) != 2 || o.Password != "pw" || o.PoolSize < 64 {
		t.Errorf("cluster options = %+v", o)
	}
	_ = c.Close()
	for _, bad := range []string{"127.0.0.1:6379", "http://x", "redis-cluster://"} {
		if _, err := NewClient(bad); err == nil {
			t.Errorf("NewRedisClient(%q) = nil error, want one", bad)
		}
	}
}

// TestRedisTTL shows that every written key expires: with Redis' own clock,
// PTTL is the state's TTL (time to refill, plus a second), and an idle key
// is gone once it passes.
func TestRedisTTL(t *testing.T) {
	s, srv := newTestRedisStore(t, nil)
	c := srv.Client(t)
	ctx := context.Background()
	req := engine.Request{Subject: "idle", Checks: []engine.Check{
		{Policy: "tb", Limit: engine.Limit{Algorithm: engine.TokenBucket, Rate: 1000, Burst: 10}, Cost: 10},
		{Policy: "fw", Limit: engine.Limit{Algorithm: engine.FixedWindow, Count: 5, Window: 100 * time.Millisecond}, Cost: 1},
		{Policy: "log", Limit: engine.Limit{Algorithm: engine.SlidingWindowLog, Count: 5, Window: 50 * time.Millisecond}, Cost: 2},
		{Policy: "swc", Limit: engine.Limit{Algorithm: engine.SlidingWindowCounter, Count: 5, Window: 10 * time.Millisecond}, Cost: 1},
		{Policy: "lb", Limit: engine.Limit{Algorithm: engine.LeakyBucket, Rate: 100, Burst: 10}, Cost: 1},
		{Policy: "peek", Limit: engine.Limit{Algorithm: engine.TokenBucket, Rate: 1, Burst: 10}, Cost: 0},
	}}
	if d := storetest.MustCheck(t, s, req); !d.Allowed {
		t.Fatalf("first check rejected: %+v", d)
	}
	// The most each TTL can be: the state's own lifetime plus the second.
	most := map[string]time.Duration{
		"tb": 10*time.Millisecond + time.Second, "fw": 100*time.Millisecond + time.Second,
		"log": 50*time.Millisecond + time.Second, "swc": 20*time.Millisecond + time.Second,
		"lb": 10*time.Millisecond + time.Second,
	}
	for _, ch := range req.Checks {
		key := s.Key(req.Subject, ch.Policy)
		pttl, err := c.PTTL(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ch.Cost == 0 {
			if pttl != -2*time.Nanosecond && pttl >= 0 {
				t.Errorf("PTTL(%s) = %v, want no key: a zero-cost check writes nothing", key, pttl)
			}
			continue
		}
		if pttl <= 0 || pttl > most[ch.Policy]+time.Millisecond {
			t.Errorf("PTTL(%s) = %v, want in (0, %v]", key, pttl, most[ch.Policy])
		}
	}
	// Idle keys go away. Poll the condition; Redis' expiry runs on its own.
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		n, err := c.Exists(ctx, s.Key("idle", "tb"), s.Key("idle", "fw"), s.Key("idle", "log"), s.Key("idle", "swc"), s.Key("idle", "lb")).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d keys still exist 10 s after an idle check", n)
		}
		<-tick.C
	}
}

// TestRedisStateIsCompact holds a token bucket subject under the 100 bytes
// the issue allows, as Redis' MEMORY USAGE counts them. The state itself is
// 12 bytes, so Redis 7.0 keeps it in a 32-byte allocation with its object
// header (16 + 3 + 12 + 1 bytes as an embedded string); the rest is the key
// (1 + length + 1 bytes, rounded up to jemalloc's 16, 32, 48 ...) and the
// 24-byte dict entry: 16 + 32 + 24 = 72 bytes up to 14 bytes of key,
// 32 + 32 + 24 = 88 up to 30. A sliding window counter's 17 bytes need the
// 48-byte class: 104 bytes with a 20-byte key.
func TestRedisStateIsCompact(t *testing.T) {
	s, srv := newTestRedisStore(t, nil)
	c := srv.Client(t)
	ctx := context.Background()
	// A slow refill: a bucket one unit short lives for its refill plus a
	// second (10 s), so none expires while a busy machine measures them.
	tb := engine.Limit{Algorithm: engine.TokenBucket, Rate: 0.1, Burst: 100}
	swc := engine.Limit{Algorithm: engine.SlidingWindowCounter, Count: 100, Window: time.Minute}
	for _, tt := range []struct {
		subject, policy string
		l               engine.Limit
		strlen          int64
		most            float64
	}{
		{"s%d", "p", tb, 12, 72},         // rl:{s123456}:p, 14 bytes
		{"user:%d", "api", tb, 12, 88},   // rl:{user:123456}:api, 20 bytes
		{"user:%d", "win", swc, 17, 104}, // rl:{user:123456}:win, 20 bytes
	} {
		subject := func(i int) string { return fmt.Sprintf(tt.subject, 100000+i) }
		for i := range 1000 {
			storetest.MustCheck(t, s, storetest.One(subject(i), tt.policy, tt.l, 1))
		}
		per, err := redisBytesPerSubject(ctx, c, s, 1000, subject, tt.policy)
		if err != nil {
			t.Fatal(err)
		}
		key := s.Key(subject(0), tt.policy)
		if n, err := c.StrLen(ctx, key).Result(); err != nil || n != tt.strlen {
			t.Errorf("STRLEN %s = %d, %v; want %d", key, n, err, tt.strlen)
		}
		t.Logf("MEMORY USAGE: %.1f bytes per %v subject with %d-byte keys like %s", per, tt.l.Algorithm, len(key), key)
		if per > tt.most {
			t.Errorf("MEMORY USAGE with keys like %s = %.1f bytes per subject, want at most %v", key, per, tt.most)
		}
	}
}

// TestRedisRejectionWrites holds the script to writing on a rejected
// check only what keepRejected asks for: a token bucket full at its
// scaled burst, later than its stored state. Rejections of a bucket that
// is not full, or under any other algorithm, leave Redis untouched.
func TestRedisRejectionWrites(t *testing.T) {
	clock := manualclock.New()
	s, srv := newTestRedisStore(t, clock)
	c := srv.Client(t)
	ctx := context.Background()
	scaled := func(l engine.Limit, cost int64, scale float64) engine.Request {
		return engine.Request{Subject: "s", Checks: []engine.Check{{Policy: "p", Limit: l, Cost: cost, Scale: scale}}}
	}
	tb := engine.Limit{Algorithm: engine.TokenBucket, Rate: 10, Burst: 100}
	tests := []struct {
		name  string
		setup []engine.Request // allowed checks made first
		req   engine.Request   // rejected
		write bool
	}{
		{"token bucket never seen, small share", nil, scaled(tb, 1, 0.001), true},
		{"token bucket not full", []engine.Request{scaled(tb, 60, 1)}, scaled(tb, 50, 1), false},
		{"leaky bucket never seen, small share", nil, scaled(engine.Limit{Algorithm: engine.LeakyBucket, Rate: 10, Burst: 100}, 1, 0.001), false},
		{"fixed window never seen, small share", nil, scaled(engine.Limit{Algorithm: engine.FixedWindow, Count: 100, Window: time.Minute}, 1, 0.001), false},
		{"sliding window log never seen, small share", nil, scaled(engine.Limit{Algorithm: engine.SlidingWindowLog, Count: 100, Window: time.Minute}, 1, 0.001), false},
		{"sliding window counter never seen, small share", nil, scaled(engine.Limit{Algorithm: engine.SlidingWindowCounter, Count: 100, Window: time.Minute}, 1, 0.001), false},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			subject := fmt.Sprint("w", i)
			for _, r := range tt.setup {
				r.Subject = subject
				if d := storetest.MustCheck(t, s, r); !d.Allowed {
					t.Fatalf("setup check %+v rejected", r)
				}
			}
			key := s.Key(subject, "p")
			before, _ := c.Get(ctx, key).Result()
			clock.Advance(time.Millisecond)
			tt.req.Subject = subject
			if d := storetest.MustCheck(t, s, tt.req); d.Allowed {
				t.Fatalf("Check(%+v) allowed, want rejected", tt.req)
			}
			after, _ := c.Get(ctx, key).Result()
			if wrote := after != before; wrote != tt.write {
				t.Errorf("rejected check wrote %v (%x -> %x), want %v", wrote, before, after, tt.write)
			}
		})
	}
}

// TestRedisStateFormat reads the stored strings back as redis.lua's header
// describes them: a 7-byte header holding T and the algorithm, then A (and
// B) in 5 bytes each, a bucket's as the top of a double and a window's as
// an integer, or the log's timestamps as whole doubles.
func TestRedisStateFormat(t *testing.T) {
	clock := manualclock.New()
	s, srv := newTestRedisStore(t, clock)
	c := srv.Client(t)
	ctx := context.Background()
	now := clock.Now().UnixMicro()
	w := time.Minute.Microseconds()
	req := engine.Request{Subject: "fmt", Checks: []engine.Check{
		{Policy: "tb", Limit: engine.Limit{Algorithm: engine.TokenBucket, Rate: 1, Burst: 10 - 1.0/3}, Cost: 1},
		{Policy: "lb", Limit: engine.Limit{Algorithm: engine.LeakyBucket, Rate: 1, Burst: 10}, Cost: 3},
		{Policy: "fw", Limit: engine.Limit{Algorithm: engine.FixedWindow, Count: 1e12, Window: time.Minute}, Cost: 1<<40 - 1e12 + 2},
		{Policy: "log", Limit: engine.Limit{Algorithm: engine.SlidingWindowLog, Count: 10, Window: time.Minute}, Cost: 3},
		{Policy: "swc", Limit: engine.Limit{Algorithm: engine.SlidingWindowCounter, Count: 1e12, Window: time.Minute}, Cost: 1<<29 + 1},
	}}
	if d := storetest.MustCheck(t, s, req); !d.Allowed {
		t.Fatalf("check rejected: %+v", d)
	}
	q5 := func(b []byte) float64 {
		return math.Float64frombits(binary.LittleEndian.Uint64(append([]byte{0, 0, 0}, b...)))
	}
	i5 := func(b []byte) float64 {
		return float64(binary.LittleEndian.Uint64(append(append([]byte(nil), b...), 0, 0, 0)))
	}
	tests := []struct {
		policy string
		alg    engine.Algorithm
		t      int64
		nums   []float64 // A, B as 5-byte numbers, or the log's timestamps
	}{
		{"tb", engine.TokenBucket, now, []float64{quant.Down(9 - 1.0/3)}},
		{"lb", engine.LeakyBucket, now, []float64{3}},
		{"fw", engine.FixedWindow, now - now%w, []float64{1<<40 - 1e12 + 2}},
		{"log", engine.SlidingWindowLog, 0, []float64{float64(now), float64(now), float64(now)}},
		{"swc", engine.SlidingWindowCounter, now - now%w, []float64{1<<29 + 1, 0}},
	}
	for _, tt := range tests {
		key := s.Key(req.Subject, tt.policy)
		v, err := c.Get(ctx, key).Bytes()
		if err != nil {
			t.Fatal(err)
		}
		lo := uint64(binary.LittleEndian.Uint32(v))
		hi := uint64(v[4]) | uint64(v[5])<<8 | uint64(v[6])<<16
		if gotT, gotAlg := int64(hi%(1<<21)<<32|lo), engine.Algorithm(hi>>21); gotT != tt.t || gotAlg != tt.alg {
			t.Errorf("header of %s = T %d, algorithm %v; want %d, %v", key, gotT, gotAlg, tt.t, tt.alg)
		}
		var nums []float64
		if tt.alg == engine.SlidingWindowLog {
			for i := 7; i+8 <= len(v); i += 8 {
				nums = append(nums, math.Float64frombits(binary.LittleEndian.Uint64(v[i:])))
			}
		} else {
			num := q5
			if tt.alg.Windowed() {
				num = i5
			}
			for i := 7; i+5 <= len(v); i += 5 {
				nums = append(nums, num(v[i:i+5]))
			}
		}
		want := 7 + 5*len(tt.nums)
		if tt.alg == engine.SlidingWindowLog {
			want = 7 + 8*len(tt.nums)
		}
		if len(v) != want || !slices.Equal(nums, tt.nums) {
			t.Errorf("GET %s = %d bytes holding %v; want %d holding %v", key, len(v), nums, want, tt.nums)
		}
	}
}

// TestRedisStateOfAnotherShape shows that a value of the wrong length or
// algorithm reads as a subject never seen, as one written by an older
// format or by a policy that changed algorithm would.
func TestRedisStateOfAnotherShape(t *testing.T) {
	clock := manualclock.New()
	s, srv := newTestRedisStore(t, clock)
	c := srv.Client(t)
	ctx := context.Background()
	tb := engine.Limit{Algorithm: engine.TokenBucket, Rate: 1, Burst: 10}
	fw := engine.Limit{Algorithm: engine.FixedWindow, Count: 10, Window: time.Minute}
	storetest.MustCheck(t, s, storetest.One("x", "p", tb, 7))
	key := s.Key("x", "p")
	good, err := c.Get(ctx, key).Bytes()
	if err != nil {
		t.Fatal(err)
	}
	// The format before 12-byte states: struct '<Bdd', 3 tokens at now.
	old := binary.LittleEndian.AppendUint64([]byte{1}, math.Float64bits(3))
	old = binary.LittleEndian.AppendUint64(old, math.Float64bits(float64(clock.Now().UnixMicro())))
	for _, tt := range []struct {
		name  string
		value []byte
		l     engine.Limit
	}{
		{"another algorithm", good, fw},
		{"too long", append(append([]byte(nil), good...), 0), tb},
		{"too short", good[:11], tb},
		{"old format", old, tb},
	} {
		if err := c.Set(ctx, key, tt.value, 0).Err(); err != nil {
			t.Fatal(err)
		}
		d := storetest.MustCheck(t, s, storetest.One("x", "p", tt.l, 0))
		if want := int64(10); d.Results[0].Remaining != want {
			t.Errorf("%s: remaining %d, want %d as for a subject never seen", tt.name, d.Results[0].Remaining, want)
		}
	}
}

// redisStateValue is st as redis.lua stores it for alg (see its header).
func redisStateValue(alg engine.Algorithm, st engine.State) []byte {
	t := uint64(st.T)
	if alg == engine.SlidingWindowLog {
		t = 0
	}
	hi := t>>32 + uint64(alg)<<21
	v := binary.LittleEndian.AppendUint32(nil, uint32(t))
	v = append(v, byte(hi), byte(hi>>8), byte(hi>>16))
	q5 := func(x float64) []byte { return binary.LittleEndian.AppendUint64(nil, math.Float64bits(x))[3:] }
	i5 := func(x float64) []byte { return binary.LittleEndian.AppendUint64(nil, uint64(x))[:5] }
	switch alg {
	case engine.SlidingWindowLog:
		for _, ts := range st.Log {
			v = binary.LittleEndian.AppendUint64(v, math.Float64bits(float64(ts)))
		}
	case engine.SlidingWindowCounter:
		v = append(append(v, i5(st.A)...), i5(st.B)...)
	case engine.FixedWindow:
		v = append(v, i5(st.A)...)
	default:
		v = append(v, q5(st.A)...)
	}
	return v
}

// TestRedisDecidesFromStoredState writes states in redis.lua's format, has
// the script decide from them, and requires Decide's result and Decide's
// next state, byte for byte: the script reads and writes the format as Go
// describes it, and rounds as Go does where the random conformance test
// rarely looks: at a limit that is not a 29-bit number, and at window
// counts above 2^29, kept exactly.
func TestRedisDecidesFromStoredState(t *testing.T) {
	clock := manualclock.New()
	s, srv := newTestRedisStore(t, clock)
	c := srv.Client(t)
	ctx := context.Background()
	now := clock.Now()
	us := now.UnixMicro()
	hour := time.Hour.Microseconds()
	offGrid := quant.Down(10-1.0/3) + 0x1p-25*0.75 // between two 29-bit numbers
	tests := []struct {
		name string
		l    engine.Limit
		st   engine.State
		cost int64
	}{
		{"leaky bucket filled to an off-grid burst", engine.Limit{Algorithm: engine.LeakyBucket, Rate: 1, Burst: offGrid},
			engine.State{A: quant.Down(offGrid) + 0x1p-26 - 5, T: us}, 5},
		{"leaky bucket draining", engine.Limit{Algorithm: engine.LeakyBucket, Rate: 3, Burst: 10}, engine.State{A: 7.25, T: us - 1234567}, 2},
		{"token bucket refilling", engine.Limit{Algorithm: engine.TokenBucket, Rate: 1.0 / 3, Burst: 10}, engine.State{A: quant.Down(0.1), T: us - 7654321}, 1},
		{"fixed window above 2^29", engine.Limit{Algorithm: engine.FixedWindow, Count: 1e12, Window: time.Hour}, engine.State{A: 1<<29 + 2, T: us - us%hour}, 1},
		{"fixed window near 2^40", engine.Limit{Algorithm: engine.FixedWindow, Count: 1e12, Window: time.Hour}, engine.State{A: 1e12 - 2, T: us - us%hour}, 1},
		{"sliding window counter", engine.Limit{Algorithm: engine.SlidingWindowCounter, Count: 100.5, Window: time.Hour}, engine.State{A: 10, B: 40, T: us - us%hour}, 3},
		{"sliding window counter above 2^29", engine.Limit{Algorithm: engine.SlidingWindowCounter, Count: 1e12 * 0.7, Window: time.Hour},
			engine.State{A: 1<<30 + 1, B: 1<<31 + 7, T: us - us%hour}, 1},
		{"sliding window counter into the next window", engine.Limit{Algorithm: engine.SlidingWindowCounter, Count: 1e12, Window: time.Hour},
			engine.State{A: 1e12 - 1e9 - 1, B: 1e9 + 3, T: us - us%hour - hour}, 1},
		{"sliding window log", engine.Limit{Algorithm: engine.SlidingWindowLog, Count: 5, Window: time.Hour}, engine.State{Log: []int64{us - hour, us - 5, us - 1}}, 2},
	}
	for i, tt := range tests {
		key := s.Key("stored", fmt.Sprint(i))
		if err := c.Set(ctx, key, redisStateValue(tt.l.Algorithm, tt.st), 0).Err(); err != nil {
			t.Fatal(err)
		}
		want, wr := engine.Decide(now, tt.st, tt.l, tt.cost)
		d := storetest.MustCheck(t, s, storetest.One("stored", fmt.Sprint(i), tt.l, tt.cost))
		if d.Results[0] != wr || !wr.Allowed {
			t.Errorf("%s: redis decided %+v, engine.Decide %+v; want them equal, allowed", tt.name, d.Results[0], wr)
		}
		got, err := c.Get(ctx, key).Bytes()
		if err != nil {
			t.Fatal(err)
		}
		if wv := redisStateValue(tt.l.Algorithm, want); !bytes.Equal(got, wv) {
			t.Errorf("%s: redis stored %x, want %x (engine.Decide's state %+v)", tt.name, got, wv, want)
		}
		if tt.l.Algorithm == engine.LeakyBucket && tt.l.Burst == offGrid {
			if d := storetest.MustCheck(t, s, storetest.One("stored", fmt.Sprint(i), tt.l, 0)); !d.Allowed {
				t.Errorf("%s: a cost-0 check just after = %+v, want allowed", tt.name, d.Results[0])
			}
		}
	}
}

// TestRedisQuantisersAgree runs redis.lua's own q29, q29pack and q29unpack
// on the edge values and requires the very doubles quantDown and quantUp
// give, and that the 5 bytes stored hold them exactly.
func TestRedisQuantisersAgree(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	script := luaFunction(t, "q29") + luaFunction(t, "q29pack") + luaFunction(t, "q29unpack") + `
local out = {}
for i = 1, #ARGV do
  local x = struct.unpack('<d', ARGV[i])
  for _, q in ipairs({q29(x, math.floor), q29(x, math.ceil)}) do
    out[#out + 1] = struct.pack('<d', q)
    out[#out + 1] = struct.pack('<d', q29unpack(q29pack(q), 1))
  end
end
return out
`
	args := make([]any, len(quant.Edges))
	for i, x := range quant.Edges {
		args[i] = binary.LittleEndian.AppendUint64(nil, math.Float64bits(x))
	}
	v, err := c.Eval(context.Background(), script, nil, args...).StringSlice()
	if err != nil {
		t.Fatal(err)
	}
	if len(v) != 4*len(quant.Edges) {
		t.Fatalf("script returned %d values, want %d", len(v), 4*len(quant.Edges))
	}
	lua := func(i int) uint64 { return binary.LittleEndian.Uint64([]byte(v[i])) }
	for i, x := range quant.Edges {
		for j, q := range []struct {
			name string
			got  float64
		}{{"down", quant.Down(x)}, {"up", quant.Up(x)}} {
			want := math.Float64bits(q.got)
			computed, stored := lua(4*i+2*j), lua(4*i+2*j+1)
			if math.IsNaN(x) {
				if !math.IsNaN(math.Float64frombits(computed)) || !math.IsNaN(math.Float64frombits(stored)) {
					t.Errorf("q29(NaN) %s in Lua = %#016x, stored %#016x; want NaN", q.name, computed, stored)
				}
				continue
			}
			if computed != want || stored != want {
				t.Errorf("q29(%v) %s in Lua = %#016x, stored %#016x; quant%s in Go = %#016x", x, q.name, computed, stored, q.name, want)
			}
		}
	}
}

// TestRedisStoredCountAgrees runs redis.lua's own stored_count on the edge
// values, and packs and unpacks the result as '<I5', and requires the
// very doubles storedCount gives.
func TestRedisStoredCountAgrees(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	script := luaLocal(t, "MAX_COUNT") + luaFunction(t, "stored_count") + `
local out = {}
for i = 1, #ARGV do
  local n = stored_count(struct.unpack('<d', ARGV[i]))
  local s = struct.pack('<I5', n)
  out[#out + 1] = struct.pack('<d', n)
  out[#out + 1] = struct.pack('<d', (struct.unpack('<I5', s)))
  out[#out + 1] = s
end
return out
`
	args := make([]any, len(quant.CountEdges))
	for i, tt := range quant.CountEdges {
		args[i] = binary.LittleEndian.AppendUint64(nil, math.Float64bits(tt.X))
	}
	v, err := c.Eval(context.Background(), script, nil, args...).StringSlice()
	if err != nil {
		t.Fatal(err)
	}
	if len(v) != 3*len(quant.CountEdges) {
		t.Fatalf("script returned %d values, want %d", len(v), 3*len(quant.CountEdges))
	}
	for i, tt := range quant.CountEdges {
		want := math.Float64bits(quant.StoredCount(tt.X))
		computed := binary.LittleEndian.Uint64([]byte(v[3*i]))
		stored := binary.LittleEndian.Uint64([]byte(v[3*i+1]))
		packed := []byte(v[3*i+2])
		wantPacked := binary.LittleEndian.AppendUint64(nil, uint64(quant.StoredCount(tt.X)))[:5]
		if computed != want || stored != want || !bytes.Equal(packed, wantPacked) {
			t.Errorf("stored_count(%v) in Lua = %v, packed %x, read back %v; storedCount in Go = %v, packed %x",
				tt.X, math.Float64frombits(computed), packed, math.Float64frombits(stored), math.Float64frombits(want), wantPacked)
		}
	}
}

// luaLocal returns redis.lua's line defining the local variable name.
func luaLocal(t *testing.T, name string) string {
	t.Helper()
	i := strings.Index(redisScript, "\nlocal "+name+" = ")
	if i < 0 {
		t.Fatalf("redis.lua has no local %s", name)
	}
	n := strings.Index(redisScript[i+1:], "\n")
	return redisScript[i : i+1+n+1]
}

// luaFunction returns the text of redis.lua's local function name.
func luaFunction(t *testing.T, name string) string {
	t.Helper()
	i := strings.Index(redisScript, "\nlocal function "+name+"(")
	if i < 0 {
		t.Fatalf("redis.lua has no local function %s", name)
	}
	n := strings.Index(redisScript[i:], "\nend\n")
	if n < 0 {
		t.Fatalf("redis.lua's function %s has no end", name)
	}
	return redisScript[i : i+n+5]
}

// redisBytesPerSubject averages MEMORY USAGE over the keys of subjects
// subject(0) ... subject(n-1) under policy.
func redisBytesPerSubject(ctx context.Context, c redis.Cmdable, s *Store, n int, subject func(int) string, policy string) (float64, error) {
	var total int64
	for i := range n {
		key := s.Key(subject(i), policy)
		v, err := c.MemoryUsage(ctx, key, 0).Result()
		if err != nil {
			return 0, err
		}
		total += v
	}
	return float64(total) / float64(n), nil
}

// TestRedisReloadsScript shows that the store recovers when Redis loses
// its script cache, as it does on restart and failover.
func TestRedisReloadsScript(t *testing.T) {
	s, srv := newTestRedisStore(t, manualclock.New())
	c := srv.Client(t)
	ctx := context.Background()
	l := engine.Limit{Algorithm: engine.FixedWindow, Count: 3, Window: time.Minute}
	for i := range 4 {
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		d := storetest.MustCheck(t, s, storetest.One("flush", "p", l, 1))
		if d.Allowed != (i < 3) {
			t.Fatalf("check %d after SCRIPT FLUSH: allowed %v, want %v", i, d.Allowed, i < 3)
		}
	}
	ok, err := c.ScriptExists(ctx, s.ScriptSHA()).Result()
	if err != nil || !ok[0] {
		t.Fatalf("SCRIPT EXISTS after a check = %v, %v; want the script cached again", ok, err)
	}
}

// TestRedisTimeout shows that the per-call timeout cuts a call to a server
// that does not answer, instead of waiting for the client's read timeout.
func TestRedisTimeout(t *testing.T) {
	srv := redistest.Start(t)
	c := daemonClient(t, srv)
	s := New(c, Config{Timeout: 20 * time.Millisecond})
	// A paused server on a machine short of CPU looks like one the
	// machine does not run, which the store waits for (cpuPressure): this
	// is the deadline of a machine with CPU to spare.
	s.pressure = nil
	l := engine.Limit{Algorithm: engine.TokenBucket, Rate: 1, Burst: 1}
	// Warm the pool and the script cache. On a loaded machine one call may
	// itself outlast the 20 ms timeout, so warm until a call makes it.
	testwait.For(t, 5*time.Second, "a warm-up check within the timeout", func() bool {
		_, err := s.Check(context.Background(), storetest.One("slow", "p", l, 0))
		return err == nil
	})
	srv.Pause(time.Second)
	start := time.Now()
	_, err := s.Check(context.Background(), storetest.One("slow", "p", l, 1))
	took := time.Since(start)
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Check on a paused server = %v, want a deadline error", err)
	}
	if took > 500*time.Millisecond {
		t.Errorf("Check on a paused server took %v, want about the 20ms timeout", took)
	}
}

// TestRedisCluster runs the store on a three-primary Redis Cluster: the
// keys of a subject's policies share one slot, one script call decides
// them all, and subjects spread over the nodes.
func TestRedisCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	cc := cl.Client(t)
	ctx := context.Background()
	s := New(cc, Config{Timeout: time.Second})
	setVirtualClock(s, manualclock.New())
	policies := []engine.Check{
		{Policy: "second", Limit: engine.Limit{Algorithm: engine.TokenBucket, Rate: 10, Burst: 10}, Cost: 1},
		{Policy: "minute", Limit: engine.Limit{Algorithm: engine.SlidingWindowCounter, Count: 100, Window: time.Minute}, Cost: 1},
		{Policy: "day", Limit: engine.Limit{Algorithm: engine.FixedWindow, Count: 1000, Window: 24 * time.Hour}, Cost: 1},
	}
	var nodeClients []*redis.Client
	for _, node := range cl.Nodes() {
		nodeClients = append(nodeClients, node.Client(t))
	}
	// evalCalls sums the script calls that ran, over every node: EVALSHA
	// calls that did not fail (NOSCRIPT fails) plus EVAL calls.
	evalCalls := func(t *testing.T) int64 {
		var n int64
		for _, nc := range nodeClients {
			info, err := nc.Info(ctx, "commandstats").Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, line := range strings.Split(info, "\r\n") {
				name, stats, ok := strings.Cut(line, ":")
				if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval") {
					continue
				}
				for _, kv := range strings.Split(stats, ",") {
					k, v, _ := strings.Cut(kv, "=")
					x, _ := strconv.ParseInt(v, 10, 64)
					switch k {
					case "calls":
						n += x
					case "failed_calls":
						n -= x
					}
				}
			}
		}
		return n
	}
	subjects := []string{"alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi",
		"a{b}c", "{x}", "}{", "user:{42}", "=tricky"}
	nodes := map[string]bool{}
	for _, subject := range subjects {
		t.Run(subject, func(t *testing.T) {
			before := evalCalls(t)
			for i := range 12 {
				d := storetest.MustCheck(t, s, engine.Request{Subject: subject, Checks: policies})
				if d.Allowed != (i < 10) {
					t.Fatalf("check %d: allowed %v, want %v", i, d.Allowed, i < 10)
				}
			}
			if calls := evalCalls(t) - before; calls != 12 {
				t.Errorf("12 checks of 3 policies ran %d script calls over the cluster, want 12 (one per check)", calls)
			}
			slot := int64(-1)
			for _, p := range policies {
				key := s.Key(subject, p.Policy)
				got, err := cc.ClusterKeySlot(ctx, key).Result()
				if err != nil {
					t.Fatal(err)
				}
				if slot >= 0 && got != slot {
					t.Errorf("key %s in slot %d, want %d like the subject's other keys", key, got, slot)
				}
				slot = got
				if n, err := cc.Exists(ctx, key).Result(); err != nil || n != 1 {
					t.Errorf("EXISTS %s = %d, %v; want 1", key, n, err)
				}
			}
		})
		nodes[cl.PrimaryForKey(s.Key(subject, "second")).Addr()] = true
	}
	if len(nodes) < 2 {
		t.Errorf("%d subjects all landed on %d node(s), want them spread", len(subjects), len(nodes))
	}
}

// ExampleRedisStore checks a request against two policies in Redis. It
// needs a live server, so it is compiled but not run.
func ExampleStore() {
	client, err := NewClient("redis://127.0.0.1:6379")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()
	store := New(client, Config{Timeout: 5 * time.Millisecond})
	d, err := store.Check(context.Background(), engine.Request{Subject: "user:42", Checks: []engine.Check{
		{Policy: "per-second", Limit: engine.Limit{Algorithm: engine.TokenBucket, Rate: 10, Burst: 20}, Cost: 1},
		{Policy: "daily", Limit: engine.Limit{Algorithm: engine.FixedWindow, Count: 10000, Window: 24 * time.Hour}, Cost: 1},
	}})
	if err != nil {
		// Redis is down or slow: the caller decides whether to fail open.
		fmt.Println("no decision:", err)
		return
	}
	if !d.Allowed {
		fmt.Println("rejected; retry after", d.RetryAfter())
		return
	}
	for i, r := range d.Policies() {
		fmt.Printf("policy %d: %d of %d left\n", i, r.Remaining, r.Limit)
	}
}

// Warm leaves the script loaded and a connection open, and writes no
// state; on a server that does not answer it
// fails, naming what it could not do.
func TestRedisWarm(t *testing.T) {
	srv := redistest.Start(t)
	c := daemonClient(t, srv)
	s := New(c, Config{Timeout: time.Second})
	ctx := context.Background()
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Warm(ctx); err != nil {
		t.Fatalf("Warm: %v", err)
	}
	if ok, err := c.ScriptExists(ctx, s.ScriptSHA()).Result(); err != nil || !ok[0] {
		t.Errorf("after Warm, SCRIPT EXISTS = %v %v, want true", ok, err)
	}
	if n, err := c.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Errorf("after Warm, %d keys (%v), want none", n, err)
	}
	if st := c.PoolStats(); st.TotalConns < 1 {
		t.Errorf("after Warm, %d connections in the pool, want one open", st.TotalConns)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	dead, err := NewClient("redis://" + addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dead.Close() })
	err = New(dead, Config{Timeout: time.Second}).Warm(ctx)
	if err == nil || !strings.Contains(err.Error(), "loading the check script") {
		t.Errorf("Warm on a closed port = %v, want an error loading the check script", err)
	}
}
