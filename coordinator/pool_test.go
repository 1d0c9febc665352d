package coordinator

import (
	"context"
	"errors"
	"math"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/coordinator/msg"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/share"
)

// TestCoreTokenPooling: a key below BorrowMinRate that the engine rejects
// asks its peers for tokens; a peer answers with a Spend (its share
// untouched), whose filled loan the borrower spends as an extra share for
// BurstSpread; the lender's other nodes mirror no cut; and a core whose
// owner does not carry out Spends neither asks nor answers.
func TestCoreTokenPooling(t *testing.T) {
	sc := share.DefaultConfig()
	const slow = 20.0 // units/s: below BorrowMinRate
	members := []msg.Member{{Node: "eu-1", Region: "eu", State: msg.StateAlive},
		{Node: "us-1", Region: "us", State: msg.StateAlive}, {Node: "us-2", Region: "us", State: msg.StateAlive}}
	now := sc.EpochStart(1_000_000).Add(100 * time.Millisecond)
	newCore := func(node, region string, pool bool) *Core {
		c, err := NewCore(CoreConfig{Share: sc, Region: region, Node: node, PoolTokens: pool,
			Limit:  func(p string) (float64, bool) { return slow, p == policy },
			Bucket: func(p string) bool { return p == policy }}, members)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(now, members, nil, nil); err != nil {
			t.Fatal(err)
		}
		return c
	}
	eu, us, us2 := newCore("eu-1", "eu", true), newCore("us-1", "us", true), newCore("us-2", "us", true)
	key := share.Key{Policy: policy, Subject: "k"}
	uk := engine.UsageKey{Policy: policy, Subject: "k"}

	// eu's engine rejects the key: within a look it asks for tokens.
	var req share.BorrowRequest
	found := false
	for i := 0; i < 100 && !found; i++ {
		now = now.Add(10 * time.Millisecond)
		usage := map[engine.UsageKey]engine.Usage{uk: {Demand: 1, Admitted: 0}}
		for _, r := range eu.Tick(now, usage, nil).Borrows {
			if r.Version == share.TokenVersion && r.Key == key {
				req, found = r, true
			}
		}
		us.Tick(now, nil, nil)
	}
	if !found {
		t.Fatal("no token request from a region whose engine rejects a key below BorrowMinRate")
	}
	if want := 0.5; math.Abs(req.Want-want) > 1e-9 {
		t.Errorf("token request wants %v s of L, want %v (an empty bucket of one second of a 1/2 share)", req.Want, want)
	}

	// us answers with a Spend, not a loan, and keeps its share.
	before := us.Share(policy, "k")
	rd := us.Step(now, msg.Message{Kind: msg.KindBorrow, From: "eu-1", Region: "eu", Borrow: req})
	if len(rd.Loans) != 0 || len(rd.Spends) != 1 {
		t.Fatalf("token request answered with %d loans and %d spends, want 0 and 1", len(rd.Loans), len(rd.Spends))
	}
	sp := rd.Spends[0]
	// The borrower's bucket is empty (it asked for all of its 10 units):
	// both buckets hold 10, so half of what us holds leaves both equally full.
	if sp.Max != 10 || sp.Keep != 0 || sp.Part != 0.5 || sp.Limit != slow || sp.Loan.Borrower != "eu" || sp.Loan.Lender != "us" {
		t.Errorf("Spend = %+v, want Max 10, Keep 0, Part 0.5, Limit 20, from us to eu", sp)
	}
	if got := us.Share(policy, "k"); got != before {
		t.Errorf("lender's share after a token request = %v, want %v", got, before)
	}
	for _, tt := range []struct{ remaining, want float64 }{{10, 5}, {1.9, 0}, {4.5, 2}, {50, 10}} {
		if got := sp.Take(tt.remaining); float64(got) != tt.want {
			t.Errorf("Spend.Take(%v) = %d, want %v", tt.remaining, got, tt.want)
		}
	}

	// eu's acting node deposits the 5 units into its bucket; its share
	// does not move.
	l := sp.Of(5)
	loanMsg := msg.Message{Kind: msg.KindLoan, From: "us-1", Region: "us", Loan: l}
	rd = eu.Step(now, loanMsg)
	if rd.Dropped != "" {
		t.Fatalf("token loan dropped: %s", rd.Dropped)
	}
	if want := []Deposit{{Key: key, Units: 5}}; !slices.Equal(rd.Deposits, want) {
		t.Errorf("deposits of a token loan of 5 units = %+v, want %+v", rd.Deposits, want)
	}
	if got := eu.Share(policy, "k"); got != 0.5 {
		t.Errorf("borrower's share after a token loan = %v, want 0.5", got)
	}
	if rd := eu.Step(now, loanMsg); len(rd.Deposits) != 0 {
		t.Errorf("a duplicate token loan was deposited: %+v", rd.Deposits)
	}
	// us's other node mirrors no cut: a token loan moves no share.
	if us2.Step(now, loanMsg); us2.Share(policy, "k") != 0.5 {
		t.Errorf("lender's other node after a token loan: share %v, want 0.5", us2.Share(policy, "k"))
	}

	// Without PoolTokens a core neither asks nor answers.
	off := newCore("eu-1", "eu", false)
	for i := range 100 {
		at := now.Add(time.Duration(i) * 10 * time.Millisecond)
		if rd := off.Tick(at, map[engine.UsageKey]engine.Usage{uk: {Demand: 1}}, nil); len(rd.Borrows) != 0 {
			t.Fatalf("a core without PoolTokens asked: %+v", rd.Borrows)
		}
	}
	off2 := newCore("us-1", "us", false)
	if rd := off2.Step(now, msg.Message{Kind: msg.KindBorrow, From: "eu-1", Region: "eu", Borrow: req}); len(rd.Spends) != 0 {
		t.Errorf("a core without PoolTokens answered with %d spends", len(rd.Spends))
	}
	if rd := off.Step(now, loanMsg); len(rd.Deposits) != 0 {
		t.Errorf("a core without PoolTokens deposited %+v", rd.Deposits)
	}
}

