package share

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// cluster runs one Allocator per region, exchanging reports the way the
// gossip layer does: publish at the epoch boundary, rebalance Settle later.
type cluster struct {
	cfg     Config
	names   []string
	allocs  map[string]*Allocator
	epoch   uint64
	limit   float64
	key     Key
	deliver func(from, to string) bool // nil: always
}

func newCluster(t *testing.T, n int) *cluster {
	t.Helper()
	cfg := DefaultConfig()
	c := &cluster{cfg: cfg, allocs: map[string]*Allocator{}, epoch: 1000, limit: 1000,
		key: Key{Policy: "global", Subject: "acme"}}
	for i := range n {
		c.names = append(c.names, fmt.Sprintf("r%d", i))
	}
	for _, name := range c.names {
		a, err := NewAllocator(cfg, name, c.names, c.epoch)
		if err != nil {
			t.Fatal(err)
		}
		c.allocs[name] = a
	}
	return c
}

// step runs one epoch with the given offered rates per region (units/s).
func (c *cluster) step(offered map[string]float64) {
	c.epoch++
	reports := map[string]Report{}
	for _, name := range c.names {
		x := offered[name]
		share := c.allocs[name].Table(c.cfg.EpochStart(c.epoch)).Share(c.key.Policy, c.key.Subject)
		reports[name] = c.allocs[name].Report(c.epoch, []Usage{{Key: c.key, Limit: c.limit,
			Offered: x, Recent: x, Admitted: min(x, share*c.limit)}})
	}
	now := c.cfg.EpochStart(c.epoch).Add(c.cfg.Settle)
	for _, to := range c.names {
		var in []Report
		for _, from := range c.names {
			if from == to || c.deliver == nil || c.deliver(from, to) {
				in = append(in, reports[from])
			}
		}
		c.allocs[to].Rebalance(now, c.epoch, in)
	}
}

// enforced returns Σ over regions of the share each enforces at t.
func (c *cluster) enforced(t time.Time, key Key) float64 {
	var s float64
	for _, name := range c.names {
		s += c.allocs[name].Table(t).Share(key.Policy, key.Subject)
	}
	return s
}

func (c *cluster) shares(name string) []float64 { return c.allocs[name].Shares(c.key) }

func TestConstantDemandConvergesWithoutOscillation(t *testing.T) {
	tests := []struct {
		name    string
		offered []float64 // per region, units/s, L = 1000
	}{
		{"70/20/10 at 2L", []float64{1400, 400, 200}},
		{"90/5/5/0/0 at 2L", []float64{1800, 100, 100, 0, 0}},
		{"even at 1.5L", []float64{500, 500, 500}},
		{"one hot of five at 1.2L", []float64{1200, 0, 0, 0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCluster(t, len(tt.offered))
			offered := map[string]float64{}
			var total float64
			for i, x := range tt.offered {
				offered[c.names[i]] = x
				total += x
			}
			var prev []float64
			var lastChange float64
			for e := range 30 {
				c.step(offered)
				cur := c.shares(c.names[0])
				if got := sum(cur); math.Abs(got-1) > 1e-9 {
					t.Fatalf("epoch %d: Σ shares = %v, want 1", e, got)
				}
				// Every region computes the same shares.
				for _, name := range c.names[1:] {
					other := c.shares(name)
					for i := range cur {
						if math.Abs(other[i]-cur[i]) > 1e-12 {
							t.Fatalf("epoch %d: %s computes %v, %s computes %v", e, c.names[0], cur, name, other)
						}
					}
				}
				if prev != nil {
					var change float64
					for i := range cur {
						change += math.Abs(cur[i] - prev[i])
					}
					if e > 3 && change > lastChange+1e-12 {
						t.Errorf("epoch %d: share change %v grew from %v (oscillation)", e, change, lastChange)
					}
					lastChange = change
				}
				prev = cur
			}
			if lastChange > 1e-6 {
				t.Errorf("share change after 30 epochs = %v, want ~0", lastChange)
			}
			f := c.cfg.floor(len(tt.offered))
			for i, x := range tt.offered {
				// Over-demand: floor + ∝ demand. Each region at least its
				// floor, and the hot region gets what it offers or more.
				want := f + (1-f*float64(len(tt.offered)))*x/total
				if total < c.limit {
					continue
				}
				if math.Abs(prev[i]-want) > 0.002 {
					t.Errorf("share[%d] = %.4f, want ≈ %.4f (demand proportion)", i, prev[i], want)
				}
			}
		})
	}
}

