package main

import (
	"context"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/soak"
)

// failoverPoll is how often the failover watch reads the roles.
const failoverPoll = 500 * time.Millisecond

// failoverLead is how far before the reading that shows a promotion its
// span starts: twice the deployment's failure detection (Cluster's
// cluster-node-timeout and Sentinel's down-after-milliseconds are 1 s).
const failoverLead = 2 * time.Second

// watchFailovers reads every failover-capable region's node roles every
// failoverPoll until ctx ends and returns the promotions it saw
// (soak.FailoverWatch), injected or not.
func watchFailovers(ctx context.Context, dp *deployment) []soak.Span {
	clients := map[string]*redis.Client{}
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	w := soak.FailoverWatch{Lead: failoverLead}
	var out []soak.Span
	t := time.NewTicker(failoverPoll)
	defer t.Stop()
	for {
		for _, r := range dp.regions {
			if r.sentinel == nil && r.cluster == nil {
				continue
			}
			primary := map[int]bool{}
			for _, n := range r.nodes() {
				c := clients[n.Addr()]
				if c == nil {
					c = redis.NewClient(&redis.Options{Addr: n.Addr(), DialTimeout: 300 * time.Millisecond,
						ReadTimeout: 300 * time.Millisecond, MaxRetries: -1, DialerRetries: 1, PoolSize: 1})
					clients[n.Addr()] = c
				}
				if is, ok := isPrimary(ctx, c); ok {
					primary[n.Port()] = is
				}
			}
			out = append(out, w.Step(r.name, time.Now(), primary)...)
		}
		select {
		case <-ctx.Done():
			return out
		case <-t.C:
		}
	}
}

// isPrimary asks a node its role; ok is false if it did not answer in
// time (killed, paused, loading).
func isPrimary(ctx context.Context, c *redis.Client) (primary, ok bool) {
	ctx, cancel := context.WithTimeout(ctx, 400*time.Millisecond)
	defer cancel()
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return false, false
	}
	switch {
	case strings.Contains(info, "role:master"):
		return true, true
	case strings.Contains(info, "role:slave"):
		return false, true
	}
	return false, false
}
