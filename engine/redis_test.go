package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/internal/redistest"
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
func newTestRedisStore(t testing.TB, clock Clock) (*RedisStore, *redistest.Server) {
	t.Helper()
	srv := redistest.Start(t)
	s := NewRedisStore(srv.Client(t), RedisConfig{Timeout: time.Second})
	setVirtualClock(s, clock)
	return s, srv
}

// setVirtualClock makes s read time from clock instead of Redis' TIME.
func setVirtualClock(s *RedisStore, clock Clock) {
	if clock != nil {
		s.clock, s.ttlPad = clock, virtualTTLPad
	}
}

// The Redis store runs every store-independent test in store_test.go.
func init() {
	storeCases = append(storeCases, storeCase{"redis", func(t *testing.T, clock Clock) checker {
		s, _ := newTestRedisStore(t, clock)
		return s
	}})
}

func TestRedisKey(t *testing.T) {
	s := NewRedisStore(nil, RedisConfig{})
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
	if err := (RedisConfig{Prefix: "a{b}:"}).Validate(); err == nil {
		t.Error("Validate(prefix with braces) = nil, want an error")
	}
	s := NewRedisStore(nil, RedisConfig{Prefix: "{x}"})
	if _, err := s.Check(context.Background(), one("a", "p", Limit{Algorithm: TokenBucket, Rate: 1, Burst: 1}, 1)); err == nil {
		t.Error("Check on a store with a braced prefix = nil error, want one")
	}
}

