package server

import (
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/delivery"
)

// The dead-letter API (docs/API.md#dead-letters): failed items, listed by
// inbox, subscription and time of failure, and replayed one by one or by
// selection.

// deadLetterFilter reads the selection of a dead-letter request from
// query, or answers 400 naming the field.
func deadLetterFilter(w http.ResponseWriter, q url.Values) (delivery.DeadLetters, bool) {
	f := delivery.DeadLetters{Inbox: q.Get("inbox"), Subscription: q.Get("subscription")}
	if (f.Inbox != "" && !checkName(w, "inbox", f.Inbox)) || (f.Subscription != "" && !checkName(w, "subscription", f.Subscription)) {
		return f, false
	}
	for _, p := range []struct {
		name string
		t    *time.Time
	}{{"from", &f.From}, {"to", &f.To}} {
		name, t := p.name, p.t
		if v := q.Get(name); v != "" {
			var err error
			if *t, err = time.Parse(time.RFC3339Nano, v); err != nil {
				writeError(w, api.CodeInvalidField, "%s %q: want an RFC 3339 time such as 2026-11-21T10:00:00Z", name, v)
				return f, false
			}
		}
	}
	if !f.From.IsZero() && !f.To.IsZero() && !f.From.Before(f.To) {
		writeError(w, api.CodeInvalidField, "from %s is not before to %s", q.Get("from"), q.Get("to"))
		return f, false
	}
	return f, true
}

func (s *Server) listDeadLetters(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f, ok := deadLetterFilter(w, q)
	if !ok {
		return
	}
	limit, ok := intParam(w, q.Get("limit"), "limit", 100, 1, maxListLimit)
	if !ok {
		return
	}
	if f.After, ok = intParam(w, q.Get("after"), "after", 0, 0, 1<<62); !ok {
		return
	}
	f.Limit = int(limit)
	items, err := s.deadLetters.ListDeadLetters(r.Context(), f)
	if err != nil {
		s.writeErr(w, err)
		return
	}
	next := int64(0)
	if len(items) == f.Limit {
		next = items[len(items)-1].ID
	}
	writeJSON(w, http.StatusOK, api.ItemPage{Items: itemsJSON(items), NextAfter: next})
}

// deadLetterID reads the {id} of the path, or answers 400.
func deadLetterID(w http.ResponseWriter, r *http.Request) (int64, bool) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id < 1 {
		writeError(w, api.CodeInvalidField, "item id %q: want a positive whole number", r.PathValue("id"))
		return 0, false
	}
	return id, true
}

func (s *Server) getDeadLetter(w http.ResponseWriter, r *http.Request) {
	if r.PathValue("id") == "replay" { // POST /v1/dead-letters/replay's path, not an id
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, api.CodeMethodNotAllowed, "%s %s: this path takes POST", r.Method, r.URL.Path)
		return
	}
	id, ok := deadLetterID(w, r)
	if !ok {
		return
	}
	it, err := s.deadLetters.Item(r.Context(), "", id)
	if err != nil {
		s.writeErr(w, err)
		return
	}
	if it.State != delivery.StateFailed {
		writeError(w, api.CodeNotFound, "item %d is %s, not a dead letter", id, it.State)
		return
	}
	writeJSON(w, http.StatusOK, itemsJSON([]delivery.Item{it})[0])
}

// replayDeadLetter replays one dead letter: 200 with the item, now
// pending; 404 when there is no such item; 409 when it is not failed.
func (s *Server) replayDeadLetter(w http.ResponseWriter, r *http.Request) {
	id, ok := deadLetterID(w, r)
	var none struct{} // it takes no body: one with a field is refused
	if !ok || !decodeBody(w, r, &none, true) {
		return
	}
	ids, err := s.deadLetters.Replay(r.Context(), delivery.DeadLetters{ID: id})
	if err != nil {
		s.writeErr(w, err)
		return
	}
	it, err := s.deadLetters.Item(r.Context(), "", id)
	if err != nil {
		s.writeErr(w, err)
		return
	}
	if len(ids) == 0 {
		writeError(w, api.CodeInvalidState, "item %d is %s, not a dead letter: only failed items are replayed", id, it.State)
		return
	}
	writeJSON(w, http.StatusOK, itemsJSON([]delivery.Item{it})[0])
}

// replayDeadLetters replays every dead letter a selection names. An empty
// selection must say "all": true, so that nothing is replayed by accident.
func (s *Server) replayDeadLetters(w http.ResponseWriter, r *http.Request) {
	var req api.ReplayDeadLetters
	if !decodeBody(w, r, &req, false) {
		return
	}
	f, ok := deadLetterFilter(w, url.Values{"inbox": {req.Inbox}, "subscription": {req.Subscription}, "from": {req.From}, "to": {req.To}})
	if !ok {
		return
	}
	if f.Empty() && !req.All {
		writeError(w, api.CodeMissingField, "name an inbox, a subscription or a time range (from, to), or send \"all\": true to replay every dead letter")
		return
	}
	ids, err := s.deadLetters.Replay(r.Context(), f)
	if err != nil {
		s.writeErr(w, err)
		return
	}
	if ids == nil {
		ids = []int64{}
	}
	writeJSON(w, http.StatusOK, api.Replayed{Replayed: len(ids), IDs: ids})
}
