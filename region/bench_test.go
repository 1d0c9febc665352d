package region

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/quota"
)

// The HTTP path of a check on the memory store, as the peer comparison
// drives it (10 000 users, one token bucket policy of 1000/s each, every
// check allowed), without the network: the route, the body decoding, the
// decision, the headers and the encoded answer. The requests (one per
// user) and the response writer are reused, so allocs/op counts what the
// daemon allocates per request (net/http's server adds its own per
// connection and request). Profile with
//
//	go test -run '^$' -bench BenchmarkHTTP -benchmem -cpuprofile cpu.out -memprofile mem.out ./region/

const benchUsers = 10000

func newBenchDaemon(b *testing.B) *Daemon { return newBenchDaemonRate(b, 1000) }

// newBenchDaemonRate is newBenchDaemon with a token bucket of rate per
// second and as much burst.
func newBenchDaemonRate(b *testing.B, rate float64) *Daemon {
	return newBenchDaemonOn(b, "memory", rate)
}

// newBenchDaemonOn is newBenchDaemonRate on the given store.
func newBenchDaemonOn(b *testing.B, store string, rate float64) *Daemon {
	b.Helper()
	cfg := DefaultConfig()
	cfg.Store = store
	if store != "memory" {
		// This measures cost, not latency: on a machine busy with other
		// work some round trips outlast the 5 ms default, and a check
		// decided by the fallback would not be the cost measured.
		cfg.StoreTimeout = time.Second
	}
	p := quota.Policy{ID: "bench", Match: quota.Match{Routes: []string{"/bench"}}, Algorithm: "token_bucket",
		RatePerSec: rate, Burst: rate, Mode: quota.ModeEnforce}
	cfg.Policies = []quota.Policy{p}
	reg := prometheus.NewRegistry()
	d, err := New(context.Background(), cfg, slog.New(slog.DiscardHandler), reg, reg)
	if err != nil {
		b.Fatalf("New: %v", err)
	}
	b.Cleanup(d.close)
	return d
}

// reusableBody is a request body that can be read again after Reset.
type reusableBody struct{ bytes.Reader }

func (*reusableBody) Close() error { return nil }

// discardWriter is a ResponseWriter that keeps the status and forgets the
// body; Reset empties its header map for the next request.
type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(code int)        { w.status = code }
func (w *discardWriter) reset() {
	clear(w.h)
	w.status = http.StatusOK
}

// degradedWriter is a discardWriter that notes a degraded decision.
type degradedWriter struct {
	discardWriter
	degraded bool
}

func (w *degradedWriter) Write(p []byte) (int, error) {
	w.degraded = w.degraded || bytes.Contains(p, []byte(`"degraded":true`))
	return len(p), nil
}

// benchRequests are one request per user, each with a body to rewind.
type benchRequest struct {
	r    *http.Request
	body *reusableBody
	raw  []byte
}

func benchRequests(newReq func(user string) (*http.Request, []byte)) []benchRequest {
	out := make([]benchRequest, 0, benchUsers)
	for i := range benchUsers {
		r, raw := newReq("u" + strconv.Itoa(i))
		br := benchRequest{r: r, raw: raw}
		if raw != nil {
			br.body = &reusableBody{}
			r.Body = br.body
		}
		out = append(out, br)
	}
	return out
}

func runHTTPBench(b *testing.B, h http.Handler, reqs []benchRequest) {
	runHTTPBenchStatus(b, h, reqs, http.StatusOK)
}

