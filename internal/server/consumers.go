package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/stream"
)

// The consumers API beyond the list (docs/API.md, Streams and consumers):
// one consumer, its reset, and its history of commits and resets. A
// consumer is a subscription's position in its source's stream and has
// the subscription's name.

// Bounds of GET /v1/consumers/{name}/commits.
const (
	defaultHistoryLimit = 100
	maxHistoryLimit     = 1000
)

func (s *Server) routeConsumers() {
	for pattern, h := range map[string]http.HandlerFunc{
		"GET /v1/consumers/{name}":         s.getConsumer,
		"POST /v1/consumers/{name}/reset":  s.resetConsumer,
		"GET /v1/consumers/{name}/commits": s.consumerCommits,
	} {
		s.handle(pattern, s.requireToken(h))
	}
}

// consumerOf returns the consumer of subscription name as the API shows
// it: its next offset is the subscription's read position, which the
// stream consumer follows.
func (s *Server) consumerOf(ctx context.Context, name string) (api.Consumer, error) {
	sub, err := s.subs.Subscription(ctx, name)
	if err != nil {
		return api.Consumer{}, err
	}
	c, err := s.streams.Consumer(ctx, sub.Name)
	if err != nil {
		return api.Consumer{}, err
	}
	lag, err := s.subs.Lag(ctx, sub.Name)
	if err != nil {
		return api.Consumer{}, err
	}
	return api.Consumer{Consumer: c.ID, Subscription: sub.Name, Stream: c.StreamID, NextOffset: lag.NextOffset,
		HighWatermark: lag.HighWatermark, Lag: lag.Events, UpdatedAt: c.UpdatedAt}, nil
}

// consumerErr answers err of consumer name: an unknown one is 404 naming it.
func (s *Server) consumerErr(w http.ResponseWriter, name string, err error) {
	if errors.Is(err, delivery.ErrNotFound) || errors.Is(err, stream.ErrConsumerNotFound) {
		writeError(w, api.CodeNotFound, "no consumer %q: a consumer has its subscription's name (postbox consumers list)", name)
		return
	}
	s.writeErr(w, err)
}

func (s *Server) getConsumer(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if !checkName(w, "consumer", name) {
		return
	}
	c, err := s.consumerOf(r.Context(), name)
	if err != nil {
		s.consumerErr(w, name, err)
		return
	}
	writeJSON(w, http.StatusOK, c)
}

// resetStart turns a reset request into a start position, or says which
// field is wrong.
func resetStart(req api.ResetRequest) (stream.Start, error) {
	var given []string
	var start stream.Start
	if req.ToOffset != nil {
		given = append(given, "to_offset")
		if *req.ToOffset < 1 {
			return start, fmt.Errorf("to_offset %d: offsets start at 1", *req.ToOffset)
		}
		start = stream.Start{Policy: stream.StartAtOffset, Offset: *req.ToOffset}
	}
	if req.ToTime != nil {
		given = append(given, "to_time")
		t, err := time.Parse(time.RFC3339Nano, *req.ToTime)
		if err != nil || t.IsZero() {
			return start, fmt.Errorf("to_time %q: want an RFC 3339 time after year 1, such as 2026-11-24T10:00:00Z", *req.ToTime)
		}
		start = stream.Start{Policy: stream.StartAtTime, Time: t}
	}
	for _, f := range []struct {
		name   string
		v      *bool
		policy string
	}{{"earliest", req.Earliest, stream.StartEarliest}, {"latest", req.Latest, stream.StartLatest}} {
		if f.v == nil {
			continue
		}
		given = append(given, f.name)
		if !*f.v {
			return start, fmt.Errorf("%s: false is no position; give %q: true, or another field", f.name, f.name)
		}
		start = stream.Start{Policy: f.policy}
	}
	switch len(given) {
	case 0:
		return start, fmt.Errorf("give one of to_offset, to_time, earliest (true) or latest (true)")
	case 1:
		return start, nil
	}
	return start, fmt.Errorf("%s: give only one", strings.Join(given, ", "))
}

func startPosition(st stream.Start) api.StartPosition {
	c := st.Canonical()
	p := api.StartPosition{Policy: c.Policy, Offset: c.Offset}
	if c.Policy == stream.StartAtTime {
		p.Time = &c.Time
	}
	return p
}

func (s *Server) resetConsumer(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	var req api.ResetRequest
	if !checkName(w, "consumer", name) || !decodeBody(w, r, &req, false) {
		return
	}
	start, err := resetStart(req)
	if err != nil {
		code := api.CodeInvalidField
		if req == (api.ResetRequest{}) {
			code = api.CodeMissingField
		}
		writeError(w, code, "%v", err)
		return
	}
	before, err := s.consumerOf(r.Context(), name)
	if err != nil {
		s.consumerErr(w, name, err)
		return
	}
	c, err := s.positions.Reset(r.Context(), name, start)
	if err != nil {
		if start.Policy == stream.StartAtOffset && (errors.Is(err, stream.ErrOffsetOutOfRange) || errors.Is(err, delivery.ErrInvalid)) {
			writeError(w, api.CodeInvalidField, "to_offset %d: past the end of stream %s, whose next offset is %d",
				start.Offset, before.Stream, before.HighWatermark+1)
			return
		}
		s.consumerErr(w, name, err)
		return
	}
	// The answer is where the reset put the consumer: its subscription
	// may have moved on already.
	st, err := s.streams.Stats(r.Context(), c.StreamID)
	if err != nil {
		s.writeErr(w, err)
		return
	}
	after := before
	after.NextOffset, after.HighWatermark, after.UpdatedAt = c.NextOffset, st.LastOffset, c.UpdatedAt
	after.Lag = stream.LagOf(c.NextOffset, st.LastOffset)
	writeJSON(w, http.StatusOK, api.ConsumerReset{Consumer: after, PreviousNextOffset: before.NextOffset, Start: startPosition(start)})
}

func (s *Server) consumerCommits(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if !checkName(w, "consumer", name) {
		return
	}
	limit := defaultHistoryLimit
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxHistoryLimit {
			writeError(w, api.CodeInvalidField, "limit %q: want 1 to %d", v, maxHistoryLimit)
			return
		}
		limit = n
	}
	c, err := s.consumerOf(r.Context(), name)
	if err != nil {
		s.consumerErr(w, name, err)
		return
	}
	a, ok := s.streams.(stream.Auditor)
	if !ok {
		writeError(w, api.CodeNotKept, "this server's stream backend keeps no history of consumer commits: the sqlite and postgres stream backends keep one")
		return
	}
	moves, err := a.Moves(r.Context(), name, limit)
	if err != nil {
		s.consumerErr(w, name, err)
		return
	}
	out := api.ConsumerHistory{Consumer: c.Consumer, Stream: c.Stream, Commits: make([]api.ConsumerMove, 0, len(moves))}
	for _, m := range moves {
		cm := api.ConsumerMove{Kind: m.Kind, Offset: m.Offset, NextOffset: m.Offset + 1, At: m.At}
		if m.Start != nil {
			p := startPosition(*m.Start)
			cm.Start = &p
		}
		out.Commits = append(out.Commits, cm)
	}
	writeJSON(w, http.StatusOK, out)
}
