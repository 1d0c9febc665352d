package main

import (
	"bufio"
	"context"
	"fmt"
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
	s := soak.Sample{At: time.Now()}
	for _, d := range dp.daemons() {
		pid := d.pid()
		if pid == 0 {
			continue
		}
		g, err := goroutines(ctx, d.addr)
		if err != nil {
			continue
		}
		rss, err := rssBytes(pid)
		if err != nil {
			continue
		}
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil {
			continue
		}
		s.Daemons++
		s.Goroutines += g
		s.RSSBytes += rss
		s.FDs += int64(len(fds))
	}
	for _, r := range dp.regions {
		for _, n := range r.nodes() {
			keys, mem, primary := redisFigures(ctx, n.Addr())
			if primary {
				s.RedisKeys += keys
				s.RedisMemory += mem
			}
		}
	}
	return s
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

func goroutines(ctx context.Context, addr string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+addr+"/metrics", nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return int64(f), err
		}
	}
	return 0, fmt.Errorf("%s/metrics: no go_goroutines", addr)
}

// redisFigures returns a node's key count and used memory, and whether it
// is a primary (only primaries are summed: replicas hold copies).
func redisFigures(ctx context.Context, addr string) (keys, mem int64, primary bool) {
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second, ReadTimeout: time.Second, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	info, err := c.Info(ctx, "replication", "memory").Result()
	if err != nil || !strings.Contains(info, "role:master") {
		return 0, 0, false
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			mem, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	keys, err = c.DBSize(ctx).Result()
	if err != nil {
		return 0, 0, false
	}
	return keys, mem, true
}
