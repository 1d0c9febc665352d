package region

import (
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/decide"
	"github.com/sluice-rl/sluice/quota"
)

// otherPair is the header pair that the forward-auth mode other than mode
// reads.
func otherPair(mode string) (pair authzHeaders, flag string) {
	if mode == ForwardAuthForwarded {
		return originalHeaders, ForwardAuthOriginal
	}
	return forwardedHeaders, ForwardAuthForwarded
}

// pairSent reports whether h carries both headers of pair, non-empty.
func pairSent(h http.Header, pair authzHeaders) bool {
	m, u := h[pair.methodKey], h[pair.uriKey]
	return len(m) > 0 && m[0] != "" && len(u) > 0 && u[0] != ""
}

// pairAbsent reports whether h carries neither header of pair.
func pairAbsent(h http.Header, pair authzHeaders) bool {
	return len(h[pair.methodKey]) == 0 && len(h[pair.uriKey]) == 0
}

// misconfigLogEvery is how often, at most, the daemon logs forward-auth
// calls that carry the other header pair.
const misconfigLogEvery = time.Second

// forwardAuthMisconfig counts and logs plain /v1/authz calls that lack the
// configured header pair but carry the other one: a gateway set up for the
// other --forward-auth-headers mode, which is the operator's error, not
// the client's.
type forwardAuthMisconfig struct {
	count   prometheus.Counter
	lastLog atomic.Int64 // unix ns of the last line
	since   atomic.Int64 // calls since the last line
}

func newForwardAuthMisconfig(reg prometheus.Registerer) *forwardAuthMisconfig {
	m := &forwardAuthMisconfig{count: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_forward_auth_misconfigured_total",
		Help: "Plain /v1/authz calls that lacked the header pair --forward-auth-headers names but carried the other one: a gateway set up for the other mode. They are let through unlimited, except where a policy fails closed.",
	})}
	reg.MustRegister(m.count)
	return m
}

// misconfiguredAuthz answers a plain /v1/authz call that lacks the
// configured header pair but carries the other one, and reports whether it
// was such a call. It is answered as if the store were down: 200, so that
// every shipped gateway configuration lets the request through, unless a
// policy that fails closed (every security-class policy, by default)
// applies to the request the other pair names, which is then refused with
// 503 as on a store failure. It is counted and logged, at most once a
// second, naming the flag to set. The other pair is read only to find
// those policies, never to spend: nothing is decided against the store.
func (d *Daemon) misconfiguredAuthz(w http.ResponseWriter, in *dataRequest, path string) bool {
	want := forwardAuthHeaders(d.cfg.ForwardAuthHeaders)
	other, mode := otherPair(d.cfg.ForwardAuthHeaders)
	if !pairAbsent(in.header, want) || !pairSent(in.header, other) {
		return false
	}
	d.faMisconfig.count.Inc()
	d.logMisconfig(want, other, mode)
	method, route, p := forwardedTarget(in.header, other, in.method, path, false)
	if p == nil && d.failsClosed(in, method, route) {
		v := decide.Verdict{Status: http.StatusServiceUnavailable, RetryAfter: time.Second}
		d.answerAuthz(w, in, false, route, &v)
		return true
	}
	w.WriteHeader(http.StatusOK)
	return true
}

// logMisconfig logs one line a second at most for misconfigured calls,
// with how many there were since the last line.
func (d *Daemon) logMisconfig(want, other authzHeaders, mode string) {
	n, ok := d.faMisconfig.due(time.Now())
	if !ok {
		return
	}
	d.log.Error("forward-auth calls carry "+other.method+" and "+other.uri+" but this daemon reads "+
		want.method+" and "+want.uri+": set --forward-auth-headers "+mode+" (forward-auth-headers in --config); "+
		"until then they are let through unlimited, except where a policy fails closed",
		"calls", n)
}

// due counts one misconfigured call at now and reports whether a line is
// due (none in the last misconfigLogEvery), with the calls it reports:
// this one and those since the last line.
func (m *forwardAuthMisconfig) due(now time.Time) (calls int64, ok bool) {
	n := m.since.Add(1)
	last := m.lastLog.Load()
	t := now.UnixNano()
	if last != 0 && t-last < int64(misconfigLogEvery) || !m.lastLog.CompareAndSwap(last, t) {
		return 0, false
	}
	m.since.Add(-n)
	return n, true
}

// failsClosed reports whether an enforced policy that fails closed on a
// store failure applies to the request of in's identity to method route.
func (d *Daemon) failsClosed(in *dataRequest, method, route string) bool {
	id, err := d.identity(in)
	if err != nil {
		return false
	}
	who := d.reg.Resolve(id)
	applied := d.reg.AppendMatch(nil, quota.Query{Tier: who.Tier, Subject: who.Subject, Method: method, Route: route})
	for _, a := range applied {
		p := a.Policy
		if p.Mode != quota.ModeEnforce {
			continue
		}
		if p.OnStoreFailure == quota.FailClosed || (p.OnStoreFailure == "" && p.Class == quota.ClassSecurity) {
			return true
		}
	}
	return false
}
