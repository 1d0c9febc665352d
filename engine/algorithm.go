package engine

import (
	"math"
	"time"

	"github.com/sluice-rl/sluice/engine/internal/quant"
)

// State is what one policy remembers about one subject between checks.
// The zero State is a subject never seen: a full token bucket, an empty
// leaky bucket, empty windows.
//
// Times are Unix microseconds because that is what Redis TIME gives, and
// the Redis store must reach bit-identical decisions from the same state.
type State struct {
	// A is the token count (token bucket), the level (leaky bucket), or the
	// current window's count (fixed window, sliding window counter). Decide
	// returns a bucket's A rounded to 29 significant bits in the limiter's
	// favour (see quant.Down), as the Redis store keeps it. A window count is
	// a whole number, a sum of whole costs, and is returned exactly (see
	// quant.StoredCount).
	A float64
	// B is the previous window's count (sliding window counter only),
	// exact as A is.
	B float64
	// T is the time of the last update (buckets) or the start of the
	// current window (window algorithms); zero means no state.
	T int64
	// Log holds one timestamp per admitted unit, oldest first (sliding
	// window log only).
	Log []int64
}

// Result is one policy's verdict on one check.
type Result struct {
	Allowed bool
	// Limit is the policy's capacity as enforced here: the burst of a
	// bucket or the count of a window, after any regional scaling.
	Limit int64
	// Remaining is what could still be spent right now, after this check.
	Remaining int64
	// ResetAfter is the time until the full limit is available again
	// (bucket refilled or drained, window over).
	ResetAfter time.Duration
	// RetryAfter is the time until the same cost would be allowed; zero
	// when allowed.
	RetryAfter time.Duration
}

// Decide applies one policy to one check at time now. It is pure: the
// caller stores the returned State only if it commits the check (a check
// rejected by any of several policies commits none of them), or if the
// check was rejected and keepRejected holds for this policy (a refreshed,
// full bucket: nothing spent). A cost of zero reads the state and consumes
// nothing.
//
// now must be after the Unix epoch; the limit must be valid (Validate).
// A cost above the limit's capacity, possible when a region's share shrinks
// a global limit, is rejected with a finite RetryAfter rather than never.
func Decide(now time.Time, st State, l Limit, cost int64) (State, Result) {
	us := now.UnixMicro()
	if l.Algorithm == SlidingWindowLog {
		r, drop := decideLog(us, st.Log, &l, float64(cost))
		if r.Allowed {
			st.Log = commitLog(append([]int64(nil), st.Log...), drop, us, cost)
		}
		return st, r
	}
	next := counters{a: st.A, b: st.B, t: st.T}
	var r Result
	decide(us, &next, &l, float64(cost), &r)
	if !r.Allowed {
		if keepRejected(st.T, &next, &l) {
			return State{A: next.a, T: next.t}, r
		}
		return st, r
	}
	return State{A: next.a, B: next.b, T: next.t}, r
}

// counters is the state of every algorithm but the log, as the deciding
// functions update it in place: small, and free of the log's slice, so
// the hot path copies nothing it does not need.
type counters struct {
	a, b float64
	t    int64
}

// decide handles every algorithm but the log. It updates st to the state
// after the check and fills r; when the check is rejected the caller keeps
// the old state. Every floating-point operation here is mirrored, in the
// same order, by the Redis store's Lua script (see redis.lua): change both.
// The results are computed on the exact numbers; only a bucket's state
// returned is rounded (quant.Down, quant.UpTo) to what the Redis store can
// keep. Window counts are whole numbers and are kept exactly (quant.StoredCount).
func decide(now int64, st *counters, l *Limit, cost float64, r *Result) {
	*r = Result{}
	switch l.Algorithm {
	case TokenBucket:
		tokenBucket(now, st, l, cost, r)
	case LeakyBucket:
		leakyBucket(now, st, l, cost, r)
	case FixedWindow:
		fixedWindow(now, st, l, cost, r)
	case SlidingWindowCounter:
		slidingCounter(now, st, l, cost, r)
	}
}

// keepRejected reports whether a rejected check's state must be stored
// all the same: a token bucket that is full at the burst enforced now
// (quant.Down of it, as stored), at a time later than the stored state's
// (oldT, zero for none). Storing it spends nothing, so a request rejected
// under any policy may store it and stay all-or-nothing.
//
// The bucket keeps absolute tokens, and refills from its stored time at the
// rate enforced when it is next checked. A region whose share of a global
// limit is too small for a check's cost rejects every check; were nothing
// stored, a subject never seen would, once the share is raised, start from
// a full bucket at the new burst, and a known one would be refilled at the
// new rate for all the time since its stored state: either way up to a
// whole burst on top of the rate. Stored full at the small burst at each
// rejection, the bucket refills from that level at the raised rate, from
// the moment of the last rejection.
//
// Only a full bucket is stored: a rejected bucket that is not full is left
// unwritten (a rejection of a known subject costs no write), so after a
// raise it is refilled at the new rate since its last admission, less
// than the time it needed to fill at the old rate. The other algorithms
// need nothing: a leaky bucket or window left unwritten reads as empty,
// which is what a fresh state stored at the rejection would hold.
func keepRejected(oldT int64, next *counters, l *Limit) bool {
	return l.Algorithm == TokenBucket && next.t != oldT && next.a == quant.Down(l.Burst)
}

