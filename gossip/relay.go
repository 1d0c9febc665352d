package gossip

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/sluice-rl/sluice/coordinator"
	"golang.org/x/sync/errgroup"
)

// What crosses regions goes through one node per region (package
// coordinator's Relay and RelayOrder): a report, a borrow request or a
// loan to the borrower is sent once per other region, flagged for relay
// (envelope.Relay), and its receiver sends the same message, unflagged,
// to the other live nodes of its region. A region is sent to node by node,
// unflagged, as before relays, while any of its live nodes does not
// advertise nodeMeta.Relays (a rolling upgrade from an older build); every
// node delivers a direct message as it always did.

// forwardQueue bounds the relayed messages waiting to be sent on; a full
// queue drops (ReasonRelayFull): the region's other nodes miss that
// message, as they would a lost one.
const forwardQueue = 64

// ReasonRelayFull labels sluice_gossip_dropped_total for a relayed message
// this node could not send on because its forward queue was full.
const ReasonRelayFull = "relay_full"

// forward is a message to send on inside this region.
type forward struct {
	kind Kind
	b    []byte
}

// forwardLoop sends relayed messages on to this region's other live
// nodes, one message at a time, until ctx ends.
func (n *Node) forwardLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case f := <-n.fwd:
			n.forwardOne(ctx, f)
		}
	}
}

// forwardTries bounds how often a relayed message is sent to a node of
// this region that did not take it: the relay is the only way the message
// reaches that node, so one failed send (a dial timing out on a loaded
// host) would cost the node the whole round, while a node that is really
// gone costs at most this many timeouts per message until membership
// declares it dead.
const forwardTries = 2

// forwardOne sends f to this region's other live nodes, and once more to
// those whose send failed that membership still holds live.
func (n *Node) forwardOne(ctx context.Context, f forward) {
	var failed []string
	for try := range forwardTries {
		var targets []Member
		for _, m := range n.Members() {
			if m.Node != n.cfg.Node && m.Region == n.cfg.Region && m.State.Live() && (try == 0 || slices.Contains(failed, m.Node)) {
				targets = append(targets, m)
			}
		}
		var err error
		failed, err = n.sendEach(ctx, f.b, f.kind, pathRelay, targets)
		if err == nil || ctx.Err() != nil {
			return
		}
		n.cfg.Logger.Debug("gossip: relay inside region", "kind", f.kind.String(), "try", try+1, "err", err)
	}
}

// sendAcross sends payload to every other region accepted by to: through
// its relay when every live node of the region relays, falling back to the
// next node of coordinator.RelayOrder when a send fails (sendRelay), and to
// each of its live nodes otherwise. It returns once every send has finished.
func (n *Node) sendAcross(ctx context.Context, payload any, kind Kind, to func(region string) bool) error {
	direct, relayed, err := encode(n.cfg.Node, n.cfg.Region, payload, true)
	if err != nil {
		return err
	}
	if len(direct) > n.cfg.MaxMessageSize {
		n.metrics.sendErrors.WithLabelValues(kind.String()).Inc()
		return fmt.Errorf("gossip: %s message is %d bytes > MaxMessageSize %d", kind, len(direct), n.cfg.MaxMessageSize)
	}
	members := n.Members()
	byNode := map[string]Member{}
	regions := map[string]bool{}
	for _, m := range members {
		byNode[m.Node] = m
		if m.Region != "" && m.Region != n.cfg.Region && m.State.Live() && to(m.Region) {
			regions[m.Region] = true
		}
	}
	g, _ := errgroup.WithContext(ctx)
	for _, r := range sortedRegions(regions) {
		order := coordinator.RelayOrder(members, r)
		if !relaysAll(order, byNode) {
			var targets []Member
			for _, name := range order {
				targets = append(targets, byNode[name])
			}
			g.Go(func() error { return n.sendTo(ctx, direct, kind, pathReliable, targets) })
			continue
		}
		g.Go(func() error { return n.sendRelay(ctx, relayed, kind, r, order, byNode) })
	}
	return g.Wait()
}

// relayTries bounds how many nodes of a region one send tries in turn: a
// send to a node whose host is gone waits memberlist's TCP timeout, so a
// region cut off costs at most this many timeouts per message (until
// membership declares its nodes dead and nothing is sent), not one per
// node.
const relayTries = 2

// sendRelay sends b to the first of the first relayTries nodes of order
// that takes it, and notes which node that was for region r.
func (n *Node) sendRelay(ctx context.Context, b []byte, kind Kind, r string, order []string, byNode map[string]Member) error {
	var errs []error
	for _, name := range order[:min(len(order), relayTries)] {
		err := n.sendOne(ctx, b, kind, pathReliable, byNode[name])
		if err == nil {
			n.noteRelay(r, name)
			return nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return fmt.Errorf("gossip: no relay of region %q took the %s: %w", r, kind, errors.Join(errs...))
}

// noteRelay records that region r's messages go through node now and
// counts a change of relay (sluice_gossip_relay_changes_total): the relay
// died or left and the next node took over, or membership changed it.
func (n *Node) noteRelay(r, node string) {
	n.relayMu.Lock()
	last, seen := n.relayVia[r]
	n.relayVia[r] = node
	n.relayMu.Unlock()
	if seen && last != node {
		n.metrics.relayChanges.WithLabelValues(r).Inc()
		n.cfg.Logger.Info("gossip: relay changed", "region", r, "from", last, "to", node)
	}
}

// relaysAll reports whether every node of order advertises Relays.
func relaysAll(order []string, byNode map[string]Member) bool {
	for _, name := range order {
		if !byNode[name].Relays {
			return false
		}
	}
	return len(order) > 0
}

func sortedRegions(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for r := range m {
		out = append(out, r)
	}
	slices.Sort(out)
	return out
}
