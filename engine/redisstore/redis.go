// Package redisstore keeps the engine's state in Redis (a single server,
// a Cluster or a Sentinel-managed primary): one Lua script decides a
// check's policies atomically, and checks bound for the same primary are
// pipelined. It decides exactly as engine.MemoryStore does.
package redisstore

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluice-rl/sluice/engine"
)

// redisScript decides every policy of one subject in one atomic call. It
// mirrors algorithm.go operation for operation; see its header.
//
//go:embed redis.lua
var redisScript string

// clusterScript is redisScript flagged to touch keys of several slots, as
// the merged call of a batch does on a Cluster node (pipeline.go). Redis
// requires 7.0 or later for the flag; a server that refuses it gets one
// call per check instead.
var clusterScript = "#!lua flags=allow-cross-slot-keys\n" + redisScript

// Scripter is the part of a go-redis client the Redis store uses. Both
// *redis.Client and *redis.ClusterClient satisfy it; a cluster client
// routes each call by the slot of its first key, which every key of the
// call shares, and splits a pipeline by primary.
type Scripter interface {
	EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd
	Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd
	Process(ctx context.Context, cmd redis.Cmder) error
	Pipeline() redis.Pipeliner
}

// Config configures a Store.
type Config struct {
	// Timeout bounds each call to Redis, from sending the script to reading
	// its reply: Redis's round trip, not the time a check waits in the
	// store's queue for its turn. Zero means DefaultTimeout. The client
	// must have ContextTimeoutEnabled (NewClient sets it), or a stalled
	// server holds the caller for the client's ReadTimeout instead.
	Timeout time.Duration
	// QueueWait bounds how long a check may wait in the store's queue for
	// a primary before it is sent; one that waits longer fails with
	// ErrStoreBusy, which the Limiter does not count as a store failure,
	// unless the daemon has goroutines waiting to run or the machine is
	// short of CPU: the wait is then the machine's, and the check is sent,
	// up to ten times the bound (twenty on a machine short of CPU).
	// Zero means 10 x Timeout, at least DefaultRedisQueueWait. It is
	// larger than Timeout on purpose: under a burst the daemon should slow
	// down, not give up on Redis.
	QueueWait time.Duration
	// Pipelines bounds the batches in flight to one primary at once, each
	// on its own connection, so that one slow batch does not stall the
	// others. Zero means DefaultRedisPipelines.
	Pipelines int
	// MaxBatch bounds the checks written to one primary in one round trip.
	// Zero means DefaultRedisMaxBatch.
	MaxBatch int
	// Prefix starts every key. Zero means "rl:". It must not contain a
	// brace, which would move the hash tag off the subject.
	Prefix string
}

// DefaultTimeout is the per-call timeout of a Store: a rate
// limiter in front of a request must answer in a few milliseconds or not
// at all.
const DefaultTimeout = 5 * time.Millisecond

// Defaults of the Redis store's queue per primary. Two batches of up to
// 64 checks in flight keep a Redis server busy (it runs one script at a
// time: one batch runs while the next is written or its replies read)
// while the checks of a burst share round trips. More batches in flight
// only make each smaller: with 64 concurrent callers, two batches instead
// of four spend about 15% less of the daemon's CPU and 5% less of Redis's
// per check (BenchmarkRedisCheck), for the same throughput.
const (
	DefaultRedisQueueWait = 50 * time.Millisecond
	DefaultRedisPipelines = 2
	DefaultRedisMaxBatch  = 64
)

// Validate reports a configuration the store cannot use.
func (c Config) Validate() error {
	if c.Timeout < 0 {
		return fmt.Errorf("redis timeout must not be negative, got %v", c.Timeout)
	}
	if c.QueueWait < 0 {
		return fmt.Errorf("redis queue wait must not be negative, got %v", c.QueueWait)
	}
	if c.Pipelines < 0 || c.MaxBatch < 0 {
		return fmt.Errorf("redis pipelines (%d) and batch size (%d) must not be negative", c.Pipelines, c.MaxBatch)
	}
	if strings.ContainsAny(c.Prefix, "{}") {
		return fmt.Errorf("redis key prefix %q must not contain a brace: the hash tag must name the subject", c.Prefix)
	}
	return nil
}

