// Package client is the Go client of the postbox ingress: it sends
// envelopes over one WebSocket connection, many batches in flight at once,
// and returns each envelope's ACK or NACK.
//
// A Conn is safe for concurrent use: each Send writes one frame and waits
// for the replies to its envelopes, which the server sends as their commits
// finish. Publisher wraps a Conn that reconnects, for the outbox relay.
package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/postbox-events/postbox"
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
	// HTTPClient dials the connection (TLS settings, proxies). Optional.
	HTTPClient *http.Client
	// MaxReplyBytes bounds one reply frame. Defaults to 64 MiB.
	MaxReplyBytes int64
	// PingInterval is how often the server is pinged; a server that does
	// not answer within PingTimeout breaks the connection (ErrClosed), so
	// a vanished peer is noticed even while nothing is sent. Default 20s
	// and 10s; a negative interval turns pings off.
	PingInterval time.Duration
	PingTimeout  time.Duration
}

// Message is one encoded envelope and its event id.
type Message struct {
	EventID  string
	Envelope []byte // the JSON envelope
}

// Encode returns env as a Message.
func Encode(env postbox.Envelope) (Message, error) {
	b, err := json.Marshal(env)
	if err != nil {
		return Message{}, fmt.Errorf("encode envelope %s: %w", env.EventID, err)
	}
	return Message{EventID: env.EventID, Envelope: b}, nil
}

// Conn is one WebSocket connection to a postbox ingress.
type Conn struct {
	c      *websocket.Conn
	cancel context.CancelFunc
	done   chan struct{} // closed when the reader ends

	wmu sync.Mutex // one frame written at a time

	mu      sync.Mutex
	waiting map[string][]*call // event id → calls waiting for its reply, oldest first
	err     error
}

type call struct {
	replies []postbox.Reply
	index   map[string][]int // event id → positions still unanswered
	left    int
	done    chan struct{}
}

// URL returns rawURL with the default ingress path when it has none, and
// http(s) schemes turned into ws(s).
func URL(rawURL string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", fmt.Errorf("server url %q: %w", rawURL, err)
	}
	switch u.Scheme {
	case "ws", "wss":
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	default:
		return "", fmt.Errorf("server url %q: scheme must be ws, wss, http or https", rawURL)
	}
	if u.Host == "" {
		return "", fmt.Errorf("server url %q: no host", rawURL)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = DefaultPath
	}
	return u.String(), nil
}

// Dial connects to the ingress at rawURL (ws://host:port, with or without
// a path).
func Dial(ctx context.Context, rawURL string, opts Options) (*Conn, error) {
	u, err := URL(rawURL)
	if err != nil {
		return nil, err
	}
	h := http.Header{}
	if opts.Token != "" {
		h.Set("Authorization", "Bearer "+opts.Token)
	}
	c, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: opts.HTTPClient, HTTPHeader: h, Subprotocols: []string{"postbox.v1"}})
	if err != nil {
		if resp != nil && resp.StatusCode == http.StatusUnauthorized {
			return nil, fmt.Errorf("dial %s: %w", u, ErrUnauthorized)
		}
		return nil, fmt.Errorf("dial %s: %w", u, err)
	}
	if opts.MaxReplyBytes <= 0 {
		opts.MaxReplyBytes = 64 << 20
	}
	c.SetReadLimit(opts.MaxReplyBytes)
	if opts.PingInterval == 0 {
		opts.PingInterval = wsping.DefaultInterval
	}
	if opts.PingTimeout <= 0 {
		opts.PingTimeout = wsping.DefaultTimeout
	}
	rctx, cancel := context.WithCancel(context.Background())
	conn := &Conn{c: c, cancel: cancel, done: make(chan struct{}), waiting: map[string][]*call{}}
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

// ErrUnauthorized is returned by Dial when the server refuses the token.
var ErrUnauthorized = errors.New("client: server refused the token (401)")

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
	err := c.c.Write(ctx, websocket.MessageText, frame)
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
		_, data, err := c.c.Read(ctx)
		if err != nil {
			c.fail(fmt.Errorf("%w: %v", ErrClosed, err))
			return
		}
		replies, err := postbox.DecodeReplies(data)
		if err != nil {
			c.fail(fmt.Errorf("%w: server sent an unreadable reply: %v", ErrClosed, err))
			c.c.Close(websocket.StatusProtocolError, "unreadable reply")
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

func (c *Conn) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.mu.Unlock()
	c.cancel()
}

// Close closes the connection; pending Sends return ErrClosed.
func (c *Conn) Close() error {
	c.fail(fmt.Errorf("%w: closed by the client", ErrClosed))
	err := c.c.Close(websocket.StatusNormalClosure, "")
	<-c.done
	return err
}

// Err returns why the connection broke, or nil while it works.
func (c *Conn) Err() error { return c.closedErr() }
