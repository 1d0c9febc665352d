package rls

import (
	"bytes"
	"context"
	"reflect"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-rl/sluice/quota"
)

// FuzzDecodeRequest checks decodeRequest against proto.Unmarshal: both
// accept the same encodings, and read the same request from them.
func FuzzDecodeRequest(f *testing.F) {
	for _, r := range []*rlsv3.RateLimitRequest{
		{Domain: "edge", HitsAddend: 3, Descriptors: []*rlv3.RateLimitDescriptor{desc("remote_address", "10.0.0.1"), desc("path", "/v1", "user", "u1")}},
		{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: desc("k", "v").Entries, HitsAddend: wrapperspb.UInt64(7), IsNegativeHits: true,
			Limit: &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5}}}},
		{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{{}, desc("k", "")}},
		{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: desc("k", "v").Entries,
			Limit: &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: 2, UnitMultiplier: wrapperspb.UInt32(3)}}}},
	} {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x0a, 0x02, 0xc3, 0x28})             // domain not UTF-8
	f.Add([]byte{0x12, 0x04, 0x1a, 0x02, 0x08, 0x05}) // descriptor hits_addend 5
	f.Add([]byte{0x08, 0x01, 0x0a, 0x01, 'd'})        // domain of the wrong wire type, then right
	f.Fuzz(func(t *testing.T, data []byte) {
		var m rlsv3.RateLimitRequest
		perr := proto.Unmarshal(data, &m)
		var got request
		derr := decodeRequest(data, &got)
		if (perr == nil) != (derr == nil) {
			t.Fatalf("decodeRequest error %v, proto.Unmarshal error %v", derr, perr)
		}
		if perr != nil {
			return
		}
		var want request
		want.fromMessage(&m)
		normalize := func(r *request) {
			r.entries = nil
			for i := range r.descs {
				if len(r.descs[i].entries) == 0 {
					r.descs[i].entries = nil
				}
			}
			if len(r.descs) == 0 {
				r.descs = nil
			}
		}
		normalize(&got)
		normalize(&want)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("decodeRequest = %+v, want %+v", got, want)
		}
	})
}

// TestAppendResponse checks the hand encoding of answers against
// proto.Marshal, on answers of every shape decide gives.
func TestAppendResponse(t *testing.T) {
	s := inProcess(t, []quota.Policy{
		{ID: "ip", Mode: quota.ModeEnforce, Algorithm: "fixed_window", Count: 2, Window: 1, Match: quota.Match{Domain: "edge", Descriptors: []quota.DescriptorEntry{{Key: "remote_address"}}}},
		{ID: "route", Mode: quota.ModeEnforce, Algorithm: "token_bucket", RatePerSec: 0.5, Burst: 3, Match: quota.Match{Domain: "edge", Descriptors: []quota.DescriptorEntry{{Key: "path"}}}},
		{ID: "none", Mode: quota.ModeEnforce, Algorithm: "fixed_window", Count: 0, Window: 60, Match: quota.Match{Domain: "edge", Descriptors: []quota.DescriptorEntry{{Key: "blocked"}}}},
		{ID: "free", Unlimited: true, Match: quota.Match{Domain: "edge", Descriptors: []quota.DescriptorEntry{{Key: "free"}}}},
	})
	reqs := []*rlsv3.RateLimitRequest{
		{Domain: "other", Descriptors: []*rlv3.RateLimitDescriptor{desc("k", "v")}},
		{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{desc("free", "x")}},
		{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{desc("blocked", "x"), desc("path", "/")}},
	}
	for range 4 { // allowed, then over the limit
		reqs = append(reqs, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{desc("remote_address", "10.0.0.1"), desc("path", "/a")}})
	}
	shapes := map[string]bool{}
	for i, m := range reqs {
		var req request
		req.fromMessage(m)
		var r reply
		if err := s.decide(context.Background(), &req, &r, &scratch{}); err != nil {
			t.Fatalf("decide(%d) = %v", i, err)
		}
		want, err := proto.Marshal(&r.resp)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendResponse(nil, &r.resp); !bytes.Equal(got, want) {
			t.Errorf("appendResponse(%v) = %x, want %x", &r.resp, got, want)
		}
		shapes[r.resp.OverallCode.String()] = true
		shapes["headers"] = shapes["headers"] || len(r.resp.ResponseHeadersToAdd) > 0
	}
	// A degraded answer, which the memory store never gives.
	degraded := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		RequestHeadersToAdd: []*corev3.HeaderValue{{Key: "X-Sluice-Degraded", Value: "true"}}}
	if want, _ := proto.Marshal(degraded); !bytes.Equal(appendResponse(nil, degraded), want) {
		t.Errorf("appendResponse(%v) = %x, want %x", degraded, appendResponse(nil, degraded), want)
	}
	if !shapes["OK"] || !shapes["OVER_LIMIT"] || !shapes["headers"] {
		t.Errorf("the answers had %v, want OK, OVER_LIMIT and headers among them", shapes)
	}
}

// TestRequestRoomIsBounded decodes requests far past the descriptor and
// entry limits, from the wire and from a message: each keeps no more room
// than the limits need, and validation still says how many were sent.
func TestRequestRoomIsBounded(t *testing.T) {
	const many = 500_000 // about what a 1 MiB message holds
	manyDescs := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: make([]*rlv3.RateLimitDescriptor, many)}
	for i := range manyDescs.Descriptors {
		manyDescs.Descriptors[i] = &rlv3.RateLimitDescriptor{}
	}
	manyEntries := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{
		desc("k", "v"), {Entries: make([]*rlv3.RateLimitDescriptor_Entry, many)}}}
	for i := range manyEntries.Descriptors[1].Entries {
		manyEntries.Descriptors[1].Entries[i] = &rlv3.RateLimitDescriptor_Entry{Key: "k"}
	}
	tests := []struct {
		name string
		req  *rlsv3.RateLimitRequest
		want string
	}{
		{"descriptors", manyDescs, "descriptors: at most 8 descriptors, got 500000"},
		{"entries", manyEntries, "descriptors[1].entries: at most 8 entries, got 500000"},
	}
	for _, tt := range tests {
		b, err := proto.Marshal(tt.req)
		if err != nil {
			t.Fatal(err)
		}
		var wire, msg request
		if err := decodeRequest(b, &wire); err != nil {
			t.Fatalf("%s: decodeRequest: %v", tt.name, err)
		}
		msg.fromMessage(tt.req)
		for _, r := range []struct {
			via string
			req *request
		}{{"wire", &wire}, {"message", &msg}} {
			// append doubles: twice the kept counts is the most it grows to.
			if d, e := cap(r.req.descs), cap(r.req.entries); d > 2*keptDescriptors || e > 2*keptDescriptors*keptEntries {
				t.Errorf("%s from the %s: room for %d descriptors and %d entries, want at most %d and %d",
					tt.name, r.via, d, e, 2*keptDescriptors, 2*keptDescriptors*keptEntries)
			}
			if _, err := validate(r.req, nil); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%s from the %s: validate = %v, want %q", tt.name, r.via, err, tt.want)
			}
		}
	}
}