// Store keeps limiter state in Redis or Redis Cluster, so that every
// gateway shares it. It decides exactly as the MemoryStore does: a Lua
// script reads, decides and writes every policy of a check's subject
// atomically, on Redis' clock (TIME), so gateway clock skew cannot mint
// tokens. One call may decide several checks, each on its own.
//
// A policy's state lives at Prefix + "{" + subject + "}:" + policy. The
// braces make the subject the hash tag, so all of a subject's policies
// share one cluster slot and one script call may touch them all. A subject
// that contains a brace or starts with "=" is written as "=" followed by
// its unpadded base64url encoding, so the tag is always the whole subject.
// Each state is a string of 12 bytes (buckets, fixed window), 17 (sliding
// window counter) or 7 + 8 per timestamp (sliding window log), laid out as
// redis.lua's header describes, with a TTL of the time the state still
// matters plus a second. A token bucket subject with a 20-byte key costs
// 88 bytes of Redis memory.
//
// Concurrent checks bound for one primary are pipelined: see pipeline.go.
type Store struct {
	c         Scripter
	timeout   time.Duration
	queueWait time.Duration
	pipelines int
	maxBatch  int
	gatherCap time.Duration // maxGatherWindow; a test that must not race the window lengthens it
	prefix    string
	cfgErr    error
	sha       string
	// merge writes a batch as one script call of all its checks, on a
	// single server. On a Cluster, while crossSlot holds, a batch goes as
	// one call of clusterScript to the primary of its lane (pipeline.go);
	// crossSlot is cleared if a node refuses that script.
	merge      bool
	cluster    bool
	crossSlot  atomic.Bool
	clusterSHA string
	lanes      sync.Map // shard name -> *lane
	// unread holds the client's connections, so that the deadline watch
	// sees a reply that arrived but was not read yet; nil for a client it
	// cannot hook.
	unread *unreadConns
	// pressure tells the deadline watch whether the machine's CPUs were
	// short, so that a reply late for want of CPU fails no check.
	pressure *cpuPressure
	// clock, set only by tests, replaces Redis' TIME with virtual time so
	// that the Redis store runs on the same clock as the memory store.
	clock engine.Clock
	// ttlPad, set only by tests together with clock, lengthens every TTL:
	// Redis expires keys on real time, which virtual time does not follow.
	// Keeping a state past its TTL changes no decision.
	ttlPad int64
}

// New returns a store that keeps its state through c. A config
// that fails Validate makes every Check fail with that error.
func New(c Scripter, cfg Config) *Store {
	s := &Store{c: c, timeout: cfg.Timeout, queueWait: cfg.QueueWait, pipelines: cfg.Pipelines, gatherCap: maxGatherWindow,
		maxBatch: cfg.MaxBatch, prefix: cfg.Prefix, cfgErr: cfg.Validate(), pressure: newCPUPressure()}
	_, s.cluster = c.(masterForKeyer)
	if u := newUnreadConns(); u.hookConns(c) {
		s.unread = u
	}
	s.merge = !s.cluster
	s.crossSlot.Store(s.cluster)
	if s.timeout <= 0 {
		s.timeout = DefaultTimeout
	}
	if s.queueWait <= 0 {
		s.queueWait = max(DefaultRedisQueueWait, 10*s.timeout)
	}
	if s.pipelines <= 0 {
		s.pipelines = DefaultRedisPipelines
	}
	if s.maxBatch <= 0 {
		s.maxBatch = DefaultRedisMaxBatch
	}
	if s.prefix == "" {
		s.prefix = "rl:"
	}
	sum := sha1.Sum([]byte(redisScript))
	s.sha = hex.EncodeToString(sum[:])
	sum = sha1.Sum([]byte(clusterScript))
	s.clusterSHA = hex.EncodeToString(sum[:])
	return s
}

// Warm loads the script on the server (on a Cluster, go-redis loads it on
// every primary) and sends a few checks through a lane, so that the first
// checks after a start pay neither the dial, nor the script's compile and
// first run, nor the lane's start inside their deadline: on a busy machine
// those alone outlast the 5 ms default and turn the first checks into
// fallback decisions. A client that cannot load scripts (a test double)
// has nothing to warm.
func (s *Store) Warm(ctx context.Context) error {
	l, ok := s.c.(interface {
		ScriptLoad(ctx context.Context, script string) *redis.StringCmd
	})
	if !ok {
		return nil
	}
	sha, err := l.ScriptLoad(ctx, redisScript).Result()
	if err != nil {
		return fmt.Errorf("loading the check script: %w", err)
	}
	if sha != s.sha {
		return fmt.Errorf("loading the check script: the server named it %s, want %s", sha, s.sha)
	}
	if s.cluster {
		// A server that refuses the flag is not an error: crossSlot is
		// cleared at the first batch it refuses.
		_ = l.ScriptLoad(ctx, clusterScript).Err()
	}
	// A zero cost only reads: no state is written. A server's first runs
	// of the script are several times slower than the rest (measured: 7,
	// 2.6 and 1.4 ms, then 0.3), so a few, each allowed a second.
	req := engine.Request{Subject: "sluice:warm", Checks: []engine.Check{{Policy: "warm", Limit: engine.Limit{Algorithm: engine.TokenBucket, Rate: 1, Burst: 1}}}}
	for range 4 {
		if _, err := s.CheckWithin(ctx, req, time.Second); err != nil {
			return fmt.Errorf("a first check: %w", err)
		}
	}
	return nil
}