const usPerSec = 1e6

func usToDuration(us int64) time.Duration { return time.Duration(us) * time.Microsecond }

// ceilUs converts a non-negative float of microseconds to a whole number,
// rounding up, and bounds it so a degenerate limit cannot overflow.
func ceilUs(v float64) int64 {
	if !(v > 0) {
		return 0
	}
	if v > 1e15 {
		return 1e15
	}
	return int64(math.Ceil(v))
}

func tokenBucket(now int64, st *counters, l *Limit, cost float64, r *Result) {
	rate, burst := l.Rate, l.Burst
	tokens := burst
	t := now
	if st.t != 0 {
		tokens = st.a
		t = st.t
		if now > t {
			tokens = tokens + (float64(now-t)*rate)/usPerSec
			t = now
		}
		if tokens > burst {
			tokens = burst
		}
	}
	r.Limit = quant.Units(burst)
	if cost <= tokens {
		r.Allowed = true
		tokens = tokens - cost
		if tokens > burst {
			tokens = burst // a deposit (a negative cost) fills up to the burst
		}
	} else {
		retry := ceilUs((cost - tokens) * usPerSec / rate)
		// Rounding must never make a client retry too early.
		for i := 0; i < 3 && tokens+(float64(retry)*rate)/usPerSec < cost; i++ {
			retry++
		}
		r.RetryAfter = usToDuration(retry)
	}
	r.Remaining = quant.Units(tokens)
	r.ResetAfter = usToDuration(ceilUs((burst - tokens) * usPerSec / rate))
	st.a, st.t = quant.Down(tokens), t
}

// leakyBucket is the leaky bucket as a meter: each admitted unit raises a
// level that drains at Rate; a check that would overflow Burst is rejected.
func leakyBucket(now int64, st *counters, l *Limit, cost float64, r *Result) {
	rate, burst := l.Rate, l.Burst
	level := 0.0
	t := now
	if st.t != 0 {
		level = st.a
		t = st.t
		if now > t {
			level = math.Max(0, level-(float64(now-t)*rate)/usPerSec)
			t = now
		}
	}
	r.Limit = quant.Units(burst)
	if level+cost <= burst {
		r.Allowed = true
		level = level + cost
	} else {
		retry := ceilUs((level + cost - burst) * usPerSec / rate)
		for i := 0; i < 3 && (level-(float64(retry)*rate)/usPerSec)+cost > burst; i++ {
			retry++
		}
		r.RetryAfter = usToDuration(retry)
	}
	r.Remaining = quant.Units(burst - level)
	r.ResetAfter = usToDuration(ceilUs(level * usPerSec / rate))
	st.a, st.t = quant.UpTo(level, burst), t
}

func windowUs(l *Limit) int64 { return int64(l.Window / time.Microsecond) }

func fixedWindow(now int64, st *counters, l *Limit, cost float64, r *Result) {
	w := windowUs(l)
	start := now - now%w
	count := st.a
	t := st.t
	if st.t == 0 || start > st.t {
		count, t = 0, start
	}
	end := t + w
	r.Limit, r.ResetAfter = quant.Units(l.Count), usToDuration(end-now)
	if count+cost <= l.Count {
		r.Allowed = true
		count = count + cost
	} else if cost <= l.Count {
		r.RetryAfter = usToDuration(end - now)
	} else {
		r.RetryAfter = usToDuration(end - now + w)
	}
	r.Remaining = quant.Units(l.Count - count)
	st.a, st.t = quant.StoredCount(count), t
}

// slidingCounter estimates the count over the last window as the current
// window's count plus the previous one's weighted by how much of it still
// overlaps: n_curr + n_prev × (w − e)/w.
func slidingCounter(now int64, st *counters, l *Limit, cost float64, r *Result) {
	w := windowUs(l)
	start := now - now%w
	cur, prev, t := st.a, st.b, st.t
	switch {
	case st.t == 0:
		cur, prev, t = 0, 0, start
	case start == st.t+w:
		cur, prev, t = 0, st.a, start
	case start > st.t:
		cur, prev, t = 0, 0, start
	}
	e := max(now-t, 0)
	est := estimate(cur, prev, w, e)
	r.Limit = quant.Units(l.Count)
	if est+cost <= l.Count {
		r.Allowed = true
		cur = cur + cost
		est = est + cost
	} else {
		r.RetryAfter = usToDuration(slidingRetry(cur, prev, w, e, l.Count, cost))
	}
	r.Remaining = quant.Units(l.Count - est)
	switch {
	case cur > 0:
		r.ResetAfter = usToDuration(t + 2*w - now)
	case prev > 0:
		r.ResetAfter = usToDuration(t + w - now)
	}
	st.a, st.b, st.t = quant.StoredCount(cur), quant.StoredCount(prev), t
}

