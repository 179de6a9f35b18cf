package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// The replay commands: subscriptions replay starts a replay of a time
// range (POST /v1/subscriptions/{name}/replay) and, with --wait, follows
// it; replays get shows one (GET /v1/replays/{id}).

// init adds the commands to their groups, which main.go and
// subscriptions.go declare.
func init() {
	subscriptionCommands = append(subscriptionCommands, subcommand{"replay",
		"deliver again every completed and failed item a subscription made in a time range", runSubscriptionsReplay})
	commands["replays"] = command{"show replays of a time range (postbox subscriptions replay starts them)", runReplays}
}

var replayCommands = []subcommand{
	{"get", "show a replay's progress", runReplaysGet},
}

func runReplays(ctx context.Context, env *cmdEnv, args []string) error {
	return runGroup(ctx, env, "replays", replayCommands, args)
}

// replayJob is a replay job as the API answers it.
type replayJob struct {
	ID           string   `json:"id"`
	Subscription string   `json:"subscription"`
	Inbox        string   `json:"inbox"`
	Since        apiTime  `json:"since"`
	Until        apiTime  `json:"until"`
	States       []string `json:"states"`
	State        string   `json:"state"`
	Matched      int64    `json:"matched"`
	Replayed     int64    `json:"replayed"`
	Batches      int64    `json:"batches"`
	Reached      apiTime  `json:"reached"`
	Error        *string  `json:"error"`
	CreatedAt    apiTime  `json:"created_at"`
	FinishedAt   apiTime  `json:"finished_at"`
}

// progress is one line of a job's progress.
func (j replayJob) progress() string {
	s := fmt.Sprintf("replay %s: %s, %d of %d items replayed", j.ID, j.State, j.Replayed, j.Matched)
	if j.Error != nil {
		s += ": " + *j.Error
	}
	return s
}

func runSubscriptionsReplay(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "subscriptions replay", "NAME --since T [--until T] [--states completed,failed] [--wait] [flags]",
		`Delivers again every item the subscription NAME made (when its event reached the inbox) at or
after --since and before --until (default: now): completed and failed ones, or those --states
names. Each goes back to pending with a fresh attempt budget; its attempt log is kept.
Pending and processing items are on their way already and are left alone. The server
replays them in the background, 1000 per transaction; this prints the job's id, and with
--wait follows it to its end, printing its progress on stderr. --since and --until take an
RFC 3339 time or how long ago (90m, 2h30m, 7d). postbox replays get ID shows a job.`)
	af := addAPIFlags(fs, "print the job's JSON (with --wait: at its end)")
	since := fs.String("since", "", "replay the items made at or after "+whenHelp+" (required)")
	until := fs.String("until", "", "replay the items made before "+whenHelp+" (default: now)")
	states := fs.String("states", "completed,failed", "the `states` to replay: completed, failed or both")
	wait := fs.Bool("wait", false, "follow the job to its end, its progress on stderr")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	name, err := nameArg(fs)
	if err != nil {
		return err
	}
	if err := checkName("subscriptions replay", "NAME", name); err != nil {
		return err
	}
	if *since == "" {
		return usagef("subscriptions replay: --since is required: the start of the range")
	}
	now := time.Now()
	body := map[string]any{}
	for _, f := range []struct{ name, value string }{{"since", *since}, {"until", *until}} {
		if f.value == "" {
			continue
		}
		t, err := parseWhen(f.value, now)
		if err != nil {
			return usagef("subscriptions replay: --%s %v", f.name, err)
		}
		body[f.name] = t.UTC().Format(time.RFC3339Nano)
	}
	var list []string
	for _, s := range strings.Split(*states, ",") {
		s = strings.TrimSpace(s)
		if s != "completed" && s != "failed" {
			return usagef("subscriptions replay: --states %q: use completed, failed or both (completed,failed)", s)
		}
		list = append(list, s)
	}
	body["states"] = list
	var raw json.RawMessage
	if _, err := c.do(ctx, http.MethodPost, "/v1/subscriptions/"+url.PathEscape(name)+"/replay", body, &raw); err != nil {
		return fmt.Errorf("subscriptions replay %s: %w", name, err)
	}
	var j replayJob
	if err := json.Unmarshal(raw, &j); err != nil {
		return fmt.Errorf("subscriptions replay %s: the server's answer: %w", name, err)
	}
	if *wait {
		fmt.Fprintln(env.stderr, j.progress())
		if raw, j, err = followReplay(ctx, env, c, j); err != nil {
			return fmt.Errorf("subscriptions replay %s: %w", name, err)
		}
	}
	if af.json {
		return printJSON(env, raw)
	}
	fmt.Fprintln(env.stdout, j.ID)
	if j.State == "failed" {
		return fmt.Errorf("subscriptions replay %s: %s", name, j.progress())
	}
	return nil
}

// replayPoll is how often --wait asks for a job's progress.
const replayPoll = 500 * time.Millisecond

// followReplay polls job until it ends, printing its progress on stderr
// when it moves.
func followReplay(ctx context.Context, env *cmdEnv, c *apiClient, j replayJob) (json.RawMessage, replayJob, error) {
	var raw json.RawMessage
	last := j.Replayed
	for j.State == "running" {
		select {
		case <-ctx.Done():
			return nil, j, fmt.Errorf("stopped waiting; the replay goes on: postbox replays get %s", j.ID)
		case <-time.After(replayPoll):
		}
		var err error
		if raw, err = c.get(ctx, "/v1/replays/"+url.PathEscape(j.ID), &j); err != nil {
			return nil, j, err
		}
		if j.Replayed != last || j.State != "running" {
			fmt.Fprintln(env.stderr, j.progress())
			last = j.Replayed
		}
	}
	if raw == nil {
		b, _ := json.Marshal(j)
		raw = b
	}
	return raw, j, nil
}

func runReplaysGet(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "replays get", "ID [flags]", `Shows the replay ID: its subscription and range, its state (running, completed or failed),
how many items it matched when it started and how many it has replayed, and its error.`)
	af := addAPIFlags(fs, "print the job's JSON")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	id, err := args1(fs, "ID")
	if err != nil {
		return err
	}
	var j replayJob
	raw, err := c.get(ctx, "/v1/replays/"+url.PathEscape(id), &j)
	if err != nil {
		return fmt.Errorf("replays get %s: %w", id, err)
	}
	if af.json {
		return printJSON(env, raw)
	}
	errText := ""
	if j.Error != nil {
		errText = *j.Error
	}
	return printFields(env, [][2]string{
		{"id", j.ID}, {"subscription", j.Subscription}, {"inbox", j.Inbox}, {"since", j.Since.String()}, {"until", j.Until.String()},
		{"states", strings.Join(j.States, ",")}, {"state", j.State}, {"matched", fmt.Sprint(j.Matched)},
		{"replayed", fmt.Sprint(j.Replayed)}, {"batches", fmt.Sprint(j.Batches)}, {"reached", j.Reached.String()},
		{"created_at", j.CreatedAt.String()}, {"finished_at", j.FinishedAt.String()}, {"error", errText},
	})
}
