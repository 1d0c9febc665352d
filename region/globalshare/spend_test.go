package globalshare

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/coordinator"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/gossip"
	"github.com/sluice-rl/sluice/internal/testwait"
	"github.com/sluice-rl/sluice/share"
)

// stubGossip is a Gossip of fixed members that records the loans sent and
// hands the test the coordinator's message handler.
type stubGossip struct {
	members []gossip.Member
	mu      sync.Mutex
	handler func(gossip.Message)
	loans   []share.Loan
}

func (g *stubGossip) Name() string             { return "us-1" }
func (g *stubGossip) Region() string           { return "us" }
func (g *stubGossip) Members() []gossip.Member { return g.members }
func (g *stubGossip) Regions() map[string][]string {
	return map[string][]string{"eu": {"eu-1"}, "us": {"us-1"}}
}
func (g *stubGossip) OnMessage(h func(gossip.Message))                             { g.mu.Lock(); g.handler = h; g.mu.Unlock() }
func (g *stubGossip) BroadcastReport(context.Context, share.Report) error          { return nil }
func (g *stubGossip) SendNodeUsage(context.Context, gossip.NodeUsage) error        { return nil }
func (g *stubGossip) SendBorrowRequest(context.Context, share.BorrowRequest) error { return nil }
func (g *stubGossip) SendLoan(_ context.Context, l share.Loan) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.loans = append(g.loans, l)
	return nil
}

func (g *stubGossip) sent() []share.Loan {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]share.Loan(nil), g.loans...)
}

// TestCoordinatorCarriesOutSpends: a token request from another region
// reaches the owner's Spend, off Run's goroutine, with the core's Spend
// for the key; the loan is sent filled with what Spend took, and not at
// all when Spend took nothing or failed.
func TestCoordinatorCarriesOutSpends(t *testing.T) {
	sc := share.DefaultConfig()
	const slow = 20.0 // units/s, below BorrowMinRate
	members := []gossip.Member{{Node: "eu-1", Region: "eu", State: gossip.StateAlive}, {Node: "us-1", Region: "us", State: gossip.StateAlive}}
	for _, tt := range []struct {
		name   string
		took   int64
		err    error
		tokens float64 // of the loan sent; 0: none sent
	}{
		{"tokens taken", 4, nil, 4 / slow},
		{"nothing to spare", 0, nil, 0},
		{"store failed", 3, errors.New("store down"), 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			start := sc.EpochStart(1_000_000).Add(100 * time.Millisecond)
			clk := &fakeClock{now: start}
			g := &stubGossip{members: members}
			spends := make(chan Spend, 4)
			c, h := runSlowKeyCoordinator(t, sc, g, clk, slow,
				func(_ context.Context, sp Spend) (int64, error) {
					spends <- sp
					return tt.took, tt.err
				},
				func(context.Context, Deposit) error { return nil })

			// The borrower is a core of its own, asking as eu would.
			eu, err := coordinator.NewCore(coordinator.CoreConfig{Share: sc, Region: "eu", Node: "eu-1", PoolTokens: true,
				Limit: func(p string) (float64, bool) { return slow, p == policy }, Bucket: func(p string) bool { return p == policy }}, members)
			if err != nil {
				t.Fatal(err)
			}
			if err := eu.Start(start, members, nil, nil); err != nil {
				t.Fatal(err)
			}
			var req share.BorrowRequest
			uk := engine.UsageKey{Policy: policy, Subject: "k"}
			for now := start; req.Want == 0 && now.Before(start.Add(time.Second)); now = now.Add(10 * time.Millisecond) {
				for _, r := range eu.Tick(now, map[engine.UsageKey]engine.Usage{uk: {Demand: 1}}, nil).Borrows {
					if r.Version == share.TokenVersion {
						req = r
					}
				}
			}
			if req.Want == 0 {
				t.Fatal("no token request from the borrower")
			}
			h(gossip.Message{Kind: gossip.KindBorrow, From: "eu-1", Region: "eu", Borrow: req})

			var sp Spend
			select {
			case sp = <-spends:
			case <-time.After(5 * time.Second):
				t.Fatal("Spend was never called for a token request")
			}
			if sp.Key != (share.Key{Policy: policy, Subject: "k"}) || sp.Limit != slow || sp.Loan.Borrower != "eu" || sp.Loan.Lender != "us" {
				t.Errorf("Spend = %+v, want key %s/k, limit %v, a loan from us to eu", sp, policy, slow)
			}
			testwait.For(t, 5*time.Second, "the spend carried out", func() bool { return c.spendsDone.Load() == 1 })
			got := g.sent()
			if tt.tokens == 0 {
				if len(got) != 0 {
					t.Errorf("loans sent = %+v, want none", got)
				}
				return
			}
			if len(got) != 1 || got[0].Tokens != tt.tokens || got[0].Amount != tt.tokens || got[0].Version != share.TokenVersion {
				t.Errorf("loans sent = %+v, want one token loan of %v s of L", got, tt.tokens)
			}
		})
	}
}

