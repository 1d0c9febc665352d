package share

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Config tunes the allocation. All regions of a cluster must use the same
// Config, or their allocations diverge.
type Config struct {
	// Interval is the report period T (default 10 s).
	Interval time.Duration
	// Recent is the window of the "recent" rate x (default 2 s).
	Recent time.Duration
	// Smoothing is the weight of the new interval rate in the demand EWMA
	// (default 0.7).
	Smoothing float64
	// Floor is the fraction of L_global reserved for all regions together;
	// each of n regions gets at least Floor/n (default 0.03).
	Floor float64
	// CapFactor caps a region's share at CapFactor times its recent rate
	// (default 1.2) during the water-fill.
	CapFactor float64
	// Pressure: a key is reported when a region offers more than Pressure
	// times its current share (default 0.5). Keys nobody reports run at
	// L_global/n.
	Pressure float64
	// RaiseDelay is how long after an epoch's rebalance a raise takes effect
	// (cuts take effect at once). Must exceed clock skew plus delivery delay
	// spread (default 1 s).
	RaiseDelay time.Duration
	// Settle is how long after an epoch boundary the caller should wait for
	// reports before calling Rebalance (default 2.5 s); reports arriving
	// later count as missing. It is advice for the caller; Allocator does
	// not read a clock.
	Settle time.Duration
	// PartitionIntervals is K: after K epochs without hearing from a
	// majority, a region falls back to Safe; after K+1 epochs the majority
	// reclaims an unreachable region's share (default 3).
	PartitionIntervals int
	// Safe is the fraction of L_global an isolated region keeps per key
	// (and the majority reserves for it). Zero means Floor/n, which makes
	// partitions overshoot-free (default 0).
	Safe float64

	// BorrowHorizon: a region asks for a loan when its bucket for a key
	// will be empty within this time at the offered rate (default 1 s).
	BorrowHorizon time.Duration
	// BorrowEvery is the least time between two borrow requests for one
	// key from one region, and how long a lender keeps a request it could
	// not serve at once (default 1 s; zero disables borrowing).
	BorrowEvery time.Duration
	// LendFraction is the part of its slack (share minus CapFactor times
	// its own offered rate) a lender gives per request (default 1: the
	// lender already keeps 20% headroom over its own rate, and lending
	// only half leaves a shifted region at 50%, 75%, ... of its need for
	// seconds).
	LendFraction float64
	// BorrowMinRate (units/s): keys whose L_global is below it neither
	// borrow nor lend, because a rate estimated over a fraction of a
	// second from fewer arrivals is noise, and lending on noise moves
	// share away from where the next burst lands (default 40: ten
	// arrivals per 250 ms).
	BorrowMinRate float64
	// BurstSpread is how long a borrower spends the tokens a loan hands
	// over (Loan.Tokens): an extra share of Tokens/BurstSpread for that
	// long after it accepts (default 500 ms; zero: loans carry no tokens).
	BurstSpread time.Duration
	// TokenEvery is the least time between two token requests for one
	// key from one region (tokens.go): keys whose L_global is below
	// BorrowMinRate, too slow for rate loans, pool their buckets' tokens
	// instead (default 200 ms; zero disables token pooling).
	TokenEvery time.Duration
	// NoiseZ is how many standard deviations of Poisson counting noise a
	// rate measured over Recent must stand out by before the allocation
	// acts on it (default 3; zero trusts every measurement, taking a risen
	// recent rate as the demand at once).
	// Counting noise is √count: a key offered 4/s in a region has about 8
	// arrivals in the 2 s recent window, ±35%, and taking those 8 at face
	// value moved shares of a steady key by a third from one interval to
	// the next. With NoiseZ the demand jumps to the recent rate only when
	// it exceeds the interval rate by more than NoiseZ standard deviations,
	// and the cap applies to an upper bound of the recent rate rather than
	// the count itself (Slot.RecentHigh). For keys with hundreds of
	// arrivals per window the bound is a few percent above the count.
	NoiseZ float64
	// NoiseSmoothing replaces Smoothing as the weight of the new interval
	// rate when that rate is within NoiseZ standard deviations of the
	// smoothed demand (default 0.5; zero always uses Smoothing). A steady
	// key's demand then averages over about two intervals instead of
	// one and a half, while a real change, beyond the noise, is followed at
	// Smoothing's pace (or at once by the recent-rate jump).
	NoiseSmoothing float64
}

// DefaultConfig returns the recommended settings.
func DefaultConfig() Config {
	return Config{
		Interval:           10 * time.Second,
		Recent:             2 * time.Second,
		Smoothing:          0.7,
		Floor:              0.03,
		CapFactor:          1.2,
		Pressure:           0.5,
		RaiseDelay:         time.Second,
		Settle:             2500 * time.Millisecond,
		PartitionIntervals: 3,
		BorrowHorizon:      time.Second,
		BorrowEvery:        time.Second,
		LendFraction:       1,
		BorrowMinRate:      40,
		BurstSpread:        500 * time.Millisecond,
		TokenEvery:         200 * time.Millisecond,
		NoiseZ:             3,
		NoiseSmoothing:     0.5,
	}
}

