// Command loadgen drives one HTTP/1.1 endpoint at a fixed offered rate
// (open loop) or as fast as its connections allow (closed loop, -rate 0),
// and prints the achieved rate and latency quantiles.
//
// In open-loop mode request i is due at start + i/rate and its latency is
// measured from that due time, so time a request spends waiting for a free
// connection behind a slow answer counts (no coordinated omission). Each
// connection is kept alive and reused; a broken one is redialled and the
// failure counted. The bodies, paths and headers may hold the placeholder
// {user}, replaced by u0 .. u(N-1) in turn, so that the load spreads over
// -users subjects.
//
// An https:// URL is driven over TLS: -tls-ca names the CA the server is
// verified against, -tls-cert and -tls-key a client certificate for a
// server that requires one. A connection's handshake is part of the first
// request sent on it; the rest pay for the encryption alone.
//
//	loadgen -url http://127.0.0.1:8080/v1/check -rate 5000 -duration 10s \
//	  -body '{"user":"{user}","route":"/bench"}'
//
// The last line is machine-readable:
//
//	RESULT offered=5000 achieved=4999.8 requests=50000 ... p50_us=210 p90_us=350 p99_us=900 p999_us=2100 max_us=4000 lag_p50_us=40 lag_p99_us=80 svc_p50_us=170 svc_p99_us=820
//
// p50_us .. max_us are the figures to quote: from each request's due
// time, or, when its sender sat idle waiting for that time, from when the
// sender woke (a Go program's timers are only as fine as the runtime's
// poller, which sleeps in whole milliseconds on Linux, and that slack is
// the generator's, not the server's). Beside them, lag is how late each
// request was sent after its due time, for whatever reason, and svc is the
// time from the actual send, which alone would hide a stall.
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/bench/internal/clienttls"
	"github.com/sluice-rl/sluice/bench/internal/latency"
)

type config struct {
	latency.Flags
	target  *url.URL
	method  string
	body    string
	headers []string
	conns   int
	// tls is the client configuration of an https:// target, nil for
	// http://.
	tls *tls.Config
}

type headerList []string

func (h *headerList) String() string     { return strings.Join(*h, ", ") }
func (h *headerList) Set(v string) error { *h = append(*h, v); return nil }

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		cfg     config
		rawURL  string
		headers headerList
		tlsf    clienttls.Flags
	)
	tlsf.Register(flag.CommandLine)
	cfg.Flags.Register(flag.CommandLine, "request", "sends back to back on every connection")
	flag.StringVar(&rawURL, "url", "", "target, http://host:port/path or https://... (the path may hold {user})")
	flag.StringVar(&cfg.method, "method", "", "HTTP method (default POST with a -body, GET without)")
	flag.StringVar(&cfg.body, "body", "", "request body; {user} is replaced")
	flag.Var(&headers, "header", `extra request header "Name: value" ({user} is replaced); repeatable`)
	flag.IntVar(&cfg.conns, "conns", 64, "connections (one sender each)")
	flag.Parse()
	cfg.headers = headers
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("-url: want http://host:port/path or https://host:port/path, got %q", rawURL)
	}
	cfg.target = u
	switch {
	case u.Scheme == "https":
		if cfg.tls, err = tlsf.Config(u.Hostname(), "http/1.1"); err != nil {
			return err
		}
	case tlsf.Set():
		return errors.New("-tls-*: given with an http:// -url: write https://")
	}
	if cfg.method == "" {
		cfg.method = http.MethodGet
		if cfg.body != "" {
			cfg.method = http.MethodPost
		}
	}
	if err := cfg.Flags.Validate(); err != nil {
		return err
	}
	if cfg.conns < 1 {
		return errors.New("-conns: must be at least 1")
	}
	reqs, err := buildRequests(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	res := drive(ctx, cfg, reqs)
	fmt.Print(res.report(cfg))
	if res.Requests == 0 {
		return errors.New("no request completed")
	}
	return nil
}

