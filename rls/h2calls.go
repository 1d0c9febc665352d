package rls

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/sluice-rl/sluice/rls/internal/h2serve"
)

// The methods the own transport serves, in h2Paths' order: a connection
// whose first call is ShouldRateLimit is the transport's.
const (
	methodRLS = iota
	methodHealth
)

const (
	pathShouldRateLimit = "/" + ServiceName + "/ShouldRateLimit"
	pathHealthCheck     = "/grpc.health.v1.Health/Check"
)

// h2Paths are the own transport's h2serve.Config.Paths.
var h2Paths = []string{methodRLS: pathShouldRateLimit, methodHealth: pathHealthCheck}

// h2Calls answers the own transport's calls: ShouldRateLimit and
// Health/Check.
type h2Calls struct{ s *Server }

// h2Room is what one ShouldRateLimit call on the own transport decodes
// and works in, kept with the transport's pooled call.
type h2Room struct {
	req     request
	rep     reply
	scratch scratch
}

// Answer answers one call: see h2serve.Handler.
func (h h2Calls) Answer(ctx context.Context, c *h2serve.Call) error {
	switch c.Method {
	case methodRLS:
		return h.s.decodeAndDecide(ctx, c)
	case methodHealth:
		return h.s.health(c)
	}
	return status.Error(codes.Unimplemented, "unknown method")
}

// decodeAndDecide answers ShouldRateLimit on the own transport.
func (s *Server) decodeAndDecide(ctx context.Context, c *h2serve.Call) error {
	room, _ := c.Room.(*h2Room)
	if room == nil {
		room = new(h2Room)
		c.Room = room
	}
	// The room keeps no policy alive in the transport's pool.
	defer func() {
		room.req.reset()
		clear(room.scratch.applied[:cap(room.scratch.applied)])
	}()
	if err := decodeRequest(c.Message, &room.req); err != nil {
		return status.Error(codes.Internal, "grpc: error unmarshalling request: "+err.Error())
	}
	err := s.decide(ctx, &room.req, &room.rep, &room.scratch)
	s.count(&room.rep, err)
	if err != nil {
		return err
	}
	c.Out = appendResponse(c.Out, &room.rep.resp)
	return nil
}

// health answers grpc.health.v1.Health/Check for the service and for ""
// (the server): SERVING until shutdown begins, then NOT_SERVING.
func (s *Server) health(c *h2serve.Call) error {
	service, err := decodeHealthRequest(c.Message)
	if err != nil {
		return status.Error(codes.Internal, "grpc: error unmarshalling request: "+err.Error())
	}
	if service != "" && service != ServiceName {
		return status.Error(codes.NotFound, "unknown service")
	}
	const serving, notServing = 1, 2
	v := uint64(serving)
	if s.stopping.Load() {
		v = notServing
	}
	c.Out = append(c.Out, 1<<3|0, byte(v)) // status (1): varint
	return nil
}

// decodeHealthRequest reads HealthCheckRequest.service (field 1).
func decodeHealthRequest(b []byte) (string, error) {
	var service string
	for off := 0; off < len(b); {
		num, typ, n := consumeTag(b[off:])
		if n < 0 {
			return "", errMalformed
		}
		off += n
		if num == 1 && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b[off:])
			if n < 0 {
				return "", errMalformed
			}
			service = string(v)
			off += n
			continue
		}
		if n = protowire.ConsumeFieldValue(num, typ, b[off:]); n < 0 {
			return "", errMalformed
		}
		off += n
	}
	return service, nil
}