func estimate(cur, prev float64, w, e int64) float64 {
	return cur + prev*float64(w-e)/float64(w)
}

// slidingRetry finds how long after e (µs into the current window) the
// estimate leaves room for cost, assuming no other traffic.
func slidingRetry(cur, prev float64, w, e int64, limit, cost float64) int64 {
	if cost > limit {
		return 2*w - e
	}
	if cur+cost <= limit {
		// Wait for the previous window's weight to fall far enough.
		target := ceilUs(float64(w) - (limit-cost-cur)*float64(w)/prev)
		for i := 0; i < 3 && target < w && estimate(cur, prev, w, target)+cost > limit; i++ {
			target++
		}
		return max(target-e, 1)
	}
	// The current window alone is too full: wait into the next window,
	// where today's count becomes the previous one.
	target := ceilUs(float64(w) - (limit-cost)*float64(w)/cur)
	for i := 0; i < 3 && target < w && estimate(0, cur, w, target)+cost > limit; i++ {
		target++
	}
	return w - e + target
}

// decideLog decides for the sliding window log without changing it; drop
// is how many expired timestamps a commit removes from the front.
func decideLog(now int64, log []int64, l *Limit, cost float64) (Result, int) {
	w := windowUs(l)
	drop := 0
	for drop < len(log) && log[drop] <= now-w {
		drop++
	}
	live := log[drop:]
	n := float64(len(live))
	capacity := math.Floor(l.Count)
	r := Result{Limit: int64(capacity)}
	switch {
	case n+cost <= capacity:
		r.Allowed = true
		n += cost
	case cost > capacity:
		r.RetryAfter = usToDuration(w)
	default:
		k := int(n + cost - capacity) // timestamps that must expire first
		r.RetryAfter = usToDuration(live[k-1] + w - now)
	}
	r.Remaining = quant.Units(capacity - n)
	switch {
	case r.Allowed && cost > 0:
		r.ResetAfter = usToDuration(w)
	case len(live) > 0:
		r.ResetAfter = usToDuration(live[len(live)-1] + w - now)
	}
	return r, drop
}

// commitLog drops expired timestamps and records cost new ones, reusing
// the slice's memory.
func commitLog(log []int64, drop int, now, cost int64) []int64 {
	if drop > 0 {
		n := copy(log, log[drop:])
		log = log[:n]
	}
	for range cost {
		log = append(log, now)
	}
	return log
}

// The Redis store keeps the number of a token or leaky bucket's state in 5
// bytes: the top 40 bits of its IEEE 754 encoding (sign, exponent and 28
// stored significand bits, so 29 significant bits), which puts a bucket's
// whole state in 12 bytes and its key in a smaller allocation. So that
// both stores decide bit for bit alike, every store keeps the bucket's
// number rounded to those bits, always in the limiter's favour: token
// counts down, levels up. Such a number moves by less than 2^-28 of its
// value (about 4e-9) each time it is stored. That error is per check, so
// it adds up where values are large and costs small: a token bucket
// holding more than 2^28 tokens loses up to a token per check.
//
// Window counts are not rounded this way: they are whole numbers, and the
// Redis store keeps them as 5-byte integers, exactly (see quant.StoredCount).
//
// A leaky bucket's level is rounded up only as far as its burst allows
// (quant.UpTo).
//
// ttl is how long state must be kept after a check at now: until the
// bucket is full (or empty) again or the window can no longer matter, plus
// a second of slack. Past it, a missing state decides exactly as the
// stored one would. st is the state as stored, already rounded, so the
// TTL is that of what is kept (redis.lua's ttl does the same). l is the limit as enforced, f the scale it was
// enforced at: a token bucket's TTL is computed on the unscaled limit, so
// that it is full by then whatever share the region gets later. A leaky
// bucket's is not: if the share shrinks while it drains, it drains slower
// than its TTL assumed, and one that expires restarts empty. No finite
// TTL covers a share that may shrink towards zero; the allocation's floor
// keeps it from doing so.
func ttl(now int64, st *counters, log []int64, l *Limit, f float64) int64 {
	const slack = usPerSec
	switch l.Algorithm {
	case TokenBucket:
		return ceilUs((l.Burst/f-st.a)*usPerSec/(l.Rate/f)) + slack
	case LeakyBucket:
		return ceilUs(st.a*usPerSec/l.Rate) + slack
	case FixedWindow:
		return st.t + windowUs(l) - now + slack
	case SlidingWindowCounter:
		return st.t + 2*windowUs(l) - now + slack
	case SlidingWindowLog:
		if n := len(log); n > 0 {
			return log[n-1] + windowUs(l) - now + slack
		}
	}
	return slack
}
