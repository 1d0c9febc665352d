package redistest

import (
	"strings"
	"testing"
	"time"
)

// TestRemeetJoinsNodes checks the fallback create relies on when redis-cli's
// one CLUSTER MEET is lost: remeet alone must join nodes that never met.
func TestRemeetJoinsNodes(t *testing.T) {
	skipShort(t)
	t.Parallel()
	bin := lookPath(t, "redis-server")
	c := &Cluster{t: t}
	pp := &portPicker{}
	for range 3 {
		c.nodes = append(c.nodes, startServer(t, bin, clusterArgs, func() (int, error) { return pp.pick(true) }))
	}
	c.remeet()
	deadline := time.Now().Add(10 * time.Second)
	for _, s := range c.nodes {
		for {
			nodes, err := s.doString(probeTimeout, "CLUSTER", "NODES")
			if err == nil && strings.Count(nodes, "connected") == 3 && !strings.Contains(nodes, "handshake") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: CLUSTER NODES after remeet = %q, %v; want all 3 nodes connected", s.Addr(), nodes, err)
			}
			<-time.After(pollInterval)
		}
	}
}
