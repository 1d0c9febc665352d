package coordinator

import (
	"math"
	"time"

	"github.com/sluice-rl/sluice/coordinator/msg"
	"github.com/sluice-rl/sluice/share"
)

// Validation of received messages: the one place where the core decides
// whether a message that the transport decoded is one it can use.

// Reasons a Step refuses a message: it is counted and never applied.
const (
	// DropRegion: the message names a region neither membership nor the
	// allocation knows.
	DropRegion = "unknown_region"
	// DropEpoch: its epoch is in the future or more than maxAge epochs old,
	// or it carries a quota counter of a window that has not begun.
	DropEpoch = "epoch"
	// DropNumber: a rate, share, amount or limit that is NaN, infinite or
	// negative, a borrow request or loan of nothing or of more than the
	// whole limit, or a loan handing over more tokens than its cut frees.
	DropNumber = "number"
	// DropMalformed: a field that must be set is empty.
	DropMalformed = "malformed"
	// DropExpired: a borrow request or loan of a generation this region
	// has already rebalanced past; its loan expired with it.
	DropExpired = "expired"
)

// The core's two epoch windows, both here: a message is used at all only
// within maxAge epochs of now (validate; its quota counts are merged
// whatever its age), and a report or node usage is filed for a rebalance
// only within fresh.

// maxAge is how many epochs old a message may be and still be used (its
// quota counts; reports and node usage are filed only within fresh).
const maxAge = 16

// fresh bounds what is filed: epochs around the current one only.
func (c *Core) fresh(now time.Time, epoch uint64) bool {
	cur := c.cfg.Share.Epoch(now)
	return epoch+3 >= cur && epoch <= cur+1
}

// validate returns why m cannot be used, or "".
func (c *Core) validate(now time.Time, m msg.Message) string {
	finite := func(vs ...float64) bool {
		for _, v := range vs {
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				return false
			}
		}
		return true
	}
	epochOK := func(e uint64) bool {
		cur := c.cfg.Share.Epoch(now)
		return e <= cur+1 && e+maxAge >= cur
	}
	switch m.Kind {
	case msg.KindReport:
		r := m.Report
		switch {
		case r.Region == "":
			return DropMalformed
		case !c.knownRegion(r.Region):
			return DropRegion
		case !epochOK(r.Epoch), !c.windowsBegun(now, r.Quotas):
			return DropEpoch
		}
		for _, k := range r.Keys {
			if !finite(k.Limit, k.Offered, k.Recent, k.Demand, k.Admitted, k.Share) {
				return DropNumber
			}
		}
	case msg.KindNodeUsage:
		u := m.Usage
		switch {
		case u.Region == "" || u.Node == "":
			return DropMalformed
		case !c.knownRegion(u.Region):
			return DropRegion
		case !epochOK(u.Epoch), !c.windowsBegun(now, u.Quotas):
			return DropEpoch
		}
		for _, k := range u.Keys {
			if !finite(k.Limit, k.Offered, k.Recent, k.Admitted) {
				return DropNumber
			}
		}
	case msg.KindBorrow:
		r := m.Borrow
		switch {
		case r.Region == "" || r.Policy == "":
			return DropMalformed
		case !c.knownRegion(r.Region):
			return DropRegion
		case !epochOK(r.Epoch):
			return DropEpoch
		case !(r.Want > 0 && r.Want <= 1):
			return DropNumber
		case c.expired(r.Epoch):
			return DropExpired
		}
	case msg.KindLoan:
		l := m.Loan
		switch {
		case l.Lender == "" || l.Borrower == "" || l.Policy == "":
			return DropMalformed
		case !c.knownRegion(l.Lender) || !c.knownRegion(l.Borrower):
			return DropRegion
		case !epochOK(l.Epoch):
			return DropEpoch
		case !(l.Amount > 0 && l.Amount <= 1) || !(l.Tokens >= 0 && l.Tokens <= l.Amount):
			return DropNumber
		case c.expired(l.Epoch):
			return DropExpired
		}
	}
	return ""
}

// windowsBegun reports whether every quota counter in qs is of a window
// that has begun by the end of the epoch after now, the newest epoch
// validate accepts. A counter of a later window would hold its key's
// count at a window no region has reached, so it is refused with its
// message; older windows are harmless (a merge ignores them), as are
// counters of policies that are not global quotas here.
func (c *Core) windowsBegun(now time.Time, qs []share.QuotaCounter) bool {
	if len(qs) == 0 {
		return true
	}
	horizon := c.cfg.Share.EpochStart(c.cfg.Share.Epoch(now) + 2).Add(-1)
	for _, q := range qs {
		if win, ok := c.quotaWindow(q.Policy); ok && q.Window > share.WindowIndex(horizon, win) {
			return false
		}
	}
	return true
}

// expired reports whether a borrow request or loan of generation gen (the
// epoch of its sender's last rebalance) belongs to a generation this
// region has rebalanced past: every loan of it has expired.
func (c *Core) expired(gen uint64) bool { return c.balanced && gen < c.b.gen }
