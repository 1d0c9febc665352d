package redisstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/internal/tlsconfig"
)

// NewClient connects to the Redis named by url:
//
//	redis://[user:password@]host:port[/db]   one server (*redis.Client)
//	rediss://...                             the same over TLS
//	redis-cluster://[user:password@]h1:p1,h2:p2,...   a cluster (*redis.ClusterClient)
//	rediss-cluster://...                     the same over TLS, every node
//	redis-sentinel://[user:password@]master@s1:p1,s2:p2,...[/db]
//	                                         the primary that the Sentinels at
//	                                         s1:p1,... name for master
//	                                         (*redis.Client, a failover client)
//	rediss-sentinel://...                    the same over TLS, to the
//	                                         Sentinels and to the servers
//	                                         they name
//
// A Sentinel deployment is one primary, so the Limiter keeps one circuit
// breaker for it, as for redis://. The credentials in the URL are the data
// nodes'; NewClient asks the Sentinels without any, and verifies TLS
// servers against the system's CAs (NewClientWith takes other settings).
//
// The client is set up for a rate limiter on the request path:
//   - ContextTimeoutEnabled, so the per-check deadline (Config.Timeout)
//     also cuts a blocked socket read; without it go-redis waits for its
//     ReadTimeout (5 s) whatever the context says.
//   - MaxRetries 1: one retry covers a pooled connection that a restarted
//     server closed. More would only spend the caller's few milliseconds.
//     The store's script calls are never retried (pipeline.go, the once
//     types): a retried script whose first run did execute spends twice.
//   - PoolSize at least 128 per node: 64 or more concurrent checks each
//     hold a connection for a round trip, and the default (10 per CPU) would
//     queue them for the pool on a small machine.
//   - Short dial timeout and one dial attempt: a node that does not accept
//     within 250 ms, or refuses, is down for our purposes. go-redis would
//     otherwise retry a refused dial 5 times 100 ms apart, so every check
//     against a dead server would wait out its whole deadline.
func NewClient(url string) (redis.UniversalClient, error) {
	return NewClientWith(url, ClientConfig{})
}

// NewClientWith is NewClient with the connection settings of cc: TLS for
// the rediss schemes (a CA, a client certificate, a server name) and the
// Sentinels' credentials. A URL and settings that cannot go together
// (ClientConfig.Validate) are an error, as is a file that cannot be read.
func NewClientWith(url string, cc ClientConfig) (redis.UniversalClient, error) {
	if err := cc.Validate(url); err != nil {
		return nil, err
	}
	tlsConf, err := cc.TLS.config(url)
	if err != nil {
		return nil, err
	}
	// A client whose TLS files are given re-reads them (tlsreload.go):
	// its dialer takes the last good set for each new connection.
	var dial func(context.Context, string, string) (net.Conn, error)
	if !strings.HasPrefix(url, "rediss://") {
		if dial, err = cc.dialer(time.Now(), tlsConf); err != nil {
			return nil, err
		}
	}
	if rest, ok := cutScheme(url, "redis-cluster"); ok {
		return newClusterClient(url, rest, tlsConf, dial, cc.tuning())
	}
	var opt *redis.Options
	if _, ok := cutScheme(url, "redis-sentinel"); ok {
		fo, err := parseSentinelURL(url)
		if err != nil {
			return nil, err
		}
		fo.TLSConfig, fo.Dialer = tlsConf, dial
		fo.SentinelUsername, fo.SentinelPassword = cc.SentinelUsername, cc.SentinelPassword
		t := cc.tuning()
		fo.ContextTimeoutEnabled, fo.DialerRetries, fo.MaxRetries = true, 1, t.maxRetries
		fo.MinRetryBackoff, fo.MaxRetryBackoff = t.retryBackoff, t.retryBackoff
		fo.PoolSize, fo.DialTimeout = t.poolSize, t.dialTimeout
		fo.ReadTimeout, fo.WriteTimeout = t.ioTimeout, t.ioTimeout
		return redis.NewFailoverClient(fo), nil
	}
	if !strings.HasPrefix(url, "redis://") && !strings.HasPrefix(url, "rediss://") {
		return nil, errors.New("redis url must start with redis://, rediss://, redis-cluster://, rediss-cluster://, redis-sentinel:// or rediss-sentinel://, got " + strconv.Quote(url))
	}
	if opt, err = redis.ParseURL(url); err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	if tlsConf != nil {
		// ParseURL's own TLS config names the URL's host; ours adds the
		// CA, the client certificate and the server name, and keeps a
		// skip_verify the URL asked for (Validate refused it beside a CA).
		skip := opt.TLSConfig != nil && opt.TLSConfig.InsecureSkipVerify
		if tlsConf.ServerName == "" && opt.TLSConfig != nil {
			tlsConf.ServerName = opt.TLSConfig.ServerName
		}
		tlsConf.InsecureSkipVerify = skip
		opt.TLSConfig = tlsConf
		if dial, err = cc.dialer(time.Now(), tlsConf); err != nil {
			return nil, err
		}
		opt.Dialer = dial
	}
	t := cc.tuning()
	opt.ContextTimeoutEnabled, opt.DialerRetries, opt.MaxRetries = true, 1, t.maxRetries
	opt.MinRetryBackoff, opt.MaxRetryBackoff = t.retryBackoff, t.retryBackoff
	opt.PoolSize, opt.DialTimeout = t.poolSize, t.dialTimeout
	opt.ReadTimeout, opt.WriteTimeout = t.ioTimeout, t.ioTimeout
	return redis.NewClient(opt), nil
}

