package ingress

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/ingresspb"
)

// GRPCWindowBytes is the HTTP/2 flow-control window of a gRPC connection
// and of each of its streams: what a peer may send ahead of the ingress
// reading it.
const GRPCWindowBytes = 1 << 20

// grpcMinPingInterval is the shortest interval between a client's
// keepalive pings the server tolerates (gRPC clients ping at most every
// 10s).
const grpcMinPingInterval = 5 * time.Second

// GRPC returns the ingress as the gRPC service ingresspb.Ingress: the
// WebSocket's protocol on a bidirectional stream, each ingresspb.Frame
// holding what one WebSocket message holds and each ingresspb.Replies what
// the server's messages hold. Register it on a grpc.Server made with
// ServerOptions.
//
// A stream is a connection: it is counted against MaxConnections (one
// more is refused with ResourceExhausted), with device tokens it carries
// "authorization: Bearer TOKEN" in its metadata (Unauthenticated without
// a known one) and replaces its device's older connection on either
// transport (which ends with Aborted). Envelopes are validated, queued
// and answered as on the WebSocket, with MaxInFlight, the per-connection
// bound on envelopes waiting for the writer's queue, and MaxBufferedBytes:
// a gRPC message is counted once it has arrived whole (gRPC reads it
// before handing it over), and a connection not read pushes back on its
// sender through the HTTP/2 window (GRPCWindowBytes). gRPC keepalive pings
// (PingInterval, PingTimeout) find dead peers; FrameTimeout does not apply.
//
// When the client closes its side, the stream ends (OK) once every
// envelope it sent is answered. At Drain a frame read gets outage NACKs,
// and once every envelope read is answered the stream ends with
// Unavailable. Unauthenticated, ResourceExhausted and Unavailable carry
// their api.Code (unauthorized, too_many_connections, unavailable) as the
// Reason of an errdetails.ErrorInfo in the status details.
func (in *Ingress) GRPC() ingresspb.IngressServer { return grpcIngress{in: in} }

// ServerOptions returns the grpc.Server options the gRPC ingress needs:
// the frame limit as the message limit, the flow-control windows and
// keepalive. Add credentials for TLS.
func (in *Ingress) ServerOptions() []grpc.ServerOption {
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(int(in.cfg.MaxFrameBytes)),
		grpc.InitialWindowSize(GRPCWindowBytes),
		grpc.InitialConnWindowSize(GRPCWindowBytes),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: grpcMinPingInterval, PermitWithoutStream: true}),
	}
	if in.cfg.PingInterval > 0 {
		opts = append(opts, grpc.KeepaliveParams(keepalive.ServerParameters{Time: in.cfg.PingInterval, Timeout: in.cfg.PingTimeout}))
	}
	return opts
}

type grpcIngress struct {
	ingresspb.UnimplementedIngressServer
	in *Ingress
}

// GRPCErrorDomain is the Domain of the errdetails.ErrorInfo a refusal's
// status carries; its Reason is the api.Code the WebSocket's refusal
// carries in its JSON error.
const GRPCErrorDomain = "postbox"

// The gRPC transport's statuses, by why a stream ends (the WebSocket's
// HTTP statuses and close codes in ws.go). A refusal carries its api.Code
// in the status details (errdetails.ErrorInfo's Reason), so that a client
// reads it without parsing the message; a replaced stream has no code, as
// on the WebSocket.
var (
	errGRPCUnauthenticated    = grpcRefusal(codes.Unauthenticated, api.CodeUnauthorized, "authorization: a known bearer token is required")
	errGRPCTooMany            = grpcRefusal(codes.ResourceExhausted, api.CodeTooManyConnections, "too_many_connections: the server holds as many ingress connections as it allows; connect again later")
	errGRPCTooManyFromAddress = grpcRefusal(codes.ResourceExhausted, api.CodeTooManyConnections,
		"too_many_connections: this address holds as many ingress connections without a device token as one address may; close one or connect again later")
	errGRPCShuttingDown = grpcRefusal(codes.Unavailable, api.CodeUnavailable, "server shutting down")
	errGRPCReplaced     = status.Error(codes.Aborted, "replaced by a newer connection of this device")
)

// grpcRefusal is a status of c with message, whose details carry code.
func grpcRefusal(c codes.Code, code api.Code, message string) error {
	st, err := status.New(c, message).WithDetails(&errdetails.ErrorInfo{Reason: string(code), Domain: GRPCErrorDomain})
	if err != nil {
		panic(err) // an ErrorInfo always marshals
	}
	return st.Err()
}

