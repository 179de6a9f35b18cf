package agent

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/httproute"
	"github.com/postbox-events/postbox/internal/tracing"
	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxsqlite"
)

// MaxIntakeBytes bounds one intake request body.
const MaxIntakeBytes = 64 << 20

// DefaultReadTimeout is Config.ReadTimeout's default.
const DefaultReadTimeout = 30 * time.Second

// intake is the agent's local HTTP API.
type intake struct {
	store       *outboxsqlite.Store
	deviceID    string
	sessionID   string
	limits      postbox.Limits
	readTimeout time.Duration // Config.ReadTimeout
	log         *slog.Logger
	m           *metrics
}

func (in *intake) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/events", in.handleEvents)
	mux.HandleFunc("GET /v1/outbox", in.handleOutbox)
	mux.Handle("GET /metrics", promhttp.HandlerFor(in.m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	// What no route takes, in JSON as every other error.
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if allow := httproute.Allowed(mux, r); len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			writeError(w, http.StatusMethodNotAllowed, api.CodeMethodNotAllowed, "", r.Method+" "+r.URL.Path+": this path takes "+strings.Join(allow, ", "), -1)
			return
		}
		writeError(w, http.StatusNotFound, api.CodeNotFound, "", "no route "+r.Method+" "+r.URL.Path+" (the intake takes POST /v1/events)", -1)
	})
	return mux
}

// handleEvents queues one envelope (a JSON object) or many (an array).
// Missing schema_version, event_id, ts, session_id and device_id are filled
// in. Every envelope is validated before any is queued: one bad envelope
// fails the request with 400 naming it and its field, and queues nothing.
// 202 comes after the outbox commit.
func (in *intake) handleEvents(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxIntakeBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			writeError(w, http.StatusRequestEntityTooLarge, api.CodeTooLarge, "", fmt.Sprintf("request body over %d bytes", MaxIntakeBytes), -1)
		case errors.Is(err, os.ErrDeadlineExceeded):
			writeError(w, http.StatusRequestTimeout, api.CodeRequestTimeout, "", fmt.Sprintf("the request body did not arrive within %v", in.readTimeout), -1)
		default: // the body ended before its JSON did
			writeError(w, http.StatusBadRequest, api.CodeInvalidJSON, "", "the request body could not be read: it ended early", -1)
		}
		return
	}
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		writeError(w, http.StatusBadRequest, api.CodeInvalidJSON, "", "empty body: send an event object or an array of them", -1)
		return
	}
	single := trimmed[0] != '['
	raws, err := postbox.SplitFrame(trimmed)
	if err != nil {
		// The protocol's words for a WebSocket frame, said of a body.
		msg := strings.Replace(err.Error(), "frame must be an envelope object or an array of envelopes", "the body must be an event object or an array of them", 1)
		writeError(w, http.StatusBadRequest, api.CodeInvalidJSON, "", msg, -1)
		return
	}
	if len(raws) == 0 {
		writeError(w, http.StatusBadRequest, api.CodeInvalidJSON, "", "empty array: send at least one event", -1)
		return
	}
	traceparent, tracestate := requestTrace(r)
	envs := make([]postbox.Envelope, len(raws))
	now := time.Now().UTC().Format(time.RFC3339Nano)
	// What fill and the request's trace context can add to an envelope, at
	// most: one this close to the limit is measured again once filled, as
	// the server will measure it.
	filled := 512 + len(in.deviceID) + len(in.sessionID) + len(traceparent) + len(tracestate)
	maxBytes := cmp.Or(in.limits.MaxEnvelopeBytes, postbox.DefaultMaxEnvelopeBytes)
	for i, raw := range raws {
		env, err := postbox.ParseEnvelope(raw, in.limits)
		if err == nil {
			in.fill(&env, now)
			if env.TraceParent == "" && env.TraceState == "" {
				env.TraceParent, env.TraceState = traceparent, tracestate
			}
			err = env.Validate(in.limits)
		}
		if err == nil && len(raw)+filled > maxBytes {
			if b, _ := env.AppendJSON(nil); len(b) > maxBytes {
				err = &postbox.FieldError{Code: postbox.CodeTooLarge, Message: fmt.Sprintf(
					"envelope is %d bytes once its missing fields are filled in, over the limit of %d", len(b), maxBytes)}
			}
		}
		if err == nil && env.DeliverAt != "" {
			// The outbox keeps an envelope's fields, and has none for it:
			// refused rather than sent at once.
			err = &postbox.FieldError{Field: "deliver_at", Code: postbox.CodeInvalidField,
				Message: "deliver_at: the agent's outbox does not carry a delivery time; send a scheduled event to the server's ingress"}
		}
		if err == nil && env.DeviceID != in.deviceID {
			err = &postbox.FieldError{Field: "device_id", Code: postbox.CodeForbidden, Message: fmt.Sprintf("device_id: this agent sends for %q, not %q", in.deviceID, env.DeviceID)}
		}
		if err != nil {
			fe := postbox.Nack("", err)
			idx := i
			if single {
				idx = -1
			}
			in.m.intake.WithLabelValues("invalid").Inc()
			code, status := fe.Code, http.StatusBadRequest
			switch code {
			case postbox.CodeUnavailable: // not an envelope's fault: Nack's code for an error without one
				code = postbox.CodeInvalidField
			case postbox.CodeTooLarge:
				status = http.StatusRequestEntityTooLarge
			}
			writeError(w, status, code, fe.Field, fe.Message, idx)
			return
		}
		envs[i] = env
	}
	results, err := in.store.Insert(r.Context(), envs)
	if err != nil {
		in.log.Error("agent intake: outbox insert failed", "err", err, "events", len(envs))
		writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "", "the outbox could not store the events; nothing was queued: "+err.Error(), -1)
		return
	}
	out := make([]api.AgentEvent, len(results))
	status := http.StatusAccepted
	for i, res := range results {
		out[i] = api.AgentEvent{EventID: res.EventID, Status: api.AgentQueued}
		switch {
		case errors.Is(res.Err, outboxsqlite.ErrRejected):
			reason := ""
			if re, ok := errors.AsType[*outboxsqlite.RejectedError](res.Err); ok {
				reason = re.Reason
			}
			out[i].Status, out[i].Message = api.AgentRejected, "event_id is in the outbox, refused by the server ("+reason+"): it is not sent again unless requeued (postbox outbox requeue)"
			status = http.StatusConflict
		case res.Err != nil:
			out[i].Status, out[i].Message = api.AgentConflict, "event_id is queued already with a different type or payload; this one was not queued"
			status = http.StatusConflict
		case res.Duplicate:
			out[i].Status = api.AgentDuplicate
		}
	}
	for _, o := range out {
		in.m.intake.WithLabelValues(o.Status).Inc()
	}
	if single {
		writeJSON(w, status, out[0])
		return
	}
	writeJSON(w, status, api.AgentEvents{Events: out})
}

