package coordinator

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-rl/sluice/coordinator/msg"
)

// lost is what nd's sluice_globalshare_region_lost_total says of region
// at stage.
func lost(nd *coreNode, region, stage string) float64 {
	return testutil.ToFloat64(nd.core.m.Lost.WithLabelValues(region, stage))
}

// TestCoreDeadRegion: when ap crashes, eu and us reclaim its share Hold
// after their last answered ping to it, at once (no RaiseDelay: the hold
// already covers the cut of a region cut off rather than crashed); fed
// membership's verdicts only, Hold after the verdict. Never before.
func TestCoreDeadRegion(t *testing.T) {
	for _, tt := range []struct {
		name    string
		contact bool
	}{{"pings", true}, {"verdicts only", false}} {
		t.Run(tt.name, func(t *testing.T) {
			sc := testShareConfig()
			sc.BorrowEvery = 0
			n := newCoreNet(t, sc, "eu-1", "us-1", "ap-1")
			if !tt.contact {
				n.contactEvery = 0
			}
			n.rate = map[string]float64{"eu-1": 60, "us-1": 60, "ap-1": 30}
			n.run(n.now.Add(6*sc.Interval), 50*time.Millisecond, nil)
			// Away from the next rebalance, so that only the rule moves shares.
			n.run(n.now.Truncate(sc.Interval).Add(sc.Interval+sc.Settle+2*sc.RaiseDelay), 10*time.Millisecond, nil)
			before := n.shares("eu-1", "us-1")
			ap := n.node("ap-1")
			ap.down = true
			lost := n.now.Truncate(n.contactEvery + 1) // the last answered ping: now, or the verdict below
			if !tt.contact {
				ap.state = msg.StateDead
				lost = n.now.Add(10 * time.Millisecond) // the first tick that sees it
			}
			hold := n.node("eu-1").core.Hold()
			var took time.Duration
			n.run(lost.Add(hold+100*time.Millisecond), 10*time.Millisecond, func() {
				if s := n.shares("eu-1", "us-1"); took == 0 && sum(s) > sum(before)+0.1 {
					took = n.now.Sub(lost)
					if sum(s) > 1+1e-9 {
						t.Errorf("eu+us = %.3f, want ≤ 1", sum(s))
					}
				}
			})
			if took < hold || took > hold+20*time.Millisecond {
				t.Errorf("eu+us = %.3f before ap died; they reclaimed its share %v after it was lost (0: never), want Hold %v (+ two ticks)",
					sum(before), took, hold)
			}
		})
	}
}

// TestCorePartitionSlowMinorityVerdict: ap is cut off; eu and us's
// membership declares it dead at once, ap's own declares them dead only
// after three intervals (memberlist's Lifeguard on a node without
// confirmers). With contact fed, ap cuts to Safe within Silence and a tick
// and the majority reclaims its share only after Hold, so Σ of the
// enforced shares stays ≤ 1 at every step.
func TestCorePartitionSlowMinorityVerdict(t *testing.T) {
	sc := testShareConfig()
	n := newCoreNet(t, sc, "eu-1", "us-1", "ap-1")
	n.rate = map[string]float64{"eu-1": 60, "us-1": 60, "ap-1": 60}
	n.run(n.now.Add(5*sc.Interval), 10*time.Millisecond, nil)
	start := n.now
	ap := n.node("ap-1")
	isolated, reclaimed := time.Duration(0), time.Duration(0)
	// Messages and pings are cut both ways at once; membership's verdict
	// differs by side.
	n.cut = func(a, b string) bool { return a != b && (a == "ap" || b == "ap") }
	n.verdict = func(viewer, region string) bool {
		if viewer == "ap" && n.now.Sub(start) < 3*sc.Interval {
			return false // ap's view: the others still look alive
		}
		return n.cut(viewer, region)
	}
	n.run(start.Add(6*sc.Interval), 10*time.Millisecond, func() {
		s := n.shares("eu-1", "us-1", "ap-1")
		if sum(s) > 1+1e-9 {
			t.Fatalf("%v into the partition: Σ enforced shares = %.4f (eu, us, ap %.3f)", n.now.Sub(start), sum(s), s)
		}
		if isolated == 0 && s[2] <= sc.Floor/3+1e-12 {
			isolated = n.now.Sub(start)
		}
		if reclaimed == 0 && s[0]+s[1] > 0.95 {
			reclaimed = n.now.Sub(start)
		}
	})
	silence, hold := ap.core.cfg.Silence, n.node("eu-1").core.Hold()
	if isolated == 0 || isolated > silence+n.contactEvery+20*time.Millisecond {
		t.Errorf("ap fell back to Safe %v into the partition (0: never), want within Silence %v + a ping period and two ticks", isolated, silence)
	}
	if reclaimed == 0 || reclaimed > hold+n.contactEvery+sc.Interval {
		t.Errorf("eu+us reclaimed ap's share %v into the partition (0: never), want within Hold %v and the rebalance after it", reclaimed, hold)
	}
}

