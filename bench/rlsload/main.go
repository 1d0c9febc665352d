// Command rlsload drives Envoy's rate limit service,
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit over gRPC, at
// a fixed offered rate (open loop) or as fast as its streams allow (closed
// loop, -rate 0), and prints the achieved rate, latency quantiles and the
// count of OK, OVER_LIMIT and failed calls.
//
// -streams calls are in flight at most, spread over -conns connections
// (HTTP/2, so several streams share one connection). -client h2, the
// default, is the generator's own lean HTTP/2 client (see h2.go), which
// leaves more of a shared machine's CPU to the servers than grpc-go's
// client (-client grpc) does; both send the same requests. Every request names
// -domain and one descriptor of -entries, whose values may hold the
// placeholder {user}, replaced by u0 .. u(N-1) in turn so that the load
// spreads over -users subjects.
//
// With -tls (or any -tls-* flag) the calls go over TLS with ALPN h2, the
// server verified against -tls-ca, presenting -tls-cert and -tls-key to a
// server that requires a client certificate.
//
// In open-loop mode request i is due at start + i/rate and its latency is
// measured from that due time, as bench/loadgen does (see its
// documentation): a server that stalls is charged for every call held back
// behind it, and when a stream sat idle until the due time latency starts
// at its wake-up instead, the generator's timer slack not being the
// server's.
//
//	rlsload -addr 127.0.0.1:8081 -domain bench -entries 'user={user}' -rate 5000 -duration 10s
//
// The last line is machine-readable:
//
//	RESULT offered=5000 achieved=4999.8 requests=50000 ok=50000 over_limit=0 errors=0 unsent=0 p50_us=210 ... svc_p99_us=820
//
// requests counts the answered calls (OK or OVER_LIMIT); errors the calls
// that failed or answered another code; all_calls every call of the run,
// warm-up included. lag is how late each call was sent
// after its due time and svc the time from the actual send.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-rl/sluice/bench/internal/clienttls"
	"github.com/sluice-rl/sluice/bench/internal/latency"
)

type config struct {
	latency.Flags
	addr    string
	domain  string
	entries []entry
	conns   int
	streams int
	client  string
	// tls is the client configuration of a TLS service, nil for
	// plaintext gRPC.
	tls *tls.Config
}

// entry is one descriptor entry; {user} in Value is replaced.
type entry struct{ Key, Value string }

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "rlsload:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		cfg     config
		entries string
		tlsf    clienttls.Flags
		useTLS  bool
	)
	tlsf.Register(flag.CommandLine)
	cfg.Flags.Register(flag.CommandLine, "call", "calls back to back on every stream")
	flag.BoolVar(&useTLS, "tls", false, "call over TLS (implied by any -tls-* flag)")
	flag.StringVar(&cfg.addr, "addr", "", "the rate limit service, host:port (plaintext gRPC unless -tls)")
	flag.StringVar(&cfg.domain, "domain", "bench", "domain of every request")
	flag.StringVar(&entries, "entries", "user={user}", "the descriptor's entries, key=value[,key=value...]; {user} in a value is replaced")
	flag.IntVar(&cfg.conns, "conns", 4, "connections")
	flag.IntVar(&cfg.streams, "streams", 50, "calls in flight at most (one sender each), spread over the connections")
	flag.StringVar(&cfg.client, "client", "h2", "h2: the generator's own lean HTTP/2 client; grpc: grpc-go's client")
	flag.Parse()
	var err error
	if cfg.entries, err = parseEntries(entries); err != nil {
		return fmt.Errorf("-entries: %w", err)
	}
	if err := cfg.Flags.Validate(); err != nil {
		return err
	}
	switch {
	case cfg.addr == "":
		return errors.New("-addr: required")
	case cfg.domain == "":
		return errors.New("-domain: required")
	case cfg.conns < 1:
		return errors.New("-conns: must be at least 1")
	case cfg.streams < cfg.conns:
		return fmt.Errorf("-streams: must be at least -conns (%d)", cfg.conns)
	case cfg.client != "h2" && cfg.client != "grpc":
		return fmt.Errorf("-client: h2 or grpc, got %q", cfg.client)
	}
	if useTLS || tlsf.Set() {
		host, _, err := net.SplitHostPort(cfg.addr)
		if err != nil {
			return fmt.Errorf("-addr: %w", err)
		}
		if cfg.tls, err = tlsf.Config(host, "h2"); err != nil {
			return err
		}
	}
	reqs := buildRequests(cfg)
	conns := make([]conn, cfg.conns)
	for i := range conns {
		var err error
		if conns[i], err = dial(cfg, reqs); err != nil {
			return fmt.Errorf("-addr: %w", err)
		}
		defer conns[i].Close()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	res := drive(ctx, cfg, conns, len(reqs))
	fmt.Print(res.report(cfg))
	if res.Requests == 0 {
		return errors.New("no call answered")
	}
	return nil
}

// parseEntries reads key=value[,key=value...].
func parseEntries(s string) ([]entry, error) {
	var out []entry
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("want key=value[,key=value...], got %q", s)
		}
		out = append(out, entry{Key: k, Value: v})
	}
	return out, nil
}