func TestMissingReportKeepsLastShare(t *testing.T) {
	c := newCluster(t, 3)
	offered := map[string]float64{"r0": 1400, "r1": 400, "r2": 200}
	for range 5 {
		c.step(offered)
	}
	before := c.shares("r0")
	c.deliver = func(from, to string) bool { return from != "r2" }
	c.step(map[string]float64{"r0": 200, "r1": 1800, "r2": 5000})
	after := c.shares("r0")
	if after[2] != before[2] {
		t.Errorf("r2's share with its report missing = %v, want last share %v", after[2], before[2])
	}
	if got := sum(after); math.Abs(got-1) > 1e-9 {
		t.Errorf("Σ shares = %v, want 1", got)
	}
}

func TestUnreportedKeysGetEvenDefault(t *testing.T) {
	c := newCluster(t, 4)
	c.step(map[string]float64{"r0": 10})
	tab := c.allocs["r0"].Table(c.cfg.EpochStart(c.epoch + 1))
	if got := tab.Share("global", "nobody"); got != 0.25 {
		t.Errorf("Share(unreported) = %v, want 0.25", got)
	}
	if tab.Len() != 0 {
		t.Errorf("coordinated keys = %d, want 0 (no pressure)", tab.Len())
	}
}

func TestCutsBeforeRaises(t *testing.T) {
	c := newCluster(t, 2)
	c.step(map[string]float64{"r0": 1800, "r1": 200})
	c.step(map[string]float64{"r0": 1800, "r1": 200})
	c.step(map[string]float64{"r0": 200, "r1": 1800}) // shift
	start := c.cfg.EpochStart(c.epoch).Add(c.cfg.Settle)
	for d := time.Duration(0); d < 2*c.cfg.RaiseDelay; d += 100 * time.Millisecond {
		if got := c.enforced(start.Add(d), c.key); got > 1+1e-9 {
			t.Errorf("Σ enforced at +%v = %v, want ≤ 1", d, got)
		}
	}
	mid := c.enforced(start.Add(c.cfg.RaiseDelay/2), c.key)
	if mid > 0.9 {
		t.Errorf("Σ enforced before raises = %v, want the raise held back", mid)
	}
}

func TestPartitionFallbackBound(t *testing.T) {
	// Random partitions of 5 regions; at every 250 ms the enforced shares
	// of a coordinated and an unreported key stay within the bound.
	for seed := range uint64(40) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 7))
			n := 3 + r.IntN(5)
			c := newCluster(t, n)
			offered := map[string]float64{}
			for _, name := range c.names {
				offered[name] = r.Float64() * 800
			}
			side := map[string]int{}
			for e := range 40 {
				if e == 5 { // partition: random sides
					for _, name := range c.names {
						side[name] = r.IntN(2)
					}
					c.deliver = func(from, to string) bool { return side[from] == side[to] }
				}
				if e == 30 { // heal
					c.deliver = nil
				}
				c.step(offered)
				bound := c.cfg.PartitionBound(n, n)
				start := c.cfg.EpochStart(c.epoch).Add(c.cfg.Settle)
				for d := time.Duration(0); d < c.cfg.Interval; d += 250 * time.Millisecond {
					for _, key := range []Key{c.key, {Policy: "global", Subject: "cold"}} {
						if got := c.enforced(start.Add(d), key); got > bound+1e-9 {
							t.Fatalf("epoch %d +%v: Σ enforced(%v) = %v, want ≤ %v (sides %v)", e, d, key, got, bound, side)
						}
					}
				}
			}
			// Healed: everyone back to the full limit.
			if got := c.enforced(c.cfg.EpochStart(c.epoch+1), c.key); math.Abs(got-1) > 1e-9 {
				t.Errorf("after healing Σ enforced = %v, want 1", got)
			}
		})
	}
}

