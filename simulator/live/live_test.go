package live

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/simulator"
)

// TestSteadyUnevenMatchesVirtual is issue 5's must-show: the live run of
// steady-uneven (3 regions, 2·L split 70/20/10, real daemons, memberlist and
// HTTP, interval compressed to 1 s) and the virtual-time run of the same
// scenario agree on global_error_p99_pct within 3 percentage points.
func TestSteadyUnevenMatchesVirtual(t *testing.T) {
	if testing.Short() {
		t.Skip("live run of 30 s; skipped under -short")
	}
	sc, ok := simulator.Builtin("steady-uneven")
	if !ok {
		t.Fatal("no built-in steady-uneven")
	}
	ctx := context.Background()
	virt, err := simulator.Run(ctx, sc, simulator.Options{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	live, err := Run(ctx, sc, Options{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("live run took %v, %d checks", time.Since(start).Round(time.Millisecond), live.Checks)
	t.Logf("virtual: %+v", virt.Summary)
	t.Logf("live:    %+v", live.Summary)
	for _, w := range live.Windows {
		if testing.Verbose() {
			t.Logf("live window %v: offered %d admitted %d oracle %d error %.2f%% regions %+v", w.StartS, w.Offered, w.Admitted, w.Oracle, w.ErrorPct, w.Regions)
		}
	}
	if d := math.Abs(live.Summary.GlobalErrorP99Pct - virt.Summary.GlobalErrorP99Pct); d > 3 {
		t.Errorf("global_error_p99_pct: live %.2f, virtual %.2f: %.2f points apart, want ≤ 3",
			live.Summary.GlobalErrorP99Pct, virt.Summary.GlobalErrorP99Pct, d)
	}
	if len(live.Windows) != len(virt.Windows) {
		t.Errorf("live has %d windows, virtual %d", len(live.Windows), len(virt.Windows))
	}
}
