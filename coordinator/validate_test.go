package coordinator

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/coordinator/msg"
	"github.com/sluice-rl/sluice/share"
)

// TestCoreDropsUnusableMessages: a message naming an unknown region, an
// epoch far from now or a non-finite figure is counted and never applied.
func TestCoreDropsUnusableMessages(t *testing.T) {
	sc := testShareConfig()
	n := newCoreNet(t, sc, "eu-1", "us-1")
	c := n.node("eu-1").core
	cur := sc.Epoch(n.now)
	key := share.Key{Policy: policy, Subject: "hot"}
	report := func(region string, epoch uint64, v float64) msg.Message {
		return msg.Message{Kind: msg.KindReport, From: region + "-1", Region: region, Report: share.Report{
			Version: share.ReportVersion, Region: region, Epoch: epoch,
			Keys: []share.KeyReport{{Key: key, Limit: limit, Offered: v, Recent: v, Demand: v, Admitted: v}}}}
	}
	for _, tt := range []struct {
		name string
		msg  msg.Message
		want string
	}{
		{"good report", report("us", cur, 50), ""},
		{"unknown region", report("mars", cur, 50), DropRegion},
		{"future epoch", report("us", cur+2, 50), DropEpoch},
		{"ancient epoch", report("us", cur-maxAge-1, 50), DropEpoch},
		{"NaN demand", report("us", cur, math.NaN()), DropNumber},
		{"infinite demand", report("us", cur, math.Inf(1)), DropNumber},
		{"negative demand", report("us", cur, -1), DropNumber},
		{"no region", report("", cur, 1), DropMalformed},
		{"NaN node usage", msg.Message{Kind: msg.KindNodeUsage, Usage: msg.NodeUsage{Node: "eu-2", Region: "eu", Epoch: cur,
			Keys: []msg.KeyUsage{{Key: key, Limit: math.NaN()}}}}, DropNumber},
		{"infinite want", msg.Message{Kind: msg.KindBorrow, Borrow: share.BorrowRequest{Region: "us", Epoch: cur, Key: key,
			Want: math.Inf(1)}}, DropNumber},
		{"loan from nowhere", msg.Message{Kind: msg.KindLoan, Loan: share.Loan{Lender: "mars", Borrower: "eu", Epoch: cur,
			Key: key, Amount: 0.1}}, DropRegion},
		{"loan above the limit", msg.Message{Kind: msg.KindLoan, Loan: share.Loan{Lender: "us", Borrower: "eu", Epoch: cur,
			Key: key, Amount: 2}}, DropNumber},
		{"NaN loan", msg.Message{Kind: msg.KindLoan, Loan: share.Loan{Lender: "us", Borrower: "eu", Epoch: cur,
			Key: key, Amount: math.NaN()}}, DropNumber},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := c.Dropped()[tt.want]
			rd := c.Step(n.now, tt.msg)
			if rd.Dropped != tt.want {
				t.Fatalf("Step(%s).Dropped = %q, want %q", tt.name, rd.Dropped, tt.want)
			}
			if tt.want == "" {
				return
			}
			if got := c.Dropped()[tt.want]; got != before+1 {
				t.Errorf("Dropped()[%s] = %d, want %d", tt.want, got, before+1)
			}
			if r := tt.msg.Report; tt.msg.Kind == msg.KindReport {
				if _, filed := c.reports[r.Epoch][r.Region]; filed && r.Region != "us" || filed && r.Epoch != cur {
					t.Errorf("a dropped report was filed")
				}
				if f := c.reports[cur]["us"]; len(f.Keys) == 1 && !(f.Keys[0].Demand == 50) {
					t.Errorf("a dropped report replaced the good one: %+v", f)
				}
			}
		})
	}
}