// ScriptSHA is the SHA-1 of the store's script, as EVALSHA names it.
func (s *Store) ScriptSHA() string { return s.sha }

// Key returns the Redis key that holds subject's state for policy.
func (s *Store) Key(subject, policy string) string {
	return s.prefix + "{" + redisSubject(subject) + "}:" + policy
}

// resetScript deletes a subject's keys: one call, atomic, and routed by
// the keys' shared hash tag on Redis Cluster.
const resetScript = "return redis.call('DEL', unpack(KEYS))"

// Reset forgets subject's state under each of policies: its next check
// finds a full bucket or empty windows, as for a subject never seen.
func (s *Store) Reset(ctx context.Context, subject string, policies []string) error {
	if subject == "" {
		return fmt.Errorf("%w: empty subject", engine.ErrBadRequest)
	}
	if len(policies) == 0 {
		return nil
	}
	keys := make([]string, len(policies))
	for i, p := range policies {
		keys[i] = s.Key(subject, p)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.c.Eval(ctx, resetScript, keys).Err(); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("redis reset: %w", err)
	}
	return nil
}

// redisSubject makes a subject safe to use as a hash tag: unchanged unless
// it contains a brace or starts with "=", the mark of an encoded subject.
func redisSubject(subject string) string {
	if !strings.ContainsAny(subject, "{}") && !strings.HasPrefix(subject, "=") {
		return subject
	}
	return "=" + base64.RawURLEncoding.EncodeToString([]byte(subject))
}

// Check decides a request: all of its policies or none, in one call to
// Redis bounded by the configured timeout. An error means the store could
// not decide (Redis down, slow or refusing, or the store's queue full past
// QueueWait: ErrStoreBusy), never that the request was denied; the
// Decision is then empty.
func (s *Store) Check(ctx context.Context, req engine.Request) (engine.Decision, error) {
	return s.CheckWithin(ctx, req, s.timeout)
}

// CheckWithin is Check with roundTrip in place of the configured Timeout:
// the deadline of Redis's round trip, counted from the moment the check is
// sent, after any wait in the store's queue.
func (s *Store) CheckWithin(ctx context.Context, req engine.Request, roundTrip time.Duration) (engine.Decision, error) {
	if err := req.Validate(); err != nil {
		return engine.Decision{Decider: -1}, err
	}
	if s.cfgErr != nil {
		return engine.Decision{Decider: -1}, s.cfgErr
	}
	if s.cluster && req.Spans() {
		return engine.Decision{Decider: -1}, errSpansCluster
	}
	var d engine.Decision
	d.N = len(req.Checks)
	if d.N == 0 {
		d.Finish(req.Checks)
		return d, nil
	}
	if roundTrip <= 0 {
		roundTrip = s.timeout
	}
	p := s.newQueuedCheck(req, roundTrip)
	v, err := s.roundTrip(ctx, req.Subject, p)
	if err != nil {
		return engine.Decision{Decider: -1}, checkErr(req.Subject, err)
	}
	return scriptDecision(req, v)
}

// errSpansCluster refuses a request whose checks name other subjects
// (engine.Check.Subject) on a Cluster: their keys may lie in other slots,
// which one script call cannot reach.
var errSpansCluster = fmt.Errorf("%w: on a Redis Cluster a request's checks are of its own subject (one call reaches one slot)", engine.ErrBadRequest)

// scriptDecision reads the script's five integers per policy of req.
func scriptDecision(req engine.Request, v []int64) (engine.Decision, error) {
	var d engine.Decision
	d.N = len(req.Checks)
	if len(v) != 5*d.N {
		return engine.Decision{Decider: -1}, checkErr(req.Subject, fmt.Errorf("script returned %d values, want %d", len(v), 5*d.N))
	}
	for i := range d.N {
		r := &d.Results[i]
		r.Allowed = v[5*i] == 1
		r.Limit = v[5*i+1]
		r.Remaining = v[5*i+2]
		r.ResetAfter = time.Duration(v[5*i+3]) * time.Microsecond
		r.RetryAfter = time.Duration(v[5*i+4]) * time.Microsecond
	}
	d.Finish(req.Checks)
	return d, nil
}

