package coordinator

import (
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/coordinator/msg"
	"github.com/sluice-rl/sluice/share"
)

// TestCoreSharesFollowTraffic drives four nodes in three regions through
// scripted epochs: shares follow the traffic, the two eu nodes enforce the
// same share, only eu's publisher sends its report, and Σ of the enforced
// shares never exceeds 1.
func TestCoreSharesFollowTraffic(t *testing.T) {
	sc := testShareConfig()
	sc.BorrowEvery = 0
	n := newCoreNet(t, sc, "eu-1", "eu-2", "us-1", "ap-1")
	n.rate = map[string]float64{"eu-1": 70, "eu-2": 70, "us-1": 40, "ap-1": 20}
	if got := n.shares("eu-1")[0]; math.Abs(got-1.0/3) > 1e-12 {
		t.Fatalf("Share before any rebalance = %v, want 1/3", got)
	}
	check := func() {
		s := n.shares("eu-1", "eu-2", "us-1", "ap-1")
		if s[0] != s[1] {
			t.Fatalf("%v: eu-1 enforces %v, eu-2 %v", n.now, s[0], s[1])
		}
		if got := s[0] + s[2] + s[3]; got > 1+1e-9 {
			t.Fatalf("%v: Σ enforced shares = %v > 1", n.now, got)
		}
	}
	n.run(n.now.Add(8*sc.Interval), 50*time.Millisecond, check)
	s := n.shares("eu-1", "us-1", "ap-1")
	for i, want := range []float64{0.7, 0.2, 0.1} {
		if math.Abs(s[i]-want) > 0.05 {
			t.Errorf("shares eu/us/ap = %.3f, want 0.7/0.2/0.1 ± 0.05", s)
			break
		}
	}
	reports := map[string]int{}
	for _, rd := range n.log {
		for _, r := range rd.Reports {
			reports[r.Region]++
		}
	}
	if reports["eu"] != reports["us"] || reports["eu"] < 7 {
		t.Errorf("reports sent per region = %v: want one per epoch per region (eu's publisher only)", reports)
	}

	// All traffic moves to us.
	n.rate = map[string]float64{"us-1": 200}
	n.run(n.now.Add(5*sc.Interval), 50*time.Millisecond, check)
	if us := n.shares("us-1")[0]; us < 0.9 {
		t.Errorf("after the shift us holds %.3f, want ≥ 0.9", us)
	}
}

// TestCoreDeterministic: the same script gives the same messages in the
// same order, byte for byte.
func TestCoreDeterministic(t *testing.T) {
	sc := testShareConfig()
	var logs [2][]Ready
	for i := range logs {
		n := newCoreNet(t, sc, "eu-1", "eu-2", "us-1", "ap-1")
		n.rate = map[string]float64{"eu-1": 45, "eu-2": 45, "us-1": 5, "ap-1": 5}
		n.run(n.now.Add(3*sc.Interval), 50*time.Millisecond, nil)
		n.rate = map[string]float64{"us-1": 100}
		n.run(n.now.Add(3*sc.Interval), 50*time.Millisecond, nil)
		logs[i] = n.log
	}
	if !reflect.DeepEqual(logs[0], logs[1]) {
		t.Error("two runs of one script sent different messages")
	}
	loans := 0
	for _, rd := range logs[0] {
		loans += len(rd.Loans)
	}
	if loans == 0 {
		t.Error("no loan after the shift: the script does not exercise borrowing")
	}
}