// Validate reports the first setting that cannot work.
func (c Config) Validate() error {
	switch {
	case c.Interval <= 0:
		return errors.New("share: interval must be positive")
	case c.Recent <= 0 || c.Recent > c.Interval:
		return fmt.Errorf("share: recent window must be in (0, interval], got %v", c.Recent)
	case !(c.Smoothing > 0 && c.Smoothing <= 1):
		return fmt.Errorf("share: smoothing must be in (0, 1], got %v", c.Smoothing)
	case !(c.Floor >= 0 && c.Floor < 1):
		return fmt.Errorf("share: floor must be in [0, 1), got %v", c.Floor)
	case !(c.CapFactor >= 1):
		return fmt.Errorf("share: cap factor must be at least 1, got %v", c.CapFactor)
	case !(c.Pressure >= 0 && c.Pressure <= 1):
		return fmt.Errorf("share: pressure must be in [0, 1], got %v", c.Pressure)
	case c.RaiseDelay < 0 || c.RaiseDelay >= c.Interval:
		return fmt.Errorf("share: raise delay must be in [0, interval), got %v", c.RaiseDelay)
	case c.Settle < 0 || c.Settle+c.RaiseDelay >= c.Interval:
		return fmt.Errorf("share: settle + raise delay must be below the interval, got %v", c.Settle)
	case c.PartitionIntervals < 1:
		return fmt.Errorf("share: partition intervals must be at least 1, got %d", c.PartitionIntervals)
	case !(c.Safe >= 0 && c.Safe <= 1):
		return fmt.Errorf("share: safe share must be in [0, 1], got %v", c.Safe)
	case c.BorrowHorizon < 0 || c.BorrowEvery < 0 || c.BorrowEvery > c.Interval:
		return fmt.Errorf("share: borrow horizon must be ≥ 0 and borrow period in [0, interval], got %v, %v", c.BorrowHorizon, c.BorrowEvery)
	case c.TokenEvery < 0 || c.TokenEvery > c.Interval:
		return fmt.Errorf("share: token period must be in [0, interval], got %v", c.TokenEvery)
	case c.BurstSpread < 0 || c.BurstSpread > c.Interval:
		return fmt.Errorf("share: burst spread must be in [0, interval], got %v", c.BurstSpread)
	case !(c.LendFraction >= 0 && c.LendFraction <= 1):
		return fmt.Errorf("share: lend fraction must be in [0, 1], got %v", c.LendFraction)
	case !(c.NoiseZ >= 0):
		return fmt.Errorf("share: noise z must be ≥ 0, got %v", c.NoiseZ)
	case !(c.NoiseSmoothing >= 0 && c.NoiseSmoothing <= 1):
		return fmt.Errorf("share: noise smoothing must be in [0, 1], got %v", c.NoiseSmoothing)
	}
	return nil
}

// floor returns the per-region floor fraction for n regions.
func (c Config) floor(n int) float64 {
	if n <= 0 {
		return 0
	}
	return c.Floor / float64(n)
}

// safe returns the fraction an isolated region keeps for n known regions.
func (c Config) safe(n int) float64 {
	if c.Safe > 0 {
		return c.Safe
	}
	return c.floor(n)
}

// PartitionBound is the documented upper bound of Σ shares / L_global while
// u of n regions are unreachable and delays stay within RaiseDelay.
func (c Config) PartitionBound(n, u int) float64 {
	extra := c.safe(n) - c.floor(n)
	if extra < 0 {
		extra = 0
	}
	return 1 + float64(u)*extra
}

// Epoch returns the epoch number of time t: floor(t / Interval) since the
// Unix epoch, so every region numbers epochs alike without coordination.
func (c Config) Epoch(t time.Time) uint64 {
	return uint64(t.UnixNano() / int64(c.Interval))
}

// EpochStart returns the time epoch e begins.
func (c Config) EpochStart(e uint64) time.Time {
	return time.Unix(0, int64(e)*int64(c.Interval))
}

// recentHigh is an upper confidence bound of a rate measured as recent
// units/s over Config.Recent: the count plus NoiseZ Poisson standard
// deviations (√(count+1), so that a count of zero still has room for the
// arrival that did not happen to land in the window).
func (c Config) recentHigh(recent float64) float64 {
	if !(c.NoiseZ > 0) || !(recent >= 0) {
		return recent
	}
	rs := c.Recent.Seconds()
	return recent + c.NoiseZ*math.Sqrt(recent*rs+1)/rs
}

// risen reports whether the recent rate is above the interval rate by more
// than NoiseZ standard deviations of the recent count under the interval
// rate (any rise at all when NoiseZ is zero).
func (c Config) risen(offered, recent float64) bool {
	if !(recent > offered) {
		return false
	}
	rs := c.Recent.Seconds()
	return recent-offered > c.NoiseZ*math.Sqrt(max(offered, 0)*rs)/rs
}

// withinNoise reports whether an interval rate offered differs from the
// smoothed demand d by no more than NoiseZ standard deviations of the
// interval count under d.
func (c Config) withinNoise(d, offered float64) bool {
	if !(c.NoiseZ > 0) {
		return false
	}
	ts := c.Interval.Seconds()
	return math.Abs(offered-d) <= c.NoiseZ*math.Sqrt(max(d, 0)*ts)/ts
}
