package main

import (
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-rl/sluice/internal/testwait"
)

const (
	tokensEnvoyFile = "../../deploy/envoy/envoy-ratelimit-tokens.yaml"
	tokensRLSFile   = "deploy/envoy/ratelimit-tokens.yaml"
)

// tokensRateLimits reads the route's rate_limits entries of
// deploy/envoy/envoy-ratelimit-tokens.yaml into Envoy's own protobuf type,
// validated as Envoy validates them, and the ratelimit filter's domain.
func tokensRateLimits(t *testing.T) (string, []*routev3.RateLimit) {
	t.Helper()
	raw, err := os.ReadFile(tokensEnvoyFile)
	if err != nil {
		t.Fatal(err)
	}
	var root map[string]any
	if err := yaml.Unmarshal(raw, &root); err != nil {
		t.Fatalf("%s: %v", tokensEnvoyFile, err)
	}
	hcm := yamlAt(t, root, "static_resources", "listeners", 0, "filter_chains", 0, "filters", 0, "typed_config")
	var domain string
	for _, f := range yamlAt(t, hcm, "http_filters").([]any) {
		if yamlAt(t, f, "name") == "envoy.filters.http.ratelimit" {
			domain, _ = yamlAt(t, f, "typed_config", "domain").(string)
		}
	}
	route := yamlAt(t, hcm, "route_config", "virtual_hosts", 0, "routes", 0, "route")
	var out []*routev3.RateLimit
	for i, e := range yamlAt(t, route, "rate_limits").([]any) {
		b, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		rl := &routev3.RateLimit{}
		if err := protojson.Unmarshal(b, rl); err != nil {
			t.Fatalf("rate_limits[%d] is not an envoy.config.route.v3.RateLimit: %v", i, err)
		}
		if err := rl.ValidateAll(); err != nil {
			t.Fatalf("rate_limits[%d] does not validate: %v", i, err)
		}
		out = append(out, rl)
	}
	return domain, out
}

// envoyCall builds the ShouldRateLimit Envoy's rate limit filter sends for
// the entries of limits applied on the request path (streamDone false) or
// on stream done (true): one descriptor per entry whose actions all find
// their value, its hits_addend the entry's number or, from a
// %RESP(name)% format, the response header's value. Only the actions and
// formats the shipped file uses are understood.
func envoyCall(t *testing.T, domain string, limits []*routev3.RateLimit, streamDone bool, req, resp map[string]string) *rlsv3.RateLimitRequest {
	t.Helper()
	out := &rlsv3.RateLimitRequest{Domain: domain}
	for i, rl := range limits {
		if rl.GetApplyOnStreamDone() != streamDone {
			continue
		}
		d := &rlv3.RateLimitDescriptor{}
		complete := true
		for _, a := range rl.GetActions() {
			switch {
			case a.GetGenericKey() != nil:
				key := a.GetGenericKey().GetDescriptorKey()
				if key == "" {
					key = "generic_key"
				}
				d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: key, Value: a.GetGenericKey().GetDescriptorValue()})
			case a.GetRequestHeaders() != nil:
				v, ok := req[a.GetRequestHeaders().GetHeaderName()]
				complete = complete && ok
				d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: a.GetRequestHeaders().GetDescriptorKey(), Value: v})
			default:
				t.Fatalf("rate_limits[%d]: action %v not understood by this test", i, a)
			}
		}
		if !complete {
			continue
		}
		switch ha := rl.GetHitsAddend(); {
		case ha.GetNumber() != nil:
			d.HitsAddend = wrapperspb.UInt64(ha.GetNumber().GetValue())
		case strings.HasPrefix(ha.GetFormat(), "%RESP(") && strings.HasSuffix(ha.GetFormat(), ")%"):
			name := strings.TrimSuffix(strings.TrimPrefix(ha.GetFormat(), "%RESP("), ")%")
			n, err := strconv.ParseUint(resp[name], 10, 64)
			if err != nil {
				t.Fatalf("rate_limits[%d]: response header %s = %q: %v", i, name, resp[name], err)
			}
			d.HitsAddend = wrapperspb.UInt64(n)
		case ha != nil:
			t.Fatalf("rate_limits[%d]: hits_addend %v not understood by this test", i, ha)
		}
		out.Descriptors = append(out.Descriptors, d)
	}
	return out
}