// buildRequests renders one request per user. A request is only read
// while it is sent, so senders share them.
func buildRequests(cfg config) []*rlsv3.RateLimitRequest {
	out := make([]*rlsv3.RateLimitRequest, cfg.Users)
	for i := range out {
		user := "u" + strconv.Itoa(i)
		d := &rlv3.RateLimitDescriptor{}
		for _, e := range cfg.entries {
			d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: e.Key, Value: strings.ReplaceAll(e.Value, "{user}", user)})
		}
		out[i] = &rlsv3.RateLimitRequest{Domain: cfg.domain, Descriptors: []*rlv3.RateLimitDescriptor{d}}
	}
	return out
}

// result is what a run measured: its requests are the calls answered with
// a decision, OK or OVER_LIMIT.
type result struct {
	*latency.Measure
	ok, overLimit uint64
	// all counts every call answered or failed, warm-up included: the
	// calls a server's CPU time over the whole run paid for.
	all uint64
}

func (r *result) report(cfg config) string {
	head := fmt.Sprintf("ShouldRateLimit %s domain %s, %d streams over %d connections, %s: %d answers (%.0f/s): %d OK, %d OVER_LIMIT; %d errors, %d not sent",
		cfg.addr, cfg.domain, cfg.streams, cfg.conns, latency.Mode(cfg.Rate), r.Requests, r.Achieved(), r.ok, r.overLimit, r.Errors, r.Unsent)
	return r.Report(head, cfg.Rate, fmt.Sprintf("ok=%d over_limit=%d errors=%d unsent=%d all_calls=%d", r.ok, r.overLimit, r.Errors, r.Unsent, r.all))
}

// conn is one connection to the service; each sender calls through its
// own sender of it.
type conn interface {
	newSender() sender
	Close() error
}

// sender makes one call at a time: user's request, within cfg.Timeout.
type sender interface {
	call(ctx context.Context, user int) (rlsv3.RateLimitResponse_Code, error)
}

func dial(cfg config, reqs []*rlsv3.RateLimitRequest) (conn, error) {
	if cfg.client == "h2" {
		c, err := dialH2(cfg.addr, cfg.tls, cfg.Timeout, reqs)
		if err != nil {
			return nil, err
		}
		return h2Conn{c, cfg.Timeout}, nil
	}
	creds := insecure.NewCredentials()
	if cfg.tls != nil {
		creds = credentials.NewTLS(cfg.tls)
	}
	cc, err := grpc.NewClient(cfg.addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, err
	}
	return grpcConn{cc, rlsv3.NewRateLimitServiceClient(cc), reqs, cfg.Timeout}, nil
}

type grpcConn struct {
	cc      *grpc.ClientConn
	client  rlsv3.RateLimitServiceClient
	reqs    []*rlsv3.RateLimitRequest
	timeout time.Duration
}

func (c grpcConn) newSender() sender { return c }
func (c grpcConn) Close() error      { return c.cc.Close() }

func (c grpcConn) call(ctx context.Context, user int) (rlsv3.RateLimitResponse_Code, error) {
	cctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := c.client.ShouldRateLimit(cctx, c.reqs[user])
	return resp.GetOverallCode(), err
}

type h2Conn struct {
	c       *h2conn
	timeout time.Duration
}

func (c h2Conn) Close() error { return c.c.Close() }
func (c h2Conn) newSender() sender {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &h2Sender{c: c.c, timeout: c.timeout, timer: t, cl: &h2call{done: make(chan h2result, 2)}}
}

type h2Sender struct {
	c       *h2conn
	timeout time.Duration
	timer   *time.Timer
	cl      *h2call
}

func (s *h2Sender) call(_ context.Context, user int) (rlsv3.RateLimitResponse_Code, error) {
	return s.c.call(s.cl, user, s.timer, s.timeout)
}

// drive runs the senders, sender w on connection w mod len(conns), each
// naming the users in turn from its own offset, and merges what they
// measured.
func drive(ctx context.Context, cfg config, conns []conn, users int) *result {
	type part struct {
		snd                sender
		user               int
		ok, overLimit, all uint64
	}
	parts := make([]part, cfg.streams)
	for w := range parts {
		parts[w] = part{snd: conns[w%len(conns)].newSender(), user: w * users / cfg.streams}
	}
	m := latency.Drive(ctx, cfg.Run(cfg.streams),
		func(w int, measured bool) error {
			p := &parts[w]
			u := p.user
			if p.user++; p.user == users {
				p.user = 0
			}
			code, err := p.snd.call(ctx, u)
			p.all++
			if err != nil || !measured {
				return err
			}
			switch code {
			case rlsv3.RateLimitResponse_OK:
				p.ok++
			case rlsv3.RateLimitResponse_OVER_LIMIT:
				p.overLimit++
			default:
				return fmt.Errorf("overall_code %v", code)
			}
			return nil
		})
	res := &result{Measure: m}
	for _, p := range parts {
		res.ok += p.ok
		res.overLimit += p.overLimit
		res.all += p.all
	}
	return res
}