// TestCoreDropsBadBorrowsAndLoans: borrow requests and loans that are
// malformed, from an unknown region, for nothing or more than the whole
// limit, handing over more tokens than their cut frees, of a generation
// this region has rebalanced past, or of an epoch too old or in the future
// are counted and never applied: the region's share does not move, and
// nothing is sent in answer (no loan for a bad request).
func TestCoreDropsBadBorrowsAndLoans(t *testing.T) {
	sc := testShareConfig()
	n := newCoreNet(t, sc, "eu-1", "us-1")
	n.rate = map[string]float64{"eu-1": 30, "us-1": 30}
	n.run(n.now.Add(3*sc.Interval), 10*time.Millisecond, nil)
	c := n.node("eu-1").core
	gen := c.b.gen
	key := share.Key{Policy: policy, Subject: "hot"}
	// Requests and loans of share and of tokens alike.
	for _, version := range []uint8{share.RateVersion, share.TokenVersion} {
		borrow := func(region string, epoch uint64, want float64) msg.Message {
			return msg.Message{Kind: msg.KindBorrow, From: region + "-1", Region: region, Borrow: share.BorrowRequest{
				Version: version, Region: region, Epoch: epoch, Key: key, Want: want}}
		}
		loan := func(lender string, epoch uint64, amount, tokens float64) msg.Message {
			return msg.Message{Kind: msg.KindLoan, From: lender + "-1", Region: lender, Loan: share.Loan{
				Version: version, Lender: lender, Borrower: "eu", Epoch: epoch, Key: key, Amount: amount, Tokens: tokens, Seq: 1}}
		}
		for _, tt := range []struct {
			name string
			msg  msg.Message
			want string
		}{
			{"borrow without region", borrow("", gen, 0.2), DropMalformed},
			{"borrow from an unknown region", borrow("mars", gen, 0.2), DropRegion},
			{"borrow of nothing", borrow("us", gen, 0), DropNumber},
			{"borrow of more than the limit", borrow("us", gen, 1.5), DropNumber},
			{"borrow NaN", borrow("us", gen, math.NaN()), DropNumber},
			{"borrow of an infinite amount", borrow("us", gen, math.Inf(1)), DropNumber},
			{"borrow of an expired generation", borrow("us", gen-1, 0.2), DropExpired},
			{"borrow from too far back", borrow("us", sc.Epoch(n.now)-maxAge-1, 0.2), DropEpoch},
			{"borrow from the future", borrow("us", sc.Epoch(n.now)+2, 0.2), DropEpoch},
			{"borrow without policy", func() msg.Message { m := borrow("us", gen, 0.2); m.Borrow.Policy = ""; return m }(), DropMalformed},
			{"loan without lender", loan("", gen, 0.2, 0), DropMalformed},
			{"loan without borrower", func() msg.Message { m := loan("us", gen, 0.2, 0); m.Loan.Borrower = ""; return m }(), DropMalformed},
			{"loan without policy", func() msg.Message { m := loan("us", gen, 0.2, 0); m.Loan.Policy = ""; return m }(), DropMalformed},
			{"loan to an unknown region", func() msg.Message { m := loan("us", gen, 0.2, 0); m.Loan.Borrower = "mars"; return m }(), DropRegion},
			{"loan from an unknown region", loan("mars", gen, 0.2, 0), DropRegion},
			{"loan of more than the limit", loan("us", gen, 1.5, 0), DropNumber},
			{"loan of nothing", loan("us", gen, 0, 0), DropNumber},
			{"loan with more tokens than its cut", loan("us", gen, 0.2, 0.3), DropNumber},
			{"loan with negative tokens", loan("us", gen, 0.2, -0.1), DropNumber},
			{"loan of an expired generation", loan("us", gen-1, 0.2, 0.2), DropExpired},
			{"loan from too far back", loan("us", sc.Epoch(n.now)-maxAge-1, 0.2, 0), DropEpoch},
			{"loan from the future", loan("us", sc.Epoch(n.now)+2, 0.2, 0), DropEpoch},
		} {
			t.Run(fmt.Sprintf("v%d/%s", version, tt.name), func(t *testing.T) {
				before, share0 := c.Dropped()[tt.want], c.Share(policy, "hot")
				rd := c.Step(n.now, tt.msg)
				if rd.Dropped != tt.want {
					t.Fatalf("Step(%s).Dropped = %q, want %q", tt.name, rd.Dropped, tt.want)
				}
				if len(rd.Loans) != 0 || len(rd.Borrows) != 0 || len(rd.Spends) != 0 {
					t.Errorf("Step(%s) sent %d loans, %d borrow requests and %d spends, want none", tt.name, len(rd.Loans), len(rd.Borrows), len(rd.Spends))
				}
				if got := c.Dropped()[tt.want]; got != before+1 {
					t.Errorf("Dropped()[%s] = %d, want %d", tt.want, got, before+1)
				}
				if got := c.Share(policy, "hot"); got != share0 {
					t.Errorf("share after a dropped message = %v, want %v", got, share0)
				}
			})
		}
	}
	// The same loan, well formed and of this generation, is applied.
	good := msg.Message{Kind: msg.KindLoan, From: "us-1", Region: "us", Loan: share.Loan{
		Version: share.RateVersion, Lender: "us", Borrower: "eu", Epoch: gen, Key: key, Amount: 0.2, Seq: 1}}
	if rd := c.Step(n.now, good); rd.Dropped != "" {
		t.Fatalf("a good loan was dropped: %q", rd.Dropped)
	}
}

