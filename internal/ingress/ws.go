package ingress

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"

	"github.com/coder/websocket"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/internal/wsping"
	"github.com/postbox-events/postbox/stream"
)

// WSPath is the default path of the WebSocket ingress.
const WSPath = "/v1/ws"

// appendChunk bounds the events of one AppendAsync call.
const appendChunk = 512

// Subprotocol is the WebSocket subprotocol of the envelope/ACK protocol.
const Subprotocol = "postbox.v1"

// ServeHTTP accepts a WebSocket connection and runs the envelope/ACK
// protocol on it until either side closes it.
//
// Reading and answering are decoupled: the reader decodes frames and queues
// their events for the writer without waiting for the commit, so a client
// may pipeline many frames; replies are sent, batched into frames, as commits
// finish. The reader stops reading when the store's queue is full or when
// MaxInFlight envelopes are unanswered, which pushes back on the sender
// through TCP.
func (in *Ingress) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	device := ""
	if in.cfg.Tokens != nil {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		d, known := in.cfg.Tokens.Device(strings.TrimSpace(token))
		if !ok || !known {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("WWW-Authenticate", `Bearer realm="postbox"`)
			w.WriteHeader(http.StatusUnauthorized)
			json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": "unauthorized", "message": "Authorization: a known bearer token is required"}})
			in.log.Warn("ingress: refused connection with unknown token", "remote", r.RemoteAddr)
			return
		}
		device = d
	}
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{Subprotocol}})
	if err != nil {
		in.log.Warn("ingress: websocket accept failed", "remote", r.RemoteAddr, "err", err)
		return
	}
	c.SetReadLimit(in.cfg.MaxFrameBytes)
	in.m.connections.Inc()
	defer in.m.connections.Dec()
	in.log.Debug("ingress: connection open", "remote", r.RemoteAddr, "device", device)

	in.sessions.Add(1)
	defer in.sessions.Done()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	s := &wsSession{in: in, c: c, wake: make(chan struct{}, 1), room: make(chan struct{})}
	// At Drain the reader refuses new frames (retryable NACKs) and, once
	// every envelope read is answered, the connection closes as "going
	// away". (A Read cannot be interrupted without closing the connection,
	// so the reader keeps reading until then.)
	var wg sync.WaitGroup
	drained := make(chan struct{})
	wg.Go(func() {
		select {
		case <-in.drain:
			s.waitAnswered(ctx)
			close(drained)
			c.Close(websocket.StatusGoingAway, "server shutting down")
		case <-ctx.Done():
		}
	})
	wg.Go(func() {
		if err := s.writeLoop(ctx); err != nil {
			cancel()
		}
	})
	if in.cfg.PingInterval > 0 {
		wg.Go(func() {
			if err := wsping.Run(ctx, c, in.cfg.PingInterval, in.cfg.PingTimeout); err != nil {
				in.log.Warn("ingress: closing a connection whose peer is gone", "remote", r.RemoteAddr, "device", device, "err", err)
				cancel()
			}
		})
	}
	err = s.readLoop(ctx, device)
	cancel()
	wg.Wait()
	status := websocket.CloseStatus(err)
	switch {
	case isClosed(drained):
		in.log.Debug("ingress: connection drained at shutdown", "remote", r.RemoteAddr)
	case status == websocket.StatusNormalClosure || status == websocket.StatusGoingAway:
		c.Close(websocket.StatusNormalClosure, "")
	case status == websocket.StatusMessageTooBig:
		in.log.Warn("ingress: frame over the size limit, connection closed", "remote", r.RemoteAddr, "limit", in.cfg.MaxFrameBytes)
	default:
		in.log.Debug("ingress: connection closed", "remote", r.RemoteAddr, "err", err)
		c.CloseNow()
	}
}

// wsSession is one connection's state shared by its reader, its writer
// and the store's commit callbacks.
type wsSession struct {
	in *Ingress
	c  *websocket.Conn

	mu       sync.Mutex
	out      []postbox.Reply // replies waiting to be written
	commits  []commit        // appends answered by the store, to be turned into replies
	inFlight int             // envelopes read and not yet answered on the wire
	wake     chan struct{}   // replies are waiting
	room     chan struct{}   // closed (and replaced) when inFlight goes down
}

