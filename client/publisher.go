package client

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/outbox"
)

// DefaultAckTimeout is how long Publisher waits for the replies to one
// batch before it gives the connection up for dead, when
// Options.AckTimeout is zero.
const DefaultAckTimeout = 30 * time.Second

// Publisher is an outbox.Publisher that sends to a postbox ingress over one
// WebSocket connection or gRPC stream (see Dial), dialled when first needed and again after it
// breaks. Concurrent Publish calls share the connection, so many batches
// are in flight at once.
//
// It is the one publisher that builds postbox envelopes: each message is
// sent as its outbox.Message.Envelope, whichever outbox it came from.
type Publisher struct {
	url        string
	opts       Options
	ackTimeout time.Duration

	mu   sync.Mutex
	conn *Conn
}

var _ outbox.Publisher = (*Publisher)(nil)

// NewPublisher returns a Publisher to the ingress at url, which waits
// opts.AckTimeout (zero: DefaultAckTimeout) for the replies to a batch.
func NewPublisher(url string, opts Options) (*Publisher, error) {
	if _, err := URL(url); err != nil {
		return nil, err
	}
	ackTimeout := opts.AckTimeout
	if ackTimeout <= 0 {
		ackTimeout = DefaultAckTimeout
	}
	return &Publisher{url: url, opts: opts, ackTimeout: ackTimeout}, nil
}

// Publish implements outbox.Publisher: it sends each message as its
// envelope (outbox.Message.Envelope). A message whose envelope cannot be
// encoded (its Body is not JSON) is not sent; its reply is a
// non-retryable invalid_json NACK.
func (p *Publisher) Publish(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
	batch := make([]Message, 0, len(msgs))
	var refused map[int]postbox.Reply // position in msgs → its NACK
	size := 0
	for _, m := range msgs {
		size += len(m.Body) + 256 // and the other fields, in most cases
	}
	buf := make([]byte, 0, size) // the envelopes, one after another
	// refuse answers message i here, without sending it.
	refuse := func(i int, fe *postbox.FieldError) {
		if refused == nil {
			refused = map[int]postbox.Reply{}
		}
		refused[i] = postbox.Nack(msgs[i].EventID, fe)
	}
	for i, m := range msgs {
		env := m.Envelope()
		start := len(buf)
		var err error
		if buf, err = env.AppendJSON(buf); err != nil {
			buf = buf[:start]
			refuse(i, &postbox.FieldError{Field: "payload", Code: postbox.CodeInvalidJSON, Message: "payload: the envelope cannot be encoded: " + err.Error()})
			continue
		}
		// The server refuses a payload nested too deep too; in a frame, one
		// near JSON's own nesting limit would make the whole frame
		// unreadable, every event in it unanswered.
		if fe := postbox.CheckPayloadDepth(m.Body); fe != nil {
			buf = buf[:start]
			refuse(i, fe)
			continue
		}
		batch = append(batch, Message{EventID: m.EventID, Envelope: buf[start:len(buf):len(buf)]})
	}
	replies, err := p.send(ctx, batch)
	if err != nil {
		return nil, err
	}
	if refused == nil {
		return replies, nil
	}
	out := make([]postbox.Reply, len(msgs))
	for i := range msgs {
		if r, ok := refused[i]; ok {
			out[i] = r
			continue
		}
		out[i], replies = replies[0], replies[1:]
	}
	return out, nil
}

// send sends batch on the connection and waits up to the ACK timeout for
// its replies.
func (p *Publisher) send(ctx context.Context, batch []Message) ([]postbox.Reply, error) {
	conn, err := p.connect(ctx)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, p.ackTimeout)
	defer cancel()
	replies, err := conn.Send(sctx, batch)
	if err != nil {
		if ctx.Err() == nil && sctx.Err() != nil {
			err = fmt.Errorf("no replies within %s; closing the connection: %w", p.ackTimeout, err)
			conn.Close()
		}
		p.drop(conn)
		return nil, err
	}
	return replies, nil
}

func (p *Publisher) connect(ctx context.Context) (*Conn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn != nil && p.conn.Err() == nil {
		return p.conn, nil
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := Dial(dctx, p.url, p.opts)
	if err != nil {
		return nil, err
	}
	if p.opts.Logger != nil {
		p.opts.Logger.Info("client: connected", "url", p.url)
	}
	p.conn = conn
	return conn, nil
}

// drop forgets conn if it is broken, so the next Publish dials again.
func (p *Publisher) drop(conn *Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == conn && conn.Err() != nil {
		p.conn = nil
	}
}

// Close closes the connection.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil {
		return nil
	}
	err := p.conn.Close()
	p.conn = nil
	return err
}