func TestNewRedisClient(t *testing.T) {
	c, err := NewRedisClient("redis://127.0.0.1:6379/2")
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
	c, err = NewRedisClient("redis-cluster://u:pw@127.0.0.1:7000,127.0.0.1:7001")
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
		if _, err := NewRedisClient(bad); err == nil {
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
	req := Request{Subject: "idle", Checks: []Check{
		{Policy: "tb", Limit: Limit{Algorithm: TokenBucket, Rate: 1000, Burst: 10}, Cost: 10},
		{Policy: "fw", Limit: Limit{Algorithm: FixedWindow, Count: 5, Window: 100 * time.Millisecond}, Cost: 1},
		{Policy: "log", Limit: Limit{Algorithm: SlidingWindowLog, Count: 5, Window: 50 * time.Millisecond}, Cost: 2},
		{Policy: "swc", Limit: Limit{Algorithm: SlidingWindowCounter, Count: 5, Window: 10 * time.Millisecond}, Cost: 1},
		{Policy: "lb", Limit: Limit{Algorithm: LeakyBucket, Rate: 100, Burst: 10}, Cost: 1},
		{Policy: "peek", Limit: Limit{Algorithm: TokenBucket, Rate: 1, Burst: 10}, Cost: 0},
	}}
	if d := mustCheck(t, s, req); !d.Allowed {
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

// TestRedisStateIsCompact holds a token bucket subject near the 100 bytes
// the issue allows, as Redis' MEMORY USAGE counts them. The state itself is
// 17 bytes; the rest is Redis' own per-key cost (dict entry, object header,
// key) rounded up to jemalloc size classes, so the figure moves in steps
// of 16 with the key's length: 88 bytes up to 14 bytes of key, 104 up to
// 30.
func TestRedisStateIsCompact(t *testing.T) {
	s, srv := newTestRedisStore(t, nil)
	c := srv.Client(t)
	ctx := context.Background()
	l := Limit{Algorithm: TokenBucket, Rate: 10, Burst: 100}
	for _, tt := range []struct {
		subject, policy string
		most            float64
	}{
		{"s%d", "p", 88},        // rl:{s123456}:p, 14 bytes
		{"user:%d", "api", 104}, // rl:{user:123456}:api, 20 bytes
	} {
		subject := func(i int) string { return fmt.Sprintf(tt.subject, 100000+i) }
		for i := range 1000 {
			mustCheck(t, s, one(subject(i), tt.policy, l, 1))
		}
		per, err := redisBytesPerSubject(ctx, c, s, 1000, subject, tt.policy)
		if err != nil {
			t.Fatal(err)
		}
		key := s.Key(subject(0), tt.policy)
		if n, err := c.StrLen(ctx, key).Result(); err != nil || n != 17 {
			t.Errorf("STRLEN %s = %d, %v; want 17 (algorithm byte, two doubles)", key, n, err)
		}
		t.Logf("MEMORY USAGE: %.1f bytes per token bucket subject with %d-byte keys like %s", per, len(key), key)
		if per > tt.most {
			t.Errorf("MEMORY USAGE with keys like %s = %.1f bytes per subject, want at most %v", key, per, tt.most)
		}
	}
}

// TestRedisQuantisersAgree runs redis.lua's own q29 on the edge values and
// requires the very doubles quantDown and quantUp give.
func TestRedisQuantisersAgree(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	script := luaFunction(t, "q29") + `
local out = {}
for i = 1, #ARGV do
  local x = struct.unpack('<d', ARGV[i])
  for _, q in ipairs({q29(x, math.floor), q29(x, math.ceil)}) do
    out[#out + 1] = struct.pack('<d', q)
  end
end
return out
`
	args := make([]any, len(quantEdges))
	for i, x := range quantEdges {
		args[i] = binary.LittleEndian.AppendUint64(nil, math.Float64bits(x))
	}
	v, err := c.Eval(context.Background(), script, nil, args...).StringSlice()
	if err != nil {
		t.Fatal(err)
	}
	if len(v) != 2*len(quantEdges) {
		t.Fatalf("script returned %d values, want %d", len(v), 2*len(quantEdges))
	}
	lua := func(i int) uint64 { return binary.LittleEndian.Uint64([]byte(v[i])) }
	for i, x := range quantEdges {
		for j, q := range []struct {
			name string
			got  float64
		}{{"down", quantDown(x)}, {"up", quantUp(x)}} {
			want := math.Float64bits(q.got)
			computed := lua(2*i + j)
			if math.IsNaN(x) {
				if !math.IsNaN(math.Float64frombits(computed)) {
					t.Errorf("q29(NaN) %s in Lua = %#016x, want NaN", q.name, computed)
				}
				continue
			}
			if computed != want {
				t.Errorf("q29(%v) %s in Lua = %#016x; quant%s in Go = %#016x", x, q.name, computed, q.name, want)
			}
		}
	}
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
func redisBytesPerSubject(ctx context.Context, c redis.Cmdable, s *RedisStore, n int, subject func(int) string, policy string) (float64, error) {
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
	s, srv := newTestRedisStore(t, newManualClock())
	c := srv.Client(t)
	ctx := context.Background()
	l := Limit{Algorithm: FixedWindow, Count: 3, Window: time.Minute}
	for i := range 4 {
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		d := mustCheck(t, s, one("flush", "p", l, 1))
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
	c, err := NewRedisClient("redis://" + srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	s := NewRedisStore(c, RedisConfig{Timeout: 20 * time.Millisecond})
	l := Limit{Algorithm: TokenBucket, Rate: 1, Burst: 1}
	mustCheck(t, s, one("slow", "p", l, 0)) // warm the pool and the script cache
	srv.Pause(time.Second)
	start := time.Now()
	_, err = s.Check(context.Background(), one("slow", "p", l, 1))
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
	s := NewRedisStore(cc, RedisConfig{Timeout: time.Second})
	setVirtualClock(s, newManualClock())
	policies := []Check{
		{Policy: "second", Limit: Limit{Algorithm: TokenBucket, Rate: 10, Burst: 10}, Cost: 1},
		{Policy: "minute", Limit: Limit{Algorithm: SlidingWindowCounter, Count: 100, Window: time.Minute}, Cost: 1},
		{Policy: "day", Limit: Limit{Algorithm: FixedWindow, Count: 1000, Window: 24 * time.Hour}, Cost: 1},
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
				d := mustCheck(t, s, Request{Subject: subject, Checks: policies})
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
func ExampleRedisStore() {
	client, err := NewRedisClient("redis://127.0.0.1:6379")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()
	store := NewRedisStore(client, RedisConfig{Timeout: 5 * time.Millisecond})
	d, err := store.Check(context.Background(), Request{Subject: "user:42", Checks: []Check{
		{Policy: "per-second", Limit: Limit{Algorithm: TokenBucket, Rate: 10, Burst: 20}, Cost: 1},
		{Policy: "daily", Limit: Limit{Algorithm: FixedWindow, Count: 10000, Window: 24 * time.Hour}, Cost: 1},
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
