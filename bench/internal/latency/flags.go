package latency

import (
	"errors"
	"flag"
	"time"
)

// Flags are the flags by which both load generators shape a run: Users
// subjects named in turn, Rate calls a second (0: closed loop), Duration
// measured after Warmup, each call given up after Timeout.
type Flags struct {
	Users                     int
	Rate                      float64
	Duration, Warmup, Timeout time.Duration
}

// Register adds -users, -rate, -duration, -warmup and -timeout to fs. call
// names what the tool sends ("request", "call") and closedLoop what it
// does at -rate 0, in the flags' help.
func (f *Flags) Register(fs *flag.FlagSet, call, closedLoop string) {
	fs.IntVar(&f.Users, "users", 10000, "distinct values of {user}, used in turn")
	fs.Float64Var(&f.Rate, "rate", 0, "offered "+call+"s per second; 0 "+closedLoop+" (closed loop)")
	fs.DurationVar(&f.Duration, "duration", 10*time.Second, "measured time")
	fs.DurationVar(&f.Warmup, "warmup", time.Second, "time at the same load before measuring")
	fs.DurationVar(&f.Timeout, "timeout", 5*time.Second, "per-"+call+" deadline; a "+call+" past it counts as an error")
}

// Validate names the first flag out of range: -users below 1, a negative
// -rate, a -duration that is not positive.
func (f Flags) Validate() error {
	switch {
	case f.Users < 1:
		return errors.New("-users: must be at least 1")
	case f.Rate < 0:
		return errors.New("-rate: must not be negative")
	case f.Duration <= 0:
		return errors.New("-duration: must be positive")
	}
	return nil
}

// Run is the pacing of the flags' run over senders concurrent senders.
func (f Flags) Run(senders int) RunConfig {
	return RunConfig{Warmup: f.Warmup, Duration: f.Duration, Rate: f.Rate, Senders: senders}
}
