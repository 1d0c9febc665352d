package redisstore

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// NewClient connects to the Redis named by url:
//
//	redis://[user:password@]host:port[/db]   one server (*redis.Client)
//	rediss://...                             the same over TLS
//	redis-cluster://[user:password@]h1:p1,h2:p2,...   a cluster (*redis.ClusterClient)
//	redis-sentinel://[user:password@]master@s1:p1,s2:p2,...[/db]
//	                                         the primary that the Sentinels at
//	                                         s1:p1,... name for master
//	                                         (*redis.Client, a failover client)
//
// A Sentinel deployment is one primary, so the Limiter keeps one circuit
// breaker for it, as for redis://. The credentials are the data nodes';
// the Sentinels are asked without any.
//
// The client is set up for a rate limiter on the request path:
//   - ContextTimeoutEnabled, so the per-check deadline (Config.Timeout)
//     also cuts a blocked socket read; without it go-redis waits for its
//     ReadTimeout (5 s) whatever the context says.
//   - MaxRetries 1: one retry covers a pooled connection that a restarted
//     server closed. More would only spend the caller's few milliseconds;
//     and a retried script whose first run did execute spends twice, so
//     retries must stay rare.
//   - PoolSize at least 128 per node: 64 or more concurrent checks each
//     hold a connection for a round trip, and the default (10 per CPU) would
//     queue them for the pool on a small machine.
//   - Short dial timeout and one dial attempt: a node that does not accept
//     within 250 ms, or refuses, is down for our purposes. go-redis would
//     otherwise retry a refused dial 5 times 100 ms apart, so every check
//     against a dead server would wait out its whole deadline.
func NewClient(url string) (redis.UniversalClient, error) {
	const (
		maxRetries  = 1
		dialTimeout = 250 * time.Millisecond
		ioTimeout   = time.Second // backstop; the context deadline is shorter
		// The one retry comes at once: go-redis's default backoff (8 ms and
		// up) is longer than the whole deadline of a check.
		retryBackoff = 100 * time.Microsecond
	)
	poolSize := max(128, 16*runtime.GOMAXPROCS(0))
	if rest, ok := strings.CutPrefix(url, "redis-cluster://"); ok {
		var user, pass string
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			user, pass, _ = strings.Cut(rest[:at], ":")
			rest = rest[at+1:]
		}
		rest = strings.TrimSuffix(rest, "/")
		var addrs []string
		for a := range strings.SplitSeq(rest, ",") {
			if a = strings.TrimSpace(a); a != "" {
				addrs = append(addrs, a)
			}
		}
		if len(addrs) == 0 {
			return nil, fmt.Errorf("redis url %q names no node", url)
		}
		return redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: addrs,
			// Learn of a failover within seconds even when no error
			// prompts a reload (the default is a minute).
			ClusterStateReloadInterval: 5 * time.Second,
			Username:                   user,
			Password:                   pass,
			ContextTimeoutEnabled:      true,
			DialerRetries:              1,
			MinRetryBackoff:            retryBackoff,
			MaxRetryBackoff:            retryBackoff,
			MaxRetries:                 maxRetries,
			PoolSize:                   poolSize,
			DialTimeout:                dialTimeout,
			ReadTimeout:                ioTimeout,
			WriteTimeout:               ioTimeout,
		}), nil
	}
	if strings.HasPrefix(url, "redis-sentinel://") {
		opt, err := parseSentinelURL(url)
		if err != nil {
			return nil, err
		}
		opt.ContextTimeoutEnabled = true
		opt.DialerRetries = 1
		opt.MinRetryBackoff, opt.MaxRetryBackoff = retryBackoff, retryBackoff
		opt.MaxRetries = maxRetries
		opt.PoolSize = poolSize
		opt.DialTimeout = dialTimeout
		opt.ReadTimeout, opt.WriteTimeout = ioTimeout, ioTimeout
		return redis.NewFailoverClient(opt), nil
	}
	if !strings.HasPrefix(url, "redis://") && !strings.HasPrefix(url, "rediss://") {
		return nil, errors.New("redis url must start with redis://, rediss://, redis-cluster:// or redis-sentinel://, got " + strconv.Quote(url))
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	opt.ContextTimeoutEnabled = true
	opt.DialerRetries = 1
	opt.MinRetryBackoff, opt.MaxRetryBackoff = retryBackoff, retryBackoff
	opt.MaxRetries = maxRetries
	opt.PoolSize = poolSize
	opt.DialTimeout = dialTimeout
	opt.ReadTimeout, opt.WriteTimeout = ioTimeout, ioTimeout
	return redis.NewClient(opt), nil
}

// parseSentinelURL reads a store URL of the form
// redis-sentinel://[user:password@]master@host:port,host:port[/db] into the
// failover options it names: master name, Sentinel addresses, database, and
// the credentials of the data nodes. It sets no timeouts or pool sizes;
// NewClient adds those. Each error is one line naming what is wrong.
func parseSentinelURL(url string) (*redis.FailoverOptions, error) {
	const form = "redis-sentinel://MASTER@HOST:PORT[,HOST:PORT...][/DB]"
	rest, ok := strings.CutPrefix(url, "redis-sentinel://")
	if !ok {
		return nil, fmt.Errorf("redis url %q must start with redis-sentinel://", url)
	}
	at := strings.LastIndex(rest, "@")
	if i := strings.LastIndex(rest[:max(at, 0)], "@"); i >= 0 {
		// Quote the URL in errors without its password.
		user, _, _ := strings.Cut(rest[:i], ":")
		url = "redis-sentinel://" + user + ":xxxxx" + rest[i:]
	}
	if at < 0 {
		return nil, fmt.Errorf("redis url %q names no master: want %s", url, form)
	}
	who, hosts := rest[:at], rest[at+1:]
	opt := &redis.FailoverOptions{MasterName: who}
	if i := strings.LastIndex(who, "@"); i >= 0 {
		opt.Username, opt.Password, _ = strings.Cut(who[:i], ":")
		opt.MasterName = who[i+1:]
	}
	if opt.MasterName == "" {
		return nil, fmt.Errorf("redis url %q names no master: want %s", url, form)
	}
	if strings.ContainsAny(opt.MasterName, " \t\r\n/,:") {
		return nil, fmt.Errorf("redis url %q: master name %q may not contain spaces, '/', ',' or ':'", url, opt.MasterName)
	}
	if slash := strings.Index(hosts, "/"); slash >= 0 {
		db := hosts[slash+1:]
		hosts = hosts[:slash]
		if db != "" {
			n, err := strconv.Atoi(db)
			if err != nil || n < 0 || strconv.Itoa(n) != db {
				return nil, fmt.Errorf("redis url %q: database %q is not a non-negative integer", url, db)
			}
			opt.DB = n
		}
	}
	for a := range strings.SplitSeq(hosts, ",") {
		if a = strings.TrimSpace(a); a == "" {
			continue
		}
		host, port, err := net.SplitHostPort(a)
		if err != nil || host == "" {
			return nil, fmt.Errorf("redis url %q: sentinel address %q is not HOST:PORT", url, a)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return nil, fmt.Errorf("redis url %q: sentinel address %q has no port from 1 to 65535", url, a)
		}
		opt.SentinelAddrs = append(opt.SentinelAddrs, a)
	}
	if len(opt.SentinelAddrs) == 0 {
		return nil, fmt.Errorf("redis url %q names no sentinel: want %s", url, form)
	}
	return opt, nil
}
