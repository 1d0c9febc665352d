package gossip

import (
	"fmt"
	"math"
	"time"
)

// clockCheck bounds the two values this node keys its duplicate
// suppression on: a region's report epoch (noteReport) and a policy
// revision (notePolicy). One from the far future would make every later
// genuine one look seen before, so neither may be ahead of this node's
// clock by more than the tolerance. Everything else a message says about
// time (how old an epoch may be, borrow and loan generations, quota
// windows) is the coordinator's to judge: its Step validates and counts
// what it refuses. Epochs are share.Config.Epoch: Unix time divided by the
// report interval; policy revisions are hybrid logical clocks with
// milliseconds since the Unix epoch in their high 48 bits (see
// PolicyUpdate).
type clockCheck struct {
	now       time.Time
	interval  time.Duration
	tolerance time.Duration
}

// epochs is the tolerance in whole epochs: the clock tolerance rounded up,
// plus the epoch in progress.
func (c clockCheck) epochs() uint64 {
	return uint64((c.tolerance+c.interval-1)/c.interval) + 1
}

func (c clockCheck) nowEpoch() uint64 {
	ns := c.now.UnixNano()
	if ns < 0 {
		return 0
	}
	return uint64(ns / int64(c.interval))
}

// reportEpoch rejects a report epoch more than the tolerance ahead of now.
func (c clockCheck) reportEpoch(e uint64) error {
	now, tol := c.nowEpoch(), c.epochs()
	if e > now && e-now > tol {
		return decodeErr(ReasonEpoch, fmt.Errorf("report epoch %d is %d epochs ahead of this node's %d", e, e-now, now))
	}
	return nil
}

// revision rejects a policy revision made after now plus the tolerance.
// An old revision is fine: the newest set may be weeks old.
func (c clockCheck) revision(v uint64) error {
	ms := c.now.Add(c.tolerance).UnixMilli()
	if ms < 0 {
		ms = 0
	}
	if limit := uint64(ms); v>>16 > limit {
		return decodeErr(ReasonRevision, fmt.Errorf("policy revision %d is from %s, after this node's clock", v, revisionTime(v)))
	}
	return nil
}

func revisionTime(v uint64) string {
	ms := v >> 16
	if ms > uint64(math.MaxInt64/int64(time.Millisecond)) {
		return "beyond the year 2262"
	}
	return time.UnixMilli(int64(ms)).UTC().Format(time.RFC3339)
}

// check runs the clock check of m's kind, if it has one.
func (c clockCheck) check(m Message) error {
	switch m.Kind {
	case KindReport:
		return c.reportEpoch(m.Report.Epoch)
	case KindPolicy:
		return c.revision(m.Policy.Version)
	}
	return nil
}

// checkSender accepts a message only from a live member whose membership
// metadata names the region the message speaks for, and only a kind that
// region may send to this node (self is this node's region): node usage
// from this region, reports and borrow requests from another, loans from
// the lender's own region or to this one. Policy updates are not bound to
// a region and are relayed and replayed (push/pull) long after their
// author may have left, so they are not checked here. A contact ping, or
// its answer, comes from another region, from a member in any state; a
// ping that says where to answer it, and an answer, from anyone.
func checkSender(m Message, sender Member, known bool, self string) error {
	if m.Kind == KindPolicy {
		return nil
	}
	if m.Kind == KindPing && m.Region != self && ((known && sender.Region == m.Region) || (!known && (m.Ping.Ack || m.Ping.Addr != ""))) {
		// Answered whatever state membership gives the sender, and from a
		// sender not known yet at the address it gives: a node this one
		// takes for dead may be alive and pinging, a node restarted knows
		// few members at first, and an unanswered ping would tell the
		// pinger this region is out of reach. An answer is taken only if
		// it answers a ping sent to its sender (pingBook.answer).
		return nil
	}
	if !known || !sender.State.Live() {
		return decodeErr(ReasonSender, fmt.Errorf("%s from %q, not a live member", m.Kind, m.From))
	}
	if sender.Region != m.Region {
		return decodeErr(ReasonRegion, fmt.Errorf("%s claims region %q, its sender %q is of %q", m.Kind, m.Region, m.From, sender.Region))
	}
	switch m.Kind {
	case KindNodeUsage:
		if m.Region != self {
			return decodeErr(ReasonRegion, fmt.Errorf("node usage of region %q sent to a node of %q", m.Region, self))
		}
	case KindReport, KindBorrow, KindPing:
		if m.Region == self {
			return decodeErr(ReasonRegion, fmt.Errorf("%s of this node's own region %q", m.Kind, self))
		}
	case KindLoan:
		if m.Region != self && m.Loan.Borrower != self {
			return decodeErr(ReasonRegion, fmt.Errorf("loan from %q to %q sent to a node of %q", m.Region, m.Loan.Borrower, self))
		}
	}
	return nil
}
