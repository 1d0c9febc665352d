package share_test

import (
	"fmt"
	"time"

	"github.com/sluice-rl/sluice/share"
)

// Three regions share a global limit of 1000 units/s for one key; traffic is
// 70/20/10 of twice the limit. After one report exchange every region
// enforces a share proportional to its demand.
func Example() {
	cfg := share.DefaultConfig()
	regions := []string{"ap", "eu", "us"}
	now := time.Unix(1_700_000_000, 0)
	epoch := cfg.Epoch(now)
	key := share.Key{Policy: "global-api", Subject: "acme"}
	offered := map[string]float64{"ap": 1400, "eu": 400, "us": 200}

	allocs := map[string]*share.Allocator{}
	var reports []share.Report
	for _, r := range regions {
		a, _ := share.NewAllocator(cfg, r, regions, epoch)
		allocs[r] = a
		reports = append(reports, a.Report(epoch, []share.Usage{{Key: key, Limit: 1000,
			Offered: offered[r], Recent: offered[r]}}))
	}
	later := cfg.EpochStart(epoch).Add(cfg.Settle + cfg.RaiseDelay)
	for _, r := range regions {
		allocs[r].Rebalance(cfg.EpochStart(epoch).Add(cfg.Settle), epoch, reports)
		fmt.Printf("%s %.3f\n", r, allocs[r].Table(later).Share(key.Policy, key.Subject))
	}
	// Output:
	// ap 0.689
	// eu 0.204
	// us 0.107
}

// A global daily quota: each region counts its own spend and merges the
// others' counts from their reports.
func ExampleQuotaCounter() {
	day := 24 * time.Hour
	w := share.WindowIndex(time.Unix(1_700_000_000, 0), day)
	var eu, us share.QuotaCounter
	eu.Add(w, "eu", 700)
	us.Add(w, "us", 250)
	eu.Merge(us) // us's report arrives in eu
	fmt.Println(eu.Total(), eu.Allow(w, 1000, 50), eu.Allow(w, 1000, 51))
	// Output: 950 true false
}
