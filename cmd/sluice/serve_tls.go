package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/sluice-rl/sluice/engine/redisstore"
	"github.com/sluice-rl/sluice/internal/tlsconfig"
	"github.com/sluice-rl/sluice/region"
)

// tlsReloadEvery is how often each TLS listener's files are read again.
const tlsReloadEvery = time.Second

// tlsFileFlags are the certificate, key and client CA flags of a listener
// (or, for the unprefixed ones, of every listener).
type tlsFileFlags struct{ cert, key, clientCA string }

// tlsFlags are serve's TLS flags. --tls-* apply to every listener; the
// --admin-tls-* and --rls-tls-* pair and client CA, where set, replace
// them on --admin-listen and --rls-listen.
type tlsFlags struct {
	all, admin, rls tlsFileFlags
	require         bool
}

func (t *tlsFlags) register(f *pflag.FlagSet) {
	for _, l := range []struct {
		prefix, which string
		v             *tlsFileFlags
	}{{"", "every listener", &t.all}, {"admin-", "--admin-listen, instead of --tls-*", &t.admin}, {"rls-", "--rls-listen, instead of --tls-*", &t.rls}} {
		f.StringVar(&l.v.cert, l.prefix+"tls-cert-file", "", "PEM certificate (chain, leaf first) served by TLS on "+l.which+"; re-read when it changes")
		f.StringVar(&l.v.key, l.prefix+"tls-key-file", "", "PEM private key of --"+l.prefix+"tls-cert-file; re-read when it changes")
		f.StringVar(&l.v.clientCA, l.prefix+"tls-client-ca-file", "", "PEM CA certificates a client certificate must chain to (mutual TLS: clients without one are refused) on "+l.which)
	}
	f.BoolVar(&t.require, "require-tls", false, "refuse to start with any listener (--listen, --admin-listen, --rls-listen) in plaintext")
}

// listenerTLS is one listener's address and the TLS files it serves (no
// certificate path: plaintext).
type listenerTLS struct {
	name, flag, addr string
	protos           []string
	files            tlsconfig.Files
	admin            bool // the admin API is served here
}

// plan resolves the flags into each listener serve opens, or a one-line
// error naming the flag: a certificate without its key, a client CA
// without a certificate, a listener's own TLS flag without its listener,
// a plaintext listener under --require-tls.
func (t *tlsFlags) plan(cfg region.Config, rlsListen string) ([]listenerTLS, error) {
	all, err := t.all.files("--")
	if err != nil {
		return nil, err
	}
	ls := []listenerTLS{{name: "gateway", flag: "--listen", addr: cfg.Listen, protos: []string{"http/1.1"}, files: all, admin: cfg.AdminListen == ""}}
	for _, o := range []struct {
		name, flag, addr string
		own              tlsFileFlags
		protos           []string
	}{{"admin", "--admin-listen", cfg.AdminListen, t.admin, []string{"http/1.1"}}, {"rls", "--rls-listen", rlsListen, t.rls, []string{"h2"}}} {
		prefix := "--" + o.name + "-"
		if o.addr == "" {
			if f := o.own.firstSet(prefix); f != "" {
				return nil, fmt.Errorf("%s: set without %s, so there is no such listener", f, o.flag)
			}
			continue
		}
		own, err := o.own.files(prefix)
		if err != nil {
			return nil, err
		}
		files := all
		if own.Cert.Path != "" {
			files.Cert, files.Key = own.Cert, own.Key
		}
		if own.ClientCA.Path != "" {
			files.ClientCA = own.ClientCA
		}
		ls = append(ls, listenerTLS{name: o.name, flag: o.flag, addr: o.addr, protos: o.protos, files: files, admin: o.name == "admin"})
	}
	for _, l := range ls {
		if l.files.Cert.Path == "" && l.files.ClientCA.Path != "" {
			p := strings.TrimSuffix(l.files.ClientCA.Flag, "client-ca-file")
			return nil, fmt.Errorf("%s: a client CA needs a certificate on %s %s: set %scert-file and %skey-file", l.files.ClientCA.Flag, l.flag, l.addr, p, p)
		}
		if t.require && l.files.Cert.Path == "" {
			return nil, fmt.Errorf("--require-tls: %s %s is plaintext: give it a certificate (--tls-cert-file and --tls-key-file)", l.flag, l.addr)
		}
	}
	return ls, nil
}

// files is the flags with prefix ("--", "--admin-") as tlsconfig.Files,
// with the certificate and key set together or not at all.
func (f tlsFileFlags) files(prefix string) (tlsconfig.Files, error) {
	c, k := prefix+"tls-cert-file", prefix+"tls-key-file"
	if (f.cert == "") != (f.key == "") {
		return tlsconfig.Files{}, fmt.Errorf("%s and %s must be set together", c, k)
	}
	return tlsconfig.Files{Cert: tlsconfig.File{Path: f.cert, Flag: c}, Key: tlsconfig.File{Path: f.key, Flag: k},
		ClientCA: tlsconfig.File{Path: f.clientCA, Flag: prefix + "tls-client-ca-file"}}, nil
}

