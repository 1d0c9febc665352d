package redisstore

import (
	"context"
	"errors"
	"fmt"
	"runtime/metrics"
	"strconv"
	"strings"
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
// the previous one returns, up to Config.MaxBatch checks. A lone check
// goes out at once; under load a lane waits a little for its batch to
// fill (gather), since a call's fixed cost to Redis is several times a
// check's. A single server's lane sends a further batch beside one in
// flight as soon as a check waits. A Cluster primary sees only its share
// of the checks, and its batches would be a fraction of a single
// server's: its lane sends a further batch only when a full one waits.
//
// On a single server (or a Sentinel's primary) a batch goes as one script
// call that decides its checks one after another: Redis then pays its
// per-call cost (the call's setup, TIME, the script's closures) once per
// batch, and the daemon writes and reads one command. On a Cluster a batch
// is one call too, to its lane's primary (execNode), and a check whose
// slot moved is sent again alone. Each check keeps its own result and its
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
	// replied is set when Redis's reply to the check was read, even after
	// the watch failed it: the primary is answering.
	replied atomic.Bool
}

// answer is the script's reply, five integers per policy, or an error.
type answer struct {
	v   []int64
	err error
}

// finish answers the check unless it was answered or abandoned already.
func (p *queuedCheck) finish(v []int64, err error) {
	var reply redis.Error
	if err == nil || errors.As(err, &reply) {
		p.replied.Store(true)
	}
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
	// stall is the scheduling delay the last batch's deadline watch
	// measured: the queue's bound is lengthened by as much, since a check
	// that waited while the daemon could not run waited for the daemon,
	// not for Redis.
	stall time.Duration
	// arrived counts the checks queued since takenAt, the last take; rate
	// is the checks per second that arrived between the last two takes,
	// from which gather tells how soon a batch would fill.
	arrived int
	takenAt time.Time
	rate    float64
	// lastArrived is arrived at the last take: the most callers the next
	// batch can expect. Callers that wait for their answer before they
	// send again (one client checking in a loop) never fill a batch
	// larger than their number, however fast they come.
	lastArrived int
	// want is the batch a gathering flush waits for.
	want int
	// gathering is set while a flush waits for its batch to fill; the
	// check that fills it wakes the flush through full.
	gathering bool
	full      chan struct{}
	// addr is the primary's address, "" for a single server.
	addr string
	// silent is set when a batch's watch gave up on the primary, or a
	// batch came back past its deadline with no reply, and cleared when
	// any reply of a batch is read. While it is set, CPU pressure excuses
	// no more waits on the lane (machineShort): a server that answered
	// nothing for as long as pressure excuses (about a second) is not late
	// for want of CPU, and without this every check queued behind the
	// batch waited its own second as well.
	silent atomic.Bool
}

// Batch size adaptation: a batch of at least gatherBatch checks that took
// more than a quarter of its deadline halves the size; one that was full
// and took less than an eighth grows it by a quarter (at least one). The
// margin is wide because the round trip also holds the daemon's own
// scheduling delays. A smaller batch costs Redis tens of microseconds: a
// slow round trip is then not its size's doing, and halving it would only
// make every check pay more of a call's cost (on a loaded machine, lanes
// halved down to a few checks per call).
const initialBatch = 16

