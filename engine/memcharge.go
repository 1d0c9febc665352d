package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Charge charges a request after the fact (see ChargeRequest): every
// policy, past its limit if need be, or on an error none. A settled
// reservation is gone whether or not the settlement charged anything.
func (s *MemoryStore) Charge(_ context.Context, req ChargeRequest) (Decision, error) {
	if err := req.Validate(); err != nil {
		return Decision{Decider: -1}, err
	}
	now := s.clock.Now().UnixMicro()
	var held map[string]int64
	var at int64
	if req.Reservation != "" {
		r, ok := s.resv.take(req.Subject, req.Reservation, now)
		if !ok {
			return Decision{Decider: -1}, fmt.Errorf("%w: %q", ErrUnknownReservation, req.Reservation)
		}
		held, at = r.costs, r.at
	}
	var all [MaxChecks]pending
	p := all[:len(req.Checks)]
	s.placeAll(req.Subject, req.Checks, p)
	var buf [MaxChecks]*memShard
	shards := s.lockAcross(buf[:0], req.Checks, p, now, func(int) bool { return true })
	defer s.releaseAcross(shards, p, s.recency(now))
	d := Decision{N: len(p)}
	nowSec := expirySeconds(now, s.base)
	for i := range p {
		c, q := &req.Checks[i], &p[i]
		e := &q.tab.e[q.idx]
		var st State
		if e.meta>>algShift == uint32(q.lim.Algorithm) && e.expiry() >= nowSec {
			st = State{A: e.a, B: e.b, T: e.t}
		}
		next, r := Charge(time.UnixMicro(now), st, q.lim, c.Cost-held[c.Policy], at)
		if held != nil && len(req.Held) == len(req.Checks) {
			req.Held[i] = held[c.Policy]
		}
		if e.meta>>algShift == uint32(SlidingWindowLog) {
			delete(q.sh.logs, q.key)
		}
		e.a, e.b, e.t = next.A, next.B, next.T
		keep := int64(ChargeTTL(now, next, q.lim, c.ScaleFactor()) / time.Microsecond)
		e.meta = packMeta(expirySeconds(now+keep, s.base), q.lim.Algorithm)
		d.Results[i] = r
	}
	d.Finish(nil)
	return d, nil
}

// ErrTooManyReservations is a reservation refused because the store
// holds as many unexpired ones as it holds states at most (MaxKeys).
var ErrTooManyReservations = errors.New("too many reservations held")

// Reserve records subject's estimate under each check's policy, to settle
// by id within ttl (Reserver).
func (s *MemoryStore) Reserve(_ context.Context, subject, id string, checks []Check, ttl time.Duration) error {
	if err := ValidateReservation(subject, id, checks, ttl); err != nil {
		return err
	}
	now := s.clock.Now().UnixMicro()
	costs := make(map[string]int64, len(checks))
	for i := range checks {
		costs[checks[i].Policy] = checks[i].Cost
	}
	return s.resv.put(resKey{subject, id}, reservation{at: now, exp: now + ttl.Microseconds(), costs: costs})
}

type resKey struct{ subject, id string }

// reservation is an estimate held: spent at at, settled before exp (Unix
// µs), with the cost spent under each policy.
type reservation struct {
	at, exp int64
	costs   map[string]int64
}

// reservations holds a store's reservations, at most max of them.
type reservations struct {
	mu  sync.Mutex
	m   map[resKey]reservation
	max int
}

func (r *reservations) init(max int64) {
	r.m = make(map[resKey]reservation)
	r.max = int(max)
}

func (r *reservations) put(k resKey, v reservation) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.m[k]; !ok && len(r.m) >= r.max {
		r.sweepLocked(v.at)
		if len(r.m) >= r.max {
			return ErrTooManyReservations
		}
	}
	r.m[k] = v
	return nil
}

// take removes the reservation and returns it unless it was missing or
// expired (now at or after its exp).
func (r *reservations) take(subject, id string, now int64) (reservation, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := resKey{subject, id}
	v, ok := r.m[k]
	delete(r.m, k)
	return v, ok && now < v.exp
}

func (r *reservations) sweep(now int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sweepLocked(now)
}

func (r *reservations) sweepLocked(now int64) {
	for k, v := range r.m {
		if now >= v.exp {
			delete(r.m, k)
		}
	}
}
