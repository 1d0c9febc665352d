package engine

import (
	"context"
	"fmt"
	"time"
)

// Failure says what a policy does when its store cannot decide.
type Failure uint8

const (
	// FailOpen allows, through a coarse in-process limit of the policy's
	// rate times LimiterConfig.OpenFactor per daemon: availability first.
	FailOpen Failure = iota
	// FailLocal protects capacity: an in-process limit of the policy's rate
	// divided by the number of live daemons.
	FailLocal
	// FailClosed rejects: for security policies (login, OTP), where brute
	// force during an outage is worse than blocked logins.
	FailClosed
)

func (f Failure) String() string {
	switch f {
	case FailOpen:
		return "open"
	case FailLocal:
		return "local"
	case FailClosed:
		return "closed"
	}
	return fmt.Sprintf("failure(%d)", uint8(f))
}

// Store decides checks; *MemoryStore and the Redis store (engine/redisstore) are Stores.
type Store interface {
	Check(ctx context.Context, req Request) (Decision, error)
}

// UsageKey names a (subject, policy) pair whose usage is tracked.
type UsageKey struct {
	Subject, Policy string
}

// Usage is what a tracked pair demanded (allowed and rejected alike: a
// starved region must still show its demand) and what was admitted, in
// cost units, and what the pair's last decision left (Remaining) and when
// (At; zero if none was tracked).
type Usage struct {
	Demand, Admitted int64
	Remaining        int64
	At               time.Time
}