// fakeBucket is a TokenBucket holding level units, recording what it is
// asked.
type fakeBucket struct {
	level    int64
	ok       bool  // Level's ok
	allow    bool  // Take's answer
	err      error // returned by every call
	took     []int64
	deposits []int64
}

func (b *fakeBucket) Level(context.Context, share.Key) (int64, bool, error) {
	return b.level, b.ok, b.err
}

func (b *fakeBucket) Take(_ context.Context, _ share.Key, units int64) (bool, error) {
	b.took = append(b.took, units)
	return b.allow, b.err
}

func (b *fakeBucket) Put(_ context.Context, _ share.Key, units int64) error {
	b.deposits = append(b.deposits, units)
	return b.err
}

// TestSpendDo: a spend reads the bucket, takes Spend.Take of its level in
// one check, and hands over only what the store itself allowed; a bucket
// that cannot be read or a store that fails takes and hands over nothing.
func TestSpendDo(t *testing.T) {
	sp := Spend{Key: share.Key{Policy: policy, Subject: "k"}, Max: 5, Keep: 2, Part: 0.5, Limit: 20}
	fail := errors.New("store down")
	for _, tt := range []struct {
		name    string
		b       fakeBucket
		want    int64
		took    []int64
		wantErr bool
	}{
		{"takes part of the level above Keep", fakeBucket{level: 10, ok: true, allow: true}, 4, []int64{4}, false},
		{"at most Max", fakeBucket{level: 100, ok: true, allow: true}, 5, []int64{5}, false},
		{"too little to take", fakeBucket{level: 3, ok: true, allow: true}, 0, nil, false},
		{"no bucket to read", fakeBucket{level: 10, ok: false, allow: true}, 0, nil, false},
		{"the take rejected", fakeBucket{level: 10, ok: true, allow: false}, 0, []int64{4}, false},
		{"the store failed", fakeBucket{level: 10, ok: true, allow: true, err: fail}, 0, nil, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := tt.b
			got, err := sp.Do(context.Background(), &b)
			if got != tt.want || (err != nil) != tt.wantErr || !reflect.DeepEqual(b.took, tt.took) {
				t.Errorf("Spend.Do = %d, %v (took %v), want %d, error %v (took %v)", got, err, b.took, tt.want, tt.wantErr, tt.took)
			}
		})
	}
}

// TestDepositDo: a deposit puts its units into the bucket once, puts
// nothing for no units, and reports a store that could not take them.
func TestDepositDo(t *testing.T) {
	key := share.Key{Policy: policy, Subject: "k"}
	var b fakeBucket
	if err := (Deposit{Key: key, Units: 3}).Do(context.Background(), &b); err != nil || !reflect.DeepEqual(b.deposits, []int64{3}) {
		t.Errorf("Deposit.Do = %v, deposits %v; want nil, [3]", err, b.deposits)
	}
	if err := (Deposit{Key: key}).Do(context.Background(), &b); err != nil || len(b.deposits) != 1 {
		t.Errorf("Deposit.Do of 0 units = %v, deposits %v; want nil and nothing put", err, b.deposits)
	}
	b.err = errors.New("store down")
	if err := (Deposit{Key: key, Units: 2}).Do(context.Background(), &b); err == nil {
		t.Error("Deposit.Do on a failing store = nil, want an error")
	}
}