// TestCorePausedPingsDecideNothing: when a node's pings stop running (its
// process paused) its contacts age without any ping given up; it must not
// take that for a partition: no cut to Safe, no reclaim.
func TestCorePausedPingsDecideNothing(t *testing.T) {
	sc := testShareConfig()
	n := newCoreNet(t, sc, "eu-1", "us-1", "ap-1")
	n.rate = map[string]float64{"eu-1": 60, "us-1": 60, "ap-1": 60}
	n.run(n.now.Add(5*sc.Interval), 10*time.Millisecond, nil)
	n.run(n.now.Truncate(sc.Interval).Add(sc.Interval+sc.Settle+2*sc.RaiseDelay), 10*time.Millisecond, nil)
	before := n.shares("eu-1", "us-1", "ap-1")
	pause := n.now
	hold := n.node("ap-1").core.Hold()
	n.paused = func(viewer string) bool { return viewer == "ap-1" }
	n.run(pause.Add(2*hold), 10*time.Millisecond, func() {
		if s := n.shares("eu-1", "us-1", "ap-1"); s[2] < before[2]-1e-9 || s[0]+s[1] > before[0]+before[1]+1e-9 {
			t.Fatalf("%v into ap's pause: shares eu, us, ap %.3f, were %.3f: want no cut and no reclaim", n.now.Sub(pause), s, before)
		}
	})
	for _, nd := range n.nodes {
		for _, r := range []string{"eu", "us", "ap"} {
			if l := lost(nd, r, "silent") + lost(nd, r, "reclaimed"); l != 0 {
				t.Errorf("%s counted region %s lost %v times during ap's pause, want 0", nd.name, r, l)
			}
		}
	}
}

// TestCorePartitionedRegionCuts: a region cut off from the other two is
// isolated and falls back to the safe share, while the majority reclaims
// its share; Σ of the enforced shares stays ≤ 1 throughout.
func TestCorePartitionedRegionCuts(t *testing.T) {
	sc := testShareConfig()
	n := newCoreNet(t, sc, "eu-1", "us-1", "ap-1")
	n.rate = map[string]float64{"eu-1": 60, "us-1": 60, "ap-1": 60}
	n.run(n.now.Add(5*sc.Interval), 50*time.Millisecond, nil)
	n.cut = func(a, b string) bool { return a != b && (a == "ap" || b == "ap") }
	n.run(n.now.Add(6*sc.Interval), 50*time.Millisecond, func() {
		if s := sum(n.shares("eu-1", "us-1", "ap-1")); s > 1+1e-9 {
			t.Fatalf("%v: Σ enforced shares = %v during the partition", n.now, s)
		}
	})
	if ap := n.shares("ap-1")[0]; ap > sc.Floor/3+1e-12 {
		t.Errorf("isolated ap enforces %v, want the safe share %v", ap, sc.Floor/3)
	}
	if s := sum(n.shares("eu-1", "us-1")); s < 0.95 {
		t.Errorf("majority eu+us = %v, want ≥ 0.95", s)
	}
	// Each side counts each loss once, however many ticks it lasts.
	for _, c := range []struct{ node, region, stage string }{
		{"eu-1", "ap", "silent"}, {"eu-1", "ap", "reclaimed"}, {"us-1", "ap", "silent"}, {"us-1", "ap", "reclaimed"},
		{"ap-1", "eu", "silent"}, {"ap-1", "us", "silent"},
	} {
		if l := lost(n.node(c.node), c.region, c.stage); l != 1 {
			t.Errorf("%s counted region %s %s %v times, want once", c.node, c.region, c.stage, l)
		}
	}
	if l := lost(n.node("eu-1"), "us", "silent"); l != 0 {
		t.Errorf("eu-1 counted us, which it could reach, silent %v times", l)
	}
}