// runHTTPBenchStatus runs reqs round and round, each answered with want;
// a request whose user still has tokens may be allowed instead, so the
// rejected share is reported when want is not 200.
func runHTTPBenchStatus(b *testing.B, h http.Handler, reqs []benchRequest, want int) {
	w := &discardWriter{h: http.Header{}}
	i, n := 0, 0
	b.ReportAllocs()
	for b.Loop() {
		br := reqs[i]
		i++
		if i == len(reqs) {
			i = 0
		}
		if br.body != nil {
			br.body.Reset(br.raw)
		}
		w.reset()
		h.ServeHTTP(w, br.r)
		switch {
		case w.status == want:
			n++
		case want == http.StatusOK || w.status != http.StatusOK:
			b.Fatalf("status %d, want %d", w.status, want)
		}
	}
	if want != http.StatusOK {
		b.ReportMetric(float64(n)/float64(b.N), "rejected/op")
	}
}

// BenchmarkHTTPCheck is POST /v1/check with a JSON body naming the user.
func BenchmarkHTTPCheck(b *testing.B) {
	d := newBenchDaemon(b)
	runHTTPBench(b, d.Handler(), checkRequests(b))
}

// checkRequests are POST /v1/check requests, one per user.
func checkRequests(b *testing.B) []benchRequest {
	return benchRequests(func(user string) (*http.Request, []byte) {
		raw := []byte(`{"user":"` + user + `","route":"/bench","method":"GET"}`)
		r, err := http.NewRequest("POST", "http://sluice/v1/check", nil)
		if err != nil {
			b.Fatal(err)
		}
		r.Header.Set("Content-Type", "application/json")
		r.ContentLength = int64(len(raw))
		return r, raw
	})
}