// requestTrace returns the W3C trace context of the request's traceparent
// and tracestate headers, which events without one of their own take. One
// that is not valid is ignored, as W3C Trace Context asks of a receiver.
func requestTrace(r *http.Request) (traceparent, tracestate string) {
	traceparent = r.Header.Get(tracing.HeaderTraceParent)
	if traceparent == "" || postbox.CheckTraceParent(traceparent) != nil {
		return "", ""
	}
	tracestate = r.Header.Get(tracing.HeaderTraceState)
	if postbox.CheckTraceState(tracestate) != nil {
		tracestate = ""
	}
	return traceparent, tracestate
}

// fill sets the fields a producer may leave out.
func (in *intake) fill(env *postbox.Envelope, now string) {
	if env.SchemaVersion == 0 {
		env.SchemaVersion = postbox.SchemaVersion
	}
	if env.EventID == "" {
		env.EventID = outbox.NewEventID()
	}
	if env.TS == "" {
		env.TS = now
	}
	if env.SessionID == "" {
		env.SessionID = in.sessionID
	}
	if env.DeviceID == "" {
		env.DeviceID = in.deviceID
	}
}

func (in *intake) handleOutbox(w http.ResponseWriter, r *http.Request) {
	pending, rejected, err := in.store.Counts(r.Context())
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "", err.Error(), -1)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int64{"pending": pending, "rejected": rejected})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// intakeCode is a code the intake answers an error with: one of the API's
// (api.Codes) or, for an envelope refused, the protocol's NACK codes
// (postbox.Code), so that a client of the server and of the agent reads
// the same codes.
type intakeCode interface{ api.Code | postbox.Code }

// writeError writes {"error":{"code","message","field","index"}}; index
// is the position of the refused event in an array, or -1.
func writeError[C intakeCode](w http.ResponseWriter, status int, code C, field, msg string, index int) {
	e := map[string]any{"code": string(code), "message": msg}
	if field != "" {
		e["field"] = field
	}
	if index >= 0 {
		e["index"] = index
		e["message"] = "event " + strconv.Itoa(index) + ": " + msg
	}
	writeJSON(w, status, map[string]any{"error": e})
}
