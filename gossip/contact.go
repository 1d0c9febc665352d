package gossip

import (
	"context"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/sluice-rl/sluice/coordinator"
	"github.com/sluice-rl/sluice/coordinator/msg"
)

// Contact pings. Every Config.ContactEvery a node pings the nodes of the
// other regions it watches (coordinator.PingTargets) and records, per
// node, the send time of the last answered ping (Member.Contact) and of
// the last one unanswered within the probe timeout (Member.Unanswered).
// The coordinator reads a region as out of contact only when its pings go
// unanswered, and reclaims its share after a hold.
//
// The pings are the node's own (KindPing over memberlist's packet path,
// through the same transport as the failure detector, faults included)
// rather than memberlist's Ping, because memberlist's drops an answer
// that comes after the probe timeout: a region whose daemons are starved
// of CPU answers, late, and through memberlist's Ping it looks exactly
// like a region cut off. Here an answer counts as contact however late it
// comes (up to Config.lateAnswers), so a slow region stays in contact and
// only one that does not answer at all looks cut off. A node of an older
// build, which does not advertise nodeMeta.Pings, is pinged through
// memberlist's Ping as before.

// pingBook is the bookkeeping of a node's own contact pings: pure, with
// time passed in, under Node.mu.
type pingBook struct {
	next    uint64
	pending map[uint64]pendingPing
	timeout time.Duration // after it an unanswered ping counts as Unanswered
	keep    time.Duration // until then an answer still counts as contact
}

// pendingPing is one ping sent and not answered yet.
type pendingPing struct {
	node    string
	sent    time.Time // on Config.Now: what Contact and Unanswered record
	at      time.Time // on the monotonic clock: when it times out
	givenUp bool      // counted as unanswered already
}

func newPingBook(timeout, keep time.Duration) pingBook {
	// A random start makes the answer to a ping hard to guess by anyone
	// who cannot read the pings (memberlist's encryption is the real
	// protection; an answer must also come from the node pinged).
	return pingBook{next: rand.Uint64(), pending: map[uint64]pendingPing{}, timeout: timeout, keep: max(keep, timeout)}
}

// send records a ping to node sent at sent (Config.Now) and at (the
// monotonic clock) and returns its sequence number.
func (b *pingBook) send(node string, sent, at time.Time) uint64 {
	b.next++
	b.pending[b.next] = pendingPing{node: node, sent: sent, at: at}
	return b.next
}

// forget drops the ping seq (it could not be sent).
func (b *pingBook) forget(seq uint64) { delete(b.pending, seq) }

// answer takes the answer to ping seq from node from: the ping, whether
// it had been given up already (a late answer), and whether seq was a
// ping to from still kept.
func (b *pingBook) answer(from string, seq uint64) (p pendingPing, ok bool) {
	p, ok = b.pending[seq]
	if !ok || p.node != from {
		return pendingPing{}, false
	}
	delete(b.pending, seq)
	return p, true
}

// expire gives up the pings unanswered for timeout at now (returning them)
// and forgets those unanswered for keep.
func (b *pingBook) expire(now time.Time) (givenUp []pendingPing) {
	for seq, p := range b.pending {
		age := now.Sub(p.at)
		if age >= b.keep {
			delete(b.pending, seq)
		}
		if age >= b.timeout && !p.givenUp {
			givenUp = append(givenUp, p)
			if age < b.keep {
				p.givenUp = true
				b.pending[seq] = p
			}
		}
	}
	return givenUp
}

// ContactLag bounds how old a member's Contact may be while its answers
// come within the probe timeout: the ping period (Config.ContactEvery)
// plus the probe timeout. An answer that comes later still counts, with
// its ping's send time.
func (n *Node) ContactLag() time.Duration { return n.cfg.ContactEvery + n.pingTimeout }

