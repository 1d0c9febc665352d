package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluice-rl/sluice/engine"
)

// The Redis store pipelines: concurrent checks bound for the same primary
// wait in that primary's queue (a lane) and are written to Redis together,
// in one round trip. A lane runs at most Config.Pipelines batches at
// once, each on its own connection; a batch takes whatever is queued when
// the previous one returns, up to Config.MaxBatch checks. Nothing
// waits for a batch to fill: a lone check goes out at once, and under load
// the batches grow by themselves.
//
// On a single server (or a Sentinel's primary) a batch goes as one script
// call that decides its checks one after another: Redis then pays its
// per-call cost (the call's setup, TIME, the script's closures) once per
// batch, and the daemon writes and reads one command. On a Cluster, where
// the checks of a batch lie in many slots, it goes as a pipeline of one
// call per check. Either way each check keeps its own result and its
// atomicity (a Redis error for one check, such as a key of the wrong type,
// fails only that check: the script decides each in a protected call) and
// its own deadline, which starts when its batch is sent: time in the queue
// is the daemon's overload, not Redis's failure, and is bounded
// separately, by the caller's context and by Config.QueueWait
// (engine.ErrStoreBusy).

// queuedCheck states: a queued check may be abandoned (its caller left) or
// taken into a batch; a sent check is answered once, by its reply or by its
// deadline, whichever comes first.
const (
	checkQueued uint32 = iota
	checkSent
	checkDone
)

// queuedCheck is one check in a lane: its script call, its deadline and
// the channel its caller waits on.
type queuedCheck struct {
	// cmd is the whole command of a call of this check alone, EVALSHA sha
	// numkeys keys... now pad 1 n args..., handed to go-redis as it is;
	// for a single policy it lives in cmdBuf and points at one, allocated
	// with the check. keys is n, the number of its keys.
	cmd    []any
	cmdBuf [14]any
	keys   int
	one    struct {
		key               string
		alg, window, cost int64
		p1, p2, scale     float64
	}
	roundTrip time.Duration
	queuedAt  time.Time
	deadline  time.Time // set when sent
	state     atomic.Uint32
	done      chan answer // buffered: finish never blocks
}

// answer is the script's reply, five integers per policy, or an error.
type answer struct {
	v   []int64
	err error
}

// finish answers the check unless it was answered or abandoned already.
func (p *queuedCheck) finish(v []int64, err error) {
	for {
		st := p.state.Load()
		if st == checkDone {
			return
		}
		if p.state.CompareAndSwap(st, checkDone) {
			p.done <- answer{v, err}
			return
		}
	}
}

// lane is the queue of one Redis primary.
type lane struct {
	mu      sync.Mutex
	queue   []*queuedCheck
	running int // batches in flight, at most Store.pipelines
	// size bounds the next batch, from 1 to Store.maxBatch. Redis
	// runs one script at a time, so a batch's round trip grows with the
	// checks in flight ahead of it; size keeps that well inside the
	// deadline (see adapt), and the rest wait in the queue, where waiting
	// is not failing.
	size int
}

// Batch size adaptation: a batch that took more than a quarter of its
// deadline halves the size; one that was full and took less than an eighth
// grows it by a quarter (at least one). The margin is wide because the
// round trip also holds the daemon's own scheduling delays.
const initialBatch = 16

// adapt sets ln's batch size from a batch of n checks that took took,
// against the shortest deadline of the batch.
func (ln *lane) adapt(n int, took, deadline time.Duration, maxBatch int) {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	switch {
	case took > deadline/4:
		ln.size = max(1, ln.size/2)
	case took < deadline/8 && n >= ln.size:
		ln.size = min(maxBatch, ln.size+max(1, ln.size/4))
	}
}

// lane returns the queue of the primary that holds subject's state.
func (s *Store) lane(ctx context.Context, subject string) *lane {
	name := s.Shard(ctx, subject)
	if ln, ok := s.lanes.Load(name); ok {
		return ln.(*lane)
	}
	ln, _ := s.lanes.LoadOrStore(name, &lane{size: min(initialBatch, s.maxBatch)})
	return ln.(*lane)
}