// adapt sets ln's batch size from a batch of n checks that took took,
// against the shortest deadline of the batch.
func (ln *lane) adapt(n int, took, deadline time.Duration, maxBatch int) {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	switch {
	case took > deadline/4 && n >= gatherBatch:
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
	addr := name
	if !s.cluster {
		addr = ""
	}
	ln, _ := s.lanes.LoadOrStore(name, &lane{size: min(initialBatch, s.maxBatch), full: make(chan struct{}, 1), addr: addr})
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
	ln.arrived++
	start := false
	switch {
	case ln.gathering && len(ln.queue) >= ln.want:
		ln.gathering = false
		select {
		case ln.full <- struct{}{}:
		default:
		}
	case ln.running == 0 || (ln.running < s.pipelines && (ln.addr == "" || len(ln.queue) >= ln.size)):
		// On a Cluster a further batch goes out beside the one in
		// flight only for a full batch: a primary sees only its share
		// of the checks, and those that come meanwhile wait for the
		// next, so that each call carries many. A single server's lane
		// sees every check, its batches fill without waiting, and
		// holding its second call back left Redis idle between calls
		// (a fifth fewer checks a second at 64 callers, the same CPU
		// per check).
		start = true
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
		s.gather(ln)
		// A fresh slice each time: a late timer may still read the last.
		batch := s.take(ln, make([]*queuedCheck, 0, s.maxBatch)) // capacity: size may grow meanwhile
		if len(batch) == 0 || !s.send(ln, batch) {
			return
		}
	}
}

// gatherBatch is the batch a busy lane waits to fill before it sends: a
// call's fixed cost to Redis (its wakeup, read and write, the script's
// setup; measured at 30 to 40 µs of Redis CPU, against 5 to 6 µs per
// check) is then a small part of each check's.
const gatherBatch = 16

// gatherGain is the fewest checks a lane must expect within the gather
// window, at the rate they have been coming, to wait for them.
const gatherGain = 4

// maxGatherWindow caps the gather window whatever the deadline: the wait
// is latency every check of a busy lane pays, so a longer deadline (a
// daemon given 200 ms) must not make a lane wait 40 ms per batch at a
// few hundred checks a second.
const maxGatherWindow = time.Millisecond

// gatherWindow is how long a busy lane waits for its batch to fill, for a
// store whose deadline is timeout, at most limit (maxGatherWindow).
func gatherWindow(timeout, limit time.Duration) time.Duration { return min(timeout/5, limit) }

// gather waits, before ln's next batch is taken, until gatherBatch
// checks are queued, or as many as arrived between the last two takes if
// fewer, or the gather window (a fifth of the store's deadline, at most
// maxGatherWindow: 1 ms by default) has passed, if at the rate checks have
// been arriving at least gatherGain more would come within it; otherwise it
// returns at once, so that a lone check, a lane under light load or a
// single caller checking in a loop is sent without delay. A Cluster primary sees only its
// share of the checks: without waiting, its batches would be a fraction
// of a single server's, and each check would carry a larger part of a
// call's cost. The wait is queue time, not the deadline's: it is bounded
// by Config.QueueWait like any other.
func (s *Store) gather(ln *lane) {
	ln.mu.Lock()
	want := min(gatherBatch, ln.size, ln.lastArrived)
	need := want - len(ln.queue)
	window := gatherWindow(s.timeout, s.gatherCap)
	if need <= 0 || len(ln.queue) == 0 || ln.rate*window.Seconds() < gatherGain {
		ln.mu.Unlock()
		return
	}
	ln.gathering, ln.want = true, want
	ln.mu.Unlock()
	t := time.NewTimer(window)
	select {
	case <-ln.full:
	case <-t.C:
	}
	t.Stop()
	ln.mu.Lock()
	ln.gathering = false
	select {
	case <-ln.full:
	default:
	}
	ln.mu.Unlock()
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
	behind := -1 // bounds a check may wait: unknown, read once, and only for a check past the bound
	for n < len(ln.queue) && len(batch) < ln.size {
		p := ln.queue[n]
		n++
		if wait, bound := now.Sub(p.queuedAt), s.queueWait+ln.stall; wait > bound {
			if behind < 0 {
				behind = 0
				switch {
				case s.machineShort(ln, now):
					behind = pressedReads * starvedQueueWaits
				case runnableGoroutines():
					behind = starvedQueueWaits
				}
			}
			if wait <= time.Duration(behind)*bound {
				// The daemon has goroutines waiting to run, or the
				// machine is short of CPU: the check waited for this
				// process, or for a Redis server the machine did not
				// run (whose replies the batches in flight wait for as
				// long), not for a store that failed.
				if p.state.CompareAndSwap(checkQueued, checkSent) {
					batch = append(batch, p)
				}
				continue
			}
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
	if dt := now.Sub(ln.takenAt); dt > 0 {
		ln.rate = float64(ln.arrived) / dt.Seconds()
	}
	ln.lastArrived, ln.arrived, ln.takenAt = ln.arrived, 0, now
	if len(batch) == 0 {
		ln.running--
	}
	return batch
}

// send writes batch to Redis and answers each check. It returns when every
// check of the batch is answered, by its reply or by its deadline (see
// deadlineWatch). A client library may overstay the context's deadline (a
// dial, a handshake with a stalled server); the batch's timer then answers
// the late checks with engine.ErrDeadline and hands the lane's slot to a
// new flush, so that one stalled batch does not hold up the queue, and send
// reports false: its goroutine has no slot left and must stop once the
// library returns. The late replies are dropped; their spend, if any, is
// that of a reply lost on the network.
func (s *Store) send(ln *lane, batch []*queuedCheck) bool {
	now := time.Now()
	longest := time.Duration(0)
	first := batch[0].roundTrip
	for _, p := range batch {
		p.deadline = now.Add(p.roundTrip)
		longest = max(longest, p.roundTrip)
		first = min(first, p.roundTrip)
	}
	// The client reads the replies for longer than the deadline: a reply
	// that arrived while this daemon could not run is still Redis's
	// answer. The watch decides when a check has failed. The queue's bound
	// is read under the lane's lock, as take reads it.
	ln.mu.Lock()
	queueWait := s.queueWait
	ln.mu.Unlock()
	w := &deadlineWatch{s: s, ln: ln, batch: batch, slack: max(time.Millisecond, min(first/5, 5*time.Millisecond)),
		giveUp: now.Add(longest + queueWait)}
	// The client's reads end at the watch's giveUp, which a daemon that
	// did not run pushes back: the read is bounded by a far deadline,
	// starvedQueueWaits queue bounds, and the watch cuts it when it gives
	// up. A client whose connections the store cannot see reads until
	// giveUp as first set.
	readBy := w.giveUp
	if s.unread != nil {
		readBy = now.Add(longest + starvedQueueWaits*queueWait)
	}
	w.readBy, w.readUntil, w.readCap, w.first = readBy, readBy, readBy, first
	if s.unread != nil {
		// Counted from when the batch's oldest check was queued: a
		// check that waited in the queue while the machine was short
		// of CPU has had its share of the wait already.
		oldest := now
		for _, p := range batch {
			if p.queuedAt.Before(oldest) {
				oldest = p.queuedAt
			}
		}
		w.starved = starvedQueueWaits * queueWait
		if w.readCap = oldest.Add(longest + pressedReads*w.starved); w.readCap.Before(readBy) {
			w.readCap = readBy
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), readBy)
	defer cancel()
	w.cut = func() {
		cancel()
		if s.unread != nil {
			s.unread.moveReadDeadline(readBy, time.Now())
		}
	}
	w.mu.Lock()
	w.arm(now, first)
	w.mu.Unlock()
	s.exec(ctx, batch)
	stall := w.stop()
	replied := false
	for _, p := range batch {
		if replied = p.replied.Load(); replied {
			break
		}
	}
	switch {
	case replied:
		ln.silent.Store(false)
	case time.Since(now) >= first:
		ln.silent.Store(true) // no reply within the deadline, nor since
	}
	ln.mu.Lock()
	ln.stall = stall
	ln.mu.Unlock()
	ln.adapt(len(batch), time.Since(now)-stall, first, s.maxBatch)
	return w.handedOver.CompareAndSwap(false, true)
}

// deadlineWatch answers the checks of a batch that Redis did not answer
// within their deadlines, and only those: a deadline measures Redis, not
// this daemon's own scheduling delays. On a machine whose CPU is taken
// (other processes, or more goroutines than it runs at once), a reply can
// sit in the socket for milliseconds before the goroutine that reads it
// runs; that reply is a decision of the store, and deciding the check by
// the fallback as well would admit it twice. So the watch's timer measures
// its own lateness: a timer that fires more than slack after it was due
// shows the daemon did not run for that long, and every check's deadline
// moves by as much (stall). A check fails only when its deadline, so
// moved, has passed at two fires in a row that were both on time, slack
// apart, with no goroutine kept waiting to run longer than slack in
// between (the runtime's scheduling latencies), none waiting to run at the
// second, no reply from the primary waiting unread in a socket (Go polls
// the network late when it always has goroutines to run), and the machine
// not short of CPU with a Redis server on it (machineShort: a Redis server
// on a loaded machine answers late for want of CPU, and its late reply is
// its decision): the daemon was running for that long, with time for the reading goroutine to
// take the reply, and none came. A store that does not answer thus fails a
// check within its deadline plus one to two slacks (a fifth of the
// deadline, 1 to 5 ms) on a daemon with CPU to spare; a daemon short of
// CPU fails what is left at the queue's bound (Config.QueueWait) past the
// longest deadline (giveUp), pushed back by as long as its timer was late,
// at a fire on time with no reply from the primary waiting unread, and a
// machine short of CPU at the client's read deadline, which the watch
// keeps starvedQueueWaits queue bounds ahead of its fires, up to
// pressedReads times that past the oldest check's queueing; the watch cuts the
// client's reads then: a connection is not held longer than that by a
// server that stopped answering.
type deadlineWatch struct {
	s          *Store
	ln         *lane
	batch      []*queuedCheck
	slack      time.Duration
	giveUp     time.Time
	handedOver atomic.Bool

	mu     sync.Mutex
	due    time.Time // when the timer should fire
	stall  time.Duration
	late   time.Duration // the timer's own lateness, part of stall
	cut    func()        // ends the client's reads of the batch
	readBy time.Time     // the client's deadline for the batch's calls
	// readUntil is the client's read deadline as the watch moved it,
	// while the machine is short of CPU, to starved (starvedQueueWaits
	// queue bounds; zero for a client whose connections the store cannot
	// see, whose reads end at readBy) past a fire, at most to readCap
	// (pressedReads).
	readUntil, readCap time.Time
	starved            time.Duration
	first              time.Duration // the batch's shortest deadline
	confirm            bool          // the last fire was on time with a check past its deadline
	sched              []uint64      // the runtime's scheduling latency counts then
	timer              *time.Timer
	stopped            bool
}

// arm sets the timer to fire after d; w.mu is held.
func (w *deadlineWatch) arm(now time.Time, d time.Duration) {
	w.due = now.Add(d)
	w.timer = time.AfterFunc(d, w.expire)
}

// stop ends the watch once the batch is back and returns the scheduling
// delay it measured.
func (w *deadlineWatch) stop() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	w.timer.Stop()
	return w.stall
}

// expire runs when the timer fires: it fails the checks whose time is up
// and sets the timer for the next.
func (w *deadlineWatch) expire() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	now := time.Now()
	onTime := now.Sub(w.due) <= w.slack
	if !onTime {
		w.stall += now.Sub(w.due)
		w.late += now.Sub(w.due)
	}
	ran := onTime // the timer was on time: the daemon ran until now
	giveUp := w.giveUp.Add(w.late)
	pressed := w.s.machineShort(w.ln, now)
	to := now.Add(w.starved)
	if to.After(w.readCap) {
		to = w.readCap
	}
	if pressed && w.starved > 0 && to.Sub(w.readUntil) > w.starved/4 {
		// The machine is short of CPU (cpuPressure): a Redis server
		// on it may be what waits to run, and its reply, however late,
		// decides the checks. The client reads on, starvedQueueWaits
		// queue bounds past this fire, as for a daemon that did not
		// run, so that a daemon that the machine does not run for less
		// than that does not find its read cut when it runs again; at
		// most pressedReads times as long in all.
		w.s.unread.moveReadDeadline(w.readBy, to)
		w.readUntil = to
	}
	if pressed && giveUp.Before(w.readUntil) {
		giveUp = w.readUntil
	}
	if w.confirm && onTime && (schedLatency(w.sched) > w.slack || runnableGoroutines() || w.s.unreadReply(w.ln) || w.behind(now) || pressed) {
		// The timer ran on time, but other goroutines waited to run or
		// wait now (the reader may be one of them, or not yet told of
		// its reply), or a reply from this primary waits unread in a
		// socket: the daemon is behind, not Redis. Or the machine is
		// short of CPU, and the Redis server may be behind for want of
		// it.
		onTime = false
		w.stall += w.slack
	}
	// The checks left fail at giveUp only at a fire on time, with no
	// reply from the primary waiting unread: the first fire after the
	// daemon did not run finds the replies that came meanwhile in the
	// sockets, and the reading goroutine must have its turn to take them.
	over := !now.Before(giveUp)
	end := over && ran && !w.s.unreadReply(w.ln)
	next, past, failed, gaveUp := time.Duration(0), false, false, false
	for _, p := range w.batch {
		if p.state.Load() == checkDone {
			continue
		}
		left := p.deadline.Add(w.stall).Sub(now)
		switch {
		case end || (left <= 0 && onTime && w.confirm):
			p.finish(nil, engine.ErrDeadline)
			failed, gaveUp = true, gaveUp || end
		case left <= 0:
			past = true
		case next == 0 || left < next:
			next = left
		}
	}
	w.confirm = past && onTime
	if w.confirm {
		w.sched = schedCounts(w.sched[:0])
	}
	if (past || over) && (next == 0 || w.slack < next) {
		next = w.slack
	}
	if gaveUp {
		w.ln.silent.Store(true) // before a new flush takes the queue
	}
	if failed && w.handedOver.CompareAndSwap(false, true) {
		go w.s.flush(w.ln)
	}
	if gaveUp {
		w.cut()
		return
	}
	if next > 0 && !over {
		next = min(next, giveUp.Sub(now)+time.Microsecond)
	}
	if next > 0 {
		w.arm(now, next)
	}
}

// behind reports whether the batch's connection shows the daemon holding
// it up (unreadConns.behind): a daemon whose threads the machine did not
// run may not even have written the request.
func (w *deadlineWatch) behind(now time.Time) bool {
	return w.s.unread != nil && w.s.unread.behind(w.readBy, now, w.first)
}

// machineShort reports whether the machine is short of CPU (cpuPressure)
// while ln's primary runs on it (unreadConns.colocated). A server on another
// machine does not wait for this one's CPUs: a reply it does not send is
// its failure, and this daemon's own delays are measured apart (the
// watch's lateness, goroutines waiting to run, replies unread). Without
// that distinction a remote server that hangs would hold every check for
// about a second whenever this machine is busy, where the deadline is a
// few milliseconds. A client whose connections the store cannot see
// counts as on this machine. It is false while ln's primary is silent: a
// server that answered nothing for as long as pressure excuses is not late
// for want of CPU.
func (s *Store) machineShort(ln *lane, now time.Time) bool {
	if ln.silent.Load() || (s.unread != nil && !s.unread.colocated(ln.addr)) {
		return false
	}
	return s.pressure.short(now)
}

// unreadReply reports whether a reply from ln's primary has arrived that
// this process has not read (unreadConns).
func (s *Store) unreadReply(ln *lane) bool {
	return s.unread != nil && s.unread.waiting(ln.addr)
}

// starvedQueueWaits bounds, in queue bounds (Config.QueueWait and the
// lane's measured stall), how long a check may wait in the queue while the
// daemon has goroutines waiting to run: such a wait is the daemon's, and
// the check is sent rather than failed as busy, up to this many bounds.
const starvedQueueWaits = 10

// pressedReads bounds, in starvedQueueWaits queue bounds, how long a
// check may wait in the queue while the machine is short of CPU (take),
// and how long, from when it was queued, the client reads its reply
// (deadlineWatch), but never less than starvedQueueWaits bounds from when
// it was sent: a server that stopped answering on a loaded machine still
// fails its checks, about a second after they were queued by default.
const pressedReads = 2

// runnableMetric counts the goroutines ready to run that wait for a
// thread.
const runnableMetric = "/sched/goroutines/runnable:goroutines"

// runnableGoroutines reports whether goroutines of this process are ready
// to run and waiting: the daemon is short of CPU, and whatever waited
// meanwhile (a reply's reader, a queued check) waited for it, not for
// Redis.
func runnableGoroutines() bool {
	s := []metrics.Sample{{Name: runnableMetric}}
	metrics.Read(s)
	return s[0].Value.Kind() == metrics.KindUint64 && s[0].Value.Uint64() > 0
}

// schedMetric is the runtime's histogram of the time goroutines waited,
// ready, before they ran.
const schedMetric = "/sched/latencies:seconds"

// schedCounts appends the runtime's scheduling latency counts to counts.
func schedCounts(counts []uint64) []uint64 {
	s := []metrics.Sample{{Name: schedMetric}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64Histogram {
		return counts
	}
	return append(counts, s[0].Value.Float64Histogram().Counts...)
}

// schedLatency is the longest time a goroutine waited to run since the
// runtime counted before (schedCounts), to its histogram's bucket: how long
// this process kept ready goroutines waiting meanwhile.
func schedLatency(before []uint64) time.Duration {
	s := []metrics.Sample{{Name: schedMetric}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64Histogram {
		return 0
	}
	h := s[0].Value.Float64Histogram()
	for i := min(len(h.Counts), len(before)) - 1; i >= 0; i-- {
		if h.Counts[i] > before[i] {
			return time.Duration(h.Buckets[i] * float64(time.Second))
		}
	}
	return 0
}

// exec runs batch as one script call (merged) or as one pipeline of a call
// per check. Each check gets its own reply or error.
func (s *Store) exec(ctx context.Context, batch []*queuedCheck) {
	switch {
	case len(batch) < 2:
	case s.merge:
		s.execMerged(ctx, s.c, batch)
		return
	case s.crossSlot.Load():
		s.execNode(ctx, batch)
		return
	}
	s.execEach(ctx, batch)
}

// execNode runs a Cluster batch as one call of clusterScript on the primary
// that serves its first check, sent to that node's own client, so that
// go-redis follows no redirection for the call as a whole. The node decides
// every check whose slot it serves. A check whose slot has moved away (a
// resharding, a failover the slot map has not caught up with) fails its
// first GET inside the script, before it writes anything: the node ran
// nothing of it, so it is sent again alone, routed by go-redis's slot map,
// which follows MOVED and ASK. A check is thus decided once, by one node:
// never failed for having moved, never decided twice by the merged call
// and its retry.
func (s *Store) execNode(ctx context.Context, batch []*queuedCheck) {
	node, err := s.c.(masterForKeyer).MasterForKey(ctx, keyString(batch[0].cmd[3]))
	if err != nil {
		s.execEach(ctx, batch)
		return
	}
	if again := s.execMerged(ctx, node, batch); len(again) > 0 {
		if r, ok := s.c.(stateReloader); ok {
			r.ReloadState(ctx)
		}
		s.execEach(ctx, again)
	}
}

// execEach runs batch as one pipeline of a call per check, then, if Redis
// has lost the script (restart, failover, SCRIPT FLUSH), sends again with
// EVAL only the calls it refused: a NOSCRIPT call ran nothing.
func (s *Store) execEach(ctx context.Context, batch []*queuedCheck) {
	pipe := s.c.Pipeline()
	cmds := make([]*redis.IntSliceCmd, len(batch))
	for i, p := range batch {
		// The command goes as built (newQueuedCheck), where EvalSha would
		// copy it into a new slice; and an IntSliceCmd reads the reply's
		// integers straight into a []int64, where a Cmd would box each.
		cmds[i] = redis.NewIntSliceCmd(ctx, p.cmd...)
		_ = pipe.Process(ctx, onceIntSliceCmd{cmds[i]})
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	var again redis.Pipeliner
	for i, c := range cmds {
		if isNoScript(c.Err()) {
			if again == nil {
				again = s.c.Pipeline()
			}
			cmds[i] = redis.NewIntSliceCmd(ctx, evalCommand(batch[i].cmd, redisScript)...)
			_ = again.Process(ctx, onceIntSliceCmd{cmds[i]})
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

// A script call is sent once. go-redis sends a command again (MaxRetries)
// when its connection broke, or passed its socket timeout, before the
// reply was read; Redis may have run the script by then, and running it
// again would spend a check's or a charge's units twice. A call so lost
// fails, as a reply lost on the network does. The once types mark a
// command for go-redis not to resend (Cmder.NoRetry); a redirection
// (MOVED, ASK) is still followed, since the node that sent it ran nothing.
type (
	onceSliceCmd    struct{ *redis.SliceCmd }
	onceIntSliceCmd struct{ *redis.IntSliceCmd }
	onceCmd         struct{ *redis.Cmd }
)

func (onceSliceCmd) NoRetry() bool    { return true }
func (onceIntSliceCmd) NoRetry() bool { return true }
func (onceCmd) NoRetry() bool         { return true }

// processor is the part of a go-redis client that sends one command.
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// execMerged runs batch as one script call of all its checks through c:
// their keys in order, then now and pad (the same for all), their number,
// and each check's policy count and values (redis.lua's header); on a
// Cluster node the keys go after the values instead, undeclared, and the
// script is clusterScript. The reply holds each check's integers in turn,
// or one error in place of a failed check's. It answers every check but
// those the node did not run (Cluster only: their slots are not the
// node's, or the node refused the script), which it returns.
func (s *Store) execMerged(ctx context.Context, c processor, batch []*queuedCheck) []*queuedCheck {
	keys := 0 // a check has a key per policy
	for _, p := range batch {
		keys += p.keys
	}
	first := batch[0].cmd
	args := make([]any, 0, 3+keys+3+len(batch)+6*keys)
	sha, script := s.sha, redisScript
	if s.cluster {
		sha, script = s.clusterSHA, clusterScript
		args = append(args, "evalsha", sha, "0")
	} else {
		args = append(args, "evalsha", sha, strconv.Itoa(keys))
		for _, p := range batch {
			args = append(args, p.cmd[3:3+p.keys]...)
		}
	}
	args = append(args, first[3+batch[0].keys], first[4+batch[0].keys], len(batch))
	for _, p := range batch {
		args = append(args, p.cmd[6+p.keys:]...)
	}
	if s.cluster {
		for _, p := range batch {
			args = append(args, p.cmd[3:3+p.keys]...)
		}
	}
	cmd := redis.NewSliceCmd(ctx, args...)
	if err := c.Process(ctx, onceSliceCmd{cmd}); isNoScript(err) {
		cmd = redis.NewSliceCmd(ctx, evalCommand(args, script)...)
		_ = c.Process(ctx, onceSliceCmd{cmd})
	}
	v, err := cmd.Result()
	if err != nil {
		if s.cluster && notRun(err) {
			if refused(err) {
				s.crossSlot.Store(false)
			}
			return batch
		}
		err = callErr(ctx, err)
		for _, p := range batch {
			p.finish(nil, err)
		}
		return nil
	}
	return s.mergedReplies(v, batch, keys)
}

// mergedReplies answers each check of batch from v, the merged call's
// reply, and returns those a Cluster node did not run.
func (s *Store) mergedReplies(v []any, batch []*queuedCheck, keys int) []*queuedCheck {
	var again []*queuedCheck
	ints := make([]int64, 0, 5*keys)
	for _, p := range batch {
		if len(v) > 0 {
			if e, ok := v[0].(redis.Error); ok {
				v = v[1:]
				if s.cluster && notLocal(e) {
					again = append(again, p)
					continue
				}
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
	return again
}

// notLocal reports a check that a Cluster node refused inside the merged
// script because it does not serve the check's slot (Redis: "Script
// attempted to access a non local key"), or a redirection.
func notLocal(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "non local key") || redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK")
}

// notRun reports an error reply to a whole call that means Redis ran none
// of it: a redirection, a slot in migration, or a script it refused.
func notRun(err error) bool {
	var reply redis.Error
	if !errors.As(err, &reply) {
		return false
	}
	return redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK") ||
		redis.HasErrorPrefix(err, "TRYAGAIN") || refused(err)
}

// refused reports a server that will not run clusterScript at all: one
// older than Redis 7.0, which cannot read its flags line.
func refused(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "compiling script") || strings.Contains(msg, "shebang") || strings.Contains(msg, "flag")
}

// keyString is a key of a command as newQueuedCheck built it: a string, or
// a pointer to one.
func keyString(v any) string {
	if k, ok := v.(*string); ok {
		return *k
	}
	k, _ := v.(string)
	return k
}

// evalCommand is cmd, an EVALSHA, as the EVAL of script's text.
func evalCommand(cmd []any, script string) []any {
	return append([]any{"eval", script}, cmd[2:]...)
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
