package streamsqlite

import (
	"context"
	"database/sql"
	"sync"

	"github.com/postbox-events/postbox/stream"
)

// AppendHook runs in the transaction of a group commit that stored new
// events of its stream, after every event of the transaction is written
// and before the functions of Update run, with those events in offset
// order (duplicates and conflicts left out): what it writes commits with
// the events or not at all, and it reads nothing back. It runs on the
// writer goroutine, in a savepoint: when it fails, its writes are undone
// and the events still commit. The function it returns, when not nil, is
// called once the transaction committed, before the stream's waiters are
// woken.
type AppendHook func(tx *sql.Tx, events []stream.StoredEvent) (committed func(), err error)

// hooks are the AppendHooks of streams.
type hooks struct {
	mu     sync.Mutex
	byID   map[string]AppendHook
	events []stream.StoredEvent // the writer's
	after  []func()             // the writer's: what to call after the commit
}

// Hook sets the AppendHook of streamID, replacing the one it had; nil
// removes it. Delivery writes a subscription's inbox items with its
// events this way.
func (b *Backend) Hook(streamID string, fn AppendHook) {
	h := &b.hooks
	h.mu.Lock()
	defer h.mu.Unlock()
	if fn == nil {
		delete(h.byID, streamID)
		return
	}
	if h.byID == nil {
		h.byID = map[string]AppendHook{}
	}
	h.byID[streamID] = fn
}

// runHooks runs the hooks of the streams the batch stored new events of,
// inside tx, and keeps what they ask to be called after the commit.
func (b *Backend) runHooks(ctx context.Context, tx *sql.Tx, batch []*item) {
	hs := &b.hooks
	hs.after = hs.after[:0]
	hs.mu.Lock()
	if len(hs.byID) == 0 {
		hs.mu.Unlock()
		return
	}
	var streams []*streamState
	fns := map[*streamState]AppendHook{}
	for _, it := range batch {
		if it.ev == nil {
			continue
		}
		if fn := hs.byID[it.st.ID]; fn != nil {
			if _, seen := fns[it.st]; !seen {
				fns[it.st] = fn
				streams = append(streams, it.st)
			}
		}
	}
	hs.mu.Unlock()
	for _, st := range streams {
		events := hs.events[:0]
		for _, it := range batch {
			if it.st != st || it.ev == nil || it.res.Err != nil || it.res.Duplicate {
				continue
			}
			events = append(events, stream.StoredEvent{Event: *it.ev, Offset: it.res.Offset, StreamID: st.ID, SourceID: st.SourceID,
				StoredAt: it.res.StoredAt})
		}
		hs.events = events
		if len(events) == 0 {
			continue
		}
		var after func()
		if err := b.runFn(ctx, tx, func(tx *sql.Tx) (err error) {
			after, err = fns[st](tx, events)
			return err
		}); err == nil && after != nil {
			hs.after = append(hs.after, after)
		}
		clear(events)
	}
}

// committed calls what the hooks of the batch just committed asked for.
func (b *Backend) committed() {
	hs := &b.hooks
	for _, f := range hs.after {
		f()
	}
	clear(hs.after)
	hs.after = hs.after[:0]
}

// PrepareWrite prepares query on the writer's connection. A function that
// runs in the writer's transactions (an AppendHook, Update's) runs it with
// tx.StmtContext without preparing it again: the driver parses every
// statement it is given as text anew, which costs more than a small
// statement's work. Do not call it from such a function: it waits for the
// writer's connection.
func (b *Backend) PrepareWrite(ctx context.Context, query string) (*sql.Stmt, error) {
	return b.write.PrepareContext(ctx, query)
}