// roundTrip queues one script call, p, and waits for its answer: the reply,
// engine.ErrDeadline if Redis did not answer within roundTrip of the call being
// sent, engine.ErrStoreBusy if it was never sent within the queue's bound, or the
// context's error if the caller left first. A caller that leaves before
// its call is sent spends nothing; one that leaves after may have spent.
func (s *Store) roundTrip(ctx context.Context, subject string, p *queuedCheck) ([]int64, error) {
	ln := s.lane(ctx, subject)
	ln.mu.Lock()
	ln.queue = append(ln.queue, p)
	start := ln.running < s.pipelines
	if start {
		ln.running++
	}
	ln.mu.Unlock()
	if start {
		go s.flush(ln)
	}
	select {
	case a := <-p.done:
		return a.v, a.err
	case <-ctx.Done():
		p.state.Store(checkDone) // a queued check is dropped unsent
		return nil, ctx.Err()
	}
}

// flush sends batches from ln until its queue is empty. It holds one of
// the lane's slots, which it gives up when the queue is empty or hands to
// a new flush when a batch outlives its deadline.
func (s *Store) flush(ln *lane) {
	for {
		// A fresh slice each time: a late timer may still read the last.
		batch := s.take(ln, make([]*queuedCheck, 0, s.maxBatch)) // capacity: size may grow meanwhile
		if len(batch) == 0 || !s.send(ln, batch) {
			return
		}
	}
}

// take moves up to ln.size checks from the front of ln's queue into
// batch. Checks whose callers left are dropped, and checks that waited
// longer than the queue's bound are answered engine.ErrStoreBusy. With nothing
// left to send it gives up the caller's slot and returns an empty batch.
func (s *Store) take(ln *lane, batch []*queuedCheck) []*queuedCheck {
	now := time.Now()
	ln.mu.Lock()
	defer ln.mu.Unlock()
	n := 0
	for n < len(ln.queue) && len(batch) < ln.size {
		p := ln.queue[n]
		n++
		if now.Sub(p.queuedAt) > s.queueWait {
			if p.state.CompareAndSwap(checkQueued, checkDone) {
				p.done <- answer{err: engine.ErrStoreBusy}
			}
			continue
		}
		if p.state.CompareAndSwap(checkQueued, checkSent) {
			batch = append(batch, p)
		}
	}
	rest := copy(ln.queue, ln.queue[n:])
	clear(ln.queue[rest:])
	ln.queue = ln.queue[:rest]
	if len(batch) == 0 {
		ln.running--
	}
	return batch
}

// send writes batch to Redis as one pipeline and answers each check. It
// returns when every check of the batch is answered, by its reply or by its
// deadline. A client library may overstay the context's deadline (a dial,
// a handshake with a stalled server); the batch's timer then answers the
// late checks with engine.ErrDeadline and hands the lane's slot to a new flush, so
// that one stalled batch does not hold up the queue, and send reports
// false: its goroutine has no slot left and must stop once the library
// returns. The late replies are dropped; their spend, if any, is that of a
// reply lost on the network.
func (s *Store) send(ln *lane, batch []*queuedCheck) bool {
	now := time.Now()
	longest := time.Duration(0)
	first := batch[0].roundTrip
	for _, p := range batch {
		p.deadline = now.Add(p.roundTrip)
		longest = max(longest, p.roundTrip)
		first = min(first, p.roundTrip)
	}
	ctx, cancel := context.WithTimeout(context.Background(), longest)
	defer cancel()

	var handedOver atomic.Bool
	var expire func()
	expire = func() {
		now := time.Now()
		next := time.Duration(0)
		for _, p := range batch {
			if p.state.Load() == checkDone {
				continue
			}
			if left := p.deadline.Sub(now); left > 0 {
				if next == 0 || left < next {
					next = left
				}
				continue
			}
			p.finish(nil, engine.ErrDeadline)
		}
		if handedOver.CompareAndSwap(false, true) {
			go s.flush(ln)
		}
		if next > 0 { // a check with a longer deadline is still out
			time.AfterFunc(next, expire)
		}
	}
	timer := time.AfterFunc(first, expire)
	defer timer.Stop()

	s.exec(ctx, batch)
	ln.adapt(len(batch), time.Since(now), first, s.maxBatch)
	return handedOver.CompareAndSwap(false, true)
}

