package share

import (
	"testing"
	"time"
)

// Token pooling moves tokens, never share: a request is only asked and
// answered for keys below BorrowMinRate, at most once per TokenEvery; the
// loan a lender fills carries what it took out of its bucket, and the
// borrower spends it as an extra share for BurstSpread, after which its
// share is what it was.
func TestTokenPooling(t *testing.T) {
	cfg := DefaultConfig()
	regions := []string{"r0", "r1", "r2"}
	const epoch = 1000
	newAlloc := func(self string) *Allocator {
		a, err := NewAllocator(cfg, self, regions, epoch)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	b, l := newAlloc("r1"), newAlloc("r0")
	key := Key{Policy: "p", Subject: "k"}
	const slow = 20.0 // units/s, below BorrowMinRate
	now := cfg.EpochStart(epoch).Add(time.Second)

	if _, ok := b.AskTokens(now, key, cfg.BorrowMinRate, 0.2); ok {
		t.Error("AskTokens for a key at BorrowMinRate: asked, want no request (it borrows share)")
	}
	req, ok := b.AskTokens(now, key, slow, 3)
	if !ok {
		t.Fatal("AskTokens: no request")
	}
	if req.Version != TokenVersion || req.Want != 1 || req.Region != "r1" || req.Epoch != b.Generation() {
		t.Errorf("AskTokens = %+v, want version %d, want 1 (clipped), region r1, epoch %d", req, TokenVersion, b.Generation())
	}
	if _, ok := b.AskTokens(now.Add(cfg.TokenEvery/2), key, slow, 0.2); ok {
		t.Error("AskTokens asked twice within TokenEvery")
	}
	if _, ok := b.AskTokens(now.Add(cfg.TokenEvery), key, slow, 0.2); !ok {
		t.Error("AskTokens after TokenEvery: no request")
	}

	// A share lender does not answer a token request, a token lender does
	// not answer a share request, and neither answers another generation.
	if _, ok := l.Lend(now, req, slow, Use{Rate: 0}); ok {
		t.Error("Lend answered a token request")
	}
	rate := req
	rate.Version = RateVersion
	if _, ok := l.TokenLoan(now, rate, slow); ok {
		t.Error("TokenLoan answered a share request")
	}
	old := req
	old.Epoch--
	if _, ok := l.TokenLoan(now, old, slow); ok {
		t.Error("TokenLoan answered a request of another generation")
	}
	loan, ok := l.TokenLoan(now, req, slow)
	if !ok {
		t.Fatal("TokenLoan: no loan")
	}
	if loan.Amount != 0 || loan.Tokens != 0 || loan.Version != TokenVersion || loan.Borrower != "r1" || loan.Lender != "r0" {
		t.Errorf("TokenLoan = %+v, want an empty loan of version %d from r0 to r1", loan, TokenVersion)
	}
	if got := TokenLoanOf(loan, 3, slow); got.Amount != 0.15 || got.Tokens != 0.15 {
		t.Errorf("TokenLoanOf(3 units of 20/s) = %v, %v, want 0.15 s of L twice", got.Amount, got.Tokens)
	}
	if got := TokenLoanOf(loan, 50, slow); got.Amount != 1 || got.Tokens != 1 {
		t.Errorf("TokenLoanOf(50 units of 20/s) = %v, %v, want 1 (a loan carries at most 1 s of L)", got.Amount, got.Tokens)
	}
	if got := l.share(now, key); got != 1.0/3 {
		t.Errorf("lender's share after a token loan = %v, want 1/3: tokens come out of its bucket, not its share", got)
	}

	// The borrower's share does not move: its owner deposits the tokens.
	filled := TokenLoanOf(loan, 3, slow)
	at := now.Add(200 * time.Millisecond)
	if !b.Accept(at, filled) {
		t.Fatal("Accept refused a token loan")
	}
	if b.Accept(at, filled) {
		t.Error("Accept applied a duplicate token loan")
	}
	if got := b.Table(at).Share(key.Policy, key.Subject); got != 1.0/3 {
		t.Errorf("borrower's share after a token loan = %v, want 1/3: the tokens go into its bucket", got)
	}
	if got := b.Loans(key); got != 0 {
		t.Errorf("borrower's loans after a token loan = %v, want 0: no share moved", got)
	}
}

// TestTokenRequestsOfHotKeys: a key offered tokenHot times its limit or
// more over the regions at the last rebalance asks for no tokens (it is
// short everywhere); a key offered about its limit does.
func TestTokenRequestsOfHotKeys(t *testing.T) {
	cfg := DefaultConfig()
	regions := []string{"r0", "r1"}
	const epoch, slow = 1000, 20.0
	for _, tt := range []struct {
		name    string
		offered float64 // units/s in the other region
		ask     bool
	}{
		// This region's own report is not in the reports: it counts at
		// its share, 0.5.
		{"about its limit", 10, true},
		{"offered 1.4 L", 18, true},
		{"offered 1.5 L", 20, false},
		{"offered 25 L", 1000, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, err := NewAllocator(cfg, "r1", regions, epoch)
			if err != nil {
				t.Fatal(err)
			}
			key := Key{Policy: "p", Subject: "k"}
			var reports []Report
			for _, r := range regions {
				reports = append(reports, Report{Region: r, Epoch: epoch, Keys: []KeyReport{{Key: key, Limit: slow,
					Offered: tt.offered, Recent: tt.offered, Demand: tt.offered, Admitted: min(tt.offered, slow/2), Share: 0.5}}})
			}
			now := cfg.EpochStart(epoch + 1).Add(cfg.Settle)
			a.Rebalance(now, epoch, reports)
			if _, ok := a.AskTokens(now, key, slow, 0.2); ok != tt.ask {
				t.Errorf("AskTokens of a key offered %v/s in the other region (L %v/s) = %v, want %v", tt.offered, slow, ok, tt.ask)
			}
		})
	}
}
