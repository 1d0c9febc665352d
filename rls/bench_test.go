package rls

import (
	"context"
	"hash/fnv"
	"strconv"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/rls/internal/h2serve"
)

// BenchmarkShouldRateLimit is one call in process (no network) on
// the memory store, for 10 000 addresses that are never over the limit:
// one descriptor, and three (address, route, user) decided together.
func BenchmarkShouldRateLimit(b *testing.B) {
	entry := func(k string) []quota.DescriptorEntry { return []quota.DescriptorEntry{{Key: k}} }
	ps := []quota.Policy{
		{ID: "ip", Mode: quota.ModeEnforce, Algorithm: "fixed_window", Count: 1e9, Window: 1, Match: quota.Match{Domain: "edge", Descriptors: entry("remote_address")}},
		{ID: "route", Mode: quota.ModeEnforce, Algorithm: "token_bucket", RatePerSec: 1e9, Burst: 1e9, Match: quota.Match{Domain: "edge", Descriptors: entry("path")}},
		{ID: "user", Mode: quota.ModeEnforce, Algorithm: "sliding_window_counter", Count: 1e9, Window: 60, Match: quota.Match{Domain: "edge", Descriptors: entry("user")}},
	}
	s := inProcess(b, ps)
	const n = 10000
	reqs := func(three bool) []*rlsv3.RateLimitRequest {
		out := make([]*rlsv3.RateLimitRequest, n)
		for i := range out {
			ip := "10.0." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256)
			r := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{desc("remote_address", ip)}}
			if three {
				r.Descriptors = append(r.Descriptors, desc("path", "/v1/orders"), desc("user", "u"+strconv.Itoa(i%100)))
			}
			out[i] = r
		}
		return out
	}
	for _, tt := range []struct {
		name  string
		three bool
	}{{"one-descriptor", false}, {"three-descriptors", true}} {
		rs := reqs(tt.three)
		wire := make([][]byte, n)
		for i, r := range rs {
			m, err := proto.Marshal(r)
			if err != nil {
				b.Fatal(err)
			}
			wire[i] = append([]byte{0, 0, 0, 0, byte(len(m))}, m...)
		}
		// The own transport's handler on a call: the request's message
		// decoded, decided and the answer encoded, as the transport has
		// it answer a call (h2serve.Handler), its room kept.
		b.Run("transport-"+tt.name, func(b *testing.B) {
			b.ReportAllocs()
			h := h2Calls{s}
			c := &h2serve.Call{Method: methodRLS}
			var out []byte
			i := 0
			for b.Loop() {
				c.Message, c.Out = wire[i%n][5:], append(out[:0], 0, 0, 0, 0, 0)
				if err := h.Answer(context.Background(), c); err != nil || len(c.Out) < 6 {
					b.Fatalf("Answer = %v, %d bytes", err, len(c.Out))
				}
				out = c.Out
				i++
			}
		})
		b.Run(tt.name, func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				resp, err := s.ShouldRateLimit(context.Background(), rs[i%n])
				if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
					b.Fatalf("ShouldRateLimit = %v, %v", resp, err)
				}
				i++
			}
		})
	}
}

// BenchmarkPlaceOf is a descriptor's place, hashed by hand, beside the
// same place built with hash/fnv (its interface and byte conversions).
func BenchmarkPlaceOf(b *testing.B) {
	es := []quota.DescriptorEntry{{Key: "remote_address", Value: "10.0.12.34"}, {Key: "path", Value: "/v1/orders"}}
	b.Run("by-hand", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = placeOf("edge", es)
		}
	})
	b.Run("hash-fnv", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			h := fnv.New64a()
			for _, e := range es {
				h.Write([]byte(e.Key))
				h.Write([]byte{0x1e})
				h.Write([]byte(e.Value))
				h.Write([]byte{0x1f})
			}
			var buf [16]byte
			_ = subjectOf("edge") + ":" + string(strconv.AppendUint(buf[:0], h.Sum64(), 16))
		}
	})
}
