package live

import (
	"fmt"
	"os"
	"testing"

	"github.com/sluice-rl/sluice/internal/racedetector"
)

// TestMain skips this package's tests under the race detector: each drives
// live daemons at thousands of checks a second and compares them with the
// virtual-time run, and under the detector the machine cannot serve that
// load, so they would measure the detector. The daemons' code is raced by
// the region, gossip and cmd/sluice tests.
func TestMain(m *testing.M) {
	if racedetector.Enabled {
		fmt.Println("simulator/live: load tests skipped under the race detector")
		os.Exit(0)
	}
	os.Exit(m.Run())
}
