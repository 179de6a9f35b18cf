// Package client is the Go client of postbox serve, for the devices and
// services that send events and for the runtimes and operators that
// handle them.
//
// Sending: a Conn sends envelopes to the ingress over one WebSocket
// connection or gRPC stream, many batches in flight at once, and returns
// each envelope's ACK or NACK. A Conn is safe for concurrent use: each
// Send writes one frame and waits for the replies to its envelopes, which
// the server sends as their commits finish. Publisher wraps a Conn that
// reconnects, for the outbox relay.
//
// Handling: API is a typed client of the HTTP API (docs/API.md), its
// request and response types package api's: subscriptions, sources,
// streams, consumers, inbox items, dead letters, replays, and the
// runtime's lease, ack, nack and extend. API.Inbox returns a Runner that
// runs a Handler over an inbox's items:
//
//	c, err := client.NewAPI("http://127.0.0.1:8000", client.APIOptions{Token: token})
//	...
//	err = c.Inbox("planner", client.RunnerConfig{Concurrency: 16}).Run(ctx, func(ctx context.Context, it api.Item) error {
//		return plan(ctx, it.EventID, it.Payload) // nil: ack; an error: nack, tried again after a backoff
//	})
package client

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/wsping"
)

// DefaultPath is the server's WebSocket ingress path, used when a URL has
// none.
const DefaultPath = "/v1/ws"

// ErrClosed is returned by Send on a connection that is closed or broken;
// nothing can be assumed about replies not received.
var ErrClosed = errors.New("client: connection closed")

// Options configure Dial.
type Options struct {
	// Token is sent as "Authorization: Bearer <Token>" when not empty.
	Token string
	// Source names the device source the events go to, and so the
	// stream they are stored in; "" is the server's default, devices.
	// The server refuses a connection naming a source that is not a
	// device source (an *APIError with api.CodeNotFound). A WebSocket
	// sends it as ?source=NAME, a gRPC stream in its metadata.
	Source string
	// HTTPClient dials a WebSocket connection (TLS settings, proxies).
	// Optional.
	HTTPClient *http.Client
	// TLSConfig is the TLS configuration of a grpcs:// connection.
	// Optional: the system's roots.
	TLSConfig *tls.Config
	// MaxReplyBytes bounds one reply frame. Defaults to 64 MiB.
	MaxReplyBytes int64
	// PingInterval is how often the server is pinged; a server that does
	// not answer within PingTimeout breaks the connection (ErrClosed), so
	// a vanished peer is noticed even while nothing is sent. Default 20s
	// and 10s; a negative interval turns pings off.
	PingInterval time.Duration
	PingTimeout  time.Duration
	// Logger, when set, logs each connection lost (Warn) and, for a
	// Publisher, each connection made (Info).
	Logger *slog.Logger
	// AckTimeout, for a Publisher, is how long it waits for the replies
	// to one batch before it gives the connection up for dead. Defaults
	// to DefaultAckTimeout (zero or negative).
	AckTimeout time.Duration
}

// Message is one encoded envelope and its event id.
type Message struct {
	EventID  string
	Envelope []byte // the JSON envelope
}

// Encode returns env as a Message.
func Encode(env postbox.Envelope) (Message, error) {
	b, err := env.AppendJSON(nil)
	if err != nil {
		return Message{}, fmt.Errorf("encode envelope %s: %w", env.EventID, err)
	}
	return Message{EventID: env.EventID, Envelope: b}, nil
}

// Conn is one connection to a postbox ingress: a WebSocket, or a gRPC
// stream (grpc:// and grpcs:// URLs).
type Conn struct {
	t      transport
	cancel context.CancelFunc
	done   chan struct{} // closed when the reader ends

	wmu sync.Mutex // one frame written at a time

	mu      sync.Mutex
	waiting map[string][]*call // event id → calls waiting for its reply, oldest first
	err     error

	log *slog.Logger // Options.Logger, or nil
	url string
}

// transport is what a Conn sends frames on and reads replies from.
type transport interface {
	// write sends one frame: a JSON array of envelopes. It is called by
	// one goroutine at a time.
	write(ctx context.Context, frame []byte) error
	// read returns the next replies; an error ends the connection.
	read(ctx context.Context) ([]postbox.Reply, error)
	// close ends the connection.
	close() error
}

type call struct {
	replies []postbox.Reply
	index   map[string][]int // event id → positions still unanswered
	left    int
	done    chan struct{}
}