// BenchmarkHTTPCheckRedis is BenchmarkHTTPCheck on a real redis-server
// with 64 requests in flight, as the peer comparison's connections keep
// them: the daemon's whole cost of a check decided by Redis, pipelining
// included. cpu-ns/check is this process's CPU time (user and system) per
// check: the daemon's side, without redis-server's, and robust to a
// machine busy with other work where ns/op is not. A check answered from
// the fallback would fail the benchmark.
func BenchmarkHTTPCheckRedis(b *testing.B) {
	const callers = 64
	srv := redistest.Start(b)
	d := newBenchDaemonOn(b, "redis://"+srv.Addr(), 1000)
	h := d.Handler()
	// Each caller has its own requests, for the users i ≡ k (mod 64).
	all := checkRequests(b)
	own := make([][]benchRequest, callers)
	for i, br := range all {
		own[i%callers] = append(own[i%callers], br)
	}
	b.SetParallelism((callers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	var next atomic.Int64
	b.ReportAllocs()
	cpu0 := processCPU(b)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		w := &degradedWriter{discardWriter: discardWriter{h: http.Header{}}}
		reqs := own[int(next.Add(1)-1)%callers]
		i := 0
		for pb.Next() {
			br := reqs[i]
			i = (i + 1) % len(reqs)
			br.body.Reset(br.raw)
			w.reset()
			h.ServeHTTP(w, br.r)
			if w.status != http.StatusOK || w.degraded {
				b.Errorf("status %d, degraded %v: the check was not decided by Redis", w.status, w.degraded)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/check")
}

// processCPU is the CPU time this process has used, user and system, in
// nanoseconds.
func processCPU(b *testing.B) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// BenchmarkHTTPAuthz is GET /v1/authz as nginx auth_request calls it: the
// limited request's path and method in headers, the subject the client
// address (one per user; an unregistered API key would be limited by
// address too).
func BenchmarkHTTPAuthz(b *testing.B) {
	d := newBenchDaemon(b)
	reqs := benchRequests(func(user string) (*http.Request, []byte) {
		r, err := http.NewRequest("GET", "http://sluice/v1/authz", nil)
		if err != nil {
			b.Fatal(err)
		}
		n, _ := strconv.Atoi(user[1:])
		r.RemoteAddr = "10.0." + strconv.Itoa(n/256) + "." + strconv.Itoa(n%256) + ":40000"
		r.Header.Set("X-Original-URI", "/bench")
		r.Header.Set("X-Original-Method", "GET")
		return r, nil
	})
	runHTTPBench(b, d.Handler(), reqs)
}

// BenchmarkHTTPCheckRejected is BenchmarkHTTPCheck for 100 users over
// their limit of one check per second: nearly every check is answered 429
// with its problem+json body, most from the deny cache.
func BenchmarkHTTPCheckRejected(b *testing.B) {
	d := newBenchDaemonRate(b, 1)
	reqs := benchRequests(func(user string) (*http.Request, []byte) {
		n, _ := strconv.Atoi(user[1:])
		raw := []byte(`{"user":"u` + strconv.Itoa(n%100) + `","route":"/bench","method":"GET"}`)
		r, err := http.NewRequest("POST", "http://sluice/v1/check", nil)
		if err != nil {
			b.Fatal(err)
		}
		r.Header.Set("Content-Type", "application/json")
		r.ContentLength = int64(len(raw))
		return r, raw
	})
	runHTTPBenchStatus(b, d.Handler(), reqs, http.StatusTooManyRequests)
}

// BenchmarkHTTPAuthzRejected is BenchmarkHTTPAuthz for 100 addresses over
// their limit of one request per second: nearly every call is answered
// 429 with a problem+json body.
func BenchmarkHTTPAuthzRejected(b *testing.B) {
	d := newBenchDaemonRate(b, 1)
	reqs := benchRequests(func(user string) (*http.Request, []byte) {
		r, err := http.NewRequest("GET", "http://sluice/v1/authz", nil)
		if err != nil {
			b.Fatal(err)
		}
		n, _ := strconv.Atoi(user[1:])
		r.RemoteAddr = "10.0.0." + strconv.Itoa(n%100) + ":40000"
		r.Header.Set("X-Original-URI", "/bench")
		r.Header.Set("X-Original-Method", "GET")
		return r, nil
	})
	runHTTPBenchStatus(b, d.Handler(), reqs, http.StatusTooManyRequests)
}

// BenchmarkServerCheck is BenchmarkHTTPCheck through the data-plane
// server's handler as Serve installs it, request conversion included, as
// a gateway's check goes (without the network).
func BenchmarkServerCheck(b *testing.B) {
	runServerBench(b, newBenchDaemon(b), func(user string, r *fasthttp.Request) {
		r.Header.SetMethod("POST")
		r.SetRequestURI("/v1/check")
		r.Header.SetHost("sluice")
		r.Header.SetContentType("application/json")
		r.SetBodyString(`{"user":"` + user + `","route":"/bench","method":"GET"}`)
	})
}

// BenchmarkServerAuthz is BenchmarkHTTPAuthz through the data-plane
// server's handler, as BenchmarkServerCheck: user i calls from its own
// address.
func BenchmarkServerAuthz(b *testing.B) {
	runServerBench(b, newBenchDaemon(b), func(user string, r *fasthttp.Request) {
		r.Header.SetMethod("GET")
		r.SetRequestURI("/v1/authz")
		r.Header.SetHost("sluice")
		r.Header.Set("X-Original-URI", "/bench")
		r.Header.Set("X-Original-Method", "GET")
	})
}

func runServerBench(b *testing.B, d *Daemon, build func(user string, r *fasthttp.Request)) {
	h := d.fastHandler(d.Handler())
	reqs := make([]*fasthttp.Request, benchUsers)
	addrs := make([]net.Addr, benchUsers)
	for i := range reqs {
		reqs[i] = new(fasthttp.Request)
		build("u"+strconv.Itoa(i), reqs[i])
		addrs[i] = &net.TCPAddr{IP: net.IPv4(10, 0, byte(i/256), byte(i%256)), Port: 40000}
	}
	var ctx fasthttp.RequestCtx
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		ctx.Response.Reset()
		ctx.Init(reqs[i], addrs[i], nil)
		i = (i + 1) % len(reqs)
		h(&ctx)
		if s := ctx.Response.StatusCode(); s != http.StatusOK {
			b.Fatalf("status %d: %s", s, ctx.Response.Body())
		}
	}
}
