//go:build vtprotobuf

package rls

import (
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/mem"
)

// vtproto is whether go-control-plane's vtproto marshalling is built in
// (the build tag vtprotobuf).
const vtproto = true

// marshalResponse encodes m with its vtproto marshalling, into a pooled
// buffer when it is large enough for grpc-go to pool.
func marshalResponse(m *rlsv3.RateLimitResponse) (mem.BufferSlice, error) {
	size := m.SizeVT()
	if mem.IsBelowBufferPoolingThreshold(size) {
		b := make([]byte, size)
		if _, err := m.MarshalToSizedBufferVTStrict(b); err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	pool := mem.DefaultBufferPool()
	b := pool.Get(size)
	if _, err := m.MarshalToSizedBufferVTStrict(*b); err != nil {
		pool.Put(b)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(b, pool)}, nil
}
