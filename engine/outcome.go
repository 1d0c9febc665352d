package engine

// Source says who made a decision.
type Source uint8

const (
	FromStore     Source = iota // the configured store decided
	FromDenyCache               // a rejection remembered in process, no store call
	FromFallback                // the store failed; decided in process (degraded)
)

func (s Source) String() string {
	return [...]string{"store", "deny_cache", "fallback"}[s]
}

// Outcome is a Decision with how it was reached: what a limiter in front
// of a store (engine/limiter) answers. It lives here, with the other value
// types, so that a package that only reads outcomes (the decision package,
// and through it the Go client) links no store, breaker or deny cache.
type Outcome struct {
	Decision
	Source Source
	// Degraded is true when the store could not decide and a policy's
	// failure mode did.
	Degraded bool
	// Unavailable is true when a FailClosed policy rejected because the
	// store could not decide: the caller answers 503, not 429.
	Unavailable bool
	// Err is the store's error behind a degraded decision, for logs.
	Err error
}
