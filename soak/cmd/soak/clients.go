package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-rl/sluice/soak"
)

// recorder keeps every request the clients made.
type recorder struct {
	mu     sync.Mutex
	reqs   []soak.Request
	unsent int
}

func (rc *recorder) add(r soak.Request) {
	rc.mu.Lock()
	rc.reqs = append(rc.reqs, r)
	rc.mu.Unlock()
}

func (rc *recorder) all() ([]soak.Request, int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]soak.Request(nil), rc.reqs...), rc.unsent
}

// markGatewayDegraded marks the requests through nginx that its access log
// at path says Sluice decided without its store.
func (rc *recorder) markGatewayDegraded(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("nginx access log: %w", err)
	}
	defer f.Close()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	_, err = soak.MarkGatewayDegraded(rc.reqs, "nginx", f)
	return err
}

// sender sends one request for subject; pick is a number in [0, 1) for
// its other choices.
type sender func(ctx context.Context, subject string, pick float64) []soak.Request

// drive offers load at tr's rate for (region, kind) until ctx ends: each
// 20 ms it hands the requests due to a pool of workers; a request no
// worker is free for is counted unsent rather than queued.
//
// A request sent before ctx ends is answered and recorded: only new
// requests stop.
func drive(ctx context.Context, rc *recorder, tr soak.Traffic, start time.Time, region, kind string, send sender, done func()) {
	jobs := make(chan struct{}, 64)
	inflight := context.WithoutCancel(ctx)
	subjects := tr.Subjects(region + "-" + kind)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range jobs {
				mu.Lock()
				s, p := subjects.Next()
				mu.Unlock()
				for _, r := range send(inflight, s, p) {
					rc.add(r)
				}
			}
		}()
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer func() { tick.Stop(); close(jobs); wg.Wait(); done() }()
	due := 0.0
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			due += tr.Rate(region, kind, now.Sub(start)) * now.Sub(last).Seconds()
			last = now
			for ; due >= 1; due-- {
				select {
				case jobs <- struct{}{}:
				default:
					rc.mu.Lock()
					rc.unsent++
					rc.mu.Unlock()
				}
			}
		}
	}
}

// httpClient closes an idle connection before the daemon does
// (region.IdleTimeout): a POST sent on a connection the daemon is closing
// fails with EOF, and net/http does not send a POST again. Without the
// limit a connection idle for two minutes failed a check with no fault.
var httpClient = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 32, IdleConnTimeout: 90 * time.Second}}

// checkRoutes are the /v1/check routes by share of requests.
func checkRoute(p float64) (route, policy string) {
	switch {
	case p < 0.6:
		return "/soak/api", "api"
	case p < 0.7:
		return "/soak/login", "login"
	case p < 0.9:
		return "/soak/orders", "orders"
	}
	return "/soak/extra", "extra"
}

// checkSender asks the region's daemons' /v1/check in turn; a request
// that fails to connect is tried once on the next daemon.
func checkSender(r *region) sender {
	var n int
	var mu sync.Mutex
	return func(ctx context.Context, subject string, p float64) []soak.Request {
		route, policy := checkRoute(p)
		body := fmt.Sprintf(`{"user":%q,"route":%q}`, subject, route)
		mu.Lock()
		n++
		first := n
		mu.Unlock()
		var out []soak.Request
		for try := 0; try < 2; try++ {
			d := r.daemons[(first+try)%len(r.daemons)]
			q := soak.Request{Start: time.Now(), Region: r.name, Daemon: d.name, Via: "check", Policy: policy, Subject: subject, Decided: true}
			req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+d.addr+"/v1/check", bytes.NewBufferString(body))
			req.Header.Set("Content-Type", "application/json")
			res, err := httpClient.Do(req)
			q.End = time.Now()
			if err != nil {
				q.Err = err.Error()
				out = append(out, q)
				continue
			}
			b, _ := io.ReadAll(io.LimitReader(res.Body, 64<<10))
			res.Body.Close()
			q.Status = res.StatusCode
			q.Degraded = bytes.Contains(b, []byte(`"degraded":true`))
			return append(out, q)
		}
		return out
	}
}

// nginxSender sends GET /gw/... through nginx from a loopback address of
// its own per subject (127.1.x.y), which is the subject Sluice counts:
// the shipped config passes the client's address in X-Forwarded-For.
func nginxSender(r *region, addr string) sender {
	ips := map[string]string{}
	var mu sync.Mutex
	var sent int
	return func(ctx context.Context, subject string, _ float64) []soak.Request {
		mu.Lock()
		ip, ok := ips[subject]
		if !ok {
			n := len(ips) + 2
			ip = fmt.Sprintf("127.1.%d.%d", (n/250)%250, n%250+1)
			ips[subject] = ip
		}
		sent++
		// The query makes the URI unique, so that nginx's access log line
		// can be matched to this request; Sluice ignores it.
		uri := fmt.Sprintf("/gw/%s?n=%d", subject, sent)
		mu.Unlock()
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
		client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
		q := soak.Request{Start: time.Now(), Region: r.name, Via: "nginx", Policy: "gw", Subject: "ip:" + ip, URI: uri}
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+addr+uri, nil)
		res, err := client.Do(req)
		q.End = time.Now()
		if err != nil {
			q.Err = err.Error()
			return []soak.Request{q}
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		q.Status = res.StatusCode
		// nginx fails open without a decision (error_page 500 =
		// @sluice_open): such an answer has no RateLimit header.
		q.Decided = res.Header.Get("RateLimit") != "" || res.StatusCode == 429
		return []soak.Request{q}
	}
}

// rlsSender calls ShouldRateLimit on the region's daemons in turn with
// grpc-go, one descriptor user=<subject> of domain soak.
func rlsSender(r *region) (sender, func(), error) {
	var clients []rlsv3.RateLimitServiceClient
	var conns []*grpc.ClientConn
	for _, d := range r.daemons {
		c, err := grpc.NewClient(d.rls, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, nil, err
		}
		conns = append(conns, c)
		clients = append(clients, rlsv3.NewRateLimitServiceClient(c))
	}
	closeAll := func() {
		for _, c := range conns {
			c.Close()
		}
	}
	var n int
	var mu sync.Mutex
	return func(ctx context.Context, subject string, _ float64) []soak.Request {
		mu.Lock()
		n++
		i := n % len(clients)
		mu.Unlock()
		q := soak.Request{Start: time.Now(), Region: r.name, Daemon: r.daemons[i].name, Via: "rls", Policy: "rls", Subject: subject, Decided: true}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		res, err := clients[i].ShouldRateLimit(cctx, &rlsv3.RateLimitRequest{Domain: "soak",
			Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: subject}}}}})
		cancel()
		q.End = time.Now()
		switch {
		case err != nil:
			q.Err = err.Error()
		case res.GetOverallCode() == rlsv3.RateLimitResponse_OK:
			q.Status = 200
			q.Degraded = saysDegraded(res.GetRequestHeadersToAdd())
		case res.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT:
			q.Status = 429
		default:
			q.Status = 500 + int(res.GetOverallCode())
		}
		return []soak.Request{q}
	}, closeAll, nil
}

// saysDegraded reports whether an RLS answer's headers for the upstream
// request say the store did not decide it.
func saysDegraded(hs []*corev3.HeaderValue) bool {
	for _, h := range hs {
		if strings.EqualFold(h.GetKey(), "X-Sluice-Degraded") && h.GetValue() == "true" {
			return true
		}
	}
	return false
}

var _ = strconv.Itoa