// TestEnvoyStreamDoneCharge runs the sluice serve that
// deploy/envoy/envoy-ratelimit-tokens.yaml prescribes and sends it, over
// grpc-go, the calls Envoy builds from that file's rate_limits: the check
// on the request path (hits 0) admits, the charge on stream done with the
// tokens of the response's x-tokens-used counts them even past the
// budget, and the next check is refused; another API key is not.
func TestEnvoyStreamDoneCharge(t *testing.T) {
	domain, limits := tokensRateLimits(t)
	raw, err := os.ReadFile(tokensEnvoyFile)
	if err != nil {
		t.Fatal(err)
	}
	flags := prescribedFlags(t, tokensEnvoyFile, string(raw), "127.0.0.1:8080")
	if got := flagValue(flags, "--envoy-config"); got != tokensRLSFile {
		t.Fatalf("prescribed --envoy-config = %q, want %s", got, tokensRLSFile)
	}
	if got := flagValue(flags, "--rls-listen"); got != "127.0.0.1:8081" {
		t.Errorf("prescribed --rls-listen = %q, want the cluster's 127.0.0.1:8081", got)
	}
	bin := buildSluice(t)
	d := startDaemon(t, bin, "--rls-listen", "127.0.0.1:0", "--envoy-config", "../../"+tokensRLSFile)
	var addr string
	testwait.For(t, 10*time.Second, "the rate limit service's address in the log", func() bool {
		for _, line := range strings.Split(d.log(), "\n") {
			var m struct{ Msg, Addr string }
			if json.Unmarshal([]byte(line), &m) == nil && m.Msg == "rate limit service listening" {
				addr = m.Addr
				return true
			}
		}
		return false
	})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := rlsv3.NewRateLimitServiceClient(conn)
	send := func(what string, r *rlsv3.RateLimitRequest) rlsv3.RateLimitResponse_Code {
		t.Helper()
		if len(r.Descriptors) != 2 {
			t.Fatalf("%s: %d descriptors, want 2 (per minute, per day)", what, len(r.Descriptors))
		}
		resp, err := c.ShouldRateLimit(t.Context(), r)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return resp.OverallCode
	}
	key := map[string]string{"x-api-key": "k1"}
	used := func(n int) map[string]string { return map[string]string{"x-tokens-used": strconv.Itoa(n)} }
	check := envoyCall(t, domain, limits, false, key, nil)
	if got := send("first check", check); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first check = %v, want OK", got)
	}
	if got := send("charge of 15000", envoyCall(t, domain, limits, true, key, used(15000))); got != rlsv3.RateLimitResponse_OK {
		t.Errorf("stream-done charge of 15000 of 20000 a minute = %v, want OK", got)
	}
	if got := send("second check", check); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("check with 5000 left = %v, want OK", got)
	}
	// The response used 20000 more: the minute's budget is 15000 in debt.
	if got := send("charge of 20000", envoyCall(t, domain, limits, true, key, used(20000))); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("stream-done charge past the budget = %v, want OVER_LIMIT (Envoy ignores it; the hits are counted)", got)
	}
	if got := send("check after the debt", check); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("check after 35000 tokens of 20000 a minute = %v, want OVER_LIMIT", got)
	}
	other := envoyCall(t, domain, limits, false, map[string]string{"x-api-key": "k2"}, nil)
	if got := send("another key's check", other); got != rlsv3.RateLimitResponse_OK {
		t.Errorf("another API key's check = %v, want OK", got)
	}
	if r := envoyCall(t, domain, limits, false, map[string]string{}, nil); len(r.Descriptors) != 0 {
		t.Errorf("a request without x-api-key builds %v, want no descriptor", r.Descriptors)
	}
}