// URL returns rawURL with the default ingress path when it has none, and
// http(s) schemes turned into ws(s). A grpc:// or grpcs:// URL is returned
// as it is, and must have no path.
func URL(rawURL string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", fmt.Errorf("server url %q: %w", rawURL, err)
	}
	switch u.Scheme {
	case "ws", "wss", "grpc", "grpcs":
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	default:
		return "", fmt.Errorf("server url %q: scheme must be ws, wss, http, https, grpc or grpcs", rawURL)
	}
	if u.Host == "" {
		return "", fmt.Errorf("server url %q: no host", rawURL)
	}
	if isGRPC(u.Scheme) {
		if u.Path != "" && u.Path != "/" {
			return "", fmt.Errorf("server url %q: a gRPC url has no path", rawURL)
		}
		u.Path = ""
		return u.String(), nil
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = DefaultPath
	}
	return u.String(), nil
}

func isGRPC(scheme string) bool { return scheme == "grpc" || scheme == "grpcs" }

// Dial connects to the ingress at rawURL: ws://host:port (wss:// for TLS),
// with or without a path, or grpc://host:port (grpcs:// for TLS). A
// connection the server refuses is an *APIError whose Code says why
// (api.CodeUnauthorized, which errors.Is matches to ErrUnauthorized, or
// api.CodeTooManyConnections), read from the WebSocket's JSON error or
// gRPC's status details.
func Dial(ctx context.Context, rawURL string, opts Options) (*Conn, error) {
	u, err := URL(rawURL)
	if err != nil {
		return nil, err
	}
	if opts.MaxReplyBytes <= 0 {
		opts.MaxReplyBytes = 64 << 20
	}
	if opts.PingInterval == 0 {
		opts.PingInterval = wsping.DefaultInterval
	}
	if opts.PingTimeout <= 0 {
		opts.PingTimeout = wsping.DefaultTimeout
	}
	if strings.HasPrefix(u, "grpc") {
		return dialGRPC(ctx, u, opts)
	}
	h := http.Header{}
	if opts.Token != "" {
		h.Set("Authorization", "Bearer "+opts.Token)
	}
	if opts.Source != "" {
		wu, err := url.Parse(u)
		if err != nil {
			return nil, fmt.Errorf("dial %s: %w", u, err)
		}
		q := wu.Query()
		q.Set("source", opts.Source)
		wu.RawQuery = q.Encode()
		u = wu.String()
	}
	c, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: opts.HTTPClient, HTTPHeader: h, Subprotocols: []string{"postbox.v1"}})
	if err != nil {
		if refused := wsRefusal(resp); refused != nil {
			return nil, fmt.Errorf("dial %s: %w", u, refused)
		}
		if resp != nil && resp.StatusCode == http.StatusUnauthorized {
			return nil, fmt.Errorf("dial %s: %w", u, ErrUnauthorized)
		}
		// The network's error, not the layers of the WebSocket's around it.
		if oe, ok := errors.AsType[*net.OpError](err); ok {
			err = oe
		}
		return nil, fmt.Errorf("dial %s: %w", u, err)
	}
	c.SetReadLimit(opts.MaxReplyBytes)
	rctx, cancel := context.WithCancel(context.Background())
	conn := newConn(wsTransport{c}, cancel, opts.Logger, u)
	go conn.readLoop(rctx)
	if opts.PingInterval > 0 {
		go func() {
			if err := wsping.Run(rctx, c, opts.PingInterval, opts.PingTimeout); err != nil {
				conn.fail(fmt.Errorf("%w: %v", ErrClosed, err))
				c.CloseNow()
			}
		}()
	}
	return conn, nil
}

func newConn(t transport, cancel context.CancelFunc, log *slog.Logger, url string) *Conn {
	return &Conn{t: t, cancel: cancel, done: make(chan struct{}), waiting: map[string][]*call{}, log: log, url: url}
}

// wsTransport is a Conn's WebSocket.
type wsTransport struct{ c *websocket.Conn }

func (t wsTransport) write(ctx context.Context, frame []byte) error {
	return t.c.Write(ctx, websocket.MessageText, frame)
}

func (t wsTransport) read(ctx context.Context) ([]postbox.Reply, error) {
	_, data, err := t.c.Read(ctx)
	if err != nil {
		return nil, err
	}
	replies, err := postbox.DecodeReplies(data)
	if err != nil {
		t.c.Close(websocket.StatusProtocolError, "unreadable reply")
		return nil, fmt.Errorf("server sent an unreadable reply: %w", err)
	}
	return replies, nil
}

func (t wsTransport) close() error { return t.c.Close(websocket.StatusNormalClosure, "") }

// ErrUnauthorized is returned by Dial when the server refuses the token.
var ErrUnauthorized = errors.New("client: server refused the token (401)")