// FuzzCoreStep feeds the core reports and loans with arbitrary figures
// and epochs: whatever it applies or drops, the share it enforces stays in
// [MinShare, 1] and its share vector in [0, 1] with a sum of at most
// 1 + 1e-9.
func FuzzCoreStep(f *testing.F) {
	f.Add(50.0, 50.0, 40.0, 0.1, int64(0))
	f.Add(math.NaN(), math.Inf(1), -1.0, 2.0, int64(-30))
	f.Add(1e308, 0.0, 1e-300, 0.5, int64(3))
	f.Fuzz(func(t *testing.T, offered, recent, demand, amount float64, de int64) {
		sc := testShareConfig()
		n := newCoreNet(t, sc, "eu-1", "us-1", "ap-1")
		n.rate = map[string]float64{"eu-1": 80, "us-1": 40}
		c := n.node("eu-1").core
		key := share.Key{Policy: policy, Subject: "hot"}
		check := func() {
			if s := c.Share(policy, "hot"); !(s >= share.MinShare && s <= 1) {
				t.Fatalf("Share = %v outside [MinShare, 1]", s)
			}
			sum := 0.0
			for _, v := range c.ShareVector(policy, "hot") {
				if !(v >= 0 && v <= 1) {
					t.Fatalf("share vector %v has a share outside [0, 1]", c.ShareVector(policy, "hot"))
				}
				sum += v
			}
			if sum > 1+1e-9 {
				t.Fatalf("share vector sums to %v", sum)
			}
		}
		for i := range 4 {
			n.run(n.now.Add(sc.Interval/2), 50*time.Millisecond, check)
			e := int64(sc.Epoch(n.now)) + de + int64(i)
			if e < 0 {
				e = 0
			}
			c.Step(n.now, msg.Message{Kind: msg.KindReport, From: "ap-1", Region: "ap", Report: share.Report{
				Version: share.ReportVersion, Region: "ap", Epoch: uint64(e) - 1,
				Keys: []share.KeyReport{{Key: key, Limit: limit, Offered: offered, Recent: recent, Demand: demand, Admitted: offered}}}})
			c.Step(n.now, msg.Message{Kind: msg.KindLoan, From: "ap-1", Region: "ap", Loan: share.Loan{
				Lender: "ap", Borrower: "eu", Epoch: c.b.gen, Key: key, Amount: amount, Seq: uint64(i)}})
			check()
			n.run(n.now.Add(sc.Interval/2), 50*time.Millisecond, check)
		}
	})
}