// TestCoordinatorCarriesOutDeposits: a token loan addressed to this region
// reaches the owner's Deposit, off Run's goroutine, with its units; a
// duplicate, one of another generation and one from an unknown region do
// not; and a coordinator without Spend and Deposit pools nothing.
func TestCoordinatorCarriesOutDeposits(t *testing.T) {
	sc := share.DefaultConfig()
	const slow = 20.0
	members := []gossip.Member{{Node: "eu-1", Region: "eu", State: gossip.StateAlive}, {Node: "us-1", Region: "us", State: gossip.StateAlive}}
	start := sc.EpochStart(1_000_000).Add(100 * time.Millisecond)
	clk := &fakeClock{now: start}
	g := &stubGossip{members: members}
	deposits := make(chan Deposit, 8)
	c, h := runSlowKeyCoordinator(t, sc, g, clk, slow,
		func(context.Context, Spend) (int64, error) { return 0, nil },
		func(_ context.Context, dp Deposit) error {
			deposits <- dp
			return nil
		})
	var gen uint64
	testwait.For(t, 5*time.Second, "the core started", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		var ok bool
		gen, ok = c.core.Generation()
		return ok
	})
	key := share.Key{Policy: policy, Subject: "k"}
	loan := func(lender string, epoch uint64, seq uint64) gossip.Message {
		return gossip.Message{Kind: gossip.KindLoan, From: lender + "-1", Region: lender, Loan: share.Loan{
			Version: share.TokenVersion, Lender: lender, Borrower: "us", Epoch: epoch, Key: key, Amount: 0.15, Tokens: 0.15, Seq: seq}}
	}
	h(loan("eu", gen, 1))
	h(loan("eu", gen, 1))   // a duplicate
	h(loan("eu", gen-1, 2)) // another generation
	h(loan("mars", gen, 3)) // an unknown region
	h(loan("eu", gen, 4))
	for i, want := range []int64{3, 3} {
		select {
		case dp := <-deposits:
			if dp.Key != key || dp.Units != want {
				t.Errorf("deposit %d = %+v, want %d units of %v", i, dp, want, key)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("deposit %d never made", i)
		}
	}
	testwait.For(t, 5*time.Second, "every message stepped", func() bool { return c.loansIn.Load() == 5 })
	testwait.For(t, 5*time.Second, "the deposits carried out", func() bool { return c.depositsDone.Load() == 2 })
	select {
	case dp := <-deposits:
		t.Errorf("a third deposit %+v, want none (duplicate, expired and unknown-region loans are dropped)", dp)
	default:
	}

	// Without Spend and Deposit the core does not pool.
	off, err := New(Config{Share: sc, Gossip: &stubGossip{members: members}, Clock: clk,
		Usage: func() map[engine.UsageKey]engine.Usage { return nil },
		Limit: func(p string) (float64, bool) { return slow, p == policy }, Bucket: func(p string) bool { return p == policy }})
	if err != nil {
		t.Fatal(err)
	}
	if off.core.Config().PoolTokens {
		t.Error("a coordinator without Spend and Deposit pools tokens")
	}
}

// runSlowKeyCoordinator runs, until the test ends, a coordinator on g and
// clk whose only global policy is a token bucket of rate slow (below
// BorrowMinRate, so its tokens are pooled), carrying out spends and
// deposits with spend and deposit; it returns once the coordinator
// listens, with the handler it gave g.
func runSlowKeyCoordinator(t *testing.T, sc share.Config, g *stubGossip, clk *fakeClock, slow float64,
	spend func(context.Context, Spend) (int64, error), deposit func(context.Context, Deposit) error) (*Coordinator, func(gossip.Message)) {
	t.Helper()
	c, err := New(Config{Share: sc, Gossip: g, Clock: clk,
		Usage:  func() map[engine.UsageKey]engine.Usage { return nil },
		Limit:  func(p string) (float64, bool) { return slow, p == policy },
		Bucket: func(p string) bool { return p == policy },
		Spend:  spend, Deposit: deposit})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	testwait.For(t, 5*time.Second, "the coordinator's handler", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.handler != nil
	})
	g.mu.Lock()
	defer g.mu.Unlock()
	return c, g.handler
}
