package gossip

import (
	"fmt"
	"math"
	"time"

	"github.com/sluice-rl/sluice/share"
)

// clockCheck judges the times a decoded message carries against the
// receiver's clock. Epochs are share.Config.Epoch: Unix time divided by
// the report interval; quota windows are share.WindowIndex of their
// policy's window; policy revisions are hybrid logical clocks with
// milliseconds since the Unix epoch in their high 48 bits (see
// PolicyUpdate).
type clockCheck struct {
	now         time.Time
	interval    time.Duration
	tolerance   time.Duration
	quotaWindow func(policy string) (time.Duration, bool)
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

// epoch accepts e within the tolerance either side of now; past only
// bounds how old an epoch may be (a borrow or loan generation may be a few
// intervals old, a report may not).
func (c clockCheck) epoch(what string, e uint64, past bool) error {
	now, tol := c.nowEpoch(), c.epochs()
	if e > now && e-now > tol {
		return decodeErr(ReasonEpoch, fmt.Errorf("%s epoch %d is %d epochs ahead of this node's %d", what, e, e-now, now))
	}
	if past && e < now && now-e > tol {
		return decodeErr(ReasonEpoch, fmt.Errorf("%s epoch %d is %d epochs behind this node's %d", what, e, now-e, now))
	}
	return nil
}

// quotas rejects a counter of a window that has not begun by now plus the
// tolerance. Older windows are harmless: a merge ignores them.
func (c clockCheck) quotas(qs []share.QuotaCounter) error {
	if c.quotaWindow == nil {
		return nil
	}
	for _, q := range qs {
		win, ok := c.quotaWindow(q.Policy)
		if !ok || win <= 0 {
			continue
		}
		if latest := share.WindowIndex(c.now.Add(c.tolerance), win); q.Window > latest {
			return decodeErr(ReasonEpoch, fmt.Errorf("quota counter %s/%s: window %d is after this node's %d", q.Policy, q.Subject, q.Window, latest))
		}
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

// check runs the clock checks of m's kind.
func (c clockCheck) check(m Message) error {
	switch m.Kind {
	case KindReport:
		if err := c.epoch("report", m.Report.Epoch, true); err != nil {
			return err
		}
		return c.quotas(m.Report.Quotas)
	case KindNodeUsage:
		if err := c.epoch("node usage", m.Usage.Epoch, true); err != nil {
			return err
		}
		return c.quotas(m.Usage.Quotas)
	case KindPolicy:
		return c.revision(m.Policy.Version)
	case KindBorrow:
		return c.epoch("borrow request", m.Borrow.Epoch, false)
	case KindLoan:
		return c.epoch("loan", m.Loan.Epoch, false)
	}
	return nil
}

// checkSender accepts a message only from a live member whose membership
// metadata names the region the message speaks for, and only a kind that
// region may send to this node (self is this node's region): node usage
// from this region, reports and borrow requests from another, loans from
// the lender's own region or to this one. Policy updates are not bound to
// a region and are relayed and replayed (push/pull) long after their
// author may have left, so they are not checked here.
func checkSender(m Message, sender Member, known bool, self string) error {
	if m.Kind == KindPolicy {
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
	case KindReport, KindBorrow:
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
