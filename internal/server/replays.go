package server

import (
	"net/http"
	"time"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/delivery"
)

// The replay API (docs/API.md#replays): every completed and failed item a
// subscription made in a time range delivered again, as a background job
// whose progress GET /v1/replays/{id} shows.

// toReplayJSON is j in the API.
func toReplayJSON(j delivery.ReplayJob) api.Replay {
	out := api.Replay{ID: j.ID, Subscription: j.Subscription, Inbox: j.Inbox, Since: j.Since, Until: j.Until, States: j.States,
		BatchSize: j.BatchSize, State: j.State, Matched: j.Matched, Replayed: j.Replayed, Batches: j.Batches, Reached: j.Reached,
		CreatedAt: j.CreatedAt, UpdatedAt: j.UpdatedAt, FinishedAt: j.FinishedAt}
	if j.Error != "" {
		out.Error = &j.Error
	}
	return out
}

// replaySubscription starts a replay of a range of the subscription's
// items: 202 with the job and its URL in Location; 400 naming the field
// for a bad time or state; 404 for an unknown subscription; 409 when one
// of its replays is running.
func (s *Server) replaySubscription(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if !checkName(w, "subscription", name) {
		return
	}
	var req api.ReplayRange
	if !decodeBody(w, r, &req, false) {
		return
	}
	rr := delivery.ReplayRange{Subscription: name, States: req.States, BatchSize: req.BatchSize}
	if req.Since == "" {
		writeError(w, api.CodeMissingField, "since: required: the RFC 3339 time the range starts at, such as 2026-11-21T10:00:00Z")
		return
	}
	for _, f := range []struct {
		name, v string
		t       *time.Time
	}{{"since", req.Since, &rr.Since}, {"until", req.Until, &rr.Until}} {
		if f.v == "" {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, f.v)
		if err != nil {
			writeError(w, api.CodeInvalidField, "%s %q: want an RFC 3339 time such as 2026-11-21T10:00:00Z", f.name, f.v)
			return
		}
		*f.t = t
	}
	for _, st := range req.States {
		if st != delivery.StateCompleted && st != delivery.StateFailed {
			writeError(w, api.CodeInvalidField, "states: %q: use completed, failed or both (pending and processing items are delivered already)", st)
			return
		}
	}
	job, err := s.replayJobs.ReplayRange(r.Context(), rr)
	if err != nil {
		s.writeErr(w, err)
		return
	}
	w.Header().Set("Location", "/v1/replays/"+job.ID)
	writeJSON(w, http.StatusAccepted, toReplayJSON(job))
}

// getReplay answers a replay job with its progress, or 404.
func (s *Server) getReplay(w http.ResponseWriter, r *http.Request) {
	job, err := s.replayJobs.ReplayJob(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, toReplayJSON(job))
}

// listReplays answers the replay jobs, newest first: of one subscription
// with ?subscription=NAME.
func (s *Server) listReplays(w http.ResponseWriter, r *http.Request) {
	sub := r.URL.Query().Get("subscription")
	if sub != "" && !checkName(w, "subscription", sub) {
		return
	}
	jobs, err := s.replayJobs.ReplayJobs(r.Context(), sub)
	if err != nil {
		s.writeErr(w, err)
		return
	}
	out := make([]api.Replay, len(jobs))
	for i, j := range jobs {
		out[i] = toReplayJSON(j)
	}
	writeJSON(w, http.StatusOK, api.ReplayList{Replays: out})
}
