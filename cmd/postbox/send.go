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
)

// sendChunk is how many events send posts in one request.
const sendChunk = 1000

// defaultSendParallel is send's --parallel: requests in flight, so that
// the agent's group commit takes several at once.
const defaultSendParallel = 8

func runSend(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "send", "--type TYPE --payload JSON [flags]", `Hands events to a running agent's intake. The agent fills in event_id, ts, session_id and
device_id when they are not given, and answers after its outbox commit. Prints one line per event
(event_id and status), or with --count above 1 a summary.`)
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
	// statuses keep the order of the events.
	chunks := (int(count) + sendChunk - 1) / sendChunk
	got := make([][]map[string]any, chunks)
	var queued atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
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
			var err error
			if got[c], err = postEvents(gctx, *agentURL, reqBody); err != nil {
				return err
			}
			if count > sendChunk {
				fmt.Fprintf(env.stderr, "send: %d/%d queued\n", queued.Add(int64(n)), count)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	var statuses []map[string]any
	for _, s := range got {
		statuses = append(statuses, s...)
	}
	switch {
	case *asJSON:
		b, _ := json.Marshal(statuses)
		fmt.Fprintln(env.stdout, string(b))
	case count == 1:
		fmt.Fprintf(env.stdout, "%s\t%s\n", statuses[0]["event_id"], statuses[0]["status"])
	default:
		fmt.Fprintf(env.stdout, "%d events queued\n", len(statuses))
	}
	return nil
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
func postEvents(ctx context.Context, agentURL string, body []byte) ([]map[string]any, error) {
	// The agent answers once its outbox committed: seconds at most, unless
	// it hangs.
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(agentURL, "/")+"/v1/events", bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("send: --agent: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
		return nil, fmt.Errorf("send: the agent at %s did not answer within %v", agentURL, apiTimeout)
	}
	if err != nil {
		return nil, fmt.Errorf("send: is the agent running? %w", err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var out struct {
		Events []map[string]any `json:"events"`
		Error  *struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, fmt.Errorf("send: the agent answered %s: %.200s", resp.Status, data)
	}
	if out.Error != nil {
		return nil, fmt.Errorf("send: the agent refused the events (%s, %s): %s", resp.Status, out.Error.Code, out.Error.Message)
	}
	if resp.StatusCode == http.StatusConflict {
		return out.Events, fmt.Errorf("send: an event id is queued already with another payload: %v", out.Events)
	}
	return out.Events, nil
}
