package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/intake"
	"github.com/postbox-events/postbox/internal/replyto"
	"github.com/postbox-events/postbox/stream"
)

// An event and its deliveries, and the search of streams and inboxes
// (docs/API.md, Events and search).

// getEvent answers the event at an offset of a stream with its
// deliveries.
func (s *Server) getEvent(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("stream")
	if !checkName(w, "stream", name) {
		return
	}
	offset, err := strconv.ParseInt(r.PathValue("offset"), 10, 64)
	if err != nil || offset < 1 {
		writeError(w, api.CodeInvalidField, "offset %q: want a positive whole number", r.PathValue("offset"))
		return
	}
	ev, err := s.streams.Event(r.Context(), name, offset)
	if errors.Is(err, stream.ErrNotFound) {
		writeError(w, api.CodeNotFound, "stream %q holds no event at offset %d (never stored, or deleted by retention)", name, offset)
		return
	}
	if err != nil {
		s.writeErr(w, err)
		return
	}
	s.writeEvent(w, r, ev)
}

// lookupEvent answers the event of a stream whose source's id is ?id= or
// ?key= (and whose variant is ?variant=, when given) with its
// deliveries: GET /v1/streams/{stream}/events with one of them, which
// without them is the replay feed.
func (s *Server) lookupEvent(w http.ResponseWriter, r *http.Request, name string, q url.Values) {
	for _, p := range []string{"after", "limit", "heartbeat"} {
		if q.Has(p) {
			writeError(w, api.CodeInvalidField, "%s: the replay feed's parameter, not a lookup's: ask ?id= or ?key= alone, or read the feed without them", p)
			return
		}
	}
	id, ok := eventIDParam(w, q)
	if !ok {
		return
	}
	if id == "" {
		writeError(w, api.CodeMissingField, "id or key: GET /v1/streams/{stream}/events?id=EVENT_ID or ?key=IDEMPOTENCY_KEY")
		return
	}
	var ev stream.StoredEvent
	var err error
	sr, searches := s.streams.(stream.Searcher)
	if q.Has("variant") || !searches {
		ev, err = s.streams.Lookup(r.Context(), name, id, q.Get("variant"))
	} else {
		var evs []stream.StoredEvent
		evs, err = sr.Search(r.Context(), name, stream.Query{NativeID: id, Limit: 10})
		switch {
		case err != nil:
		case len(evs) == 0:
			err = stream.ErrNotFound
		case len(evs) > 1:
			variants := make([]string, len(evs))
			for i, e := range evs {
				variants[i] = strconv.Quote(e.Variant)
			}
			writeError(w, api.CodeConflict, "stream %q holds %d events of id %q, of the variants (devices) %s: add &variant=… to name one",
				name, len(evs), id, strings.Join(variants, ", "))
			return
		default:
			ev = evs[0]
		}
	}
	if errors.Is(err, stream.ErrNotFound) {
		writeError(w, api.CodeNotFound, "stream %q holds no event of id %q (never stored, or deleted by retention)", name, id)
		return
	}
	if err != nil {
		s.writeErr(w, err)
		return
	}
	s.writeEvent(w, r, ev)
}

// writeEvent answers ev with its deliveries.
func (s *Server) writeEvent(w http.ResponseWriter, r *http.Request, ev stream.StoredEvent) {
	ds, err := s.events.Deliveries(r.Context(), ev.StreamID, &ev)
	if err != nil {
		s.writeErr(w, err)
		return
	}
	j := eventJSON(ev)
	if s.isWebhookStream(r.Context(), ev.StreamID) {
		j.WebhookID = webhookID(ev.StreamID, ev.Offset)
	}
	j.Deliveries = deliveriesJSON(ds)
	if j.Deliveries == nil {
		j.Deliveries = []api.Delivery{}
	}
	writeJSON(w, http.StatusOK, j)
}

// isWebhookStream reports whether streamID is the stream of a webhook
// source (a stream's id is its source's).
func (s *Server) isWebhookStream(ctx context.Context, streamID string) bool {
	if streamID == WebhookSource {
		return true
	}
	src, err := s.sourceStore.Source(ctx, streamID)
	return err == nil && src.Kind == intake.KindWebhook
}

func eventJSON(ev stream.StoredEvent) api.Event {
	handle := replyto.Of(ev.DeliveryHandle, ev.Metadata) // a device's is derived from its metadata
	if len(handle) == 0 {
		handle = []byte("null")
	}
	return api.Event{ID: ev.ID, Stream: ev.StreamID, Source: ev.SourceID, Offset: ev.Offset, EventID: ev.NativeID, Variant: ev.Variant,
		Type: ev.Type, OccurredAt: ev.OccurredAt, SourceSequence: ev.Sequence, StoredAt: ev.StoredAt, Metadata: ev.Metadata,
		Payload: ev.Payload, DeliveryHandle: handle}
}

