package main

import (
	"context"
	"net"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/sluice-rl/sluice/bench/internal/latency"
)

func TestParseEntries(t *testing.T) {
	tests := []struct {
		in      string
		want    []entry
		wantErr bool
	}{
		{"user={user}", []entry{{"user", "{user}"}}, false},
		{"remote_address=10.0.0.1,path=/v1/{user}", []entry{{"remote_address", "10.0.0.1"}, {"path", "/v1/{user}"}}, false},
		{"key=", []entry{{"key", ""}}, false},
		{"user", nil, true},
		{"=v", nil, true},
		{"a=1,", nil, true},
	}
	for _, tt := range tests {
		got, err := parseEntries(tt.in)
		if (err != nil) != tt.wantErr || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("parseEntries(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

// overOddUsers answers OVER_LIMIT to users whose name ends in an odd
// digit and OK to the rest, and remembers the descriptor values it saw.
type overOddUsers struct {
	rlsv3.UnimplementedRateLimitServiceServer
	mu   sync.Mutex
	seen map[string]int
}

func (s *overOddUsers) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	e := req.GetDescriptors()[0].GetEntries()[0]
	s.mu.Lock()
	s.seen[req.GetDomain()+" "+e.GetKey()+"="+e.GetValue()]++
	s.mu.Unlock()
	code := rlsv3.RateLimitResponse_OK
	if strings.IndexByte("13579", e.GetValue()[len(e.GetValue())-1]) >= 0 {
		code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	return &rlsv3.RateLimitResponse{OverallCode: code}, nil
}

func TestDriveCountsAnswersByCode(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &overOddUsers{seen: map[string]int{}}
	gs := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(gs, srv)
	go gs.Serve(ln)
	t.Cleanup(gs.Stop)
	for _, tt := range []struct {
		name   string
		client string
		rate   float64
	}{{"closed loop", "h2", 0}, {"open loop", "h2", 2000}, {"closed loop, grpc-go client", "grpc", 0}, {"open loop, grpc-go client", "grpc", 2000}} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := config{addr: ln.Addr().String(), domain: "bench", entries: []entry{{"user", "{user}"}},
				Flags: latency.Flags{Users: 10, Rate: tt.rate, Duration: 200 * time.Millisecond, Timeout: 5 * time.Second},
				conns: 1, streams: 2, client: tt.client}
			srv.mu.Lock()
			clear(srv.seen)
			srv.mu.Unlock()
			reqs := buildRequests(cfg)
			c, err := dial(cfg, reqs)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			res := drive(context.Background(), cfg, []conn{c}, len(reqs))
			if res.Errors != 0 || res.Requests == 0 || res.ok+res.overLimit != res.Requests {
				t.Fatalf("drive = %d requests, %d OK, %d OVER_LIMIT, %d errors (%v); want some, all answered OK or OVER_LIMIT",
					res.Requests, res.ok, res.overLimit, res.Errors, res.FirstErr)
			}
			if res.ok == 0 || res.overLimit == 0 {
				t.Errorf("drive = %d OK, %d OVER_LIMIT; want both counted", res.ok, res.overLimit)
			}
			if res.all != res.Requests+res.Errors {
				t.Errorf("drive counted %d calls in all, want %d answered + %d failed (no warm-up)", res.all, res.Requests, res.Errors)
			}
			if got := uint64(res.Lat.Count()); got != res.Requests {
				t.Errorf("latency histogram holds %d values, want one per answer (%d)", got, res.Requests)
			}
			srv.mu.Lock()
			defer srv.mu.Unlock()
			if len(srv.seen) != cfg.Users {
				t.Errorf("server saw %d distinct descriptors %v, want the %d users", len(srv.seen), srv.seen, cfg.Users)
			}
			if srv.seen["bench user=u0"] == 0 || srv.seen["bench user=u9"] == 0 {
				t.Errorf("server saw %v, want domain bench and user=u0 .. u9", srv.seen)
			}
			if line := res.report(cfg); !strings.Contains(line, "RESULT ") || !strings.Contains(line, " over_limit=") {
				t.Errorf("report = %q, want a RESULT line with over_limit=", line)
			}
		})
	}
}