// tuning is how NewClient sets up every client (see its comment).
type tuning struct {
	maxRetries                           int
	poolSize                             int
	dialTimeout, ioTimeout, retryBackoff time.Duration
}

// tuning is tuningOf with cc's IOTimeout, if set.
func (cc ClientConfig) tuning() tuning {
	t := tuningOf()
	if cc.IOTimeout > 0 {
		t.ioTimeout = cc.IOTimeout
	}
	return t
}

func tuningOf() tuning {
	return tuning{
		maxRetries:  1,
		poolSize:    max(128, 16*runtime.GOMAXPROCS(0)),
		dialTimeout: 250 * time.Millisecond,
		ioTimeout:   time.Second, // backstop; the context deadline is shorter
		// The one retry comes at once: go-redis's default backoff (8 ms and
		// up) is longer than the whole deadline of a check.
		retryBackoff: 100 * time.Microsecond,
	}
}

// newClusterClient is NewClientWith for a Cluster URL, rest the part
// after its scheme.
func newClusterClient(url, rest string, tlsConf *tls.Config, dial func(context.Context, string, string) (net.Conn, error), t tuning) (redis.UniversalClient, error) {
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
		TLSConfig:                  tlsConf,
		Dialer:                     dial,
		Username:                   user,
		Password:                   pass,
		ContextTimeoutEnabled:      true,
		DialerRetries:              1,
		MinRetryBackoff:            t.retryBackoff,
		MaxRetryBackoff:            t.retryBackoff,
		MaxRetries:                 t.maxRetries,
		PoolSize:                   t.poolSize,
		DialTimeout:                t.dialTimeout,
		ReadTimeout:                t.ioTimeout,
		WriteTimeout:               t.ioTimeout,
	}), nil
}

