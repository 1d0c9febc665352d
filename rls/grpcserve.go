package rls

import (
	"context"
	"errors"
	"net"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/health"
	"google.golang.org/grpc/mem"

	"github.com/sluice-rl/sluice/rls/internal/h2serve"
)

// Transport selects how Serve answers its connections.
type Transport uint8

const (
	// TransportH2 serves a proxy's connections with the service's own
	// HTTP/2 transport (rls/internal/h2serve) and every other connection
	// with grpc-go.
	TransportH2 Transport = iota
	// TransportGRPC serves every connection with grpc-go, tuned for the
	// proxy's calls: see tunedOptions.
	TransportGRPC
)

// Sizes of grpc-go's buffers and windows on TransportGRPC: those of the
// service's own transport, so that the two compare on the same terms.
const (
	grpcStreamWindow = h2serve.StreamWindow
	grpcConnWindow   = h2serve.ConnWindow
	grpcBufferSize   = 64 << 10
)

// tunedOptions are grpc-go's options on TransportGRPC beyond those of
// both transports: calls run on kept workers (in newServer), the write
// buffer is shared between connections, reads and writes go through
// larger buffers, the windows are static and large, and ShouldRateLimit's
// messages go through rlsCodec.
func tunedOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.SharedWriteBuffer(true),
		grpc.ReadBufferSize(grpcBufferSize),
		grpc.WriteBufferSize(grpcBufferSize),
		grpc.StaticStreamWindowSize(grpcStreamWindow),
		grpc.StaticConnWindowSize(grpcConnWindow),
		grpc.ForceServerCodecV2(rlsCodec{fallback: encoding.GetCodecV2(proto.Name)}),
	}
}

// rlsCodec is grpc-go's codec on TransportGRPC: a request of
// ShouldRateLimit is read by decodeRequest into a request, and a
// RateLimitResponse written by its vtproto marshalling into a pooled
// buffer; every other message (health, reflection) goes to fallback, the
// protobuf codec.
type rlsCodec struct{ fallback encoding.CodecV2 }

func (rlsCodec) Name() string { return proto.Name }

func (c rlsCodec) Marshal(v any) (mem.BufferSlice, error) {
	if m, ok := v.(*rlsv3.RateLimitResponse); ok && vtproto {
		return marshalResponse(m)
	}
	return c.fallback.Marshal(v)
}

func (c rlsCodec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*request)
	if !ok {
		return c.fallback.Unmarshal(data, v)
	}
	// decodeRequest copies what it keeps: the buffer goes back at once.
	b := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer b.Free()
	return decodeRequest(b.ReadOnlyData(), r)
}

// grpcCall is the room one ShouldRateLimit call on TransportGRPC decodes
// and works in, pooled between calls.
type grpcCall struct {
	req request
	sc  scratch
}

// rlsServiceDesc is RateLimitService as grpc-go serves it on
// TransportGRPC: ShouldRateLimit decodes into a request for rlsCodec.
func rlsServiceDesc() *grpc.ServiceDesc {
	d := rlsv3.RateLimitService_ServiceDesc
	d.Methods = []grpc.MethodDesc{{MethodName: "ShouldRateLimit", Handler: shouldRateLimitHandler}}
	return &d
}

func shouldRateLimitHandler(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
	s := srv.(*Server)
	c, _ := s.grpcCalls.Get().(*grpcCall)
	if c == nil {
		c = new(grpcCall)
	}
	defer s.grpcCalls.Put(c)
	if err := dec(&c.req); err != nil {
		return nil, err
	}
	r := &reply{}
	err := s.decide(ctx, &c.req, r, &c.sc)
	s.count(r, err)
	if err != nil {
		return nil, err
	}
	return &r.resp, nil
}

// serveGRPC is Serve on TransportGRPC: gs answers every connection of ln
// until ctx is cancelled, then drains as Serve does.
func (s *Server) serveGRPC(ctx context.Context, gs *grpc.Server, hs *health.Server, ln net.Listener) error {
	errc := make(chan error, 1)
	s.log.Info("rate limit service listening", "addr", ln.Addr().String())
	go func() { errc <- gs.Serve(ln) }()
	var err error
	select {
	case err = <-errc:
	case <-ctx.Done():
	}
	s.stopping.Store(true)
	hs.Shutdown()
	drain(s.cfg.ShutdownTimeout, gs.GracefulStop, gs.Stop)
	return serveError(err)
}

// drain runs graceful, and if it has not returned within timeout runs
// hard, which must make it return; drain returns when graceful has.
func drain(timeout time.Duration, graceful, hard func()) {
	stopped := make(chan struct{})
	go func() {
		graceful()
		close(stopped)
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-stopped:
	case <-t.C:
		hard()
		<-stopped
	}
}

// serveError is what Serve returns for err, the error its listener's serve
// loop ended with: nil when the loop ended because Serve closed it.
func serveError(err error) error {
	if err != nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}
