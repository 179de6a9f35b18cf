package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync/atomic"

	"golang.org/x/sync/errgroup"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/api"
)

// sendChunk is how many events send posts in one request.
const sendChunk = 1000

// defaultSendParallel is send's --parallel: requests in flight, so that
// the agent's group commit takes several at once.
const defaultSendParallel = 8

func runSend(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "send", "--type TYPE --payload JSON [flags]", `Hands events to a running agent's intake. The agent fills in event_id, ts, session_id and
device_id when they are not given, and answers after its outbox commit. Prints one line per event
(event_id and status), or with --count above 1 a summary. When a request fails, the answers
received are printed all the same, each failed request is named on stderr with its events,
requests not started are not sent, and send exits 1.`)
	agent := httpURL("http://127.0.0.1:8787")
	fs.Var(&agent, "agent", "the agent's intake, an http:// `URL` [POSTBOX_AGENT]")
	agentURL := (*string)(&agent)
	typ := fs.String("type", "", "event type, e.g. proposal.task")
	payload := fs.String("payload", "", "the payload: a JSON object, @FILE, or @- for stdin")
	count := positiveInt(1)
	fs.Var(&count, "count", "send this many `events` (each with a new event_id)")
	eventID := fs.String("event-id", "", "event id (only with --count 1); default: the agent makes one")
	device := fs.String("device-id", "", "device id; default: the agent's")
	session := fs.String("session-id", "", "session id; default: the agent's")
	parallel := positiveInt(defaultSendParallel)
	fs.Var(&parallel, "parallel", "with --count above 1: `requests` of 1,000 events in flight at once")
	asJSON := fs.Bool("json", false, "print the agent's answers as JSON")
	if err := parse(env, fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	if *typ == "" || *payload == "" {
		return usagef("send: --type and --payload are required")
	}
	if *eventID != "" && count > 1 {
		return usagef("send: --event-id goes with --count 1")
	}
	body, err := readPayload(*payload)
	if err != nil {
		return err
	}
	// Requests of sendChunk events, up to --parallel in flight; the
	// statuses keep the order of the events. A request that fails stops
	// the requests not started yet, not those in flight: the agent may
	// queue their events, and their ids are printed with every other
	// answer, so that a caller that sends again knows what is queued
	// already (a retry of everything would queue it twice, under new ids).
	chunks := (int(count) + sendChunk - 1) / sendChunk
	replies := make([]sendReply, chunks)
	var queued atomic.Int64
	var failed atomic.Bool
	var g errgroup.Group
	g.SetLimit(int(parallel))
	for c := range chunks {
		n := min(sendChunk, int(count)-c*sendChunk)
		envs := make([]postbox.Envelope, n)
		for i := range envs {
			envs[i] = postbox.Envelope{EventID: *eventID, Type: *typ, DeviceID: *device, SessionID: *session, Payload: body}
		}
		reqBody, err := json.Marshal(envs)
		if err != nil {
			return err
		}
		g.Go(func() error {
			if failed.Load() {
				return nil // not sent
			}
			r := &replies[c]
			r.sent = true
			if r.statuses, r.err = postEvents(ctx, *agentURL, reqBody); r.err != nil {
				failed.Store(true)
				return nil
			}
			if count > sendChunk {
				fmt.Fprintf(env.stderr, "send: %d/%d queued\n", queued.Add(int64(n)), count)
			}
			return nil
		})
	}
	g.Wait()
	var statuses []api.AgentEvent
	for _, r := range replies {
		statuses = append(statuses, r.statuses...)
	}
	if len(statuses) > 0 {
		switch {
		case *asJSON:
			b, _ := json.Marshal(statuses)
			fmt.Fprintln(env.stdout, string(b))
		case count == 1:
			fmt.Fprintf(env.stdout, "%s\t%s\n", statuses[0].EventID, statuses[0].Status)
		default:
			fmt.Fprintf(env.stdout, "%d events queued\n", len(statuses))
		}
	}
	if chunks == 1 {
		if err := replies[0].err; err != nil {
			return fmt.Errorf("send: %w", err)
		}
		return nil
	}
	return sendFailures(env.stderr, replies, int(count), len(statuses))
}

// sendReply is what send got for one request.
type sendReply struct {
	sent     bool             // the request was made
	statuses []api.AgentEvent // the agent's answer for each event, if any
	err      error
}

// sendFailures writes a line on w for each request of replies that failed
// and one for those never sent, and returns the error send exits with;
// nil if every request succeeded. answered is how many events the agent
// answered for: their answers are printed.
func sendFailures(w io.Writer, replies []sendReply, count, answered int) error {
	failed, unsent := 0, 0
	events := func(c int) string {
		return fmt.Sprintf("events %d-%d", c*sendChunk+1, min((c+1)*sendChunk, count))
	}
	for c, r := range replies {
		switch {
		case r.err != nil:
			failed++
			fmt.Fprintf(w, "send: request %d of %d (%s) failed: %v\n", c+1, len(replies), events(c), r.err)
		case !r.sent:
			unsent++
			fmt.Fprintf(w, "send: request %d of %d (%s) was not sent: an earlier request failed\n", c+1, len(replies), events(c))
		}
	}
	if failed == 0 {
		return nil
	}
	return fmt.Errorf("send: %d of %d requests failed and %d were not sent; the agent answered for %d of %d events (printed above): the other %d were not answered",
		failed, len(replies), unsent, answered, count, count-answered)
}

// readPayload returns the payload flag's JSON object.
func readPayload(arg string) (json.RawMessage, error) {
	data := []byte(arg)
	if name, ok := strings.CutPrefix(arg, "@"); ok {
		var err error
		if name == "-" {
			data, err = io.ReadAll(os.Stdin)
		} else {
			data, err = os.ReadFile(name)
		}
		if err != nil {
			return nil, usagef("send: --payload: %v", err)
		}
	}
	data = bytes.TrimSpace(data)
	if !json.Valid(data) || len(data) == 0 || data[0] != '{' {
		return nil, usagef("send: --payload must be a JSON object, got %.60q", data)
	}
	return data, nil
}

// postEvents posts an array of envelopes to the intake and returns the
// per-event statuses.
func postEvents(ctx context.Context, agentURL string, body []byte) ([]api.AgentEvent, error) {
	// The agent answers once its outbox committed: seconds at most, unless
	// it hangs.
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(agentURL, "/")+"/v1/events", bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("--agent: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
		return nil, fmt.Errorf("the agent at %s did not answer within %v", agentURL, apiTimeout)
	}
	if err != nil {
		return nil, fmt.Errorf("is the agent running? %w", err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var out api.AgentEvents
	var refused api.ErrorResponse
	if json.Unmarshal(data, &out) != nil || json.Unmarshal(data, &refused) != nil {
		return nil, fmt.Errorf("the agent answered %s: %.200s", resp.Status, data)
	}
	if e := refused.Error; e.Code != "" || e.Message != "" {
		return nil, fmt.Errorf("the agent refused the events (%s, %s): %s", resp.Status, e.Code, e.Message)
	}
	if resp.StatusCode == http.StatusConflict {
		for _, ev := range out.Events {
			if ev.Status == api.AgentConflict || ev.Status == api.AgentRejected {
				return out.Events, fmt.Errorf("the agent did not queue event %s: %s: %s", ev.EventID, ev.Status, ev.Message)
			}
		}
		return out.Events, fmt.Errorf("the agent answered %s", resp.Status)
	}
	return out.Events, nil
}