// exec runs batch as one script call (merged) or as one pipeline of a call
// per check, then, if Redis has lost the script (restart, failover, SCRIPT
// FLUSH), sends again with EVAL only the calls it refused: a NOSCRIPT call
// ran nothing. Each check gets its own reply or error.
func (s *Store) exec(ctx context.Context, batch []*queuedCheck) {
	if s.merge && len(batch) > 1 {
		s.execMerged(ctx, batch)
		return
	}
	pipe := s.c.Pipeline()
	cmds := make([]*redis.IntSliceCmd, len(batch))
	for i, p := range batch {
		// The command goes as built (newQueuedCheck), where EvalSha would
		// copy it into a new slice; and an IntSliceCmd reads the reply's
		// integers straight into a []int64, where a Cmd would box each.
		cmds[i] = redis.NewIntSliceCmd(ctx, p.cmd...)
		_ = pipe.Process(ctx, cmds[i])
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	var again redis.Pipeliner
	for i, c := range cmds {
		if isNoScript(c.Err()) {
			if again == nil {
				again = s.c.Pipeline()
			}
			cmds[i] = redis.NewIntSliceCmd(ctx, evalCommand(batch[i].cmd)...)
			_ = again.Process(ctx, cmds[i])
		}
	}
	if again != nil {
		_, _ = again.Exec(ctx)
	}
	reload := false
	for i, c := range cmds {
		v, err := c.Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			err, reload = callErr(ctx, err), true
		}
		batch[i].finish(v, err)
	}
	if r, ok := s.c.(stateReloader); ok && reload {
		// go-redis keeps sending a slot to the primary it knew, even when
		// that primary refuses connections, until a MOVED reply or its
		// periodic reload; after a failover no MOVED ever comes from a
		// dead node. Ask for a reload (it runs in the background, at most
		// every 200 ms).
		r.ReloadState(ctx)
	}
}

// execMerged runs batch as one script call of all its checks: their keys
// in order, then now and pad (the same for all), their number, and each
// check's policy count and values (redis.lua's header). The reply holds
// each check's integers in turn, or one error in place of a failed
// check's.
func (s *Store) execMerged(ctx context.Context, batch []*queuedCheck) {
	keys := 0 // a check has a key per policy
	for _, p := range batch {
		keys += p.keys
	}
	first := batch[0].cmd
	args := make([]any, 0, 3+keys+3+len(batch)+6*keys)
	args = append(args, "evalsha", s.sha, strconv.Itoa(keys))
	for _, p := range batch {
		args = append(args, p.cmd[3:3+p.keys]...)
	}
	args = append(args, first[3+batch[0].keys], first[4+batch[0].keys], len(batch))
	for _, p := range batch {
		args = append(args, p.cmd[6+p.keys:]...)
	}
	c := redis.NewSliceCmd(ctx, args...)
	if err := s.c.Process(ctx, c); isNoScript(err) {
		c = redis.NewSliceCmd(ctx, evalCommand(args)...)
		_ = s.c.Process(ctx, c)
	}
	v, err := c.Result()
	if err != nil {
		err = callErr(ctx, err)
		for _, p := range batch {
			p.finish(nil, err)
		}
		return
	}
	ints := make([]int64, 0, 5*keys)
	for _, p := range batch {
		if len(v) > 0 {
			if e, ok := v[0].(redis.Error); ok {
				v = v[1:]
				p.finish(nil, e)
				continue
			}
		}
		want := 5 * p.keys
		if len(v) < want {
			p.finish(nil, fmt.Errorf("script returned %d values for a check of %d policies, want %d", len(v), p.keys, want))
			v = v[len(v):]
			continue
		}
		start := len(ints)
		for _, x := range v[:want] {
			n, ok := x.(int64)
			if !ok {
				break
			}
			ints = append(ints, n)
		}
		v = v[want:]
		if len(ints)-start != want {
			ints = ints[:start]
			p.finish(nil, fmt.Errorf("script returned a non-integer value for a check of %d policies", p.keys))
			continue
		}
		p.finish(ints[start:len(ints):len(ints)], nil)
	}
}

// evalCommand is cmd, an EVALSHA, as the EVAL of the script's text.
func evalCommand(cmd []any) []any {
	return append([]any{"eval", redisScript}, cmd[2:]...)
}

// callErr is the error of a script call, told apart as a deadline when the
// client cut the read at the context's deadline rather than Redis
// answering an error.
func callErr(ctx context.Context, err error) error {
	var reply redis.Error
	if ctx.Err() != nil && !errors.As(err, &reply) {
		return fmt.Errorf("%w (%w)", engine.ErrDeadline, err)
	}
	return err
}

// isNoScript reports Redis refusing an EVALSHA for a script it does not
// hold; go-redis reports it raw or as redis.ErrNoScript.
func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}

// checkErr names the subject in a failed check's error.
func checkErr(subject string, err error) error {
	return fmt.Errorf("redis check for %q: %w", subject, err)
}
