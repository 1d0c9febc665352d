package redisstore

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/engine/limiter"
	"github.com/sluice-rl/sluice/engine/storetest"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/internal/testwait"
)

func TestParseSentinelURL(t *testing.T) {
	valid := []struct {
		url        string
		master     string
		addrs      []string
		db         int
		user, pass string
	}{
		{"redis-sentinel://mymaster@127.0.0.1:26379", "mymaster", []string{"127.0.0.1:26379"}, 0, "", ""},
		{"redis-sentinel://m@s1:26379,s2:26380,s3:26381/3", "m", []string{"s1:26379", "s2:26380", "s3:26381"}, 3, "", ""},
		{"redis-sentinel://m@s1:1, s2:2,/", "m", []string{"s1:1", "s2:2"}, 0, "", ""},
		{"redis-sentinel://u:p@ss@m@[::1]:26379/15", "m", []string{"[::1]:26379"}, 15, "u", "p@ss"},
		{"redis-sentinel://:pw@m@h:1", "m", []string{"h:1"}, 0, "", "pw"},
	}
	for _, tc := range valid {
		t.Run(tc.url, func(t *testing.T) {
			o, err := parseSentinelURL(tc.url)
			if err != nil {
				t.Fatalf("parseSentinelURL(%q) = %v, want nil", tc.url, err)
			}
			if o.MasterName != tc.master || strings.Join(o.SentinelAddrs, ",") != strings.Join(tc.addrs, ",") ||
				o.DB != tc.db || o.Username != tc.user || o.Password != tc.pass {
				t.Errorf("parseSentinelURL(%q) = master %q, sentinels %v, db %d, user %q, password %q; want %q, %v, %d, %q, %q",
					tc.url, o.MasterName, o.SentinelAddrs, o.DB, o.Username, o.Password, tc.master, tc.addrs, tc.db, tc.user, tc.pass)
			}
		})
	}
	invalid := []struct{ url, want string }{
		{"redis-sentinel://", "names no master"},
		{"redis-sentinel://h1:26379,h2:26379", "names no master"},
		{"redis-sentinel://@h1:26379", "names no master"},
		{"redis-sentinel://u:secret@@h1:26379", "names no master"},
		{"redis-sentinel://m@", "names no sentinel"},
		{"redis-sentinel://m@/2", "names no sentinel"},
		{"redis-sentinel://m@ , ", "names no sentinel"},
		{"redis-sentinel://m@h1", `sentinel address "h1" is not HOST:PORT`},
		{"redis-sentinel://m@:26379", `sentinel address ":26379" is not HOST:PORT`},
		{"redis-sentinel://m@h1:26379,h2", `sentinel address "h2" is not HOST:PORT`},
		{"redis-sentinel://m@h1:port", `sentinel address "h1:port" has no port from 1 to 65535`},
		{"redis-sentinel://m@h1:70000", `has no port from 1 to 65535`},
		{"redis-sentinel://m@h1:0", `has no port from 1 to 65535`},
		{"redis-sentinel://m@h1:26379?db=2", `has no port from 1 to 65535`},
		{"redis-sentinel://m@h1:26379/x", `database "x" is not a non-negative integer`},
		{"redis-sentinel://m@h1:26379/-1", `database "-1" is not a non-negative integer`},
		{"redis-sentinel://m@h1:26379/1/2", `database "1/2" is not a non-negative integer`},
		{"redis-sentinel://m@h1:26379/+1", `database "+1" is not a non-negative integer`},
		{"redis-sentinel://my master@h1:26379", `master name "my master" may not contain`},
		{"redis-sentinel://m:x@h1:26379", `master name "m:x" may not contain`},
		{"redis-sentinel://a/b@h1:26379", `master name "a/b" may not contain`},
		{"redis://m@h1:26379", "must start with redis-sentinel://"},
	}
	for _, tc := range invalid {
		t.Run(tc.url, func(t *testing.T) {
			_, err := parseSentinelURL(tc.url)
			if err == nil {
				t.Fatalf("parseSentinelURL(%q) = nil error, want one containing %q", tc.url, tc.want)
			}
			if msg := err.Error(); !strings.Contains(msg, tc.want) || strings.Contains(msg, "\n") {
				t.Errorf("parseSentinelURL(%q) = %q, want one line containing %q", tc.url, msg, tc.want)
			}
		})
	}
	// A password never reaches an error message, which ends up in logs.
	if _, err := parseSentinelURL("redis-sentinel://u:hunter2@m@h1"); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("error for a URL with a password = %v, want one without the password", err)
	}
}

