package share

import "time"

// Token pooling moves tokens, not share, between the buckets of a key
// whose L_global is below Config.BorrowMinRate: keys too slow for rate
// loans, whose few arrivals per second per region make any rate measured
// between two rebalances noise. Three regional buckets of one second of
// their share each strand tokens that one central bucket pools: a region
// runs dry and rejects while another's bucket sits full and wastes its
// refill. A rejection and a bucket level are facts, not estimates, so a
// region that has just rejected (or holds less than a couple of units)
// asks, and a region whose bucket holds more than it keeps for itself
// hands the rest over.
//
//	borrower ──BorrowRequest (TokenVersion)──▶ every peer   (at most one per key per Config.TokenEvery)
//	lender   takes Loan.Tokens·L_global units out of its bucket, then
//	lender   ──Loan (TokenVersion)──────────▶ borrower
//
// The lender's owner takes the units out of the region's bucket (an
// engine check of that cost) before the Loan leaves, and sends nothing if
// the check is rejected; the borrower's owner deposits them into its
// region's bucket (an engine deposit, up to the bucket's capacity), where
// the next arrival the bucket would have rejected spends them. Spending
// them instead as an extra share for a moment raises a small bucket's
// capacity just as long, and most of the tokens are clamped away when it
// falls back. No share moves and nothing is raised later, so no clock or
// delivery delay enters the bound: a token is spent at most once, in the
// lender's bucket or, after it was taken out, in the borrower's, and a
// bucket never holds more than its capacity; a loan lost, late or of
// another generation only destroys it.

// AskTokens decides whether this region asks its peers for tokens of key
// at now: want is what it asks for, in seconds of L_global (limit, units/s),
// at most 1. At most once per Config.TokenEvery per key, and not for a key
// offered tokenHot times its limit or more; only for keys
// below Config.BorrowMinRate (faster keys borrow share, Borrow), with
// another region to ask and not while isolated. The caller sends the
// request to every peer it can reach.
func (a *Allocator) AskTokens(now time.Time, key Key, limit, want float64) (BorrowRequest, bool) {
	if !a.pools(limit) || !(want > 0) {
		return BorrowRequest{}, false
	}
	if ks, ok := a.keys[key]; ok && ks.offered >= tokenHot {
		return BorrowRequest{}, false // short everywhere: no peer has tokens to spare
	}
	if last, ok := a.tokenAsked[key]; ok && now.Sub(last) < a.cfg.TokenEvery {
		return BorrowRequest{}, false
	}
	a.tokenAsked[key] = now
	return BorrowRequest{Version: TokenVersion, Region: a.self, Epoch: a.gen, Key: key, Want: min(want, 1)}, true
}

// tokenHot is the offered rate, a multiple of L_global over all regions at
// the last rebalance, from which a key asks for no tokens: it is short in
// every region, no peer has tokens to spare, and its requests would only
// cost messages (zipf-keys' hottest keys, offered up to a hundred times
// their limit, sent most of the requests).
const tokenHot = 1.5

// pools reports whether keys of L_global limit pool tokens here now.
func (a *Allocator) pools(limit float64) bool {
	return !a.isolated && len(a.regions) >= 2 && a.cfg.TokenEvery > 0 && limit > 0 && limit < a.cfg.BorrowMinRate
}

// TokenLoan answers a peer's token request at now with the loan to send,
// Amount and Tokens still zero: the owner fills them with what it takes
// out of its bucket (TokenLoanOf) and sends nothing if it takes nothing.
// Requests that are not token requests, of another generation, from an
// unknown region or for a key that does not pool (AskTokens), and any
// while isolated, get none.
func (a *Allocator) TokenLoan(now time.Time, req BorrowRequest, limit float64) (Loan, bool) {
	if req.Version < TokenVersion || req.Epoch != a.gen || req.Region == a.self || !(req.Want > 0) || !a.pools(limit) {
		return Loan{}, false
	}
	if _, ok := a.index[req.Region]; !ok {
		return Loan{}, false
	}
	a.lendSeq++
	return Loan{Version: TokenVersion, Lender: a.self, Borrower: req.Region, Epoch: a.gen, Key: req.Key, Seq: a.lendSeq}, true
}

// TokenLoanOf is l, a loan from TokenLoan, handing over units tokens of a
// key whose L_global is limit units/s: Amount = Tokens = units/limit
// seconds of L_global, at most 1.
func TokenLoanOf(l Loan, units, limit float64) Loan {
	if !(limit > 0) || !(units > 0) {
		return l
	}
	l.Tokens = min(units/limit, 1)
	l.Amount = l.Tokens
	return l
}
