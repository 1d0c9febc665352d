package main

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/soak"
)

// TestWatchFailoversSeesAPromotion: a Sentinel failover of a real Redis
// is one failover span, naming the replica promoted.
func TestWatchFailoversSeesAPromotion(t *testing.T) {
	s := redistest.StartSentinel(t)
	dp := &deployment{regions: []*region{{name: regionSentinel, sentinel: s}}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan []soak.Span)
	go func() { done <- watchFailovers(ctx, dp) }()
	time.Sleep(3 * failoverPoll) // a first reading of the roles
	_, promoted := s.KillPrimaryAndWaitFailover()
	time.Sleep(3 * failoverPoll)
	cancel()
	spans := <-done
	if len(spans) != 1 {
		t.Fatalf("spans %v, want the one promotion", spans)
	}
	sp := spans[0]
	if sp.Kind != soak.Failover || sp.Region != regionSentinel || !strings.Contains(sp.Detail, ":"+strconv.Itoa(promoted.Port())+" ") {
		t.Errorf("span %+v, want a failover of %s promoting port %d", sp, regionSentinel, promoted.Port())
	}
}