// contactLoop pings coordinator.PingsPerRegion nodes of each other region
// each Config.ContactEvery (coordinator.PingTargets), a node whose last
// ping is neither answered nor given up excepted, so at most one ping per
// node waits for its answer within the probe timeout. Pings to nodes of
// an older build run on goroutines of wg; all stop with ctx.
func (n *Node) contactLoop(ctx context.Context, wg *sync.WaitGroup) {
	t := time.NewTicker(n.cfg.ContactEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n.expirePings(time.Now())
		for _, m := range n.pingTargets() {
			if m.pings {
				n.sendPing(m)
				continue
			}
			addr, err := net.ResolveUDPAddr("udp", m.Addr)
			if err != nil {
				n.donePing(m.Node, time.Time{}, false)
				continue
			}
			wg.Go(func() {
				sent := n.cfg.Now()
				_, err := n.ml.Ping(m.Node, addr)
				if ctx.Err() != nil {
					sent = time.Time{} // stopped, not unanswered
				}
				n.donePing(m.Node, sent, err == nil)
			})
		}
	}
}

// pingTargets returns the members of other regions to ping now,
// coordinator.PingsPerRegion of each region as coordinator.PingTargets
// picks them (none with a ping in flight), marking them in flight.
func (n *Node) pingTargets() []member {
	if n.down.Load() {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	all := make([]Member, 0, len(n.members))
	for _, m := range n.members {
		all = append(all, m.Member)
	}
	names := coordinator.PingTargets(all, n.cfg.Node, n.cfg.Region, func(node string) bool { return n.pinging[node] })
	out := make([]member, 0, len(names))
	for _, name := range names {
		n.pinging[name] = true
		out = append(out, n.members[name])
	}
	return out
}

// sendPing sends member m a contact ping of this node's own.
func (n *Node) sendPing(m member) {
	n.mu.Lock()
	seq := n.book.send(m.Node, n.cfg.Now(), time.Now())
	n.mu.Unlock()
	b, err := Encode(n.cfg.Node, n.cfg.Region, msg.Ping{Seq: seq, Addr: n.addr})
	if err == nil {
		err = n.sendPacket(m.Member, b)
	}
	if err != nil {
		n.mu.Lock()
		n.book.forget(seq)
		n.mu.Unlock()
		n.donePing(m.Node, time.Time{}, false)
	}
}

// sendPacket sends b to t over memberlist's packet path (one UDP packet,
// best effort), to the address in this node's member table.
func (n *Node) sendPacket(t Member, b []byte) error {
	mn, err := mlNode(t)
	if err != nil {
		return err
	}
	return n.ml.SendBestEffort(mn, b)
}

// mlNode is the memberlist.Node of t, built from this node's member table:
// the *Node values memberlist returns are mutated by its goroutines
// without a lock we can take.
func mlNode(t Member) (*memberlist.Node, error) {
	host, port, err := net.SplitHostPort(t.Addr)
	p, perr := strconv.ParseUint(port, 10, 16)
	if err != nil || perr != nil {
		return nil, &net.AddrError{Err: "bad member address", Addr: t.Addr}
	}
	return &memberlist.Node{Name: t.Node, Addr: net.ParseIP(host), Port: uint16(p)}, nil
}

// expirePings gives up the own pings unanswered for the probe timeout at
// now: each is its node's Unanswered, and the node may be pinged again.
func (n *Node) expirePings(now time.Time) {
	n.mu.Lock()
	givenUp := n.book.expire(now)
	for _, p := range givenUp {
		delete(n.pinging, p.node)
		if p.sent.After(n.failed[p.node]) {
			n.failed[p.node] = p.sent
		}
	}
	n.mu.Unlock()
	n.metrics.pings.WithLabelValues(pingUnanswered).Add(float64(len(givenUp)))
}

// onPing answers a contact ping, or records the answer to one of this
// node's: its ping's send time is the node's Contact whenever it comes.
// Called on the decode goroutine, for a message checkSender admitted.
func (n *Node) onPing(m Message) {
	n.mu.Lock()
	if !m.Ping.Ack {
		to, known := n.members[m.From]
		if known {
			n.pingedBy[m.From] = true
		} else {
			to.Member = Member{Node: m.From, Addr: m.Ping.Addr} // checkSender admits it only with one
		}
		n.mu.Unlock()
		b, err := Encode(n.cfg.Node, n.cfg.Region, msg.Ping{Seq: m.Ping.Seq, Ack: true})
		if err == nil {
			err = n.sendPacket(to.Member, b)
		}
		if err != nil {
			n.metrics.sendErrors.WithLabelValues(KindPing.String()).Inc()
		}
		return
	}
	p, ok := n.book.answer(m.From, m.Ping.Seq)
	if ok {
		if !p.givenUp {
			delete(n.pinging, p.node)
		}
		if p.sent.After(n.contact[p.node]) {
			n.contact[p.node] = p.sent
		}
	}
	n.mu.Unlock()
	switch {
	case !ok:
		n.metrics.pings.WithLabelValues(pingStale).Inc()
	case p.givenUp:
		n.metrics.pings.WithLabelValues(pingLate).Inc()
	default:
		n.metrics.pings.WithLabelValues(pingAnswered).Inc()
	}
}

// Results of sluice_gossip_contact_pings_total. A late answer is one to a
// ping already counted unanswered; a stale one is to a ping no longer
// kept (older than Config.lateAnswers) or not sent to its sender.
const (
	pingAnswered   = "answered"
	pingUnanswered = "unanswered"
	pingLate       = "late"
	pingStale      = "stale"
)

// donePing records the end of a ping through memberlist's Ping to node
// sent at sent (zero: none was sent).
func (n *Node) donePing(node string, sent time.Time, answered bool) {
	n.mu.Lock()
	delete(n.pinging, node)
	to := n.failed
	if answered {
		to = n.contact
	}
	if !sent.IsZero() && sent.After(to[node]) {
		to[node] = sent
	}
	n.mu.Unlock()
	if !sent.IsZero() {
		result := pingUnanswered
		if answered {
			result = pingAnswered
		}
		n.metrics.pings.WithLabelValues(result).Inc()
	}
}

// Unconfirmed says whether other regions can confirm contact with this
// node yet. joined is false until a seed has answered or, without seeds,
// until another node is known (a seedless node restarted is found by the
// others' gossip). waiting lists the live nodes of other regions that
// watch this one (coordinator.PingTargets from their side) and send
// contact pings of their own, from which none has arrived since this node
// started. A daemon that waits for both before it calls itself ready keeps
// the other regions in contact with its region through a roll that
// restarts its daemons one after the other.
func (n *Node) Unconfirmed() (joined bool, waiting []string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	all := make([]Member, 0, len(n.members))
	for _, m := range n.members {
		all = append(all, m.Member)
	}
	return unconfirmed(all, n.pingsFrom(), n.pingedBy, n.cfg.Node, n.cfg.Region, n.joined.Load(), len(n.cfg.Join) > 0)
}

// pingsFrom returns the members that send contact pings of their own.
// Called with n.mu held.
func (n *Node) pingsFrom() map[string]bool {
	out := map[string]bool{}
	for name, m := range n.members {
		if m.pings {
			out[name] = true
		}
	}
	return out
}

// unconfirmed is Unconfirmed on a member list: pings says which members
// send contact pings of their own, pingedBy which have pinged self since
// it started; seeded whether self has seeds and seedAnswered whether one
// answered.
func unconfirmed(members []Member, pings, pingedBy map[string]bool, self, region string, seedAnswered, seeded bool) (joined bool, waiting []string) {
	others := false
	for _, m := range members {
		others = others || (m.Node != self && m.State.Live())
	}
	if !seedAnswered || (!seeded && !others) {
		return false, nil
	}
	for _, m := range members {
		if m.Region == region || m.State != StateAlive || !pings[m.Node] || pingedBy[m.Node] {
			continue
		}
		if slices.Contains(coordinator.PingTargets(members, m.Node, m.Region, nil), self) {
			waiting = append(waiting, m.Node)
		}
	}
	slices.Sort(waiting)
	return true, waiting
}
