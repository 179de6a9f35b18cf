package server

import (
	"net/http"
	"net/url"
	"strconv"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/delivery"
)

// An operator's acts (docs/API.md): pause and resume a subscription's
// delivery, send a test event to its endpoint, cancel or discard an item,
// and discard dead letters by selection.

func (s *Server) routeOperate() {
	for pattern, h := range map[string]http.HandlerFunc{
		"POST /v1/subscriptions/{name}/pause":         s.pauseSubscription,
		"POST /v1/subscriptions/{name}/resume":        s.resumeSubscription,
		"POST /v1/subscriptions/{name}/test":          s.testSubscription,
		"POST /v1/inboxes/{inbox}/items/{id}/cancel":  s.cancelItem,
		"POST /v1/inboxes/{inbox}/items/{id}/discard": s.discardItem,
		"POST /v1/dead-letters/discard":               s.discardDeadLetters,
	} {
		s.handle(pattern, s.requireToken(h))
	}
}

// pauseSubscription pauses a subscription's delivery: 200 with the
// subscription; the body may give a reason.
func (s *Server) pauseSubscription(w http.ResponseWriter, r *http.Request) {
	var req api.PauseSubscription
	if !checkName(w, "subscription", r.PathValue("name")) || !decodeBody(w, r, &req, true) {
		return
	}
	sub, err := s.ops.Pause(r.Context(), r.PathValue("name"), req.Reason)
	if err != nil {
		s.writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.subscriptionJSON(r, sub))
}

// resumeSubscription resumes a subscription's delivery: 200 with the
// subscription. It takes no body.
func (s *Server) resumeSubscription(w http.ResponseWriter, r *http.Request) {
	var none struct{}
	if !checkName(w, "subscription", r.PathValue("name")) || !decodeBody(w, r, &none, true) {
		return
	}
	sub, err := s.ops.Resume(r.Context(), r.PathValue("name"))
	if err != nil {
		s.writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.subscriptionJSON(r, sub))
}

// testSubscription sends a postbox.test event to the subscription's
// endpoint and answers 200 with what the endpoint said, whatever it said
// (OK tells a 2xx); 400 for a subscription without a target.
func (s *Server) testSubscription(w http.ResponseWriter, r *http.Request) {
	var none struct{}
	if !checkName(w, "subscription", r.PathValue("name")) || !decodeBody(w, r, &none, true) {
		return
	}
	res, err := s.ops.SendTest(r.Context(), r.PathValue("name"))
	if err != nil {
		s.writeErr(w, err)
		return
	}
	a := res.Attempt
	out := api.TestDelivery{EventID: res.EventID, Type: delivery.TestType, EndpointURL: a.URL, AttemptedAt: a.At,
		OK: a.Error == "" && a.Status >= 200 && a.Status < 300, StatusCode: a.Status,
		LatencyMS: float64(a.Latency.Microseconds()) / 1000}
	if a.Error != "" {
		out.Error = &a.Error
	}
	if a.Excerpt != "" {
		out.ResponseExcerpt = &a.Excerpt
	}
	writeJSON(w, http.StatusOK, out)
}

// itemPath reads the {inbox} and {id} of the path, or answers 400.
func itemPath(w http.ResponseWriter, r *http.Request) (string, int64, bool) {
	if !checkName(w, "inbox", r.PathValue("inbox")) {
		return "", 0, false
	}
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id < 1 {
		writeError(w, api.CodeInvalidField, "item id %q: want a positive whole number", r.PathValue("id"))
		return "", 0, false
	}
	return r.PathValue("inbox"), id, true
}

// cancelItem moves a pending item to failed (a dead letter): 200 with the
// item; 409 invalid_state when it is not pending.
func (s *Server) cancelItem(w http.ResponseWriter, r *http.Request) {
	var req api.CancelItem
	inbox, id, ok := itemPath(w, r)
	if !ok || !decodeBody(w, r, &req, true) {
		return
	}
	it, err := s.ops.Cancel(r.Context(), inbox, id, req.Reason)
	if err != nil {
		s.writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, itemsJSON([]delivery.Item{it})[0])
}

// discardItem deletes an item that is not processing: 200 with the item
// as it was; 409 invalid_state while it is processing.
func (s *Server) discardItem(w http.ResponseWriter, r *http.Request) {
	var none struct{}
	inbox, id, ok := itemPath(w, r)
	if !ok || !decodeBody(w, r, &none, true) {
		return
	}
	it, err := s.ops.DiscardItem(r.Context(), inbox, id)
	if err != nil {
		s.writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, itemsJSON([]delivery.Item{it})[0])
}

// maxDiscardIDs bounds the ids of one discard request.
const maxDiscardIDs = 1000

// discardDeadLetters deletes every dead letter a selection names. An
// empty selection must say "all": true, so that nothing is deleted by
// accident.
func (s *Server) discardDeadLetters(w http.ResponseWriter, r *http.Request) {
	var req api.DiscardDeadLetters
	if !decodeBody(w, r, &req, false) {
		return
	}
	f, ok := deadLetterFilter(w, url.Values{"inbox": {req.Inbox}, "subscription": {req.Subscription}, "from": {req.From}, "to": {req.To}})
	if !ok {
		return
	}
	if len(req.IDs) > maxDiscardIDs {
		writeError(w, api.CodeInvalidField, "ids: at most %d at once (%d given)", maxDiscardIDs, len(req.IDs))
		return
	}
	for _, id := range req.IDs {
		if id < 1 {
			writeError(w, api.CodeInvalidField, "ids: %d is not an item id (a positive whole number)", id)
			return
		}
	}
	f.IDs = req.IDs
	if f.Empty() && !req.All {
		writeError(w, api.CodeMissingField, "name ids, an inbox, a subscription or a time range (from, to), or send \"all\": true to discard every dead letter")
		return
	}
	ids, err := s.ops.Discard(r.Context(), f)
	if err != nil {
		s.writeErr(w, err)
		return
	}
	if ids == nil {
		ids = []int64{}
	}
	writeJSON(w, http.StatusOK, api.Discarded{Discarded: len(ids), IDs: ids})
}
