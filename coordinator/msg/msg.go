// Package msg holds the messages the share coordinator exchanges between
// daemons, and the membership it reads, as plain values: what etcd's raftpb
// is to its raft. It knows no transport: the gossip package encodes and
// decodes these types (its wire format is their msgpack form, with the
// short keys of the struct tags), checks their size, shape and sender, and
// the coordinator checks what they mean.
//
// The payloads that the allocation itself defines (share.Report,
// share.BorrowRequest, share.Loan, share.QuotaCounter) stay in package
// share; this package adds the node-level usage, the envelope (Message)
// and the membership (Member).
package msg

import (
	"fmt"
	"time"

	"github.com/sluice-rl/sluice/share"
)

// Kind says what a message carries.
type Kind uint8

// Message kinds. The values are on the wire.
const (
	// KindReport carries a share.Report: one region's report for an epoch.
	KindReport Kind = 1
	// KindNodeUsage carries a NodeUsage: one node's raw usage for an epoch,
	// sent to the other nodes of its region, which sum them into the
	// regional view.
	KindNodeUsage Kind = 2
	// KindPolicy carries a PolicyUpdate: the policy set, newest version
	// wins. The coordinator ignores it.
	KindPolicy Kind = 3
	// KindBorrow carries a share.BorrowRequest: a region asking the other
	// regions for part of their unused share of one key (share.Allocator.Borrow).
	KindBorrow Kind = 4
	// KindLoan carries a share.Loan: a lender region's answer, sent to the
	// borrower region's nodes and to the lender region's other nodes, which
	// must cut as their region's acting node already has.
	KindLoan Kind = 5
	// KindPing carries a Ping: a contact ping between nodes of two regions,
	// or its answer. It is the transport's own (gossip answers it and turns
	// the answers into Member.Contact); the coordinator never sees one.
	KindPing Kind = 6
)

func (k Kind) String() string {
	switch k {
	case KindReport:
		return "report"
	case KindNodeUsage:
		return "node_usage"
	case KindPolicy:
		return "policy"
	case KindBorrow:
		return "borrow"
	case KindLoan:
		return "loan"
	case KindPing:
		return "ping"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// NodeUsage is what one node measured over one epoch, in units per second,
// for the keys that may be under pressure in its region. The nodes of a
// region sum their NodeUsage into one regional share.Report.
type NodeUsage struct {
	Node   string     `msgpack:"n"`
	Region string     `msgpack:"r"`
	Epoch  uint64     `msgpack:"e"`
	Keys   []KeyUsage `msgpack:"k"`
	// Quotas are this node's own spend on global quotas in their current
	// window: G-counters with one component, named by the node. Counts are
	// cumulative over the window, so a lost or late message is made good by
	// the next one. Added in wire version 1 without a bump: older nodes
	// ignore the field.
	Quotas []share.QuotaCounter `msgpack:"q,omitempty"`
}

// KeyUsage is one key of a NodeUsage (share.Usage with short wire names).
type KeyUsage struct {
	share.Key
	Limit    float64 `msgpack:"l"` // L_global, units per second
	Offered  float64 `msgpack:"o"` // units per second over the interval, rejected included
	Recent   float64 `msgpack:"x"` // units per second over the last share.Config.Recent
	Admitted float64 `msgpack:"a"` // units per second over the interval
}

// PolicyUpdate carries an opaque policy set and its version; receivers keep
// the newest version they have seen.
type PolicyUpdate struct {
	Version uint64 `msgpack:"v"`
	Data    []byte `msgpack:"d"`
}

// Message is one received message.
type Message struct {
	Version uint8 // envelope version it arrived with
	Kind    Kind
	From    string // sending node
	Region  string // sending node's region
	Size    int    // encoded size in bytes

	Report share.Report        // KindReport
	Usage  NodeUsage           // KindNodeUsage
	Policy PolicyUpdate        // KindPolicy
	Borrow share.BorrowRequest // KindBorrow
	Loan   share.Loan          // KindLoan
	Ping   Ping                // KindPing
}

// Ping is a contact ping (Ack false) or its answer (Ack true, the ping's
// Seq): whenever the answer arrives, the member answered the ping sent
// with that Seq, however late.
type Ping struct {
	Seq uint64 `msgpack:"s"`
	Ack bool   `msgpack:"a,omitempty"`
	// Addr is where the pinger is reached (host:port), so that a node that
	// does not know it yet (restarted, its membership still partial) can
	// answer, as memberlist answers its own pings at their source address.
	Addr string `msgpack:"d,omitempty"`
}

// State is a member's state as a node sees it.
type State string

// Member states.
const (
	StateAlive   State = "alive"
	StateSuspect State = "suspect"
	StateDead    State = "dead"
	StateLeft    State = "left"
)

// Live reports whether a member in state s still counts: alive or suspect.
func (s State) Live() bool { return s == StateAlive || s == StateSuspect }

// Member is one node of the cluster as the membership layer sees it.
type Member struct {
	Node   string `json:"node"`
	Region string `json:"region"`
	Addr   string `json:"addr"` // host:port
	State  State  `json:"state"`
	// PolicyRevision and PolicyHash are the policy set the node advertises;
	// zero and empty until it does.
	PolicyRevision uint64 `json:"policy_revision,omitempty"`
	PolicyHash     string `json:"policy_hash,omitempty"`
	// Relays is set when the node advertises that it forwards messages
	// sent to it as its region's relay to the region's other nodes (see
	// coordinator.Relay); a node of an older build does not, and a region
	// with such a node is sent to node by node.
	Relays bool `json:"relays,omitempty"`

	// Contact is when this node last sent a ping to the member that was
	// answered (on this node's clock), however late the answer came: the
	// member was reachable at some instant after it. Zero until one is.
	// Only members of other regions are pinged.
	Contact time.Time `json:"contact,omitzero"`
	// Unanswered is when this node last sent the member a ping that went
	// unanswered within the ping timeout (zero if none): when it is later
	// than Contact, fresh evidence that the member is out of reach, rather
	// than this node having been too busy to ask. A late answer to that
	// ping moves Contact up to it, and the evidence is gone.
	Unanswered time.Time `json:"unanswered,omitzero"`
}