// TestCoreTakeoverAfterCrash scripts the end-to-end failover at the
// daemon's 1 s timings: three regions of two nodes, all traffic in r3, then
// r3's nodes crash (no leave; membership keeps them alive until it declares
// them dead) and the traffic moves to r1 and r2. The survivors must hold
// r3's share by the documented bound: K+1 intervals after r3's last report
// plus Settle and RaiseDelay, or RaiseDelay after membership declares r3
// dead if that comes first; Σ of the enforced shares never exceeds 1.
func TestCoreTakeoverAfterCrash(t *testing.T) {
	sc := testShareConfig()
	sc.Settle = 250 * time.Millisecond // region.ShareConfig(1 s)
	sc.RaiseDelay = 100 * time.Millisecond
	// Silence reclaims after K+1 missed reports a region whose nodes are
	// suspected, after 2K+2 one whose nodes still answer every probe.
	reclaim := time.Duration(sc.PartitionIntervals+1)*sc.Interval + sc.Settle + sc.RaiseDelay
	reclaimAlive := time.Duration(2*sc.PartitionIntervals+2)*sc.Interval + sc.Settle + sc.RaiseDelay
	for _, tt := range []struct {
		name    string
		delay   time.Duration // gossip delivery delay
		crash   time.Duration // into the interval: r3's report of the last one is sent at Settle/3
		suspect time.Duration // membership suspects r3's nodes this long after the crash
		detect  time.Duration // membership declares r3 dead this long after the crash
	}{
		{"crash at the boundary, slow detection", 20 * time.Millisecond, 0, 1500 * time.Millisecond, 8 * time.Second},
		{"crash after the report, slow detection", 20 * time.Millisecond, 200 * time.Millisecond, 1500 * time.Millisecond, 8 * time.Second},
		{"crash late in the interval, slow detection", 20 * time.Millisecond, 900 * time.Millisecond, 1500 * time.Millisecond, 8 * time.Second},
		{"slow gossip, slow detection", 140 * time.Millisecond, 500 * time.Millisecond, 1500 * time.Millisecond, 8 * time.Second},
		{"fast detection", 20 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second},
		{"slow gossip, fast detection", 140 * time.Millisecond, 0, time.Second, 1500 * time.Millisecond},
		{"never suspected, slower detection", 20 * time.Millisecond, 500 * time.Millisecond, 12 * time.Second, 12 * time.Second},
	} {
		for _, contact := range []bool{false, true} {
			name := tt.name + ", verdicts only"
			if contact {
				name = tt.name + ", pings"
			}
			t.Run(name, func(t *testing.T) {
				n := newCoreNetCollect(t, sc, 0, "r1-0", "r1-1", "r2-0", "r2-1", "r3-0", "r3-1")
				if !contact {
					n.contactEvery = 0
				}
				n.delay = tt.delay
				n.rate = map[string]float64{"r1-0": 70, "r1-1": 70, "r2-0": 20, "r2-1": 20, "r3-0": 10, "r3-1": 10}
				n.run(n.now.Add(8*sc.Interval), 10*time.Millisecond, nil)
				n.rate = map[string]float64{"r3-0": 100, "r3-1": 100}
				n.run(n.now.Truncate(sc.Interval).Add(7*sc.Interval+tt.crash), 10*time.Millisecond, nil)
				if r3 := n.shares("r3-0")[0]; r3 < 0.9 {
					t.Fatalf("before the crash r3 holds %.3f, want ≥ 0.9", r3)
				}
				crash := n.now
				n.node("r3-0").down, n.node("r3-1").down = true, true
				n.rate = map[string]float64{"r1-0": 50, "r1-1": 50, "r2-0": 50, "r2-1": 50}
				var took time.Duration
				n.run(crash.Add(reclaimAlive+2*sc.Interval), 10*time.Millisecond, func() {
					since := n.now.Sub(crash)
					switch {
					case since >= tt.detect:
						n.node("r3-0").state, n.node("r3-1").state = msg.StateDead, msg.StateDead
					case since >= tt.suspect:
						n.node("r3-0").state, n.node("r3-1").state = msg.StateSuspect, msg.StateSuspect
					}
					s := n.shares("r1-0", "r1-1", "r2-0", "r2-1")
					if total := max(s[0], s[1]) + max(s[2], s[3]); total > 1+1e-9 {
						t.Fatalf("%v after the crash: Σ enforced shares = %v", since, total)
					}
					if took == 0 && s[0]+s[2] > 0.9 && s[1]+s[3] > 0.9 {
						took = since
					}
				})
				silent := reclaim
				if tt.suspect >= time.Duration(sc.PartitionIntervals+1)*sc.Interval {
					silent = reclaimAlive
				}
				hold := n.node("r1-0").core.Hold()
				bound := min(silent, tt.detect+hold) + 20*time.Millisecond // two ticks
				if contact {
					// The last answered ping was at most a ping period before the crash.
					bound = hold + 20*time.Millisecond
				}
				if !contact && silent == reclaimAlive && took != 0 && took < reclaim+sc.Interval {
					t.Errorf("r1+r2 took the share of a region answering every probe %v after its crash, before 2K+2 missed reports", took)
				}
				if took == 0 || took > bound {
					t.Errorf("r1+r2 hold r3's share %v after the crash (0: never), want within %v (r1, r2 at %.3f)",
						took, bound, n.shares("r1-0", "r2-0"))
				}
			})
		}
	}
}