// wsRefusal returns the server's refusal of a WebSocket upgrade, its JSON
// error, as an *APIError; nil when resp holds none.
func wsRefusal(resp *http.Response) error {
	if resp == nil || resp.Body == nil {
		return nil
	}
	var e api.ErrorResponse
	if json.NewDecoder(resp.Body).Decode(&e) != nil || e.Error.Code == "" {
		return nil
	}
	return &APIError{Status: resp.StatusCode, Code: e.Error.Code, Message: e.Error.Message}
}

// Send writes msgs as one frame and waits for a reply to each, returned in
// the order of msgs. It returns ErrClosed (wrapped) if the connection breaks
// before every reply arrived, and ctx's error if ctx ends first; the
// connection stays usable after a ctx error but replies to this frame are
// dropped.
func (c *Conn) Send(ctx context.Context, msgs []Message) ([]postbox.Reply, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	cl := &call{replies: make([]postbox.Reply, len(msgs)), index: make(map[string][]int, len(msgs)), left: len(msgs), done: make(chan struct{})}
	size := 2
	for i, m := range msgs {
		cl.index[m.EventID] = append(cl.index[m.EventID], i)
		size += len(m.Envelope) + 1
	}
	frame := make([]byte, 0, size)
	frame = append(frame, '[')
	for i, m := range msgs {
		if i > 0 {
			frame = append(frame, ',')
		}
		frame = append(frame, m.Envelope...)
	}
	frame = append(frame, ']')

	// Waiters are registered and the frame written under one lock, so that
	// frames go out in the order their waiters queue up: two Sends of the
	// same event id get the replies meant for them.
	c.wmu.Lock()
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		c.wmu.Unlock()
		return nil, c.err
	}
	for id, n := range cl.index {
		for range n {
			c.waiting[id] = append(c.waiting[id], cl)
		}
	}
	c.mu.Unlock()
	err := c.t.write(ctx, frame)
	c.wmu.Unlock()
	if err != nil {
		c.fail(fmt.Errorf("%w: write: %v", ErrClosed, err))
		return nil, c.closedErr()
	}
	select {
	case <-cl.done:
		return cl.replies, nil
	case <-c.done:
		select {
		case <-cl.done:
			return cl.replies, nil
		default:
		}
		return nil, c.closedErr()
	case <-ctx.Done():
		c.forget(cl)
		return nil, ctx.Err()
	}
}

func (c *Conn) closedErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// forget removes cl's waiters.
func (c *Conn) forget(cl *call) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id := range cl.index {
		ws := c.waiting[id][:0]
		for _, w := range c.waiting[id] {
			if w != cl {
				ws = append(ws, w)
			}
		}
		if len(ws) == 0 {
			delete(c.waiting, id)
		} else {
			c.waiting[id] = ws
		}
	}
}

func (c *Conn) readLoop(ctx context.Context) {
	defer close(c.done)
	for {
		replies, err := c.t.read(ctx)
		if err != nil {
			var refused *APIError
			if errors.As(err, &refused) { // the server said why (gRPC's status details)
				c.fail(fmt.Errorf("%w: %w", ErrClosed, refused))
				return
			}
			c.fail(fmt.Errorf("%w: %v", ErrClosed, err))
			return
		}
		c.deliver(replies)
	}
}

func (c *Conn) deliver(replies []postbox.Reply) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range replies {
		ws := c.waiting[r.EventID]
		if len(ws) == 0 {
			continue // a reply to a frame whose Send gave up, or to an unparseable envelope
		}
		cl := ws[0]
		if len(ws) == 1 {
			delete(c.waiting, r.EventID)
		} else {
			c.waiting[r.EventID] = ws[1:]
		}
		pos := cl.index[r.EventID]
		cl.replies[pos[0]] = r
		cl.index[r.EventID] = pos[1:]
		cl.left--
		if cl.left == 0 {
			close(cl.done)
		}
	}
}

// errClosedByClient is why a connection Close closed broke.
var errClosedByClient = fmt.Errorf("%w: closed by the client", ErrClosed)

func (c *Conn) fail(err error) {
	c.mu.Lock()
	first := c.err == nil
	if first {
		c.err = err
	}
	c.mu.Unlock()
	c.cancel()
	if first && err != errClosedByClient && c.log != nil {
		c.log.Warn("client: connection lost", "url", c.url, "err", err)
	}
}

// Close closes the connection; pending Sends return ErrClosed.
func (c *Conn) Close() error {
	c.fail(errClosedByClient)
	err := c.t.close()
	<-c.done
	return err
}

// Err returns why the connection broke, or nil while it works.
func (c *Conn) Err() error { return c.closedErr() }
