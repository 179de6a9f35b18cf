package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/intake"
	"github.com/postbox-events/postbox/internal/replyto"
)

// Replies to an item's event, sent by delivery to the url of its delivery
// handle (docs/API.md, "Replies").

func (s *Server) routeReplies() {
	for pattern, h := range map[string]http.HandlerFunc{
		"POST /v1/inboxes/{inbox}/items/{id}/reply":               s.postReply,
		"GET /v1/inboxes/{inbox}/items/{id}/replies":              s.listReplies,
		"POST /v1/inboxes/{inbox}/items/{id}/replies/{key}/retry": s.retryReply,
	} {
		s.handle(pattern, s.requireToken(h))
	}
}

func (s *Server) postReply(w http.ResponseWriter, r *http.Request) {
	inbox, id, ok := itemPath(w, r)
	var req api.ReplyRequest
	if !ok || !decodeBody(w, r, &req, false) {
		return
	}
	if len(req.Body) == 0 || string(req.Body) == "null" {
		writeError(w, api.CodeInvalidField, "body: required: the JSON postbox sends to the url of the item's delivery handle")
		return
	}
	rep, made, err := s.inboxes.Reply(r.Context(), inbox, id, req.Key, req.Body)
	if err != nil {
		s.writeErr(w, err)
		return
	}
	status := http.StatusOK // the reply the key already held
	if made {
		status = http.StatusAccepted
	}
	writeJSON(w, status, replyJSON(rep))
}

func (s *Server) listReplies(w http.ResponseWriter, r *http.Request) {
	inbox, id, ok := itemPath(w, r)
	if !ok {
		return
	}
	rs, err := s.inboxes.Replies(r.Context(), inbox, id)
	if err != nil {
		s.writeErr(w, err)
		return
	}
	out := api.ReplyList{Replies: make([]api.Reply, len(rs))}
	for i, rep := range rs {
		out.Replies[i] = replyJSON(rep)
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) retryReply(w http.ResponseWriter, r *http.Request) {
	inbox, id, ok := itemPath(w, r)
	if !ok {
		return
	}
	rep, err := s.inboxes.RetryReply(r.Context(), inbox, id, r.PathValue("key"))
	if err != nil {
		s.writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusAccepted, replyJSON(rep))
}

func replyJSON(r delivery.Reply) api.Reply {
	out := api.Reply{Key: r.Key, Item: r.Item, URL: r.URL, Body: r.Body, State: r.State, Attempts: r.Attempts,
		CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, AttemptLog: attemptsJSON(r.Log)}
	if r.State == delivery.ReplyPending {
		out.NextAttemptAt = &r.NextAttemptAt
	}
	if r.LastError != "" {
		out.LastError = &r.LastError
	}
	return out
}

// replySettings returns a function that reads the reply settings of a
// source from *srcs (set once the sources are open): the "reply" member of
// its settings. A stream with no source (the devices') has none.
func replySettings(srcs **intake.Store) delivery.ReplySettings {
	return func(ctx context.Context, source string) (replyto.Settings, error) {
		var set struct {
			Reply replyto.Settings `json:"reply"`
		}
		if *srcs == nil {
			return set.Reply, errors.New("the sources are not open yet")
		}
		src, err := (*srcs).Source(ctx, source)
		if errors.Is(err, intake.ErrNotFound) {
			return set.Reply, nil
		}
		if err != nil {
			return set.Reply, err
		}
		if err := json.Unmarshal(src.Settings, &set); err != nil {
			return set.Reply, fmt.Errorf("settings of source %s: %w", source, err)
		}
		return set.Reply, nil
	}
}