// Send runs the envelope/ACK protocol on one stream.
func (g grpcIngress) Send(stream ingresspb.Ingress_SendServer) error {
	in := g.in
	sctx := stream.Context()
	device := ""
	if in.cfg.Tokens != nil {
		d, ok := bearerDevice(sctx, in.cfg.Tokens)
		if !ok {
			in.log.Warn("ingress: refused gRPC stream with unknown token")
			return errGRPCUnauthenticated
		}
		device = d
	}
	source := ""
	if md, ok := metadata.FromIncomingContext(sctx); ok {
		if v := md.Get(SourceMetadata); len(v) > 0 {
			source = v[0]
		}
	}
	streamID, gone, err := in.target(sctx, source)
	if err != nil {
		in.log.Warn("ingress: refused gRPC stream to a source it cannot send to", "err", err)
		if errors.Is(err, ErrNoSource) {
			return grpcRefusal(codes.NotFound, api.CodeNotFound, err.Error())
		}
		return grpcRefusal(codes.Unavailable, api.CodeUnavailable, err.Error())
	}
	addr := ""
	if p, ok := peer.FromContext(sctx); ok && p.Addr != nil {
		addr = clientAddr(p.Addr.String())
	}
	switch in.admit(device, addr) {
	case refusedFull:
		in.m.refused.Inc()
		in.log.Warn("ingress: refused gRPC stream over the connection limit", "limit", in.cfg.MaxConnections)
		return errGRPCTooMany
	case refusedAddress:
		in.m.refused.Inc()
		in.log.Warn("ingress: refused gRPC stream over the limit of one address", "remote", addr, "limit", in.cfg.MaxConnectionsPerAddress)
		return errGRPCTooManyFromAddress
	}
	defer in.leave(device, addr)
	in.m.connections.Inc()
	defer in.m.connections.Dec()
	if !in.enterSession() {
		return errGRPCShuttingDown
	}
	// Headers now tell the client it was let in (a refusal is a status
	// without headers).
	if err := stream.SendHeader(metadata.Pairs("postbox-protocol", Subprotocol)); err != nil {
		in.sessions.Done()
		return err
	}
	ctx, cancel := context.WithCancel(sctx)
	defer cancel()
	s := &session{in: in, cancel: cancel, send: grpcSend(stream), wake: make(chan struct{}, 1), queued: make(chan struct{}, 1), room: make(chan struct{}),
		stream: streamID, gone: gone, device: device}
	if device != "" {
		in.claim(device, s)
		defer in.unclaim(device, s)
	}
	// The reader blocks in Recv, which only returns once the stream ends
	// (this handler returned, or the client closed or broke it): it is
	// the session's last part to end, so it ends the session for Drain.
	readErr := make(chan error, 1)
	go func() {
		defer in.sessions.Done()
		defer s.giveBack()
		err := s.grpcReadLoop(ctx, stream, device)
		cancel()
		readErr <- err
	}()
	var wg sync.WaitGroup
	drained := make(chan struct{})
	wg.Go(func() {
		select {
		case <-in.drain:
			if s.waitAnswered(ctx) {
				close(drained)
				cancel()
			}
		case <-ctx.Done():
		}
	})
	wg.Go(func() {
		if err := s.writeLoop(ctx); err != nil {
			cancel()
		}
	})
	wg.Go(func() {
		if err := s.enqueueLoop(ctx); err != nil {
			cancel()
		}
	})
	<-ctx.Done()
	wg.Wait()
	switch {
	case isClosed(drained):
		in.log.Debug("ingress: gRPC stream drained at shutdown")
		return errGRPCShuttingDown
	case s.replaced.Load():
		in.log.Debug("ingress: gRPC stream replaced by a newer one of its device", "device", device)
		return errGRPCReplaced
	}
	select {
	case err := <-readErr:
		if errors.Is(err, io.EOF) {
			return nil // the client closed its side and got every answer
		}
		in.log.Debug("ingress: gRPC stream closed", "err", err)
		return status.FromContextError(err).Err()
	default:
		return status.FromContextError(sctx.Err()).Err()
	}
}

// bearerDevice returns the device of the stream's bearer token.
func bearerDevice(ctx context.Context, tokens Tokens) (string, bool) {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		if token, ok := BearerToken(v); ok {
			return tokens.Device(token)
		}
	}
	return "", false
}

// grpcReadLoop reads frames until the stream ends. It returns io.EOF when
// the client closed its side and every envelope it sent was answered.
func (s *session) grpcReadLoop(ctx context.Context, stream ingresspb.Ingress_SendServer, device string) error {
	for {
		if err := s.waitRoom(ctx); err != nil {
			return err
		}
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			if !s.waitAnswered(ctx) {
				return ctx.Err()
			}
			return io.EOF
		}
		if err != nil {
			return err
		}
		if !s.begin() {
			return errDraining
		}
		draining := isClosed(s.in.drain) // frames read before a Drain are stored
		s.in.m.frames.Inc()
		frame := msg.GetEnvelopes()
		held := int64(len(frame))
		waited, err := s.in.budget.take(ctx, held, s, s.stalls.Begin)
		if waited {
			s.stalls.End()
		}
		if err != nil {
			s.in.budget.done(s)
			return err
		}
		s.frameRead(frame, held, device, draining)
	}
}

// grpcSend writes replies as one ingresspb.Replies message.
func grpcSend(stream ingresspb.Ingress_SendServer) func(context.Context, []postbox.Reply) error {
	return func(_ context.Context, replies []postbox.Reply) error {
		return stream.Send(ingresspb.NewReplies(replies))
	}
}