func (f tlsFileFlags) firstSet(prefix string) string {
	switch {
	case f.cert != "":
		return prefix + "tls-cert-file"
	case f.key != "":
		return prefix + "tls-key-file"
	case f.clientCA != "":
		return prefix + "tls-client-ca-file"
	}
	return ""
}

// servingListeners are the listeners serve opened, TLS where planned.
type servingListeners struct {
	gateway, admin, rls net.Listener
	reloaders           []*tlsconfig.Reloader
}

// loadTLS loads the files of every TLS listener at now; a file that does
// not load is an error naming its flag.
func loadTLS(now time.Time, plan []listenerTLS, log *slog.Logger, tm *tlsMetrics) ([]*tlsconfig.Reloader, error) {
	rs := make([]*tlsconfig.Reloader, len(plan))
	for i, l := range plan {
		if l.files.Cert.Path == "" {
			continue
		}
		m, err := tm.get()
		if err != nil {
			return nil, err
		}
		r, err := tlsconfig.New(now, tlsconfig.Config{Listener: l.name, Files: l.files, NextProtos: l.protos, Logger: log, Metrics: m})
		if err != nil {
			return nil, err
		}
		rs[i] = r
	}
	return rs, nil
}

// tlsMetrics registers the TLS metrics with reg when first asked for
// them: by a TLS listener, or by a Redis client with TLS files.
type tlsMetrics struct {
	reg prometheus.Registerer
	m   *tlsconfig.Metrics
}

func (t *tlsMetrics) get() (*tlsconfig.Metrics, error) {
	if t.m == nil {
		m, err := tlsconfig.NewMetrics(t.reg)
		if err != nil {
			return nil, err
		}
		t.m = m
	}
	return t.m, nil
}

// redisTLSReload gives a Redis store whose --redis-tls-ca or
// --redis-tls-cert is set the logger and metrics of the files it re-reads.
func redisTLSReload(rc *redisstore.ClientConfig, log *slog.Logger, tm *tlsMetrics) error {
	if rc.TLS.CAFile == "" && rc.TLS.CertFile == "" {
		return nil
	}
	m, err := tm.get()
	if err != nil {
		return err
	}
	rc.Logger, rc.TLSMetrics = log, m
	return nil
}

// announceTLS logs each listener's TLS and warns of an admin API whose
// bearer token would cross the network in clear.
func announceTLS(plan []listenerTLS, rs []*tlsconfig.Reloader, adminToken bool, log *slog.Logger) {
	for i, l := range plan {
		if rs[i] != nil {
			log.Info("TLS", "listener", l.name, "addr", l.addr, "mutual", l.files.ClientCA.Path != "", "not_after", rs[i].NotAfter())
			continue
		}
		if l.admin && adminToken && !isLoopback(l.addr) {
			log.Warn("the admin API is served without TLS on a non-loopback address: its bearer token crosses the network in clear (set --admin-tls-cert-file and --admin-tls-key-file, or --tls-cert-file and --tls-key-file)", "addr", l.addr)
		}
	}
}

// isLoopback reports whether a listen address accepts only local clients.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// openListeners opens every planned listener, wrapped in TLS where it has
// a Reloader.
func openListeners(plan []listenerTLS, rs []*tlsconfig.Reloader) (*servingListeners, error) {
	s := &servingListeners{}
	for i, l := range plan {
		ln, err := net.Listen("tcp", l.addr)
		if err != nil {
			s.close()
			return nil, fmt.Errorf("%s: %w", l.flag, err)
		}
		if rs[i] != nil {
			ln = tlsconfig.NewListener(ln, rs[i])
			s.reloaders = append(s.reloaders, rs[i])
		}
		switch l.name {
		case "gateway":
			s.gateway = ln
		case "admin":
			s.admin = ln
		case "rls":
			s.rls = ln
		}
	}
	return s, nil
}

func (s *servingListeners) close() {
	for _, ln := range []net.Listener{s.gateway, s.admin, s.rls} {
		if ln != nil {
			ln.Close()
		}
	}
}

// reload re-reads every TLS listener's files once a second until ctx ends.
func (s *servingListeners) reload(ctx context.Context) error {
	errc := make(chan error, len(s.reloaders))
	for _, r := range s.reloaders {
		go func() { errc <- r.Run(ctx, tlsReloadEvery) }()
	}
	var errs []error
	for range s.reloaders {
		errs = append(errs, <-errc)
	}
	return errors.Join(errs...)
}