func deliveriesJSON(ds []delivery.EventDelivery) []api.Delivery {
	var out []api.Delivery
	for _, d := range ds {
		j := api.Delivery{Subscription: d.Subscription, Inbox: d.Inbox, Deleted: d.Deleted, Paused: d.Paused, Status: d.Status, Reason: d.Reason,
			Attempts: attemptsJSON(d.Attempts)}
		if d.Item != nil {
			j.Item = &itemsJSON([]delivery.Item{*d.Item})[0]
		}
		out = append(out, j)
	}
	return out
}

// attemptsJSON is the attempt log in the API's form.
func attemptsJSON(log []delivery.Attempt) []api.Attempt {
	out := make([]api.Attempt, len(log))
	for i, a := range log {
		out[i] = api.Attempt{Attempt: a.Number, AttemptedAt: a.At, EndpointURL: a.URL, StatusCode: a.Status,
			LatencyMS: float64(a.Latency.Microseconds()) / 1000}
		if a.Error != "" {
			out[i].Error = &log[i].Error
		}
		if a.Excerpt != "" {
			out[i].ResponseExcerpt = &log[i].Excerpt
		}
	}
	return out
}

// eventIDParam reads ?id= or ?key= (one of them, the same thing: the
// source's id of an event), or answers 400.
func eventIDParam(w http.ResponseWriter, q url.Values) (string, bool) {
	id, key := q.Get("id"), q.Get("key")
	if id != "" && key != "" && id != key {
		writeError(w, api.CodeInvalidField, "id %q and key %q: give one (both name the source's id of an event)", id, key)
		return "", false
	}
	field := "id"
	if id == "" {
		id, field = key, "key"
	}
	if id != "" && !checkAPIText(w, field, id, maxSearchText, false) {
		return "", false
	}
	return id, true
}

// searchParams are what a search of a stream or an inbox takes besides
// its own: the type, the time range, the page.
type searchParams struct {
	id, typ      string
	since, until time.Time
	before       int64
	limit        int
}

// readSearch reads the parameters of a search, or answers 400 naming the
// one at fault.
func readSearch(w http.ResponseWriter, q url.Values) (searchParams, bool) {
	var p searchParams
	var ok bool
	if p.id, ok = eventIDParam(w, q); !ok {
		return p, false
	}
	p.typ = q.Get("type")
	if p.typ != "" && !checkAPIText(w, "type", p.typ, maxSearchText, false) {
		return p, false
	}
	for _, t := range []struct {
		name string
		t    *time.Time
	}{{"since", &p.since}, {"until", &p.until}} {
		if v := q.Get(t.name); v != "" {
			var err error
			if *t.t, err = time.Parse(time.RFC3339Nano, v); err != nil {
				writeError(w, api.CodeInvalidField, "%s %q: want an RFC 3339 time such as 2026-11-21T10:00:00Z", t.name, v)
				return p, false
			}
		}
	}
	if !p.since.IsZero() && !p.until.IsZero() && !p.since.Before(p.until) {
		writeError(w, api.CodeInvalidField, "since %s is not before until %s", q.Get("since"), q.Get("until"))
		return p, false
	}
	if p.before, ok = intParam(w, q.Get("before"), "before", 0, 0, 1<<62); !ok {
		return p, false
	}
	limit, ok := intParam(w, q.Get("limit"), "limit", 100, 1, maxListLimit)
	p.limit = int(limit)
	return p, ok
}

// maxSearchText bounds ?id=, ?key= and ?type=: above any id or type a
// source may store.
const maxSearchText = 1024

// searchStream answers a page of a stream's events that the query
// selects, newest first, through the backend's indexes (stream.Searcher).
func (s *Server) searchStream(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("stream")
	if !checkName(w, "stream", name) {
		return
	}
	q := r.URL.Query()
	p, ok := readSearch(w, q)
	if !ok {
		return
	}
	query := stream.Query{NativeID: p.id, Type: p.typ, Since: p.since, Until: p.until, Before: p.before, Limit: p.limit}
	var evs []stream.StoredEvent
	var err error
	if sr, ok := s.streams.(stream.Searcher); ok {
		evs, err = sr.Search(r.Context(), name, query)
	} else {
		evs, err = s.searchWithoutIndex(r.Context(), w, name, query)
		if evs == nil && err == nil {
			return
		}
	}
	if err != nil {
		s.writeErr(w, err)
		return
	}
	page := api.EventPage{Events: make([]api.Event, len(evs))}
	for i, ev := range evs {
		page.Events[i] = eventJSON(ev)
	}
	if len(evs) == p.limit {
		page.NextBefore = evs[len(evs)-1].Offset
	}
	writeJSON(w, http.StatusOK, page)
}