// TestCoreRestoresSavedShares: recent saved shares are enforced until the
// first rebalance; old ones, or another region's, are ignored; the core
// asks to save after each raise.
func TestCoreRestoresSavedShares(t *testing.T) {
	sc := testShareConfig()
	now := sc.EpochStart(1_000_000).Add(100 * time.Millisecond)
	cur := sc.Epoch(now)
	key := share.Key{Policy: policy, Subject: "hot"}
	members := []msg.Member{{Node: "eu-1", Region: "eu", State: msg.StateAlive}, {Node: "us-1", Region: "us", State: msg.StateAlive}}
	for _, tt := range []struct {
		name  string
		saved Saved
		want  float64
	}{
		{"recent", Saved{Region: "eu", Epoch: cur - 1, Shares: []SavedShare{{Key: key, Share: 0.8}}}, 0.8},
		{"too old", Saved{Region: "eu", Epoch: cur - uint64(sc.PartitionIntervals) - 1, Shares: []SavedShare{{Key: key, Share: 0.8}}}, 0.5},
		{"another region's", Saved{Region: "us", Epoch: cur - 1, Shares: []SavedShare{{Key: key, Share: 0.8}}}, 0.5},
		{"out of range", Saved{Region: "eu", Epoch: cur - 1, Shares: []SavedShare{{Key: key, Share: 7}}}, 0.5},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := NewCore(CoreConfig{Share: sc, Region: "eu", Node: "eu-1",
				Limit: func(string) (float64, bool) { return limit, true }}, members)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Start(now, members, &tt.saved, nil); err != nil {
				t.Fatal(err)
			}
			c.Tick(now.Add(50*time.Millisecond), nil, members)
			if got := c.Share(policy, "hot"); got != tt.want {
				t.Errorf("Share = %v, want %v", got, tt.want)
			}
			if got := c.Share(policy, "cold"); got != 0.5 {
				t.Errorf("Share of another key = %v, want 1/2", got)
			}
			var saves []*Saved
			for at := now.Add(100 * time.Millisecond); at.Before(now.Add(3 * sc.Interval)); at = at.Add(50 * time.Millisecond) {
				if rd := c.Tick(at, nil, members); rd.Save != nil {
					saves = append(saves, rd.Save)
				}
			}
			if len(saves) < 2 || saves[0].Region != "eu" || saves[1].Epoch != saves[0].Epoch+1 {
				t.Errorf("saves over three intervals = %d, want one per epoch", len(saves))
			}
		})
	}
}

// TestCoreRepeatsReportsAfterLoss: a region sends each report twice for K
// epochs after it starts and for K epochs after a report of a region
// membership sees live went missing, and once otherwise; the receiver
// files the copies as one report.
func TestCoreRepeatsReportsAfterLoss(t *testing.T) {
	sc := testShareConfig()
	k := uint64(sc.PartitionIntervals)
	n := newCoreNet(t, sc, "eu-1", "us-1", "ap-1")
	n.rate = map[string]float64{"eu-1": 60, "us-1": 30, "ap-1": 10}
	start := sc.Epoch(n.now)
	copies := func(from, to int) map[uint64]int { // eu's reports per epoch in n.log[from:to]
		out := map[uint64]int{}
		for _, rd := range n.log[from:to] {
			for _, r := range rd.Reports {
				if r.Region == "eu" {
					out[r.Epoch]++
				}
			}
		}
		return out
	}
	n.run(sc.EpochStart(start+k+4), 10*time.Millisecond, nil)
	got := copies(0, len(n.log))
	for e := start; e < start+k+3; e++ {
		want := 1
		if e <= start+k {
			want = 2
		}
		if got[e] != want {
			t.Errorf("eu sent %d copies of its report of epoch %d (start %d), want %d", got[e], e, start, want)
		}
	}
	if rs := n.node("us-1").core.reports[start+k+2]; len(rs) != 2 {
		t.Errorf("us filed %d reports of epoch %d, want 2 (one per other region)", len(rs), start+k+2)
	}

	// us's report of one epoch never reaches eu: eu repeats its own for K
	// epochs after that rebalance.
	lost := sc.Epoch(n.now) // reported in the next interval
	seen := len(n.log)
	n.run(sc.EpochStart(lost+k+4), 10*time.Millisecond, func() {
		keep := n.inFlite[:0]
		for _, f := range n.inFlite {
			if f.msg.Kind == msg.KindReport && f.msg.Report.Region == "us" && f.msg.Report.Epoch == lost && f.to.region == "eu" {
				continue
			}
			keep = append(keep, f)
		}
		n.inFlite = keep
	})
	got = copies(seen, len(n.log))
	for e := lost; e < lost+k+3; e++ {
		want := 1
		if e > lost && e <= lost+k {
			want = 2
		}
		if got[e] != want {
			t.Errorf("after us's report of epoch %d was lost: eu sent %d copies of its report of epoch %d, want %d", lost, got[e], e, want)
		}
	}
}
