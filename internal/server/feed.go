package server

import (
	"context"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/feed"
	"github.com/postbox-events/postbox/stream"
)

// The replay feed: GET /v1/streams/{stream}/events (docs/API.md, Streams and consumers).

// Bounds of the replay feed.
const (
	// feedBatch is how many events one read of the stream takes: what a
	// feed holds in memory besides the connection's buffers.
	feedBatch = 500
	// feedPoll is how often a feed polls a backend that is no
	// stream.Waiter.
	feedPoll = 500 * time.Millisecond
	// feedWriteTimeout ends a feed whose reader takes nothing for this
	// long: a slow reader holds a goroutine and one batch, no more.
	feedWriteTimeout = 4 * feed.DefaultHeartbeat
	// minFeedHeartbeat and maxFeedHeartbeat bound ?heartbeat=.
	minFeedHeartbeat = time.Second
	maxFeedHeartbeat = 5 * time.Minute
)

// maxFeedAfter bounds ?after=: far beyond any offset a stream reaches,
// and far enough from the end of int64 that the reads after it cannot
// overflow into small offsets (once, a huge after started the feed over
// from the first event).
const maxFeedAfter = math.MaxInt64 / 2

// streamEvents answers the stream's events after ?after= as NDJSON lines
// (feed.Line), reading by offset without a consumer, and keeps the
// connection open for new ones, with a heartbeat line every ?heartbeat=
// (feed.DefaultHeartbeat). ?limit= ends the answer after that many
// events. With ?id= or ?key= it answers the one event of that id
// instead (lookupEvent). It holds no writer and no lock: a slow reader only slows its
// own answer, and is cut off after feedWriteTimeout without reading.
func (s *Server) streamEvents(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("stream")
	if !checkName(w, "stream", name) {
		return
	}
	q := r.URL.Query()
	if q.Has("id") || q.Has("key") {
		s.lookupEvent(w, r, name, q)
		return
	}
	after, err := queryInt(q.Get("after"), 0)
	if err != nil || after < 0 || after > maxFeedAfter {
		writeError(w, api.CodeInvalidField, "after %q: want the offset to read after, from 0 (from the first event) to %d", q.Get("after"), int64(maxFeedAfter))
		return
	}
	limit, err := queryInt(q.Get("limit"), 0)
	if err != nil || limit < 0 || limit == 0 && q.Has("limit") {
		writeError(w, api.CodeInvalidField, "limit %q: want how many events to send before the answer ends, 1 or more (none: no end)", q.Get("limit"))
		return
	}
	heartbeat := feed.DefaultHeartbeat
	if v := q.Get("heartbeat"); v != "" {
		heartbeat, err = time.ParseDuration(v)
		if err != nil || heartbeat < minFeedHeartbeat || heartbeat > maxFeedHeartbeat {
			writeError(w, api.CodeInvalidField, "heartbeat %q: want a duration from %s to %s", v, minFeedHeartbeat, maxFeedHeartbeat)
			return
		}
	}
	st, err := s.streams.Stats(r.Context(), name)
	if err != nil {
		s.writeErr(w, err)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	s.mu.Lock()
	if s.stopping != nil { // a shutdown ends the feed: the follower reconnects elsewhere or later
		defer context.AfterFunc(s.stopping, cancel)()
	}
	s.mu.Unlock()

	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", feed.ContentType)
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no") // proxies that buffer answers pass this one as it goes
	h.Set(feed.HeaderHighWatermark, strconv.FormatInt(st.LastOffset, 10))
	w.WriteHeader(http.StatusOK)
	// A write blocked on a reader that reads nothing ends with ctx: the
	// deadline moves to now (under mu, so that no write moves it back).
	var mu sync.Mutex
	defer context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		rc.SetWriteDeadline(time.Now())
	})()
	write := func(b []byte) bool {
		mu.Lock()
		if ctx.Err() != nil {
			mu.Unlock()
			return false
		}
		rc.SetWriteDeadline(time.Now().Add(feedWriteTimeout)) // not every writer has deadlines: then none
		mu.Unlock()
		if _, err := w.Write(b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if !write(nil) {
		return
	}
	waiter, _ := s.streams.(stream.Waiter)
	next, sent := after+1, int64(0)
	nextBeat := time.Now().Add(heartbeat)
	var buf []byte
	for {
		if now := time.Now(); !now.Before(nextBeat) {
			hw := next - 1
			if st, err := s.streams.Stats(ctx, name); err == nil {
				hw = st.LastOffset
			}
			if !write(feed.AppendHeartbeat(buf[:0], feed.Heartbeat{HighWatermark: hw, At: now.UTC()})) {
				return
			}
			nextBeat = now.Add(heartbeat)
		}
		n := int64(feedBatch)
		if limit > 0 {
			n = min(n, limit-sent)
		}
		evs, err := stream.ReadFrom(ctx, s.streams, name, next, int(n))
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("feed: read failed; ending the feed", "stream", name, "after", next-1, "err", err)
			}
			return // the status is sent: ending the answer is how the reader learns
		}
		if len(evs) > 0 {
			buf = buf[:0]
			for i := range evs {
				buf = feed.AppendEvent(buf, &evs[i])
			}
			if !write(buf) {
				return
			}
			next = evs[len(evs)-1].Offset + 1
			sent += int64(len(evs))
			if limit > 0 && sent >= limit {
				return
			}
			continue
		}
		// Caught up: wait for an event or the next heartbeat.
		wctx, wcancel := context.WithDeadline(ctx, nextBeat)
		if waiter != nil {
			err = waiter.Wait(wctx, name, next-1)
		} else {
			t := time.NewTimer(feedPoll)
			select {
			case <-t.C:
			case <-wctx.Done():
			}
			t.Stop()
		}
		timedOut := wctx.Err() != nil
		wcancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil && !timedOut {
			s.log.Warn("feed: wait failed; ending the feed", "stream", name, "err", err)
			return
		}
	}
}

// queryInt parses a query parameter as an int64; empty gives def.
func queryInt(v string, def int64) (int64, error) {
	if v == "" {
		return def, nil
	}
	return strconv.ParseInt(v, 10, 64)
}
