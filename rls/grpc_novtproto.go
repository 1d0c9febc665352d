//go:build !vtprotobuf

package rls

import (
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/mem"
)

// vtproto is whether go-control-plane's vtproto marshalling is built in
// (the build tag vtprotobuf); without it responses go through the
// protobuf codec.
const vtproto = false

func marshalResponse(*rlsv3.RateLimitResponse) (mem.BufferSlice, error) { panic("unreachable") }
