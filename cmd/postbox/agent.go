package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/internal/agent"
	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxsqlite"
)

func runAgent(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "agent", "--server URL --outbox FILE --device-id ID [flags]", `Runs the edge agent: a durable SQLite outbox, a local HTTP intake (POST /v1/events answers 202
after the outbox commit) and a sender that keeps a window of events in flight over one WebSocket,
deletes each row only on its ACK, keeps refused rows as rejected, and reconnects with exponential
backoff and full jitter. Unsent events are resumed after a restart.`)
	server := fs.String("server", "", "the control plane's ingress, ws://HOST:PORT (wss:// for TLS) [POSTBOX_SERVER]")
	path := fs.String("outbox", "outbox.db", "outbox SQLite file [POSTBOX_OUTBOX]")
	device := fs.String("device-id", "", "this device's id, filled into events without one [POSTBOX_DEVICE_ID]")
	listen := fs.String("listen", "127.0.0.1:8787", "address of the local intake [POSTBOX_AGENT_LISTEN]")
	token := fs.String("token", "", "bearer token for the server [POSTBOX_TOKEN]")
	caCert := fs.String("ca-cert", "", "PEM file of the CA (or self-signed certificate) a wss:// server must present; default: the system's roots [POSTBOX_CA_CERT]")
	session := fs.String("session-id", "", "session id filled into events without one (default: a new one per run)")
	sync := fs.String("synchronous", "FULL", "outbox SQLite synchronous mode: FULL or NORMAL")
	window := positiveInt(outbox.DefaultMaxInFlight)
	fs.Var(&window, "window", "most `events` sent and not yet answered")
	batch := positiveInt(outbox.DefaultBatchSize)
	fs.Var(&batch, "batch", "most `events` per frame")
	backoffMax := fs.Duration("backoff-max", outbox.DefaultReconnectMax, "cap of the reconnect backoff")
	retryMax := fs.Duration("retry-max", outbox.DefaultRetryMax, "cap of the delay before resending an event the server could not store")
	ackTimeout := fs.Duration("ack-timeout", 30*time.Second, "how long to wait for replies before giving the connection up")
	level := fs.String("log-level", "info", "debug, info, warn or error [LOG_LEVEL]")
	format := fs.String("log-format", "pretty", "json or pretty [LOG_FORMAT]")
	if err := parse(env, fs, args); err != nil {
		return err
	}
	if err := envDefaults(env, fs, map[string]string{"server": "POSTBOX_SERVER", "outbox": "POSTBOX_OUTBOX", "device-id": "POSTBOX_DEVICE_ID",
		"listen": "POSTBOX_AGENT_LISTEN", "token": "POSTBOX_TOKEN", "ca-cert": "POSTBOX_CA_CERT", "log-level": "LOG_LEVEL", "log-format": "LOG_FORMAT"}); err != nil {
		return err
	}
	if *server == "" || *device == "" {
		return usagef("agent: --server and --device-id are required")
	}
	log, err := newLogger(env.stderr, *level, *format)
	if err != nil {
		return err
	}
	a, err := agent.New(agent.Config{
		Server: *server, OutboxPath: *path, DeviceID: *device, SessionID: *session, Listen: *listen, Token: *token, CACert: *caCert,
		Synchronous: strings.ToUpper(*sync), AckTimeout: *ackTimeout, Logger: log,
		Relay: outbox.RelayConfig{
			BatchSize: int(batch), MaxInFlight: int(window),
			Retry:     outbox.Backoff{Base: outbox.DefaultRetryBase, Max: *retryMax},
			Reconnect: outbox.Backoff{Base: outbox.DefaultReconnectBase, Max: *backoffMax},
		},
	})
	if err != nil {
		return err
	}
	return a.Run(ctx)
}