// buildRequests renders one raw HTTP/1.1 request per user.
func buildRequests(cfg config) ([][]byte, error) {
	path := cfg.target.RequestURI()
	for _, h := range cfg.headers {
		if name, _, ok := strings.Cut(h, ":"); !ok || strings.TrimSpace(name) == "" {
			return nil, fmt.Errorf("-header: want \"Name: value\", got %q", h)
		}
	}
	out := make([][]byte, cfg.Users)
	for i := range out {
		user := "u" + strconv.Itoa(i)
		body := strings.ReplaceAll(cfg.body, "{user}", user)
		var b strings.Builder
		fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\n", cfg.method, strings.ReplaceAll(path, "{user}", user), cfg.target.Host)
		if cfg.body != "" {
			fmt.Fprintf(&b, "Content-Type: application/json\r\nContent-Length: %d\r\n", len(body))
		}
		for _, h := range cfg.headers {
			b.WriteString(strings.ReplaceAll(h, "{user}", user))
			b.WriteString("\r\n")
		}
		b.WriteString("\r\n")
		b.WriteString(body)
		out[i] = []byte(b.String())
	}
	return out, nil
}

// result is what a run measured, with the answers outside 2xx among the
// requests.
type result struct {
	*latency.Measure
	non2xx uint64
}

func (r *result) report(cfg config) string {
	head := fmt.Sprintf("%s %s, %d connections, %s: %d answers (%.0f/s), %d errors, %d non-2xx, %d not sent",
		cfg.method, cfg.target, cfg.conns, latency.Mode(cfg.Rate), r.Requests, r.Achieved(), r.Errors, r.non2xx, r.Unsent)
	return r.Report(head, cfg.Rate, fmt.Sprintf("errors=%d non2xx=%d unsent=%d", r.Errors, r.non2xx, r.Unsent))
}

// drive runs the senders, one a connection, and merges what they
// measured.
func drive(ctx context.Context, cfg config, reqs [][]byte) *result {
	senders := make([]*sender, cfg.conns)
	non2xx := make([]uint64, cfg.conns)
	for w := range senders {
		senders[w] = &sender{cfg: cfg, reqs: reqs, user: w * len(reqs) / cfg.conns}
	}
	m := latency.Drive(ctx, cfg.Run(cfg.conns),
		func(w int, measured bool) error {
			status, err := senders[w].do()
			if err == nil && measured && (status < 200 || status > 299) {
				non2xx[w]++
			}
			return err
		})
	res := &result{Measure: m}
	for w, s := range senders {
		s.close()
		res.non2xx += non2xx[w]
	}
	return res
}

// sender owns one kept-alive connection.
type sender struct {
	cfg  config
	reqs [][]byte
	user int
	conn net.Conn
	br   *bufio.Reader
}

func (s *sender) close() {
	if s.conn != nil {
		s.conn.Close()
		s.conn = nil
	}
}

// do sends the next user's request and reads the whole answer.
func (s *sender) do() (int, error) {
	req := s.reqs[s.user]
	s.user++
	if s.user == len(s.reqs) {
		s.user = 0
	}
	for attempt := 0; ; attempt++ {
		if s.conn == nil {
			c, err := s.dial()
			if err != nil {
				return 0, err
			}
			s.conn, s.br = c, bufio.NewReaderSize(c, 16<<10)
		}
		s.conn.SetDeadline(time.Now().Add(s.cfg.Timeout))
		status, err := s.roundTrip(req)
		if err == nil {
			return status, nil
		}
		s.close()
		// A kept-alive connection the server closed while idle fails
		// at once: retry once on a fresh one.
		if attempt > 0 || !(errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)) {
			return 0, err
		}
	}
}

// dial opens a connection to the target, with its TLS handshake done for
// an https:// one.
func (s *sender) dial() (net.Conn, error) {
	c, err := net.DialTimeout("tcp", s.cfg.target.Host, s.cfg.Timeout)
	if err != nil || s.cfg.tls == nil {
		return c, err
	}
	tc := tls.Client(c, s.cfg.tls)
	c.SetDeadline(time.Now().Add(s.cfg.Timeout))
	if err := tc.Handshake(); err != nil {
		c.Close()
		return nil, fmt.Errorf("TLS handshake: %w", err)
	}
	return tc, nil
}

func (s *sender) roundTrip(req []byte) (int, error) {
	if _, err := s.conn.Write(req); err != nil {
		return 0, err
	}
	resp, err := http.ReadResponse(s.br, nil)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return 0, err
	}
	if resp.Close {
		s.close()
	}
	return resp.StatusCode, nil
}
