package redisstore

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice/internal/tlsconfig"
)

// TLSReloadEvery is how often at most the TLS files of a Redis client are
// read again: when a new connection is opened at least this long after the
// last reading. A changed set that loads is used from that connection on;
// one that does not (a missing file, a key that does not match its
// certificate, an expired certificate, a CA file with no certificate) is
// logged once and counted in sluice_tls_reload_errors_total{listener="redis"},
// and the last good set stays in use. Connections already open keep theirs.
const TLSReloadEvery = time.Second

// tlsMetricName names a Redis client in the TLS metrics and logs.
const tlsMetricName = "redis"

// tlsDialer opens the TLS connections of a client whose files are reloaded.
type tlsDialer struct {
	r       *tlsconfig.Reloader
	skip    bool // the URL's skip_verify
	timeout time.Duration
	next    atomic.Int64 // unix nanoseconds from which the files are read again
}

// reloader loads f's files at now for a client that re-reads them, or is
// nil when no file is given (nothing to re-read). Its errors are
// *SettingErrors naming the file's setting.
func (c ClientConfig) reloader(now time.Time) (*tlsconfig.Reloader, error) {
	f := c.TLS
	if f.CAFile == "" && f.CertFile == "" {
		return nil, nil
	}
	r, err := tlsconfig.NewClient(now, tlsconfig.Config{
		Listener: tlsMetricName,
		Files: tlsconfig.Files{CA: tlsconfig.File{Path: f.CAFile, Flag: "tls-ca"},
			Cert: tlsconfig.File{Path: f.CertFile, Flag: "tls-cert"}, Key: tlsconfig.File{Path: f.KeyFile, Flag: "tls-key"}},
		Logger: c.Logger, Metrics: c.TLSMetrics,
	}, f.ServerName)
	if err != nil {
		msg := err.Error()
		for _, s := range []string{"tls-ca", "tls-cert", "tls-key"} {
			if rest, ok := strings.CutPrefix(msg, s+" "); ok {
				return nil, &SettingError{Setting: s, Err: errors.New(rest)}
			}
		}
		return nil, &SettingError{Setting: "tls-cert", Err: err}
	}
	return r, nil
}

// dialer is the Dialer of a TLS client whose files are re-read, nil when
// there are none (go-redis then dials with tlsConf as it is).
func (c ClientConfig) dialer(now time.Time, tlsConf *tls.Config) (func(context.Context, string, string) (net.Conn, error), error) {
	if tlsConf == nil {
		return nil, nil
	}
	r, err := c.reloader(now)
	if err != nil || r == nil {
		return nil, err
	}
	d := &tlsDialer{r: r, skip: tlsConf.InsecureSkipVerify, timeout: tuningOf().dialTimeout}
	d.next.Store(now.Add(TLSReloadEvery).UnixNano())
	return d.dial, nil
}

// dial opens a TLS connection to addr with the last good files, read
// again first if TLSReloadEvery has passed; the server's name is the
// configured one or addr's host, as go-redis's own dialer has it.
func (d *tlsDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	now := time.Now()
	if n := d.next.Load(); now.UnixNano() >= n && d.next.CompareAndSwap(n, now.Add(TLSReloadEvery).UnixNano()) {
		d.r.Reload(now) // a set refused is logged and counted by Reload
	}
	c := d.r.ClientConfig()
	if d.skip {
		c = c.Clone()
		c.InsecureSkipVerify = true
	}
	td := &tls.Dialer{NetDialer: &net.Dialer{Timeout: d.timeout, KeepAliveConfig: keepAlive}, Config: c}
	return td.DialContext(ctx, network, addr)
}

// keepAlive is go-redis's own TCP keep-alive policy: probing after 30 s
// idle, the peer dead after 3 probes 5 s apart unanswered.
var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 30 * time.Second, Interval: 5 * time.Second, Count: 3}
