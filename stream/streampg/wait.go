package streampg

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Wait implements stream.Waiter: it returns once streamID's high watermark
// is above after, or with ctx's error. It listens before it checks, so an
// append committed at any moment is seen by the check or wakes it.
func (b *Backend) Wait(ctx context.Context, streamID string, after int64) error {
	for {
		woken, err := b.listener.watch(ctx, streamID)
		if err != nil {
			return err
		}
		_, last, err := b.highWatermark(ctx, b.pool, streamID)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		if last > after {
			return nil
		}
		select {
		case <-woken:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// listener holds one connection that LISTENs on Channel for every waiter
// of a Backend. It starts at the first watch and reconnects after a
// failure; while it is down, waiters are woken to check again.
type listener struct {
	pool   *pgxpool.Pool
	prefix string // "schema/": the notifications of this backend's schema
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	started bool
	ready   chan struct{}            // closed while the LISTEN is in place
	streams map[string]chan struct{} // closed when the stream grows
}

func newListener(pool *pgxpool.Pool, schema string) *listener {
	ctx, cancel := context.WithCancel(context.Background())
	return &listener{pool: pool, prefix: schema + "/", ctx: ctx, cancel: cancel, done: make(chan struct{}),
		ready: make(chan struct{}), streams: map[string]chan struct{}{}}
}

// retryDelay is how long the listener waits before reconnecting.
const retryDelay = 500 * time.Millisecond

// watch returns a channel closed when streamID may have grown, once the
// LISTEN is in place.
func (l *listener) watch(ctx context.Context, streamID string) (<-chan struct{}, error) {
	l.mu.Lock()
	if !l.started {
		l.started = true
		go l.run()
	}
	ready := l.ready
	l.mu.Unlock()
	select {
	case <-ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-l.ctx.Done():
		return nil, errClosed
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ready != ready { // the connection failed since: wait for the next one
		ch := make(chan struct{})
		close(ch)
		return ch, nil
	}
	ch, ok := l.streams[streamID]
	if !ok {
		ch = make(chan struct{})
		l.streams[streamID] = ch
	}
	return ch, nil
}

// wake closes the channel of streamID.
func (l *listener) wake(streamID string) {
	l.mu.Lock()
	if ch, ok := l.streams[streamID]; ok {
		close(ch)
		delete(l.streams, streamID)
	}
	l.mu.Unlock()
}

// down marks the LISTEN gone and wakes every waiter.
func (l *listener) down() {
	l.mu.Lock()
	select {
	case <-l.ready:
		l.ready = make(chan struct{})
	default:
	}
	for id, ch := range l.streams {
		close(ch)
		delete(l.streams, id)
	}
	l.mu.Unlock()
}

func (l *listener) run() {
	defer close(l.done)
	for l.ctx.Err() == nil {
		l.listen()
		l.down()
		select {
		case <-l.ctx.Done():
		case <-time.After(retryDelay):
		}
	}
}

// listen holds one connection until it fails or the listener closes.
func (l *listener) listen() {
	pc, err := l.pool.Acquire(l.ctx)
	if err != nil {
		return
	}
	conn := pc.Hijack() // LISTEN state must not go back to the pool
	defer conn.Close(context.Background())
	if _, err := conn.Exec(l.ctx, `LISTEN `+Channel); err != nil {
		return
	}
	l.mu.Lock()
	close(l.ready)
	l.mu.Unlock()
	for {
		n, err := conn.WaitForNotification(l.ctx)
		if err != nil {
			return
		}
		if id, ok := strings.CutPrefix(n.Payload, l.prefix); ok {
			l.wake(id)
		}
	}
}

func (l *listener) close() {
	l.cancel()
	l.mu.Lock()
	started := l.started
	l.started = true // no start after close
	l.mu.Unlock()
	if started {
		<-l.done
	}
}

// errClosed is what Wait returns once the Backend is closed.
var errClosed = errors.New("streampg: backend closed")
