package ingress

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"go.opentelemetry.io/otel/trace"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/wsping"
	"github.com/postbox-events/postbox/stream"
)

// WSPath is the default path of the WebSocket ingress.
const WSPath = "/v1/ws"

// appendChunk bounds the events of one AppendAsync call.
const appendChunk = 512

// Subprotocol is the WebSocket subprotocol of the envelope/ACK protocol.
const Subprotocol = "postbox.v1"

// retryAfterFull is the Retry-After, in seconds, of a connection refused at
// the connection limit.
const retryAfterFull = "5"

// ServeHTTP accepts a WebSocket connection and runs the envelope/ACK
// protocol on it until either side closes it.
//
// Reading, queueing and answering are decoupled: the reader decodes frames
// and hands their events to the connection's enqueuer, which waits for
// room in the store's queue, and replies are sent, batched into frames, as
// commits finish. So a client may pipeline many frames, and a full store
// queue does not stop the reader: it keeps reading (and seeing pings and
// pongs) until MaxInFlight envelopes are unanswered or the memory bound
// (MaxBufferedBytes, and MaxFrameBytes of envelopes waiting per
// connection) is reached, which pushes back on the sender through TCP.
//
// With device tokens, a device has one connection: a new one replaces the
// old at once, and the old one's envelopes the writer has not taken yet
// are dropped unanswered (the device sends them again).
func (in *Ingress) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	device := ""
	if in.cfg.Tokens != nil {
		token, ok := BearerToken(r.Header.Get("Authorization"))
		d, known := in.cfg.Tokens.Device(token)
		if !ok || !known {
			w.Header().Set("WWW-Authenticate", `Bearer realm="postbox"`)
			writeError(w, api.CodeUnauthorized, "Authorization: a known bearer token is required")
			in.log.Warn("ingress: refused connection with unknown token", "remote", r.RemoteAddr)
			return
		}
		device = d
	}
	streamID, gone, err := in.target(r.Context(), r.URL.Query().Get("source"))
	if err != nil {
		code := api.CodeUnavailable
		if errors.Is(err, ErrNoSource) {
			code = api.CodeNotFound
		}
		writeError(w, code, err.Error())
		in.log.Warn("ingress: refused connection to a source it cannot send to", "remote", r.RemoteAddr, "err", err)
		return
	}
	if !isUpgrade(r.Header) {
		w.Header().Set("Upgrade", "websocket")
		w.Header().Set("Connection", "Upgrade")
		writeError(w, api.CodeUpgradeRequired, "GET "+r.URL.Path+" is a WebSocket: send Connection: Upgrade and Upgrade: websocket (a WebSocket client does), or POST events to /webhooks")
		return
	}
	addr := clientAddr(r.RemoteAddr)
	switch in.admit(device, addr) {
	case refusedFull:
		in.m.refused.Inc()
		w.Header().Set("Retry-After", retryAfterFull)
		writeError(w, api.CodeTooManyConnections,
			"the server holds as many WebSocket connections as it allows; connect again later")
		in.log.Warn("ingress: refused connection over the connection limit", "remote", r.RemoteAddr, "limit", in.cfg.MaxConnections)
		return
	case refusedAddress:
		in.m.refused.Inc()
		w.Header().Set("Retry-After", retryAfterFull)
		writeError(w, api.CodeTooManyConnections, fmt.Sprintf(
			"%s holds %d ingress connections without a device token, as many as one address may; close one or connect again later",
			addr, in.cfg.MaxConnectionsPerAddress))
		in.log.Warn("ingress: refused connection over the limit of one address", "remote", r.RemoteAddr, "limit", in.cfg.MaxConnectionsPerAddress)
		return
	}
	defer in.leave(device, addr)
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{Subprotocol}})
	if err != nil {
		in.log.Warn("ingress: websocket accept failed", "remote", r.RemoteAddr, "err", err)
		return
	}
	c.SetReadLimit(in.cfg.MaxFrameBytes)
	in.m.connections.Inc()
	defer in.m.connections.Dec()
	peer := []any{"remote", r.RemoteAddr} // and its device, with tokens
	if device != "" {
		peer = slices.Clip(append(peer, "device", device)) // each append below makes its own copy
	}
	in.log.Debug("ingress: connection open", peer...)

	if !in.enterSession() {
		c.Close(websocket.StatusGoingAway, "server shutting down")
		return
	}
	defer in.sessions.Done()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	s := &session{in: in, c: c, send: wsSend(c), cancel: cancel, wake: make(chan struct{}, 1), queued: make(chan struct{}, 1), room: make(chan struct{}),
		stream: streamID, gone: gone, device: device}
	defer s.giveBack()
	if device != "" {
		in.claim(device, s)
		defer in.unclaim(device, s)
	}
	// At Drain the reader refuses new frames (retryable NACKs) and, once
	// every envelope read is answered, the connection closes as "going
	// away". (A Read cannot be interrupted without closing the connection,
	// so the reader keeps reading until then.)
	var wg sync.WaitGroup
	drained := make(chan struct{})
	wg.Go(func() {
		select {
		case <-in.drain:
			if s.waitAnswered(ctx) {
				close(drained)
				c.Close(websocket.StatusGoingAway, "server shutting down")
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
	if in.cfg.PingInterval > 0 {
		wg.Go(func() {
			if err := wsping.RunStalls(ctx, c, in.cfg.PingInterval, in.cfg.PingTimeout, &s.stalls); err != nil {
				in.log.Warn("ingress: closing a connection whose peer is gone", append(peer, "err", err)...)
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
	case s.replaced.Load():
		in.log.Debug("ingress: connection replaced by a newer one of its device", "remote", r.RemoteAddr, "device", device)
		c.CloseNow()
	case status == websocket.StatusNormalClosure || status == websocket.StatusGoingAway:
		c.Close(websocket.StatusNormalClosure, "")
	case errors.Is(err, errFrameTimeout):
		in.log.Warn("ingress: frame not received within the frame timeout, connection closed", append(peer, "timeout", in.cfg.FrameTimeout)...)
		c.CloseNow()
	case errors.Is(err, errFrameTooBig):
		in.log.Warn("ingress: frame over the size limit, connection closed", "remote", r.RemoteAddr, "limit", in.cfg.MaxFrameBytes)
		c.Close(websocket.StatusMessageTooBig, "frame over the size limit")
	case status == websocket.StatusMessageTooBig:
		in.log.Warn("ingress: frame over the size limit, connection closed", "remote", r.RemoteAddr, "limit", in.cfg.MaxFrameBytes)
	default:
		in.log.Debug("ingress: connection closed", "remote", r.RemoteAddr, "err", err)
		c.CloseNow()
	}
}

// wsSend writes replies as one WebSocket message: a reply object, or an
// array of them.
func wsSend(c *websocket.Conn) func(context.Context, []postbox.Reply) error {
	return func(ctx context.Context, replies []postbox.Reply) error {
		var data []byte
		if len(replies) == 1 {
			data = replies[0].AppendJSON(nil)
		} else {
			data = append(data, '[')
			for i, r := range replies {
				if i > 0 {
					data = append(data, ',')
				}
				data = r.AppendJSON(data)
			}
			data = append(data, ']')
		}
		return c.Write(ctx, websocket.MessageText, data)
	}
}

// writeError answers a refused connection with the server's JSON error,
// its status from the table of api.Codes.
func writeError(w http.ResponseWriter, code api.Code, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code.Status())
	json.NewEncoder(w).Encode(api.ErrorResponse{Error: api.Error{Code: code, Message: message}})
}

// BearerToken returns the token of an Authorization value of the Bearer
// scheme, whose name matches without regard to case (RFC 9110 §11.1).
func BearerToken(v string) (string, bool) {
	scheme, token, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.TrimSpace(token), true
}

// isUpgrade reports whether h asks for a WebSocket: Connection holds the
// token upgrade and Upgrade the token websocket. What else the handshake
// needs is checked by websocket.Accept.
func isUpgrade(h http.Header) bool {
	return hasToken(h["Connection"], "upgrade") && hasToken(h["Upgrade"], "websocket")
}

// hasToken reports whether the comma-separated header values hold token,
// compared without case.
func hasToken(values []string, token string) bool {
	for _, v := range values {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// Why admit refused a connection.
const (
	admitted = iota
	refusedFull
	refusedAddress
)

// admit counts a new connection from addr (clientAddr) in, unless
// MaxConnections are open, or it has no device token and its address has
// MaxConnectionsPerAddress such connections open; a device's connection
// that will replace its old one is always admitted.
func (in *Ingress) admit(device, addr string) int {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.cfg.MaxConnections > 0 && in.open >= in.cfg.MaxConnections && (device == "" || in.devices[device] == nil) {
		return refusedFull
	}
	if device == "" {
		if in.cfg.MaxConnectionsPerAddress > 0 && in.byAddr[addr] >= in.cfg.MaxConnectionsPerAddress {
			return refusedAddress
		}
		in.byAddr[addr]++
	}
	in.open++
	return admitted
}

func (in *Ingress) leave(device, addr string) {
	in.mu.Lock()
	in.open--
	if device == "" {
		if in.byAddr[addr]--; in.byAddr[addr] <= 0 {
			delete(in.byAddr, addr)
		}
	}
	in.mu.Unlock()
}

// clientAddr is the address a connection from remote (host:port) counts
// against for MaxConnectionsPerAddress: its IP, or for IPv6 its /64, which
// one client usually holds whole.
func clientAddr(remote string) string {
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return remote // not an IP address (a test's pipe): its own
	}
	ip := ap.Addr().Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}

// claim makes s device's connection, closing the one it replaces.
func (in *Ingress) claim(device string, s *session) {
	in.mu.Lock()
	old := in.devices[device]
	in.devices[device] = s
	in.mu.Unlock()
	if old != nil {
		old.replaced.Store(true)
		old.cancel() // stops its loops, closes it and drops what it queued
		in.m.replaced.Inc()
	}
}

func (in *Ingress) unclaim(device string, s *session) {
	in.mu.Lock()
	if in.devices[device] == s {
		delete(in.devices, device)
	}
	in.mu.Unlock()
}

// session is one connection's state shared by its reader, its enqueuer,
// its writer and the store's commit callbacks.
type session struct {
	in       *Ingress
	stream   string                                       // the stream of the connection's source; "": the default (StreamID)
	gone     func() error                                 // its source's check (Config.SourceGone); nil: none
	device   string                                       // the device of its token; "": none
	c        *websocket.Conn                              // nil on gRPC
	send     func(context.Context, []postbox.Reply) error // writes replies to the peer, one writer at a time
	cancel   context.CancelFunc
	stalls   wsping.Stalls // when the reader waits for this side, not the peer
	replaced atomic.Bool   // closed because its device connected again

	mu       sync.Mutex
	out      []postbox.Reply // replies waiting to be written
	commits  []commit        // appends answered by the store, to be turned into replies
	inFlight int             // envelopes read (or frames being read) and not yet answered on the wire
	closing  bool            // a drain found nothing in flight and closes the connection
	pending  []chunk         // decoded events waiting for room in the store's queue
	held     int64           // budget held by pending
	wake     chan struct{}   // replies are waiting
	queued   chan struct{}   // pending events are waiting
	room     chan struct{}   // closed (and replaced) when inFlight or held goes down
}

// streamID is the stream the session's events go to.
func (s *session) streamID() string {
	if s.stream == "" {
		return s.in.cfg.StreamID
	}
	return s.stream
}

// sourceGone is the check of the session's source.
func (s *session) sourceGone() func() error {
	if s.stream == "" {
		return s.in.cfg.SourceGone
	}
	return s.gone
}

// chunk is events of one frame, queued in one AppendAsync.
type chunk struct {
	ids    []string
	events []stream.Event
	spans  []trace.Span // their intake spans; nil while tracing is off
	bytes  int64        // budget they hold
}

func (s *session) readLoop(ctx context.Context, device string) error {
	limit := s.in.cfg.MaxFrameBytes
	for {
		if err := s.waitRoom(ctx); err != nil {
			return err
		}
		// Reader returns at a data frame, answering pings and reading
		// pongs before it.
		_, r, err := s.c.Reader(ctx)
		if err != nil {
			return err
		}
		// The frame is read from here on: it counts as in flight before
		// anything else, so a drain waits for its answers.
		if !s.begin() {
			return errDraining
		}
		draining := isClosed(s.in.drain) // frames read before a Drain are stored
		s.in.m.frames.Inc()
		frame, frameHeld, err := s.readFrame(ctx, r, limit)
		if err != nil {
			s.in.budget.give(frameHeld)
			s.in.budget.done(s)
			return err
		}
		s.frameRead(frame, frameHeld, device, draining)
	}
}

// frameRead decodes a frame counted by begin that holds frameHeld of the
// budget, and hands its refusals to the writer and its events to the
// enqueuer (as refusals when it was read after a drain began).
func (s *session) frameRead(frame []byte, frameHeld int64, device string, draining bool) {
	if s.in.afterRead != nil {
		s.in.afterRead()
	}
	d := s.in.decodeFrame(frame, device, s.streamID())
	if gone := s.sourceGone(); gone != nil && len(d.ids) > 0 {
		if err := gone(); err != nil {
			refusal := &postbox.FieldError{Code: postbox.CodeUnavailable, Message: err.Error()}
			for _, id := range d.ids {
				d.refused = append(d.refused, postbox.Nack(id, refusal))
			}
			endIntake(d.spans, nil, err)
			d.ids, d.events, d.spans = nil, nil, nil
		}
	}
	if draining {
		for _, id := range d.ids {
			d.refused = append(d.refused, postbox.Nack(id, errShuttingDown))
		}
		endIntake(d.spans, nil, errShuttingDown)
		d.ids, d.events, d.spans = nil, nil, nil
	}
	s.in.countRefused(s.streamID(), d.refused)
	// The frame's budget is traded for what its events hold; a frame
	// decodes to no more than the budget it held.
	var chunks []chunk
	var held int64
	for len(d.events) > 0 {
		n := min(len(d.events), appendChunk)
		c := chunk{ids: d.ids[:n], events: d.events[:n], bytes: min(eventBytes(d.events[:n]), frameHeld-held)}
		if d.spans != nil {
			c.spans, d.spans = d.spans[:n], d.spans[n:]
		}
		held += c.bytes
		chunks = append(chunks, c)
		d.ids, d.events = d.ids[n:], d.events[n:]
	}
	s.in.budget.give(frameHeld - held)
	s.in.budget.done(s)
	s.read(d.refused, chunks, held)
}

// eventBytes estimates the memory events hold.
func eventBytes(events []stream.Event) int64 {
	var n int64
	for i := range events {
		e := &events[i]
		n += int64(len(e.Payload)+len(e.Metadata)+len(e.NativeID)+len(e.Type)+len(e.DeliveryHandle)) + 128
	}
	return n
}

// A frame's buffer doubles from frameStepMin up to frameStepMax, then
// grows by half: a frame holds at most half again the bytes that arrived,
// or frameStepMax.
const (
	frameStepMin = 4 << 10
	frameStepMax = 64 << 10
)

// readFrame reads one data frame to its end, within FrameTimeout. Its
// buffer grows only once a byte arrives that does not fit, taking the
// growth from the budget first (waiting for room as a stall of this side),
// so a frame holds budget for bytes that arrived, not for the frame limit
// while its body trickles in. held is the budget the frame holds, also
// when err is not nil. A frame whose body has not arrived within
// FrameTimeout, waits for room included, closes the connection: a slow
// sender cannot hold its share for long, and connections that each hold
// part of a frame and wait for room cannot wait on each other forever.
func (s *session) readFrame(ctx context.Context, r io.Reader, limit int64) (frame []byte, held int64, err error) {
	timer := time.AfterFunc(s.in.cfg.FrameTimeout, func() {
		s.cancel() // ends a wait for room
		s.c.CloseNow()
	})
	defer func() {
		if !timer.Stop() {
			err = errFrameTimeout
		}
	}()
	var next [1]byte
	for {
		if len(frame) == cap(frame) {
			n, rerr := r.Read(next[:])
			if n == 0 {
				if rerr == nil {
					continue
				}
				if errors.Is(rerr, io.EOF) {
					return frame, held, nil
				}
				return frame, held, rerr
			}
			c := int64(cap(frame))
			grow := min(max(c, frameStepMin), frameStepMax)
			if c >= frameStepMax {
				grow = c / 2
			}
			grow = min(grow, limit-c)
			if grow <= 0 {
				return frame, held, errFrameTooBig
			}
			waited, err := s.in.budget.take(ctx, grow, s, s.stalls.Begin)
			if waited {
				s.stalls.End()
			}
			if err != nil {
				return frame, held, err
			}
			held += grow
			frame = append(append(make([]byte, 0, c+grow), frame...), next[0])
			if errors.Is(rerr, io.EOF) {
				return frame, held, nil
			}
			if rerr != nil {
				return frame, held, rerr
			}
		}
		n, rerr := r.Read(frame[len(frame):cap(frame)])
		frame = frame[:len(frame)+n]
		if errors.Is(rerr, io.EOF) {
			return frame, held, nil
		}
		if rerr != nil {
			return frame, held, rerr
		}
	}
}

// errFrameTimeout ends the reader of a connection whose frame did not
// arrive within FrameTimeout.
var errFrameTimeout = errors.New("frame not received within the frame timeout")

// errFrameTooBig ends the reader of a connection that sent a frame over
// MaxFrameBytes (which the WebSocket library lets through by one byte).
var errFrameTooBig = errors.New("frame over the size limit")

// errShuttingDown refuses envelopes read after Drain began: an outage,
// not the events' failure.
var errShuttingDown = &postbox.FieldError{Code: postbox.CodeOutage, Message: "server shutting down: not stored, send again"}

// errDraining ends the reader of a connection a drain closes.
var errDraining = errors.New("connection closed at shutdown")

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// begin counts a frame being read as in flight, unless a drain already
// found the connection idle and closes it.
func (s *session) begin() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.inFlight++
	return true
}

// read replaces the frame counted by begin with its refusals, to be
// written, and its events, to be queued.
func (s *session) read(refused []postbox.Reply, chunks []chunk, held int64) {
	s.mu.Lock()
	s.out = append(s.out, refused...)
	s.pending = append(s.pending, chunks...)
	s.held += held
	s.inFlight += len(refused) - 1
	for _, c := range chunks {
		s.inFlight += len(c.ids)
	}
	s.signalRoom() // the frame may have held nothing
	s.mu.Unlock()
	if len(refused) > 0 {
		signal(s.wake)
	}
	if len(chunks) > 0 {
		signal(s.queued)
	}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// signalRoom wakes the reader and a drain, whichever waits. s.mu is held.
func (s *session) signalRoom() {
	close(s.room)
	s.room = make(chan struct{})
}

// enqueueLoop queues pending events for the store's writer, waiting for
// room in its queue; it returns when ctx ends or the store refuses.
func (s *session) enqueueLoop(ctx context.Context) error {
	for {
		// The chunk leaves pending before it is queued, so that giveBack
		// (on gRPC, the reader's, which may run before this loop ends)
		// does not give its budget back too; it still counts in held
		// until AppendAsync returns.
		s.mu.Lock()
		var c chunk
		ok := len(s.pending) > 0
		if ok {
			c = s.pending[0]
			s.pending[0] = chunk{}
			s.pending = s.pending[1:]
		}
		s.mu.Unlock()
		if !ok {
			select {
			case <-ctx.Done():
				return nil
			case <-s.queued:
			}
			continue
		}
		ids, events, spans, bytes := c.ids, c.events, c.spans, c.bytes
		if err := s.rateLimit(ctx, len(c.events)); err != nil {
			endIntake(c.spans, nil, errNotQueued)
			s.mu.Lock()
			s.held -= c.bytes
			s.signalRoom()
			s.mu.Unlock()
			s.in.budget.give(c.bytes)
			return err
		}
		var waitFrom time.Time
		if full(s.in.store, len(c.events)) { // AppendAsync waits for room
			waitFrom = time.Now()
			s.in.m.saturated.Inc()
		}
		err := s.in.store.AppendAsync(ctx, s.streamID(), c.events, func(res []stream.AppendResult, err error) {
			// The events are let go of once committed: until then the
			// store's queue holds them, within the ingress's budget. What
			// the replies' log lines name is kept, not the bytes, which
			// the budget no longer counts.
			s.in.budget.give(bytes)
			for i := range events {
				events[i].Payload, events[i].Metadata, events[i].DeliveryHandle = nil, nil, nil
			}
			s.committed(commit{ids, events, spans, res, err})
		})
		if !waitFrom.IsZero() {
			s.in.m.saturated.Dec()
			s.in.m.waited.Add(time.Since(waitFrom).Seconds())
		}
		s.mu.Lock()
		s.held -= c.bytes
		s.signalRoom()
		s.mu.Unlock()
		if err != nil {
			// ctx ended or the store closed: these events will not be
			// answered here, and the sender will send them again.
			endIntake(c.spans, nil, errNotQueued)
			s.in.budget.give(c.bytes)
			return err
		}
	}
}

// rateLimit waits until the session's device token may send n more
// events (Config.TokenRate), counting the wait; it returns ctx's error
// when the connection ends first. While it waits, the events read stay
// pending and the reader stops once they fill the connection's share:
// the sender is held up through TCP, as by a full writer queue.
func (s *session) rateLimit(ctx context.Context, n int) error {
	r := s.in.cfg.TokenRate
	if s.device == "" || r.IsZero() {
		return nil
	}
	key := "device:" + s.device
	if ok, _, err := s.in.cfg.RateLimiter.Take(ctx, key, r, min(n, r.EffectiveBurst())); ok && err == nil {
		n -= min(n, r.EffectiveBurst())
		if n == 0 {
			return nil
		}
	}
	s.in.m.Limited(s.streamID(), "token", n)
	waited, err := s.in.cfg.RateLimiter.Wait(ctx, key, r, n)
	s.in.m.limitWait.Add(waited.Seconds())
	return err
}

// giveBack returns the budget of events never queued, when the connection
// ends.
func (s *session) giveBack() {
	s.mu.Lock()
	var held int64
	for _, c := range s.pending {
		held += c.bytes
		endIntake(c.spans, nil, errNotQueued)
	}
	s.held -= held
	s.pending = nil
	s.mu.Unlock()
	s.in.budget.give(held)
}

// waitAnswered blocks until every envelope read has been answered on the
// wire, and marks the connection closing, or until ctx ends (false).
func (s *session) waitAnswered(ctx context.Context) bool {
	for {
		s.mu.Lock()
		if s.inFlight <= 0 {
			s.closing = true
			s.mu.Unlock()
			return true
		}
		room := s.room
		s.mu.Unlock()
		if s.in.drainWaits != nil {
			s.in.drainWaits()
		}
		select {
		case <-ctx.Done():
			return false
		case <-room:
		}
	}
}

// waitRoom blocks while MaxInFlight envelopes are unanswered, or while the
// connection holds MaxFrameBytes of events waiting for the store's queue
// (a stall of this side: the peer's pings are not held against it).
func (s *session) waitRoom(ctx context.Context) error {
	stalled := false
	defer func() {
		if stalled {
			s.stalls.End()
		}
	}()
	for {
		s.mu.Lock()
		full := s.held >= s.in.cfg.MaxFrameBytes
		done, room := !full && s.inFlight < s.in.cfg.MaxInFlight, s.room
		s.mu.Unlock()
		if done {
			return nil
		}
		if full && !stalled {
			s.stalls.Begin()
			stalled = true
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-room:
		}
	}
}

// commit is the store's answer to one AppendAsync.
type commit struct {
	ids     []string
	events  []stream.Event // the events the ids name, for the log
	spans   []trace.Span   // the events' intake spans; nil while tracing is off
	results []stream.AppendResult
	err     error
}

// committed queues the store's answer for the writer loop. It runs on the
// store's writer goroutine, so it only queues: the replies are built and
// encoded by the connection's own writer loop, off the store's critical
// path.
func (s *session) committed(c commit) {
	s.mu.Lock()
	s.commits = append(s.commits, c)
	s.mu.Unlock()
	signal(s.wake)
}

func (s *session) writeLoop(ctx context.Context) error {
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
			buf = s.in.appendReplies(buf, s.streamID(), c.events, c.ids, c.results, c.err)
			endIntake(c.spans, c.results, c.err)
		}
		clear(commits)
		if len(buf) == 0 {
			continue
		}
		if err := s.send(ctx, buf); err != nil {
			return err
		}
		s.mu.Lock()
		s.inFlight -= len(buf)
		s.signalRoom()
		s.mu.Unlock()
		clear(buf)
	}
}