func TestCrashedRegionIsReclaimed(t *testing.T) {
	c := newCluster(t, 5)
	offered := map[string]float64{"r0": 600, "r1": 600, "r2": 600, "r3": 600, "r4": 600}
	for range 3 {
		c.step(offered)
	}
	c.deliver = func(from, to string) bool { return from != "r4" }
	delete(offered, "r4")
	for range c.cfg.PartitionIntervals + 1 {
		c.step(offered)
	}
	at := c.cfg.EpochStart(c.epoch).Add(c.cfg.Settle + c.cfg.RaiseDelay)
	var live float64
	for _, name := range c.names[:4] {
		live += c.allocs[name].Table(at).Share(c.key.Policy, c.key.Subject)
	}
	if want := 1 - c.cfg.safe(5); math.Abs(live-want) > 1e-9 {
		t.Errorf("live regions' shares after %d intervals = %v, want %v", c.cfg.PartitionIntervals+1, live, want)
	}
}

// TestSilentLiveRegionKeepsItsShareLonger: reports of a region that
// membership still sees alive must go missing 2K+2 times in a row before
// the others hand its share out, against K+1 for a region membership
// knows nothing alive of (TestCrashedRegionIsReclaimed).
func TestSilentLiveRegionKeepsItsShareLonger(t *testing.T) {
	c := newCluster(t, 5)
	offered := map[string]float64{"r0": 600, "r1": 600, "r2": 600, "r3": 600, "r4": 600}
	for range 3 {
		c.step(offered)
	}
	for _, name := range c.names {
		c.allocs[name].SetLive(c.names)
	}
	c.deliver = func(from, to string) bool { return from != "r4" }
	k := c.cfg.PartitionIntervals
	othersShare := func() float64 {
		at := c.cfg.EpochStart(c.epoch).Add(c.cfg.Settle + c.cfg.RaiseDelay)
		var sum float64
		for _, name := range c.names[:4] {
			sum += c.allocs[name].Table(at).Share(c.key.Policy, c.key.Subject)
		}
		return sum
	}
	before := othersShare()
	for range 2*k + 1 {
		c.step(offered)
	}
	if got := othersShare(); math.Abs(got-before) > 1e-9 {
		t.Errorf("after %d missed reports of a live region the others hold %v, want %v as before", 2*k+1, got, before)
	}
	c.step(offered)
	if got, want := othersShare(), 1-c.cfg.safe(5); math.Abs(got-want) > 1e-9 {
		t.Errorf("after %d missed reports the others hold %v, want %v", 2*k+2, got, want)
	}
}

func TestMembershipChangeRedistributes(t *testing.T) {
	c := newCluster(t, 3)
	offered := map[string]float64{"r0": 900, "r1": 900, "r2": 900}
	c.step(offered)
	// r2 leaves gracefully.
	c.names = c.names[:2]
	for _, name := range c.names {
		c.allocs[name].SetMembers(c.epoch, c.names)
	}
	delete(offered, "r2")
	c.step(offered)
	at := c.cfg.EpochStart(c.epoch + 1)
	if got := c.enforced(at, c.key); math.Abs(got-1) > 1e-9 {
		t.Errorf("Σ after leave = %v, want 1", got)
	}
	if got := c.allocs["r0"].Table(at).Share("global", "cold"); got != 0.5 {
		t.Errorf("default share after leave = %v, want 0.5", got)
	}
}
