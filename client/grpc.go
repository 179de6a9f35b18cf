package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/ingresspb"
)

// grpcMinPingInterval is the shortest keepalive interval gRPC lets a
// client ask for.
const grpcMinPingInterval = 10 * time.Second

// dialGRPC opens a gRPC stream to the ingress at u (grpc://host:port or
// grpcs://host:port) and waits until the server let it in.
func dialGRPC(ctx context.Context, u string, opts Options) (*Conn, error) {
	pu, err := url.Parse(u)
	if err != nil {
		return nil, fmt.Errorf("server url %q: %w", u, err)
	}
	creds := insecure.NewCredentials()
	if pu.Scheme == "grpcs" {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if opts.TLSConfig != nil {
			cfg = opts.TLSConfig.Clone()
		}
		creds = credentials.NewTLS(cfg)
	}
	dopts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(int(opts.MaxReplyBytes))),
	}
	if opts.PingInterval > 0 {
		dopts = append(dopts, grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time: max(opts.PingInterval, grpcMinPingInterval), Timeout: opts.PingTimeout, PermitWithoutStream: true}))
	}
	cc, err := grpc.NewClient("passthrough:///"+pu.Host, dopts...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", u, err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	if opts.Token != "" {
		rctx = metadata.AppendToOutgoingContext(rctx, "authorization", "Bearer "+opts.Token)
	}
	if opts.Source != "" {
		rctx = metadata.AppendToOutgoingContext(rctx, "postbox-source", opts.Source)
	}
	type opened struct {
		stream ingresspb.Ingress_SendClient
		err    error
	}
	ch := make(chan opened, 1)
	go func() {
		stream, err := ingresspb.NewIngressClient(cc).Send(rctx)
		if err == nil {
			// The server sends headers once it let the stream in; a
			// refusal is a status without them.
			if md, _ := stream.Header(); md == nil {
				_, err = stream.Recv()
				if err == nil {
					err = errors.New("server sent replies before headers")
				}
			}
		}
		ch <- opened{stream, err}
	}()
	var o opened
	select {
	case o = <-ch:
	case <-ctx.Done():
		cancel()
		o = <-ch
		o.err = ctx.Err()
	}
	if o.err != nil {
		cancel()
		cc.Close()
		if refused := grpcRefusal(o.err); refused != o.err {
			return nil, fmt.Errorf("dial %s: %w", u, refused)
		}
		if status.Code(o.err) == codes.Unauthenticated {
			return nil, fmt.Errorf("dial %s: %w", u, ErrUnauthorized)
		}
		return nil, fmt.Errorf("dial %s: %w", u, o.err)
	}
	conn := newConn(&grpcTransport{cc: cc, stream: o.stream, cancel: cancel}, cancel, opts.Logger, u)
	go conn.readLoop(rctx)
	return conn, nil
}

// grpcTransport is a Conn's gRPC stream.
type grpcTransport struct {
	cc     *grpc.ClientConn
	stream ingresspb.Ingress_SendClient
	cancel context.CancelFunc // ends the stream
}

// write sends frame. gRPC's Send does not take a context: it returns
// once the frame is handed to the transport, or the stream ends.
func (t *grpcTransport) write(_ context.Context, frame []byte) error {
	return t.stream.Send(&ingresspb.Frame{Envelopes: frame})
}

func (t *grpcTransport) read(context.Context) ([]postbox.Reply, error) {
	m, err := t.stream.Recv()
	if err != nil {
		return nil, grpcRefusal(err)
	}
	return m.Postbox(), nil
}

// grpcRefusal returns err, the status a call ended with, as an *APIError
// when the server said why in the status details (an errdetails.ErrorInfo
// whose Reason is an api.Code: unauthorized, too_many_connections,
// unavailable at shutdown), as the WebSocket's refusals are; otherwise err.
func grpcRefusal(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.Reason != "" {
			code := api.Code(info.Reason)
			return &APIError{Status: code.Status(), Code: code, Message: st.Message()}
		}
	}
	return err
}

// close ends the stream and the connection under it; replies not received
// are dropped, as when a WebSocket closes.
func (t *grpcTransport) close() error {
	t.cancel()
	return t.cc.Close()
}