// TestNewRedisClientSentinel checks that the failover client gets the
// request-path settings NewClient gives every client.
func TestNewRedisClientSentinel(t *testing.T) {
	c, err := NewClient("redis-sentinel://u:pw@mymaster@127.0.0.1:26379,127.0.0.1:26380/4")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rc, ok := c.(*redis.Client)
	if !ok {
		t.Fatalf("NewRedisClient(redis-sentinel://) = %T, want *redis.Client", c)
	}
	o := rc.Options()
	if !o.ContextTimeoutEnabled || o.DB != 4 || o.PoolSize < 64 || o.MaxRetries != 1 || o.DialerRetries != 1 ||
		o.DialTimeout != 250*time.Millisecond || o.MaxRetryBackoff > time.Millisecond || o.Username != "u" || o.Password != "pw" {
		t.Errorf("failover client options = timeout-enabled %v, db %d, pool %d, retries %d, dial retries %d, dial timeout %v, backoff %v, user %q, password %q;"+
			" want true, 4, >= 64, 1, 1, 250ms, <= 1ms, \"u\", \"pw\"",
			o.ContextTimeoutEnabled, o.DB, o.PoolSize, o.MaxRetries, o.DialerRetries, o.DialTimeout, o.MaxRetryBackoff, o.Username, o.Password)
	}
	if _, err := NewClient("redis-sentinel://h1:26379"); err == nil {
		t.Error("NewRedisClient(redis-sentinel:// without a master) = nil error, want one")
	}
	if s := New(rc, Config{}); s.Shard(context.Background(), "x") != "store" {
		t.Errorf("Shard over a sentinel client = %q, want \"store\": a Sentinel deployment is one primary", s.Shard(context.Background(), "x"))
	}
}

func FuzzParseSentinelURL(f *testing.F) {
	for _, s := range []string{
		"redis-sentinel://m@h:1", "redis-sentinel://u:p@m@h1:1,h2:2/3", "redis-sentinel://m@[::1]:26379/0",
		"redis-sentinel://", "redis-sentinel://@", "redis-sentinel://m@h", "redis-sentinel://m@h:1/x",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, url string) {
		o, err := parseSentinelURL(url)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("parseSentinelURL(%q) error spans lines: %q", url, err)
			}
			return
		}
		if o.MasterName == "" || len(o.SentinelAddrs) == 0 || o.DB < 0 {
			t.Fatalf("parseSentinelURL(%q) = master %q, sentinels %v, db %d: accepted without a master, a sentinel or a valid db",
				url, o.MasterName, o.SentinelAddrs, o.DB)
		}
		for _, a := range o.SentinelAddrs {
			if a == "" || strings.ContainsAny(a, ",/ ") {
				t.Fatalf("parseSentinelURL(%q) gave sentinel address %q", url, a)
			}
		}
	})
}

