package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/intake"
	"github.com/postbox-events/postbox/stream"
)

// CloudEvents on POST /webhooks are parsed by internal/intake; what is
// left here needs the store: a CloudEvent sent again after the upgrade
// that keyed CloudEvents by source and id.

// Before postbox keyed CloudEvents by source and id, their key was the
// id alone. A store that held webhooks then (markerCloudEventsByID) may
// hold such events, and a CloudEvent sent again after the upgrade is
// looked for under its id too, so that it stays the duplicate it is.
const (
	markerCloudEventsBySource = "cloudevents-keyed-by-source"
	markerCloudEventsByID     = "cloudevents-keyed-by-id-before"
)

// cloudEventsKeys records, the first time this version runs on a store,
// whether the store is older (it made its default webhook source before),
// and sets s.wh.ceByID from the record.
func (s *Server) cloudEventsKeys(ctx context.Context) error {
	err := s.delivery.Once(ctx, markerCloudEventsBySource, func(ctx context.Context) error {
		older, err := s.delivery.Marked(ctx, markerWebhookSource)
		if err != nil || !older {
			return err
		}
		return s.delivery.Once(ctx, markerCloudEventsByID, func(context.Context) error { return nil })
	})
	if err != nil {
		return fmt.Errorf("cloudevents keys: %w", err)
	}
	byID, err := s.delivery.Marked(ctx, markerCloudEventsByID)
	if err != nil {
		return fmt.Errorf("cloudevents keys: %w", err)
	}
	s.wh.ceByID.Store(byID)
	return nil
}

// cloudEventByID returns the event of source stored under ce's id alone
// by an older postbox, when it is this CloudEvent (its source is ce's).
func (s *Server) cloudEventByID(ctx context.Context, source string, ce *intake.CloudEvent) (stream.StoredEvent, bool, error) {
	prev, err := s.streams.Lookup(ctx, source, ce.ID, "")
	if errors.Is(err, stream.ErrNotFound) || errors.Is(err, stream.ErrStreamNotFound) {
		return stream.StoredEvent{}, false, nil
	}
	if err != nil {
		return stream.StoredEvent{}, false, err
	}
	var meta struct {
		CE struct {
			ID     string `json:"id"`
			Source string `json:"source"`
		} `json:"cloudevents"`
	}
	if json.Unmarshal(prev.Metadata, &meta) != nil || meta.CE.ID != ce.ID || meta.CE.Source != ce.Source {
		return stream.StoredEvent{}, false, nil // another source's, or a webhook's key
	}
	return prev, true, nil
}

// answeredByID reports whether the CloudEvent ce of source, whose event
// is ev, was answered here: as the duplicate (or conflict) of the event
// an older postbox stored under its id alone (cloudEventByID), or with
// 503 when that could not be looked for.
func (s *Server) answeredByID(w http.ResponseWriter, r *http.Request, source string, ce *intake.CloudEvent, ev stream.Event) bool {
	prev, found, err := s.cloudEventByID(r.Context(), source, ce)
	if err != nil {
		if r.Context().Err() == nil {
			s.metrics.Count(source, "unavailable", 1)
			w.Header().Set("Retry-After", "1")
			writeError(w, api.CodeUnavailable, "CloudEvent %q from %q: looking for it among the events stored before postbox keyed them by source: %v; send it again", ce.ID, ce.Source, err)
		}
		return true
	}
	if found {
		s.answerStored(w, r, source, prev.NativeID, prev, storedAgain(prev, ev))
	}
	return found
}

// storedAgain is what appending ev again under prev's key reports: a
// duplicate when its type and payload are prev's (the payload's
// whitespace aside, as for every webhook), else the conflict it is.
func storedAgain(prev stream.StoredEvent, ev stream.Event) stream.AppendResult {
	switch {
	case prev.Type != ev.Type:
		return stream.AppendResult{Err: &stream.ConflictError{Field: stream.FieldType}}
	case !bytes.Equal(postbox.AppendCompact(nil, prev.Payload), postbox.AppendCompact(nil, ev.Payload)):
		return stream.AppendResult{Err: &stream.ConflictError{Field: stream.FieldPayload}}
	}
	return stream.AppendResult{Offset: prev.Offset, StoredAt: prev.StoredAt, Duplicate: true}
}
