// Package share divides a global limit L_global among regions.
//
// Every interval (Config.Interval, 10 s by default) each region publishes a
// Report: for every key under pressure (a global policy and a subject) its
// offered rate over the interval (rejected requests included, or a starved
// region could never grow), its offered rate over the last few seconds, its
// smoothed demand, the rate it admitted and its current share. Every region
// feeds the same set of reports for an epoch to the same deterministic
// function (Allocate), so every region computes the same shares and the
// shares of a key sum to L_global.
//
// The package is pure: no I/O, no clock, no goroutines. Time is an argument
// and the caller (the gossip layer in a daemon, the simulator in tests)
// decides when reports are delivered and when an epoch is rebalanced.
//
// # Allocation
//
// Per key, with n known regions and everything expressed as a fraction of
// L_global (so the shares sum to 1):
//
//  1. Demand: each region smooths its own demand, D ← x if x > x̄, else
//     0.7·x̄ + 0.3·D (x̄ is the interval rate, x the recent rate), and
//     publishes D, so the allocation itself needs no history.
//  2. Floor f = Config.Floor/n (0.03/n); cap c = max(f, 1.2·x).
//  3. Each reporting region gets f plus a proportional water-fill of what is
//     left by D, capped at c; if every region is capped, the remainder is
//     spread in proportion to D so nothing is rejected below the limit.
//  4. A region whose report is missing keeps its last share.
//  5. Cuts apply at once, raises Config.RaiseDelay later (Table), so a
//     transient under-serves instead of overshooting.
//
// # Partitions
//
// A region that has not been heard from for Config.PartitionIntervals
// epochs (K, default 3) is unreachable. A region that can reach at most half
// of the known regions (itself included; on an exact half the side holding
// the lexicographically smallest region wins) is on the minority side and
// falls back to min(share, Config.Safe) for every key after K epochs. The
// majority side reclaims an unreachable region's share only after K+1
// epochs (plus RaiseDelay), reserving Config.Safe for it. Hence, while every
// region's clock and delivery delays stay within RaiseDelay:
//
//	Σ shares ≤ L_global · (1 + u·max(0, Safe − Floor/n))      (PartitionBound)
//
// where u is the number of unreachable regions; with the default Safe =
// Floor/n the bound is exactly L_global (no overshoot), and under-service
// during a partition is at most the minority's shares minus Safe.
//
// # Borrowing and membership
//
// Between rebalances a region whose bucket will empty within
// Config.BorrowHorizon asks its peers for a loan (BorrowRequest); a lender
// cuts its own share first, then answers (Loan); loans expire at the next
// Rebalance, so Σ shares ≤ L_global holds with loans in flight or lost
// (borrow.go). SetSilent takes the regions out of contact: a region that
// has lost contact with a majority falls back to Safe at once; SetDead
// takes those out of contact long enough that they have surely cut, and
// reclaims their shares at once. The coordinator (region/globalshare)
// times both; missing reports remain the fallback.
//
// # Quotas
//
// Global daily quotas use a grow-only counter per key and window
// (QuotaCounter): one monotone component per region; a region admits while
// its own count plus the last known counts of the others stay under the
// limit. Overshoot is bounded by what the other regions admit during one
// report delay.
package share