func (s *wsSession) readLoop(ctx context.Context, device string) error {
	for {
		if err := s.waitRoom(ctx); err != nil {
			return err
		}
		typ, frame, err := s.c.Read(ctx)
		if err != nil {
			return err
		}
		s.in.m.frames.Inc()
		if typ != websocket.MessageText && typ != websocket.MessageBinary {
			continue
		}
		d := s.in.decodeFrame(frame, device)
		if isClosed(s.in.drain) {
			for _, id := range d.ids {
				d.refused = append(d.refused, postbox.Nack(id, errShuttingDown))
			}
			d.ids, d.events = nil, nil
		}
		s.in.countRefused(d.refused)
		s.reply(d.refused, len(d.refused))
		if len(d.events) == 0 {
			continue
		}
		s.mu.Lock()
		s.inFlight += len(d.events)
		s.mu.Unlock()
		// A large frame is queued in parts, so that no request is larger
		// than the writer's queue bound.
		for len(d.events) > 0 {
			n := min(len(d.events), appendChunk)
			ids := d.ids[:n]
			err = s.in.store.AppendAsync(ctx, s.in.cfg.StreamID, d.events[:n], func(res []stream.AppendResult, err error) {
				s.committed(commit{ids, res, err})
			})
			if err != nil {
				// ctx ended or the store closed: these events will not be
				// answered here, and the sender will send them again.
				s.mu.Lock()
				s.inFlight -= len(d.events)
				s.mu.Unlock()
				return err
			}
			d.ids, d.events = d.ids[n:], d.events[n:]
		}
	}
}

// errShuttingDown refuses envelopes read after Drain began.
var errShuttingDown = errors.New("server shutting down: not stored, send again")

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// waitAnswered blocks until every envelope read has been answered on the
// wire, or ctx ends.
func (s *wsSession) waitAnswered(ctx context.Context) {
	s.waitInFlight(ctx, func(n int) bool { return n <= 0 })
}

// waitRoom blocks while MaxInFlight envelopes are unanswered.
func (s *wsSession) waitRoom(ctx context.Context) error {
	s.waitInFlight(ctx, func(n int) bool { return n < s.in.cfg.MaxInFlight })
	return ctx.Err()
}

// waitInFlight blocks until ok(inFlight) or ctx ends.
func (s *wsSession) waitInFlight(ctx context.Context, ok func(int) bool) {
	for {
		s.mu.Lock()
		done, room := ok(s.inFlight), s.room
		s.mu.Unlock()
		if done {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-room:
		}
	}
}

// reply queues replies for the writer; extra counts replies that were not
// already counted in flight (refusals).
func (s *wsSession) reply(rs []postbox.Reply, extra int) {
	if len(rs) == 0 {
		return
	}
	s.mu.Lock()
	s.out = append(s.out, rs...)
	s.inFlight += extra
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// commit is the store's answer to one AppendAsync.
type commit struct {
	ids     []string
	results []stream.AppendResult
	err     error
}

// committed queues the store's answer for the writer loop. It runs on the
// store's writer goroutine, so it only queues: the replies are built and
// encoded by the connection's own writer loop, off the store's critical
// path.
func (s *wsSession) committed(c commit) {
	s.mu.Lock()
	s.commits = append(s.commits, c)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *wsSession) writeLoop(ctx context.Context) error {
	var buf []postbox.Reply
	var commits []commit
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.wake:
		}
		s.mu.Lock()
		buf, s.out = s.out, buf[:0]
		commits, s.commits = s.commits, commits[:0]
		s.mu.Unlock()
		for _, c := range commits {
			buf = s.in.appendReplies(buf, c.ids, c.results, c.err)
		}
		clear(commits)
		if len(buf) == 0 {
			continue
		}
		var data []byte
		var err error
		if len(buf) == 1 {
			data, err = json.Marshal(buf[0])
		} else {
			data, err = json.Marshal(buf)
		}
		if err != nil {
			return err
		}
		if err := s.c.Write(ctx, websocket.MessageText, data); err != nil {
			return err
		}
		s.mu.Lock()
		s.inFlight -= len(buf)
		close(s.room) // wakes the reader and a drain, whichever waits
		s.room = make(chan struct{})
		s.mu.Unlock()
		clear(buf)
	}
}