// parseSentinelURL reads a store URL of the form
// redis-sentinel://[user:password@]master@host:port,host:port[/db] into the
// failover options it names: master name, Sentinel addresses, database, and
// the credentials of the data nodes. It sets no timeouts or pool sizes;
// NewClient adds those. Each error is one line naming what is wrong.
func parseSentinelURL(url string) (*redis.FailoverOptions, error) {
	const form = "redis-sentinel://MASTER@HOST:PORT[,HOST:PORT...][/DB]"
	scheme := "redis-sentinel://"
	if strings.HasPrefix(url, "rediss-sentinel://") {
		scheme = "rediss-sentinel://"
	}
	rest, ok := cutScheme(url, "redis-sentinel")
	if !ok {
		return nil, fmt.Errorf("redis url %q must start with redis-sentinel:// or rediss-sentinel://", url)
	}
	at := strings.LastIndex(rest, "@")
	if i := strings.LastIndex(rest[:max(at, 0)], "@"); i >= 0 {
		// Quote the URL in errors without its password.
		user, _, _ := strings.Cut(rest[:i], ":")
		url = scheme + user + ":xxxxx" + rest[i:]
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

// ClientConfig holds the connection settings of a store URL that do not fit
// in it: TLS files and the Sentinels' own credentials.
type ClientConfig struct {
	// TLS applies to the rediss schemes; on a plaintext URL any of its
	// settings is an error.
	TLS TLSFiles
	// SentinelUsername and SentinelPassword authenticate to the Sentinels
	// of a redis-sentinel or rediss-sentinel URL (Sentinel's requirepass,
	// or an ACL user with an empty password meaning the default user); the
	// URL's credentials are the data nodes'. Empty asks without any.
	SentinelUsername, SentinelPassword string
	// IOTimeout bounds one read or write on a connection whose context
	// has no shorter deadline (go-redis's ReadTimeout and WriteTimeout);
	// 0 is 1 s. A store whose deadlines are longer than a second (its
	// Config.Timeout, a test's minute) needs it as long: the client gives
	// up a script call once, and does not send it again.
	IOTimeout time.Duration
	// Logger and TLSMetrics, if set, log and count the TLS files read again
	// (TLSReloadEvery) under the name redis.
	Logger     *slog.Logger
	TLSMetrics *tlsconfig.Metrics
	// KeyPrefix starts every key a daemon writes in Redis (limiter state,
	// shared policies, saved shares) and its policy channel, so that two
	// deployments sharing one Redis share no state; empty adds nothing.
	// It sits before the hash tag, never inside it: see ValidKeyPrefix.
	KeyPrefix string
}

// MaxKeyPrefixBytes bounds ClientConfig.KeyPrefix.
const MaxKeyPrefixBytes = 64

// ValidKeyPrefix reports why p cannot start Redis keys, or nil: at most
// MaxKeyPrefixBytes of ASCII letters, digits and '.', '_', '-', ':', '/'.
// A brace would move a key's hash tag off its subject (so a subject's
// keys could land in different Cluster slots); a space or control
// character would make keys that redis-cli and logs cannot show plainly.
func ValidKeyPrefix(p string) error {
	if len(p) > MaxKeyPrefixBytes {
		return fmt.Errorf("%d bytes, at most %d", len(p), MaxKeyPrefixBytes)
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("._-:/", c) >= 0) {
			return fmt.Errorf("%q has %q at byte %d: only letters, digits and . _ - : / may start a key", p, c, i)
		}
	}
	return nil
}

// TLSFiles are the files and names of a TLS connection to Redis. The zero
// value verifies servers against the system's CAs and presents no client
// certificate. There is no setting to skip verification; a rediss:// URL
// may still ask for it with skip_verify=true, as go-redis reads it, but not
// beside a CA or a server name.
type TLSFiles struct {
	// CAFile is a PEM file of the CA certificates that servers are verified
	// against, in place of the system's.
	CAFile string
	// CertFile and KeyFile are a PEM client certificate and its key, for
	// servers that require one (tls-auth-clients yes); both or neither.
	CertFile, KeyFile string
	// ServerName is the name every server's certificate must carry; empty
	// means each server's host as dialled (for a Cluster or Sentinel
	// deployment, the address each node announces).
	ServerName string
}

func (f TLSFiles) set() bool {
	return f.CAFile != "" || f.CertFile != "" || f.KeyFile != "" || f.ServerName != ""
}

// SettingError is a ClientConfig setting that cannot be used: Setting names
// it ("tls-ca", "tls-cert", "tls-key", "tls-server-name",
// "sentinel-username", "sentinel-password", "key-prefix", or "url" for the
// URL itself),
// so that a caller can name its own flag.
type SettingError struct {
	Setting string
	Err     error
}

func (e *SettingError) Error() string { return e.Setting + ": " + e.Err.Error() }
func (e *SettingError) Unwrap() error { return e.Err }

func settingErr(setting, format string, args ...any) error {
	return &SettingError{Setting: setting, Err: fmt.Errorf(format, args...)}
}

// cutScheme cuts scheme:// or its TLS form (scheme with an s after
// "redis") off url.
func cutScheme(url, scheme string) (rest string, ok bool) {
	if rest, ok = strings.CutPrefix(url, scheme+"://"); ok {
		return rest, true
	}
	return strings.CutPrefix(url, "rediss"+strings.TrimPrefix(scheme, "redis")+"://")
}

// secureURL reports whether url names a TLS scheme.
func secureURL(url string) bool {
	for _, s := range []string{"rediss://", "rediss-cluster://", "rediss-sentinel://"} {
		if strings.HasPrefix(url, s) {
			return true
		}
	}
	return false
}

// Validate reports settings that cannot go with url, each a *SettingError:
// TLS settings on a plaintext URL, Sentinel credentials on a URL that
// names no Sentinel, a client certificate without its key (or the other
// way round), a URL's skip_verify beside a CA or a server name. It reads
// no file; the files are read when the client is made.
func (c ClientConfig) Validate(url string) error {
	f := c.TLS
	if err := ValidKeyPrefix(c.KeyPrefix); err != nil {
		return &SettingError{Setting: "key-prefix", Err: err}
	}
	switch {
	case f.set() && !secureURL(url):
		return settingErr("url", "TLS settings are given but the store URL is plaintext: write rediss://, rediss-cluster:// or rediss-sentinel://")
	case (f.CertFile == "") != (f.KeyFile == ""):
		if f.CertFile == "" {
			return settingErr("tls-cert", "a client key is given without its certificate")
		}
		return settingErr("tls-key", "a client certificate is given without its key")
	case (c.SentinelUsername != "" || c.SentinelPassword != "") && !strings.Contains(url, "-sentinel://"):
		return settingErr("url", "Sentinel credentials are given but the store URL names no Sentinel")
	case c.SentinelUsername != "" && c.SentinelPassword == "":
		return settingErr("sentinel-password", "a Sentinel username needs its password")
	}
	if (f.CAFile != "" || f.ServerName != "") && strings.Contains(url, "skip_verify=") {
		return settingErr("url", "skip_verify in the store URL conflicts with a CA or server name: drop one")
	}
	return nil
}

// config is the tls.Config of f for url: nil for a plaintext URL, and for
// a rediss:// URL without settings (go-redis makes its own); otherwise TLS
// 1.2 or later with f's CA, client certificate and server name. Each error
// is a *SettingError naming the file that cannot be used.
func (f TLSFiles) config(url string) (*tls.Config, error) {
	if !secureURL(url) || (!f.set() && strings.HasPrefix(url, "rediss://")) {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.ServerName}
	if f.CAFile == "" {
		// Read the system's CAs now, not at the first handshake, where it
		// would be inside a dial timeout of 250 ms.
		pool, err := x509.SystemCertPool()
		if err != nil {
			return nil, settingErr("tls-ca", "no CA file is given and the system's CAs cannot be read: %v", err)
		}
		c.RootCAs = pool
	} else {
		pem, err := os.ReadFile(f.CAFile)
		if err != nil {
			return nil, &SettingError{Setting: "tls-ca", Err: err}
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, settingErr("tls-ca", "%s holds no PEM certificate", f.CAFile)
		}
	}
	if f.CertFile != "" {
		if _, err := os.Stat(f.CertFile); err != nil {
			return nil, &SettingError{Setting: "tls-cert", Err: err}
		}
		if _, err := os.Stat(f.KeyFile); err != nil {
			return nil, &SettingError{Setting: "tls-key", Err: err}
		}
		cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			return nil, settingErr("tls-cert", "%s and %s: %v", f.CertFile, f.KeyFile, err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// Check reads the files of c's TLS settings for url and reports the first
// that cannot be used, as NewClientWith would at its start, without
// connecting: so that a daemon fails at start, naming the setting.
func (c ClientConfig) Check(url string) error {
	if err := c.Validate(url); err != nil {
		return err
	}
	conf, err := c.TLS.config(url)
	if err != nil || conf == nil {
		return err
	}
	_, err = ClientConfig{TLS: c.TLS}.reloader(time.Now())
	return err
}
