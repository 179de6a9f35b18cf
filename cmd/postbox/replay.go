package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/postbox-events/postbox/api"
)

// The replay commands: subscriptions replay starts a replay of a time
// range (POST /v1/subscriptions/{name}/replay) and, with --wait, follows
// it; replays get shows one (GET /v1/replays/{id}).

// init adds the commands to their groups, which main.go and
// subscriptions.go declare.
func init() {
	subscriptionCommands = append(subscriptionCommands, subcommand{"replay",
		"deliver again every completed and failed item a subscription made in a time range", runSubscriptionsReplay})
	commands["replays"] = command{"show a replay's progress by its id (postbox subscriptions replay starts one)", runReplays}
}

var replayCommands = []subcommand{
	{"get", "show a replay's progress", runReplaysGet},
}

func runReplays(ctx context.Context, env *cmdEnv, args []string) error {
	return runGroup(ctx, env, "replays", replayCommands, args)
}

// progress is one line of a job's progress.
func progress(j api.Replay) string {
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
	var body api.ReplayRange
	for _, f := range []struct{ name, value string }{{"since", *since}, {"until", *until}} {
		if f.value == "" {
			continue
		}
		t, err := parseWhen(f.value, now)
		if err != nil {
			return usagef("subscriptions replay: --%s %v", f.name, err)
		}
		if f.name == "since" {
			body.Since = t.UTC().Format(time.RFC3339Nano)
		} else {
			body.Until = t.UTC().Format(time.RFC3339Nano)
		}
	}
	var list []string
	for _, s := range strings.Split(*states, ",") {
		s = strings.TrimSpace(s)
		if s != "completed" && s != "failed" {
			return usagef("subscriptions replay: --states %q: use completed, failed or both (completed,failed)", s)
		}
		list = append(list, s)
	}
	body.States = list
	j, err := c.ReplaySubscription(ctx, name, body)
	if err != nil {
		return fmt.Errorf("subscriptions replay %s: %w", name, c.explain(err))
	}
	if *wait {
		fmt.Fprintln(env.stderr, progress(j))
		if j, err = followReplay(ctx, env, c, j); err != nil {
			return fmt.Errorf("subscriptions replay %s: %w", name, err)
		}
	}
	if af.json {
		return printValue(env, j)
	}
	fmt.Fprintln(env.stdout, j.ID)
	if j.State == "failed" {
		return fmt.Errorf("subscriptions replay %s: %s", name, progress(j))
	}
	return nil
}

// replayPoll is how often --wait asks for a job's progress.
const replayPoll = 500 * time.Millisecond

// followReplay polls job until it ends, printing its progress on stderr
// when it moves.
func followReplay(ctx context.Context, env *cmdEnv, c *apiClient, j api.Replay) (api.Replay, error) {
	last := j.Replayed
	for j.State == "running" {
		select {
		case <-ctx.Done():
			return j, fmt.Errorf("stopped waiting; the replay goes on: postbox replays get %s", j.ID)
		case <-time.After(replayPoll):
		}
		next, err := c.Replay(ctx, j.ID)
		if err != nil {
			return j, c.explain(err)
		}
		j = next
		if j.Replayed != last || j.State != "running" {
			fmt.Fprintln(env.stderr, progress(j))
			last = j.Replayed
		}
	}
	return j, nil
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
	j, err := c.Replay(ctx, id)
	if err != nil {
		return fmt.Errorf("replays get %s: %w", id, c.explain(err))
	}
	if af.json {
		return printValue(env, j)
	}
	errText := ""
	if j.Error != nil {
		errText = *j.Error
	}
	return printFields(env, [][2]string{
		{"id", j.ID}, {"subscription", j.Subscription}, {"inbox", j.Inbox}, {"since", when(j.Since)}, {"until", when(j.Until)},
		{"states", strings.Join(j.States, ",")}, {"state", j.State}, {"matched", fmt.Sprint(j.Matched)},
		{"replayed", fmt.Sprint(j.Replayed)}, {"batches", fmt.Sprint(j.Batches)}, {"reached", when(j.Reached)},
		{"created_at", when(j.CreatedAt)}, {"finished_at", whenPtr(j.FinishedAt)}, {"error", errText},
	})
}
