// Package coordinator is the share coordinator that runs in every daemon,
// as a library: Core turns the engine's usage into this region's
// share.Report each interval, exchanges reports (as messages of package
// msg), rebalances with share.Allocator and publishes the resulting
// shares for the check path. It holds no goroutine, timer, socket or
// clock: its owner ticks it with the time, this node's drained usage and
// the membership it sees, steps it with every message received, and does
// what each Ready asks. The daemon's owner is region/globalshare, over
// real timers and gossip; the simulator drives one Core per region over
// a simulated network.
//
// Per epoch boundary t (share.Config.Epoch; the figures describe the
// interval that just ended, epoch e = Epoch(t)−1):
//
//	t − Recent          drain usage (the first part of the interval)
//	t                   drain usage again (the last Recent: the "recent" rate);
//	                    send this node's pressured keys to the region's other nodes
//	t + Collect         sum the region's node usage, Allocator.Report; the
//	                    region's publisher (its live node with the smallest id)
//	                    broadcasts the regional report
//	t + Settle          SetMembers from gossip, Rebalance with the reports of e,
//	                    publish Table (cuts at once)
//	t + Settle + Raise  publish Table again (raises)
//
// Every node of a region sums the same node usage and so computes the same
// regional report and the same shares; only one of them sends it. The
// regional view is built by summing node reports rather than through the
// regional Redis: see the gossip package documentation for why.
//
// The core is split by concern, a file each: epochs and reports
// (epochs.go), contact with the other regions (contact.go), the shares
// published to the check path (shares.go), borrowing between rebalances
// (borrow.go), token pooling of slow keys (pool.go), global quotas as
// G-counters (quota.go), and the validation of received messages
// (validate.go), the one place where the core decides whether a message
// is one it can use.
//
// With saved shares (Core.Start), a node starting restores them when they
// are at most PartitionIntervals epochs old: the other regions hold a
// silent region's last shares that long, so until its first rebalance a
// restarted region enforces the shares the others still reserve for it
// instead of 1/n.
package coordinator
