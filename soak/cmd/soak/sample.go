package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/soak"
)

// sampleEvery is how often the sampler reads the deployment's resources.
const sampleEvery = 10 * time.Second

// sampler reads every daemon's RSS and open descriptors from /proc and its
// goroutines from /metrics, and every Redis primary's key count and
// memory, every sampleEvery until ctx ends.
func sampler(ctx context.Context, dp *deployment, out chan<- soak.Sample) {
	defer close(out)
	t := time.NewTicker(sampleEvery)
	defer t.Stop()
	for {
		out <- sample(ctx, dp)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func sample(ctx context.Context, dp *deployment) soak.Sample {
	s := soak.Sample{At: time.Now(), FDKinds: map[string]int64{}}
	redisPorts := dp.redisPorts()
	for _, d := range dp.daemons() {
		pid := d.pid()
		if pid == 0 {
			continue
		}
		g, losses, err := daemonMetrics(ctx, d.addr)
		if err != nil {
			continue
		}
		rss, err := rssBytes(pid)
		if err != nil {
			continue
		}
		kinds, err := fdKinds(pid, redisPorts)
		if err != nil {
			continue
		}
		s.Daemons++
		s.Goroutines += g
		s.RSSBytes += rss
		for k, n := range kinds {
			s.FDs += n
			s.FDKinds[k] += n
		}
		for lost, l := range losses {
			l.Daemon, l.Region, l.Lost = d.name, d.region, lost
			s.Losses = append(s.Losses, l)
		}
	}
	for _, r := range dp.regions {
		for _, n := range r.nodes() {
			keys, mem, primary := redisFigures(ctx, n.Addr())
			if primary {
				s.RedisKeys += keys
				s.RedisMemory += mem.used
				s.RedisDataset += mem.dataset
				s.RedisPersistent += mem.persistent
			}
		}
	}
	return s
}

// redisPorts is the ports of every Redis server and Sentinel of the
// deployment, which a daemon's connections to them are told apart by.
func (dp *deployment) redisPorts() map[int]bool {
	out := map[int]bool{}
	for _, r := range dp.regions {
		for _, n := range r.nodes() {
			out[n.Port()] = true
		}
		if r.sentinel != nil {
			for _, n := range r.sentinel.Sentinels() {
				out[n.Port()] = true
			}
		}
	}
	return out
}

func rssBytes(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for %d", pid)
}

// daemonMetrics reads a daemon's /metrics: its goroutines and, per other
// region, how many times it found it out of contact and took its share
// back (Loss's Count and Reclaimed).
func daemonMetrics(ctx context.Context, addr string) (goroutines int64, lost map[string]soak.Loss, err error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+addr+"/metrics", nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	return parseMetrics(res.Body, addr)
}

// parseMetrics reads go_goroutines and the silent and reclaimed stages of
// sluice_globalshare_region_lost_total from a Prometheus text exposition.
func parseMetrics(r io.Reader, addr string) (goroutines int64, lost map[string]soak.Loss, err error) {
	const lostPrefix = `sluice_globalshare_region_lost_total{region="`
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	found := false
	lost = map[string]soak.Loss{}
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "go_goroutines "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return 0, nil, fmt.Errorf("%s/metrics: go_goroutines: %w", addr, err)
			}
			goroutines, found = int64(f), true
			continue
		}
		rest, ok := strings.CutPrefix(line, lostPrefix)
		if !ok {
			continue
		}
		region, rest, ok := strings.Cut(rest, `",stage="`)
		if !ok {
			continue
		}
		stage, v, ok := strings.Cut(rest, `"} `)
		n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if !ok || err != nil {
			continue
		}
		l := lost[region]
		switch stage {
		case "silent":
			l.Count = n
		case "reclaimed":
			l.Reclaimed = n
		default:
			continue
		}
		lost[region] = l
	}
	if err := sc.Err(); err != nil {
		return 0, nil, fmt.Errorf("%s/metrics: %w", addr, err)
	}
	if !found {
		return 0, nil, fmt.Errorf("%s/metrics: no go_goroutines", addr)
	}
	return goroutines, lost, nil
}

// redisMemory is what a node's INFO says of its memory (used_memory and
// used_memory_dataset) and, from its keyspace, how many of its keys have
// no TTL (keys less expires, over every database).
type redisMemory struct{ used, dataset, persistent int64 }

// redisFigures returns a node's key count and memory, and whether it is a
// primary (only primaries are summed: replicas hold copies).
func redisFigures(ctx context.Context, addr string) (keys int64, mem redisMemory, primary bool) {
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second, ReadTimeout: time.Second, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	info, err := c.Info(ctx, "replication", "memory", "keyspace").Result()
	if err != nil || !strings.Contains(info, "role:master") {
		return 0, mem, false
	}
	mem = parseRedisMemory(info)
	keys, err = c.DBSize(ctx).Result()
	if err != nil {
		return 0, mem, false
	}
	return keys, mem, true
}

func parseRedisMemory(info string) redisMemory {
	var m redisMemory
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			m.used, _ = strconv.ParseInt(v, 10, 64)
		}
		if v, ok := strings.CutPrefix(line, "used_memory_dataset:"); ok {
			m.dataset, _ = strconv.ParseInt(v, 10, 64)
		}
		if _, v, ok := strings.Cut(line, ":keys="); ok && strings.HasPrefix(line, "db") {
			// db0:keys=3,expires=2,avg_ttl=1500,subexpiry=0
			var keys, expires int64
			for _, kv := range strings.Split("keys="+v, ",") {
				k, n, _ := strings.Cut(kv, "=")
				switch k {
				case "keys":
					keys, _ = strconv.ParseInt(n, 10, 64)
				case "expires":
					expires, _ = strconv.ParseInt(n, 10, 64)
				}
			}
			m.persistent += keys - expires
		}
	}
	return m
}
