package redistest_test

import (
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/redistest"
)

// TestSentinelFailover writes through a failover client, kills the primary,
// and reads and writes again once the Sentinels have promoted the replica.
func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	s := redistest.StartSentinel(t)
	nodes := s.Nodes()
	if len(nodes) != 2 || len(s.Addrs()) != 3 || len(s.Sentinels()) != 3 {
		t.Fatalf("%d data nodes, %d sentinel addresses, %d sentinels; want 2, 3, 3", len(nodes), len(s.Addrs()), len(s.Sentinels()))
	}
	if got := s.Primary(); got != nodes[0] {
		t.Fatalf("Primary() = %s, want the first node %s", got.Addr(), nodes[0].Addr())
	}
	c := s.Client(t)
	ctx := ctxT(t, 40*time.Second)
	const key = "sluice:sentinel"
	if err := c.Set(ctx, key, "before", 0).Err(); err != nil {
		t.Fatalf("SET through the sentinels = %v", err)
	}
	// The value must be on the replica before the primary dies, or the
	// failover may lose it.
	if n, err := c.Wait(ctx, 1, 5*time.Second).Result(); n != 1 || err != nil {
		t.Fatalf("WAIT 1 = %d, %v, want 1, nil", n, err)
	}

	killed, promoted := s.KillPrimaryAndWaitFailover()
	if killed != nodes[0] || promoted != nodes[1] {
		t.Fatalf("KillPrimaryAndWaitFailover() = %s, %s, want %s, %s", killed.Addr(), promoted.Addr(), nodes[0].Addr(), nodes[1].Addr())
	}
	if killed.PID() != 0 || promoted.PID() == 0 {
		t.Fatalf("after failover: killed pid %d, promoted pid %d; want 0 and running", killed.PID(), promoted.PID())
	}
	if got := s.Primary(); got != promoted {
		t.Errorf("Primary() after failover = %s, want %s", got.Addr(), promoted.Addr())
	}
	if got, err := c.Get(ctx, key).Result(); got != "before" || err != nil {
		t.Fatalf("GET after failover = %q, %v, want \"before\", nil", got, err)
	}
	if err := c.Set(ctx, key, "after", 0).Err(); err != nil {
		t.Fatalf("SET after failover = %v", err)
	}
	if got, err := promoted.Client(t).Get(ctx, key).Result(); got != "after" || err != nil {
		t.Fatalf("GET on the promoted node = %q, %v, want \"after\", nil", got, err)
	}
}
