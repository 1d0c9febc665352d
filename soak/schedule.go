package soak

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Kind names one fault the nemesis injects.
type Kind string

// The faults of a soak. Each acts on one region.
const (
	// KillDaemon kills one daemon with SIGKILL and starts it again For
	// later.
	KillDaemon Kind = "kill-daemon"
	// KillPrimary kills the region's Redis primary: Sentinel and Cluster
	// promote a replica; a single Redis is started again, empty, For later.
	KillPrimary Kind = "kill-primary"
	// PauseRedis stops the region's Redis primary with SIGSTOP for For.
	PauseRedis Kind = "pause-redis"
	// Partition cuts the region's gossip from the other regions for For.
	Partition Kind = "partition"
	// PolicyChange changes, adds or takes a policy out of force through
	// the admin API, or changes the watched Envoy file (Action says which).
	PolicyChange Kind = "policy-change"
	// RollRegion restarts every daemon of the region one by one, waiting
	// for each to be ready before the next, as a deploy would.
	RollRegion Kind = "roll-region"
	// Starve starves every daemon of the region of CPU for For, as an
	// overcommitted host does: each is stopped (SIGSTOP) for tens to
	// hundreds of milliseconds at a time and let run for a few tens
	// between. Its store and its network are whole: the region must not
	// look partitioned to the others, nor they to it.
	Starve Kind = "starve"
	// Failover is no fault of the nemesis's but one the soak saw: a
	// replica promoted while no fault that takes a store away was under
	// way. A loaded machine can keep a primary from answering its peers
	// within cluster-node-timeout (or Sentinel's down-after-milliseconds),
	// and the writes it had not replicated are lost as in a killed
	// primary's failover; the checker widens the region's bound as it does
	// for one (FailoverWatch records them, Spontaneous keeps those no
	// injected fault explains).
	Failover Kind = "failover"
)

// Kinds is every fault the nemesis knows, in a fixed order.
var Kinds = []Kind{KillDaemon, KillPrimary, PauseRedis, Partition, PolicyChange, RollRegion, Starve}

// The actions of a PolicyChange.
const (
	ActionRaise  = "raise"  // the changed policy's limit goes up
	ActionLower  = "lower"  // the changed policy's limit goes down
	ActionAdd    = "add"    // the extra policy is put in force
	ActionRemove = "remove" // the extra policy is put in shadow, out of force
	ActionFile   = "file"   // the watched Envoy file's limit is changed on disk
)

var actions = []string{ActionRaise, ActionLower, ActionAdd, ActionRemove, ActionFile}

// Fault is one timed fault of a schedule. At and For are offsets from
// the start of the run.
type Fault struct {
	Kind   Kind          `json:"kind"`
	Region string        `json:"region"`
	Daemon int           `json:"daemon"` // KillDaemon: index of the daemon within its region
	Action string        `json:"action,omitempty"`
	At     time.Duration `json:"at"`
	For    time.Duration `json:"for"`
}

func (f Fault) String() string {
	s := fmt.Sprintf("%s %s", f.Kind, f.Region)
	if f.Kind == KillDaemon {
		s += fmt.Sprintf("/%d", f.Daemon)
	}
	if f.Action != "" {
		s += " " + f.Action
	}
	return fmt.Sprintf("%s at %v for %v", s, f.At, f.For)
}

// ParseKinds reads a comma-separated list of fault names ("all" for every
// one, "none" for none) and refuses a name that is not a fault.
func ParseKinds(s string) ([]Kind, error) {
	switch strings.TrimSpace(s) {
	case "all":
		return slices.Clone(Kinds), nil
	case "none", "":
		return nil, nil
	}
	var out []Kind
	for _, name := range strings.Split(s, ",") {
		k := Kind(strings.TrimSpace(name))
		if !slices.Contains(Kinds, k) {
			return nil, fmt.Errorf("unknown fault %q (want one of %s, all or none)", name, joinKinds(Kinds))
		}
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out, nil
}

func joinKinds(ks []Kind) string {
	s := make([]string, len(ks))
	for i, k := range ks {
		s[i] = string(k)
	}
	return strings.Join(s, ", ")
}

// PlanConfig says what a schedule is made of.
type PlanConfig struct {
	Seed     uint64
	Duration time.Duration
	Kinds    []Kind
	// Regions are the regions' names; Daemons the daemons of each.
	Regions []string
	Daemons int
}

// Window returns the part of the run faults start and end in: after a
// warm-up (a tenth of the run, at least 40 s: pools and buffers grow to
// their steady size in the first 20 s or so) that measures the levels
// before the faults, and before a quiet tail (a sixth, at least 30 s)
// that measures them after.
func Window(d time.Duration) (from, to time.Duration) {
	from = max(d/10, 40*time.Second)
	to = d - max(d/6, 30*time.Second)
	return from, max(to, from)
}

// Plan returns the schedule of cfg: a pure function of the seed and the
// duration (and the names), sorted by start. Every kind occurs at least
// once when the fault window allows, one fault starts about every 20 s,
// and at least two faults overlap.
func Plan(cfg PlanConfig) []Fault {
	if len(cfg.Kinds) == 0 || len(cfg.Regions) == 0 {
		return nil
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x50a4))
	from, to := Window(cfg.Duration)
	span := to - from
	n := max(len(cfg.Kinds), int(span/(20*time.Second)))
	var out []Fault
	for i := 0; i < n; i++ {
		k := cfg.Kinds[i%len(cfg.Kinds)]
		if i >= len(cfg.Kinds) {
			k = cfg.Kinds[rng.IntN(len(cfg.Kinds))]
		}
		f := Fault{Kind: k, Region: cfg.Regions[rng.IntN(len(cfg.Regions))], For: faultLength(rng, k)}
		switch k {
		case KillDaemon:
			f.Daemon = rng.IntN(max(cfg.Daemons, 1))
		case PolicyChange:
			f.Action = actions[rng.IntN(len(actions))]
		}
		if f.For >= span {
			f.For = span / 2
		}
		f.At = from + time.Duration(rng.Int64N(int64(span-f.For)+1))
		f.At = f.At.Truncate(100 * time.Millisecond)
		out = append(out, f)
	}
	slices.SortStableFunc(out, func(a, b Fault) int { return int(a.At - b.At) })
	if len(out) >= 2 && !anyOverlap(out) {
		first := out[0]
		out[1].At = first.At + first.For/2
		slices.SortStableFunc(out, func(a, b Fault) int { return int(a.At - b.At) })
	}
	return out
}

// faultLength is how long a fault of kind k lasts: the down time of a
// killed process, the pause, the partition, the starvation.
func faultLength(rng *rand.Rand, k Kind) time.Duration {
	between := func(lo, hi int) time.Duration {
		return time.Duration(lo+rng.IntN(hi-lo+1)) * time.Second
	}
	switch k {
	case KillDaemon:
		return between(3, 8)
	case KillPrimary:
		return between(5, 10)
	case PauseRedis:
		return between(2, 5)
	case Partition:
		return between(10, 20)
	case RollRegion:
		return 0 // as long as the roll takes
	case Starve:
		return between(20, 60)
	}
	return 0
}

// anyOverlap reports whether two faults of fs (sorted by At) are in
// effect at once; a fault with no length lasts a second for this.
func anyOverlap(fs []Fault) bool {
	end := time.Duration(-1)
	for _, f := range fs {
		if f.At < end {
			return true
		}
		end = max(end, f.At+max(f.For, time.Second))
	}
	return false
}
