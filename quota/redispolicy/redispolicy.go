// Package redispolicy keeps a quota.Registry's state in Redis, so that
// every daemon sharing a Redis (or Redis Cluster) enforces the same
// policies, keys and overrides.
//
// The state is one hash: the JSON snapshot and a revision number. A change
// is saved with a compare-and-set on the revision (a Lua script), so two
// daemons changing policies at once cannot lose each other's change: the
// second one fails and its caller retries against the new state. Every
// successful save publishes the new revision on a channel; each daemon's
// Watcher reloads on that message and, as a safety net for lost messages
// and reconnects, on a periodic full refresh. A daemon that cannot reach
// Redis keeps serving the last good set it loaded.
package redispolicy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/quota"
)

// Client is the part of a go-redis client the store uses; *redis.Client,
// *redis.ClusterClient and redis.UniversalClient satisfy it.
type Client interface {
	Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd
	HMGet(ctx context.Context, key string, fields ...string) *redis.SliceCmd
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// Config names the Redis key and channel. The zero value uses the
// defaults.
type Config struct {
	// Key is the hash holding the state; default "{sluice-policies}:state".
	Key string
	// Channel carries change notifications; default "sluice-policies:changed".
	Channel string
	// Timeout bounds each load or save; default 2 s.
	Timeout time.Duration
}

// ErrConcurrentChange means another daemon saved a change since this one
// last loaded the state: reload and retry.
var ErrConcurrentChange = errors.New("the shared policy state changed concurrently; retry")

// Store is a quota.Store in Redis.
type Store struct {
	c   Client
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	applied int64 // revision of the state the registry holds
}

// New returns a Store on c.
func New(c Client, cfg Config, log *slog.Logger) *Store {
	if cfg.Key == "" {
		cfg.Key = "{sluice-policies}:state"
	}
	if cfg.Channel == "" {
		cfg.Channel = "sluice-policies:changed"
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Store{c: c, cfg: cfg, log: log}
}

// Applied is the revision of the state last loaded or saved.
func (s *Store) Applied() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applied
}

func (s *Store) markApplied(rev int64) {
	s.mu.Lock()
	s.applied = max(s.applied, rev)
	s.mu.Unlock()
}

// Load returns the saved snapshot and records its revision as the one the
// caller now holds (quota.Registry.Load restores it).
func (s *Store) Load(ctx context.Context) (quota.Snapshot, error) {
	snap, rev, err := s.Fetch(ctx)
	if err != nil {
		return snap, err
	}
	s.markApplied(rev)
	return snap, nil
}

// Fetch reads the snapshot and its revision without recording anything.
func (s *Store) Fetch(ctx context.Context) (quota.Snapshot, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	vals, err := s.c.HMGet(ctx, s.cfg.Key, "rev", "snapshot").Result()
	if err != nil {
		return quota.Snapshot{}, 0, fmt.Errorf("redis policy store: %w", err)
	}
	if len(vals) != 2 || vals[0] == nil || vals[1] == nil {
		return quota.Snapshot{}, 0, fmt.Errorf("redis policy store %s: %w", s.cfg.Key, quota.ErrNoSnapshot)
	}
	revS, _ := vals[0].(string)
	data, _ := vals[1].(string)
	rev, err := strconv.ParseInt(revS, 10, 64)
	if err != nil || rev < 1 {
		return quota.Snapshot{}, 0, fmt.Errorf("redis policy store %s: corrupt revision %q", s.cfg.Key, revS)
	}
	var snap quota.Snapshot
	dec := json.NewDecoder(bytes.NewReader([]byte(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&snap); err != nil {
		return quota.Snapshot{}, 0, fmt.Errorf("redis policy store %s is corrupt: %w", s.cfg.Key, err)
	}
	return snap, rev, nil
}

// saveScript sets the snapshot only if the revision is the caller's, bumps
// it and publishes the new one. It returns the new revision, or the
// negated current one on a conflict.
const saveScript = `
local cur = tonumber(redis.call('HGET', KEYS[1], 'rev') or '0')
if cur ~= tonumber(ARGV[1]) then return -cur - 1 end
local nxt = cur + 1
redis.call('HSET', KEYS[1], 'rev', nxt, 'snapshot', ARGV[2])
redis.call('PUBLISH', ARGV[3], nxt)
return nxt
`

// Save replaces the state if nobody else changed it since this daemon
// last loaded or saved it; otherwise it returns ErrConcurrentChange.
func (s *Store) Save(ctx context.Context, snap quota.Snapshot) error {
	data, err := json.Marshal(snap)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	expect := s.Applied()
	n, err := s.c.Eval(ctx, saveScript, []string{s.cfg.Key}, expect, data, s.cfg.Channel).Int64()
	if err != nil {
		return fmt.Errorf("redis policy store: %w", err)
	}
	if n < 0 {
		return fmt.Errorf("%w (this daemon holds revision %d, Redis has %d)", ErrConcurrentChange, expect, -n-1)
	}
	s.markApplied(n)
	return nil
}

// restoreScript puts back a state Redis lost: it sets the snapshot at the
// caller's revision only if Redis's is lower (the key gone with a restart
// without persistence, a failover to an empty or stale replica, a flush),
// and publishes it. It returns the revision set, or the negated current
// one if Redis already holds that revision or a later one.
const restoreScript = `
local cur = tonumber(redis.call('HGET', KEYS[1], 'rev') or '0')
local rev = tonumber(ARGV[1])
if cur >= rev then return -cur - 1 end
redis.call('HSET', KEYS[1], 'rev', rev, 'snapshot', ARGV[2])
redis.call('PUBLISH', ARGV[3], rev)
return rev
`

// Restore saves snap, the state of revision rev this daemon holds, if
// Redis holds an earlier revision or none: revisions only grow, so an
// earlier one means Redis lost what it had. It reports whether it saved.
func (s *Store) Restore(ctx context.Context, snap quota.Snapshot, rev int64) (bool, error) {
	data, err := json.Marshal(snap)
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	n, err := s.c.Eval(ctx, restoreScript, []string{s.cfg.Key}, rev, data, s.cfg.Channel).Int64()
	if err != nil {
		return false, fmt.Errorf("redis policy store: %w", err)
	}
	return n > 0, nil
}

// Restorer is what a Watcher applies a loaded state to; *quota.Registry
// is one.
type Restorer interface {
	Restore(quota.Snapshot) error
}

// snapshotter is a Restorer that can also hand back the state it holds,
// which a Watcher puts back into a Redis that lost it; *quota.Registry is
// one.
type snapshotter interface {
	Snapshot() quota.Snapshot
}

// Watcher keeps a Restorer in step with the Store.
type Watcher struct {
	s        *Store
	target   Restorer
	refresh  time.Duration
	log      *slog.Logger
	onResult func(result string, err error)
}

// NewWatcher returns a Watcher that applies changes to target on every
// notification and at least every refresh (default 10 s).
func NewWatcher(s *Store, target Restorer, refresh time.Duration, log *slog.Logger) *Watcher {
	if refresh <= 0 {
		refresh = 10 * time.Second
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Watcher{s: s, target: target, refresh: refresh, log: log, onResult: func(string, error) {}}
}

// SetTarget sets the Restorer; call before Run.
func (w *Watcher) SetTarget(t Restorer) { w.target = t }

// OnResult sets a callback told the result of every reload: "applied",
// "unchanged", "restored" (Redis had lost the state and this daemon put
// its own back) or "error" with the error. It must return at once. Call
// before Run.
func (w *Watcher) OnResult(f func(result string, err error)) { w.onResult = f }

// Run subscribes to change notifications and reloads until ctx ends.
func (w *Watcher) Run(ctx context.Context) error {
	ps := w.s.c.Subscribe(ctx, w.s.cfg.Channel)
	defer ps.Close()
	msgs := ps.Channel()
	t := time.NewTicker(w.refresh)
	defer t.Stop()
	w.Reload(ctx)
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-msgs:
			if !ok {
				msgs = nil
			}
			w.Reload(ctx)
		case <-t.C:
			w.Reload(ctx)
		}
	}
}

// Reload fetches the state and applies it if it is newer than the one held.
// On any error the state held stays in force. A Redis that holds no state
// or an earlier revision than this daemon's has lost it (revisions only
// grow): the daemon puts its own state back, so that changes are not
// refused as concurrent forever and a sibling that seeded the empty Redis
// meanwhile takes the state back from it.
func (w *Watcher) Reload(ctx context.Context) {
	snap, rev, err := w.s.Fetch(ctx)
	if held := w.s.Applied(); held > 0 && (errors.Is(err, quota.ErrNoSnapshot) || err == nil && rev < held) {
		w.restore(ctx, rev, held)
		return
	}
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn("policy refresh failed; keeping the last good set", "err", err)
			w.onResult("error", err)
		}
		return
	}
	if rev <= w.s.Applied() {
		w.onResult("unchanged", nil)
		return
	}
	if err := w.target.Restore(snap); err != nil {
		w.log.Error("shared policy state rejected; keeping the last good set", "rev", rev, "err", err)
		w.onResult("error", err)
		return
	}
	w.s.markApplied(rev)
	w.log.Info("policies updated from the shared store", "rev", rev)
	w.onResult("applied", nil)
}

// restore puts the state of revision held back into Redis, which holds
// revision had (0 for none).
func (w *Watcher) restore(ctx context.Context, had, held int64) {
	t, ok := w.target.(snapshotter)
	if !ok {
		return
	}
	saved, err := w.s.Restore(ctx, t.Snapshot(), held)
	switch {
	case err != nil:
		w.log.Warn("the shared policy state is lost and could not be put back; keeping the last good set", "redis_rev", had, "rev", held, "err", err)
		w.onResult("error", err)
	case saved:
		w.log.Warn("the shared policy state was lost; put back this daemon's", "redis_rev", had, "rev", held)
		w.onResult("restored", nil)
	default:
		// A sibling put it back first: the next reload reads it.
		w.onResult("unchanged", nil)
	}
}