// newQueuedCheck builds req's script call: EVALSHA with its keys and
// arguments, as redis.lua's header lays them out for a call of one check.
// For a single policy, the common case, the command and the values it
// names live in the queue entry, one allocation: the values go in as
// pointers into it, which an interface holds without boxing them apart
// (go-redis writes a pointer's value as it writes the value).
func (s *Store) newQueuedCheck(req engine.Request, roundTrip time.Duration) *queuedCheck {
	n := len(req.Checks)
	p := &queuedCheck{keys: n, roundTrip: roundTrip, queuedAt: time.Now(), done: make(chan answer, 1)}
	subject := redisSubject(req.Subject)
	now, pad := any(""), any("0")
	if s.clock != nil {
		now, pad = strconv.FormatInt(s.clock.Now().UnixMicro(), 10), strconv.FormatInt(s.ttlPad, 10)
	}
	// numkeys is a string, which go-redis reads back as it is to route
	// the command on a cluster.
	if n == 1 {
		c := &req.Checks[0]
		l := c.Effective()
		a := &p.one
		if c.Subject != "" {
			subject = redisSubject(c.Subject)
		}
		a.key = s.prefix + "{" + subject + "}:" + c.Policy
		a.alg, a.window, a.cost, a.scale = int64(l.Algorithm), l.Window.Microseconds(), c.Units(), c.ScaleFactor()
		a.p1, a.p2 = scriptLimit(&l)
		p.cmd = append(p.cmdBuf[:0], "evalsha", s.sha, "1", &a.key, now, pad, "1", "1",
			&a.alg, &a.p1, &a.p2, &a.window, &a.cost, &a.scale)
		return p
	}
	p.cmd = make([]any, 0, 3+n+4+6*n)
	p.cmd = append(p.cmd, "evalsha", s.sha, strconv.Itoa(n))
	tag := s.prefix + "{" + subject + "}:"
	for i := range req.Checks {
		c := &req.Checks[i]
		if c.Subject != "" && c.Subject != req.Subject {
			p.cmd = append(p.cmd, s.Key(c.Subject, c.Policy))
			continue
		}
		p.cmd = append(p.cmd, tag+c.Policy)
	}
	p.cmd = append(p.cmd, now, pad, "1", n)
	for i := range req.Checks {
		c := &req.Checks[i]
		l := c.Effective()
		p1, p2 := scriptLimit(&l)
		// go-redis writes numbers itself, into its buffer: a float as
		// its shortest exact decimal, which the script reads back bit for
		// bit. That spares a string per argument.
		p.cmd = append(p.cmd, int(l.Algorithm), p1, p2, l.Window.Microseconds(), c.Units(), c.ScaleFactor())
	}
	return p
}

// scriptLimit is the rate and burst of a bucket, or the count and 0 of a
// window, as the script takes them.
func scriptLimit(l *engine.Limit) (p1, p2 float64) {
	if l.Algorithm.Windowed() {
		return l.Count, 0
	}
	return l.Rate, l.Burst
}

// stateReloader is the part of *redis.ClusterClient that refreshes its
// slot map.
type stateReloader interface {
	ReloadState(ctx context.Context)
}

// masterForKeyer is the part of *redis.ClusterClient that tells which
// primary serves a key.
type masterForKeyer interface {
	MasterForKey(ctx context.Context, key string) (*redis.Client, error)
}

// Shard names the Redis server that holds subject's state, so that the
// Limiter keeps one circuit breaker per cluster primary: one failed shard
// must not send every subject to the fallback. A single server is one
// shard, "store". It does no I/O: the cluster client knows its slot map.
func (s *Store) Shard(ctx context.Context, subject string) string {
	if m, ok := s.c.(masterForKeyer); ok {
		if c, err := m.MasterForKey(ctx, s.prefix+"{"+redisSubject(subject)+"}:"); err == nil {
			return c.Options().Addr
		}
	}
	return "store"
}

// Logger adapts slog to go-redis's process-wide logger, at debug
// level: go-redis logs every failed dial, which during an outage is one
// line per check. Install it once, in main: redis.SetLogger(Logger{l}).
type Logger struct{ L *slog.Logger }

// Printf implements go-redis's internal logging interface.
func (r Logger) Printf(ctx context.Context, format string, v ...any) {
	r.L.DebugContext(ctx, "go-redis: "+fmt.Sprintf(format, v...))
}