// searchWithoutIndex answers a search of a stream on a backend that is no
// stream.Searcher (NATS, Kafka): no filter reads the page by offset, an id
// is its lookup (of the variant ""), and a type or time range is refused,
// since it would read the stream through. It returns nil and no error
// when it answered.
func (s *Server) searchWithoutIndex(ctx context.Context, w http.ResponseWriter, name string, q stream.Query) ([]stream.StoredEvent, error) {
	switch {
	case q.Type != "" || !q.Since.IsZero() || !q.Until.IsZero():
		writeError(w, api.CodeInvalidField, "the stream backend of %q searches by id (or key) alone: search the items of an inbox by type and time instead", name)
		return nil, nil
	case q.NativeID == "":
		return newestFirst(ctx, s.streams, name, q.Before, q.Limit)
	}
	ev, err := s.streams.Lookup(ctx, name, q.NativeID, "")
	switch {
	case errors.Is(err, stream.ErrNotFound):
		return []stream.StoredEvent{}, nil
	case err != nil:
		return nil, err
	case q.Before > 0 && ev.Offset >= q.Before:
		return []stream.StoredEvent{}, nil
	}
	return []stream.StoredEvent{ev}, nil
}

// newestFirst returns up to limit events of streamID below the offset
// before (0: the newest), newest first, read by offset.
func newestFirst(ctx context.Context, b stream.Backend, streamID string, before int64, limit int) ([]stream.StoredEvent, error) {
	st, err := b.Stats(ctx, streamID)
	if err != nil {
		return nil, err
	}
	end := st.LastOffset
	if before > 0 {
		end = min(end, before-1)
	}
	from := max(end-int64(limit)+1, st.FirstOffset, 1)
	out := []stream.StoredEvent{}
	if end < from {
		return out, nil
	}
	evs, err := stream.ReadFrom(ctx, b, streamID, from, int(end-from+1))
	if err != nil {
		return nil, err
	}
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Offset <= end {
			out = append(out, evs[i])
		}
	}
	return out, nil
}

// searchInbox answers a page of an inbox's items that the query selects,
// newest first.
func (s *Server) searchInbox(w http.ResponseWriter, r *http.Request) {
	inbox := r.PathValue("inbox")
	if !checkName(w, "inbox", inbox) {
		return
	}
	q := r.URL.Query()
	p, ok := readSearch(w, q)
	if !ok {
		return
	}
	state := q.Get("state")
	if state != "" && !delivery.ValidState(state) {
		writeError(w, api.CodeInvalidField, "state %q: use pending, processing, completed or failed", state)
		return
	}
	items, next, err := s.events.Search(r.Context(), delivery.ItemQuery{Inbox: inbox, EventID: p.id, Type: p.typ, State: state,
		Since: p.since, Until: p.until, Before: p.before, Limit: p.limit})
	if err != nil {
		s.writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, api.ItemSearchPage{Items: itemsJSON(items), NextBefore: next})
}

// webhookDeliveries fills j, the lookup of a webhook ev of source, with
// its deliveries and their summary.
func (s *Server) webhookDeliveries(ctx context.Context, j *api.Webhook, source string, ev *stream.StoredEvent) error {
	ds, err := s.events.Deliveries(ctx, source, ev)
	if err != nil {
		return err
	}
	j.Stream, j.Offset = source, ev.Offset
	j.Deliveries = deliveriesJSON(ds)
	if len(ds) == 0 {
		j.Note = fmt.Sprintf("no subscription of source %q takes this webhook, and no item of it is stored: nothing delivers it", source)
		if subs, err := s.subs.Subscriptions(ctx); err == nil && !readsStream(subs, source) {
			j.Note = fmt.Sprintf("no subscription reads source %q: nothing delivers its webhooks (create one: POST /v1/subscriptions)", source)
		}
		return nil
	}
	best := -1
	for i, d := range ds {
		if d.Status == delivery.DeliveryNone {
			continue
		}
		if best < 0 || attention(d) > attention(ds[best]) {
			best = i
		}
	}
	if best < 0 {
		j.Note = "no subscription holds an item of this webhook: see each delivery's reason"
		return nil
	}
	d := ds[best]
	j.Subscription = d.Subscription
	if d.Item != nil {
		j.Status = d.Item.State
		if d.Item.State != delivery.StateCompleted { // a completed item's error is history: its delivery's attempts keep it
			j.LastError = d.Item.LastError
		}
		*j.UpdatedAt, *j.Attempts = d.Item.UpdatedAt, d.Item.Attempts
	}
	return nil
}

// readsStream reports whether a subscription of subs reads streamID.
func readsStream(subs []delivery.Subscription, streamID string) bool {
	for _, s := range subs {
		if s.Stream == streamID {
			return true
		}
	}
	return false
}

// attention ranks a delivery by how much it needs an operator's eye: a
// dead letter first, then what waits (an unread event counts as
// pending), what is under way, what is done.
func attention(d delivery.EventDelivery) int {
	if d.Deleted {
		return 0 // what nothing delivers any more ranks below what lives
	}
	if d.Item == nil {
		return 3 // unread: pending
	}
	switch d.Item.State {
	case delivery.StateFailed:
		return 4
	case delivery.StatePending:
		return 3
	case delivery.StateProcessing:
		return 2
	}
	return 1
}