func runSend(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "send", "--type TYPE --payload JSON [flags]", `Hands events to a running agent's intake. The agent fills in event_id, ts, session_id and
device_id when they are not given, and answers after its outbox commit. Prints one line per event
(event_id and status), or with --count above 1 a summary.`)
	agentURL := fs.String("agent", "http://127.0.0.1:8787", "the agent's intake [POSTBOX_AGENT]")
	typ := fs.String("type", "", "event type, e.g. proposal.task")
	payload := fs.String("payload", "", "the payload: a JSON object, @FILE, or @- for stdin")
	count := positiveInt(1)
	fs.Var(&count, "count", "send this many `events` (each with a new event_id)")
	eventID := fs.String("event-id", "", "event id (only with --count 1); default: the agent makes one")
	device := fs.String("device-id", "", "device id; default: the agent's")
	session := fs.String("session-id", "", "session id; default: the agent's")
	asJSON := fs.Bool("json", false, "print the agent's answers as JSON")
	if err := parse(env, fs, args); err != nil {
		return err
	}
	if err := envDefaults(env, fs, map[string]string{"agent": "POSTBOX_AGENT"}); err != nil {
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
	var statuses []map[string]any
	const chunk = 1000
	for sent := 0; sent < int(count); sent += chunk {
		n := min(chunk, int(count)-sent)
		envs := make([]postbox.Envelope, n)
		for i := range envs {
			envs[i] = postbox.Envelope{EventID: *eventID, Type: *typ, DeviceID: *device, SessionID: *session, Payload: body}
		}
		reqBody, err := json.Marshal(envs)
		if err != nil {
			return err
		}
		got, err := postEvents(ctx, *agentURL, reqBody)
		if err != nil {
			return err
		}
		statuses = append(statuses, got...)
		if count > chunk {
			fmt.Fprintf(env.stderr, "send: %d/%d queued\n", len(statuses), count)
		}
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
			return nil, fmt.Errorf("send: --payload: %w", err)
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
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(agentURL, "/")+"/v1/events", bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("send: --agent: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
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

func runOutbox(ctx context.Context, env *cmdEnv, args []string) error {
	sub := ""
	if len(args) > 0 {
		sub, args = args[0], args[1:]
	}
	switch sub {
	case "list":
		return runOutboxList(ctx, env, args)
	case "requeue":
		return runOutboxRequeue(ctx, env, args)
	case "", "-h", "--help", "help":
		fmt.Fprint(env.stdout, `Usage: postbox outbox list|requeue [flags]

  list      show the outbox's rows (default: the rejected ones, with the server's reason)
  requeue   make rejected rows pending again, so the agent sends them again

postbox outbox COMMAND --help shows a command's flags.
`)
		if sub == "" {
			return usagef("outbox: no command given")
		}
		return nil
	}
	return usagef("outbox: unknown command %q (list, requeue)", sub)
}

func openOutbox(path string) (*outboxsqlite.Store, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("outbox %s: %w", path, err)
	}
	return outboxsqlite.Open(path, outboxsqlite.Config{})
}

func runOutboxList(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "outbox list", "[flags]", "Lists outbox rows, oldest first. Works while the agent runs.")
	path := fs.String("outbox", "outbox.db", "outbox SQLite file [POSTBOX_OUTBOX]")
	state := fs.String("state", "rejected", "rejected, pending or all")
	limit := positiveInt(100)
	fs.Var(&limit, "limit", "most `rows` to show")
	asJSON := fs.Bool("json", false, "print a JSON array")
	if err := parse(env, fs, args); err != nil {
		return err
	}
	if err := envDefaults(env, fs, map[string]string{"outbox": "POSTBOX_OUTBOX"}); err != nil {
		return err
	}
	switch *state {
	case "all":
		*state = ""
	case outboxsqlite.StatePending, outboxsqlite.StateRejected:
	default:
		return usagef("outbox list: --state must be rejected, pending or all, not %q", *state)
	}
	store, err := openOutbox(*path)
	if err != nil {
		return err
	}
	defer store.Close()
	rows, err := store.List(ctx, *state, int(limit))
	if err != nil {
		return err
	}
	if *asJSON {
		if rows == nil {
			rows = []outboxsqlite.Row{}
		}
		b, _ := json.Marshal(rows)
		fmt.Fprintln(env.stdout, string(b))
		return nil
	}
	tw := tabwriter.NewWriter(env.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "EVENT_ID\tTYPE\tSTATE\tATTEMPTS\tCREATED\tLAST_ERROR")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", r.EventID, r.Type, r.State, r.Attempts, r.CreatedAt.Format(time.RFC3339), r.LastError)
	}
	return tw.Flush()
}

func runOutboxRequeue(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "outbox requeue", "(EVENT_ID... | --all) [flags]", "Makes rejected rows pending and due now; a running agent sends them within its poll interval.")
	path := fs.String("outbox", "outbox.db", "outbox SQLite file [POSTBOX_OUTBOX]")
	all := fs.Bool("all", false, "requeue every rejected row")
	if err := parse(env, fs, args); err != nil {
		return err
	}
	if err := envDefaults(env, fs, map[string]string{"outbox": "POSTBOX_OUTBOX"}); err != nil {
		return err
	}
	if *all == (fs.NArg() > 0) {
		return usagef("outbox requeue: name event ids or pass --all (not both)")
	}
	store, err := openOutbox(*path)
	if err != nil {
		return err
	}
	defer store.Close()
	n, err := store.Requeue(ctx, fs.Args())
	if err != nil {
		return err
	}
	fmt.Fprintf(env.stdout, "%d rejected events requeued\n", n)
	if n == 0 && fs.NArg() > 0 {
		return fmt.Errorf("outbox requeue: none of %v is a rejected row", fs.Args())
	}
	return nil
}
