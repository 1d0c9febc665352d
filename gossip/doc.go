// Package gossip connects the daemons of all regions: membership over
// hashicorp/memberlist and the exchange of usage reports, node usage and
// policy updates in a versioned msgpack wire format.
//
// # Membership
//
// Each daemon runs one memberlist node named by its stable node id (never
// its address), with its region in the node metadata (msgpack, < 40 bytes of
// the 512 allowed). A region is live while any of its nodes is alive or
// suspect (Regions). memberlist's events do not carry a node's state, so
// Node tracks it: join/update → alive, leave → "left" when the node announced
// its departure in its metadata first (Run does on shutdown), "dead"
// otherwise. Timings come from memberlist's presets: "lan" (probe 1 s,
// suspicion 4·log10(N) probe intervals, up to 6× that without
// confirmations), "wan" (probe 5 s, ×6) and "local" (tests: a crashed node is
// declared dead in about 5 s). A node keeps trying dead peers (ReconnectFor)
// and its seeds when alone, so a healed partition merges without an
// operator; for its first rounds it also re-pushes its state to the seeds, so
// a node restarted under the same name on a new port is accepted as soon as
// its old incarnation is dead and DeadNodeReclaim has passed. SecretKey turns
// on memberlist's AES-GCM: nodes with different keys cannot join, and what
// they send is dropped by memberlist and counted here (reason "auth", read
// from memberlist's log).
//
// # Wire format
//
// Every message is an envelope {v, k, n, r, p}: wire version, kind, sending
// node, its region, and the payload as a nested msgpack value. Structs are
// msgpack maps with one-letter keys: an older decoder skips keys it does not
// know and a newer one leaves missing keys zero, so fields are added without
// a version bump and nodes of adjacent builds read each other during a
// rolling upgrade. A version outside [MinWireVersion, WireVersion] is
// rejected, never guessed at.
//
// # Received messages are untrusted
//
// Decode reads messages with a bounded reader rather than msgpack/v5, which
// sizes a slice by its header: every claimed length is checked against the
// bytes left before anything is allocated, and MaxKeys, MaxQuotaCounters,
// MaxCounterComponents, MaxComponents and MaxNameLen cap what one message
// holds, so decoding any message of MaxMessageSize allocates a bounded
// multiple of it (the per-kind fuzz targets). Decode also rejects figures
// that are not finite or out of range and counters that are unsorted or
// could wrap. A node then admits a message only from a live member whose
// metadata names the message's region (checkSender; a message from a node
// not yet in its member table waits up to 2 s for the join to arrive, as
// a node that has just joined may send before every member has heard of
// it), and only with a report epoch and a policy revision no further
// ahead of its clock than Config.ClockTolerance (clockCheck: the two keys
// of its duplicate suppression). Anything else is rejected whole, never
// applied nor relayed, counted in sluice_gossip_rejected_total{reason} and logged at
// most once a second per reason with the sending node's name. Decode never
// panics.
//
// # Delivery
//
// memberlist calls NotifyMsg on its packet and stream loops, so the
// delegate copies the bytes onto a bounded queue (Config.QueueSize) and
// returns; a full queue drops and counts ("queue_full"), never blocks
// memberlist. One goroutine decodes and hands messages to the handlers.
//
// Regional reports and node usage go to their target nodes (reports to
// each other region's relay, see Relays) over memberlist's reliable path (SendReliable: one TCP stream per node, AES-GCM
// when keyed, up to memberlist's 20 MiB user-message limit; MaxMessageSize
// caps ours at 16 MiB and a larger message is an error, never truncated).
// They do not use the gossip queue (TransmitLimitedQueue): memberlist hands a
// queued user message to only RetransmitMult·⌈log10(N+1)⌉ random nodes and
// never relays it, and a report must reach every node of the other regions
// before the settle deadline of its epoch; with 4 nodes the queue lost
// reports in tests. Policy updates, which are small, rare and only need to
// converge, go through the queue when they fit in a packet
// (MaxPacketPayload = 1024 bytes, under the 1400-byte UDP buffer less
// framing and encryption): each receiver relays a version on first sight,
// as serf does with user events, and the newest version also travels in
// push/pull state, so a node that (re)joins catches up. Larger policy sets go
// over the reliable path to every node.
//
// # Relays
//
// What crosses regions (reports, borrow requests, loans to the borrower)
// goes once to each other region, to its relay (coordinator.RelayOrder: the
// region's alive nodes by name, then its suspected ones; the first that
// takes the send), flagged for relay; the relay sends the same message
// unflagged, byte for byte a direct one, to its region's other live nodes
// from one goroutine with a bounded queue (ReasonRelayFull when full), and
// only on first delivery. A send to a relay that fails goes to the next
// node at once; sluice_gossip_relay_changes_total{region} counts the
// changes. A node advertises relaying in its metadata; a region with a
// live node that does not (an older build) is sent to node by node, as
// before, and every node still delivers direct messages. Contact pings go
// to coordinator.PingsPerRegion nodes of each other region per round
// (coordinator.PingTargets), counted in sluice_gossip_contact_pings_total.
// What a node sends and is sent across regions then depends on the number
// of regions, not of nodes; the relay's copies inside its region grow with
// its region's nodes, as node usage does.
//
// Borrow requests (share.BorrowRequest, KindBorrow) go to every node of the
// other regions and loans (share.Loan, KindLoan) to the lender's other nodes
// first, then to the borrower region's nodes (SendLoan), both over the
// reliable path: they are about 100 bytes, but a lost loan wastes the
// lender's cut until the next rebalance. Their layouts carry their own
// version (share.BorrowVersion); an unknown one is dropped ("version"), and
// a request or loan whose region does not match its sender, without a key,
// or with an amount that is not a finite positive fraction is dropped
// ("invalid"). Duplicates are harmless: share applies a loan once.
//
// # One regional view
//
// Several daemons serve a region, and the region's demand for a key must be
// counted once. We sum node reports rather than aggregate through the
// regional Redis:
//
//   - It works with every store: the embedded memory store, Redis and Redis
//     Cluster, with no extra Redis calls on the check path or per interval
//     (aggregating in Redis means an INCRBY per key per node per interval
//     and a read of every pressured key by one node, O(keys) round trips to
//     a store that is also serving checks).
//   - The allocation needs the offered rate over the interval and over the
//     last Recent seconds, rejected requests included; the engine's buckets
//     in Redis keep neither.
//   - The exchange does not depend on the regional Redis being up, so a
//     degraded store does not also freeze the shares.
//
// The cost: each node sends its pressured keys to the other nodes of its
// region once per interval (LAN traffic), and a node's usage that arrives
// after the collect deadline is missed for that epoch (one interval of
// under-count for that node). Every node of a region sums the same node
// usage, so all compute the same regional report and shares; only the
// region's publisher (its live node with the smallest id) sends the report to
// the other regions. A node lists a key when it is coordinated or when the
// node alone offers more than Pressure·share·L/(2m) (m nodes in the region):
// if the region's total crosses the pressure threshold, some node is above
// threshold/m.
//
// # Size and bandwidth
//
// Measured by TestKeyReportSize (policy name of 10 bytes, subject of 20,
// float64 figures): one KeyReport is 97 bytes of msgpack; the envelope and
// report header are 51 bytes. A report of k pressured keys is 51 + 97·k
// bytes: 1 000 keys ≈ 97 KB, 5 000 keys ≈ 485 KB (sent over TCP, never
// truncated), and the 16 MiB cap holds about 170 000 keys.
//
// With 20 million active keys an hour, only pressured keys are listed (a
// region offering more than half its share); keys nobody reports run at
// L_global/n and cost nothing. At a 10 s interval, per region publisher,
// which sends one report to each other region's relay:
//
//	pressured keys k   report     to 1 region   to 4 other regions
//	  1 000 (0.005%)    97 KB      9.7 KB/s      39 KB/s  (0.3 Mbit/s)
//	 10 000 (0.05%)    970 KB       97 KB/s     390 KB/s  (3.1 Mbit/s)
//	100 000 (0.5%)     9.7 MB      970 KB/s     3.9 MB/s  (31 Mbit/s)
//
// and each node receives (R−1) reports per interval: 5 regions with 10 000
// pressured keys each is 390 KB/s inbound per node, over the LAN from its
// relay except at the relay itself, which also sends them on to its
// region's m−1 other nodes ((m−1)·390 KB/s on the LAN). memberlist's
// compression (on by default) shrinks the repeated policy names and
// subject prefixes further.
package gossip