// TestRedisSentinelFailover runs the store over a Sentinel deployment:
// exact decisions through the failover client, then, with the Limiter in
// front, the primary dies and the Sentinels promote its replica while a
// fail-open and a fail-closed policy are checked. No check errors; the
// store decides again once the replica is promoted; the outage is logged.
func TestRedisSentinelFailover(t *testing.T) {
	sd := redistest.StartSentinel(t)
	url := "redis-sentinel://" + redistest.MasterName + "@" + joinAddrs(sd.Addrs())
	ctx := context.Background()

	// The store alone decides exactly: the limit admitted, then rejected.
	c, err := NewClient(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	store := New(c, Config{Timeout: time.Second})
	const burst = 20
	l := engine.Limit{Algorithm: engine.FixedWindow, Count: burst, Window: time.Hour}
	for i := range burst + 3 {
		d := storetest.MustCheck(t, store, engine.Request{Subject: "exact", Checks: []engine.Check{{Policy: "q", Limit: l, Cost: 1}}})
		if d.Allowed != (i < burst) {
			t.Fatalf("check %d through the sentinels: allowed %v, want %v", i, d.Allowed, i < burst)
		}
	}

	lim := redisLimiter(t, url, limiter.Config{
		Timeout: 100 * time.Millisecond,
		Breaker: limiter.BreakerConfig{MinCalls: 5, OpenFor: 200 * time.Millisecond},
		// Every check must reach the store: the test measures what the
		// store admits across the failover.
		DenyCacheSize: -1,
	})
	modes := []engine.Failure{engine.FailOpen, engine.FailClosed}
	req := func(mode engine.Failure) engine.Request {
		return engine.Request{Subject: "failover-" + mode.String(), Checks: []engine.Check{{Policy: "q", Limit: l, Cost: 1, OnFailure: mode}}}
	}
	for _, mode := range modes {
		for range burst {
			if o, err := lim.Check(ctx, req(mode)); err != nil || !o.Allowed || o.Source != limiter.FromStore {
				t.Fatalf("%s: check before failover = allowed %v, source %v, err %v; want allowed by the store", mode, o.Allowed, o.Source, err)
			}
		}
	}
	// The replica must have every count, so that the test measures the
	// failover and not replication lag.
	primary, replica := sd.Nodes()[0], sd.Nodes()[1]
	pc, rc := primary.Client(t), replica.Client(t)
	testwait.For(t, 10*time.Second, "replication", func() bool {
		for _, mode := range modes {
			key := store.Key(req(mode).Subject, "q")
			want, err := pc.Get(ctx, key).Result()
			if got, err2 := rc.Get(ctx, key).Result(); err != nil || err2 != nil || got != want {
				return false
			}
		}
		return true
	})

	// One goroutine per failure mode checks until the store has answered 50
	// times since the Sentinels promoted the replica.
	var promoted atomic.Bool
	type result struct {
		errs, fallback, extraAdmitted, fromStoreAfter int
		lastFallback                                  time.Time
	}
	results := make([]result, len(modes))
	var wg sync.WaitGroup
	for i, mode := range modes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &results[i]
			deadline := time.Now().Add(60 * time.Second)
			for time.Now().Before(deadline) && r.fromStoreAfter < 50 {
				o, err := lim.Check(ctx, req(mode))
				switch {
				case err != nil:
					r.errs++
				case o.Source != limiter.FromStore:
					r.fallback++
					r.lastFallback = time.Now()
				case promoted.Load():
					r.fromStoreAfter++
				}
				if err == nil && o.Allowed {
					r.extraAdmitted++
				}
			}
		}()
	}
	killedAt := time.Now()
	_, newPrimary := sd.KillPrimaryAndWaitFailover()
	promotedAt := time.Now()
	promoted.Store(true)
	wg.Wait()
	if newPrimary != replica {
		t.Fatalf("promoted %s, want the replica %s", newPrimary.Addr(), replica.Addr())
	}
	for i, mode := range modes {
		r := results[i]
		if r.errs > 0 {
			t.Errorf("on_store_failure=%s: %d checks returned an error to the caller during the failover, want 0", mode, r.errs)
		}
		if r.fromStoreAfter < 50 {
			t.Fatalf("on_store_failure=%s: the store answered only %d checks after the failover, want 50", mode, r.fromStoreAfter)
		}
		if r.fallback == 0 {
			t.Errorf("on_store_failure=%s: no check was decided without the store while the primary was down", mode)
		}
		t.Logf("on_store_failure=%s: checks decided without the store for %v after the kill (sentinels promoted the replica after %v); %d fallback decisions; %d admitted beyond the limit",
			mode, r.lastFallback.Sub(killedAt).Round(time.Millisecond), promotedAt.Sub(killedAt).Round(time.Millisecond), r.fallback, r.extraAdmitted)
		limitExtra := 0 // the replica had every count, and closed admits nothing without the store
		if mode == engine.FailOpen {
			limitExtra = 2 * burst // what the in-process fallback admits, 2x by design
		}
		if r.extraAdmitted > limitExtra {
			t.Errorf("on_store_failure=%s: %d admitted beyond the limit across the failover, want at most %d", mode, r.extraAdmitted, limitExtra)
		}
	}
	// The new primary holds the counts the old one had.
	if got, err := newPrimary.Client(t).Get(ctx, store.Key(req(engine.FailClosed).Subject, "q")).Result(); err != nil || got == "" {
		t.Errorf("state on the promoted replica = %q, %v, want the subject's count", got, err)
	}
}
