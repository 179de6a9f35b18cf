package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/postbox-events/postbox/api"
)

var consumerCommands = []subcommand{
	{"list", "list the consumers: each subscription's next offset and lag (also: postbox consumers)", runConsumers},
	{"get", "show one consumer", runConsumersGet},
	{"reset", "move a consumer to an offset, a time, the earliest event or the latest", runConsumersReset},
	{"history", "show a consumer's commits and resets, newest first", runConsumersHistory},
}

// runConsumersGroup runs postbox consumers COMMAND; with no command, or
// only flags, it lists the consumers as postbox consumers always did.
func runConsumersGroup(ctx context.Context, env *cmdEnv, args []string) error {
	if len(args) == 0 {
		env.offerTable(consumerCommands)
	}
	if len(args) == 0 || strings.HasPrefix(args[0], "-") && args[0] != "-h" && args[0] != "--help" && args[0] != "-help" {
		return runConsumers(ctx, env, args)
	}
	for _, s := range consumerCommands {
		if s.name == args[0] {
			return s.run(ctx, env, args[1:])
		}
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "-help" || args[0] == "help" {
		return runGroup(ctx, env, "consumers", consumerCommands, args)
	}
	return usagef("consumers: unknown command %q: use list, get, reset or history (postbox consumers alone lists the consumers and takes no arguments)", args[0])
}

func runConsumersGet(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "consumers get", "NAME [flags]", `Shows the consumer NAME (a consumer has its subscription's name): its stream, the next
offset its subscription materialises, the stream's high watermark and the lag between them.`)
	af := addAPIFlags(fs, "print the consumer's JSON")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	name, err := nameArg(fs)
	if err != nil {
		return err
	}
	cons, err := c.Consumer(ctx, name)
	if err != nil {
		return fmt.Errorf("consumers get %s: %w", name, c.explain(err))
	}
	if af.json {
		return printValue(env, cons)
	}
	return printFields(env, consumerFields(cons))
}

func consumerFields(c api.Consumer) [][2]string {
	return [][2]string{{"consumer", c.Consumer}, {"subscription", c.Subscription}, {"stream", c.Stream},
		{"next_offset", fmt.Sprint(c.NextOffset)}, {"high_watermark", fmt.Sprint(c.HighWatermark)}, {"lag", fmt.Sprint(c.Lag)},
		{"updated_at", c.UpdatedAt.UTC().Format(time.RFC3339)}}
}

func runConsumersReset(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "consumers reset", "NAME --to-offset N | --to-time T | --earliest | --latest [flags]",
		`Moves the consumer NAME (a subscription's) to a position in its stream, backwards or
forwards, and its subscription materialises events from there again. Give exactly one of:

  --to-offset N   the offset to read next (1 to the stream's high watermark + 1)
  --to-time T     the first event the stream stored at or after T (RFC 3339)
  --earliest      the oldest event the stream still holds
  --latest        after the newest event: skip the backlog

Going back makes items only of events the subscription has no item of (items are unique
per subscription and event: those that retention deleted, or that it never matched when
its filter was narrower); to deliver items again, replay them (postbox subscriptions
replay, postbox dlq replay). Going forward skips events: no item is made of them. The
reset shows in postbox consumers history NAME.`)
	af := addAPIFlags(fs, "print the answer's JSON")
	toOffset := fs.Int64("to-offset", 0, "the `offset` to read next (≥ 1)")
	toTime := fs.String("to-time", "", "the stored `time` (RFC 3339) of the first event to read")
	earliest := fs.Bool("earliest", false, "start at the oldest event the stream holds")
	latest := fs.Bool("latest", false, "start after the newest event")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	name, err := nameArg(fs)
	if err != nil {
		return err
	}
	var req api.ResetRequest
	var given []string
	if isSet(fs, "to-offset") {
		if *toOffset < 1 {
			return usagef("consumers reset: --to-offset %d: offsets start at 1", *toOffset)
		}
		req.ToOffset, given = toOffset, append(given, "--to-offset")
	}
	if isSet(fs, "to-time") {
		if _, err := time.Parse(time.RFC3339Nano, *toTime); err != nil {
			return usagef("consumers reset: --to-time %q: want an RFC 3339 time such as 2026-11-24T10:00:00Z", *toTime)
		}
		req.ToTime, given = toTime, append(given, "--to-time")
	}
	if isSet(fs, "earliest") {
		if !*earliest {
			return usagef("consumers reset: --earliest=false: give --earliest, or another position")
		}
		req.Earliest, given = earliest, append(given, "--earliest")
	}
	if isSet(fs, "latest") {
		if !*latest {
			return usagef("consumers reset: --latest=false: give --latest, or another position")
		}
		req.Latest, given = latest, append(given, "--latest")
	}
	switch len(given) {
	case 0:
		return usagef("consumers reset: give one of --to-offset N, --to-time T, --earliest or --latest")
	case 1:
	default:
		return usagef("consumers reset: %s: give only one", strings.Join(given, ", "))
	}
	res, err := c.ResetConsumer(ctx, name, req)
	if err != nil {
		return fmt.Errorf("consumers reset %s: %w", name, c.explain(err))
	}
	if af.json {
		return printValue(env, res)
	}
	fmt.Fprintf(env.stdout, "consumer %s reset to %s: next offset %d (was %d), high watermark %d, lag %d\n",
		res.Consumer.Consumer, startText(res.Start), res.NextOffset, res.PreviousNextOffset, res.HighWatermark, res.Lag)
	return nil
}

// startText describes a start position: "earliest", "offset 5",
// "time 2026-…".
func startText(p api.StartPosition) string {
	switch {
	case p.Policy == "at_offset":
		return fmt.Sprintf("offset %d", p.Offset)
	case p.Policy == "at_time" && p.Time != nil:
		return "time " + p.Time.UTC().Format(time.RFC3339Nano)
	}
	return p.Policy
}

func runConsumersHistory(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "consumers history", "NAME [flags]", `Shows the commits and resets of the consumer NAME, newest first: each commit is the
offset up to which its subscription had materialised events; each reset where an operator
moved it to. The server keeps the newest 1000 per consumer, on the sqlite and postgres
stream backends (nats and kafka keep none: the command says so).`)
	af := addAPIFlags(fs, "print the answer's JSON")
	limit := fs.Int("limit", 20, "show the newest `n` (1 to 1000)")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	name, err := nameArg(fs)
	if err != nil {
		return err
	}
	if *limit < 1 || *limit > 1000 {
		return usagef("consumers history: --limit %d: want 1 to 1000", *limit)
	}
	h, err := c.ConsumerCommits(ctx, name, *limit)
	if err != nil {
		return fmt.Errorf("consumers history %s: %w", name, c.explain(err))
	}
	if af.json {
		return printValue(env, h)
	}
	tw := tabwriter.NewWriter(env.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "AT\tKIND\tOFFSET\tNEXT_OFFSET\tTO")
	for _, m := range h.Commits {
		to := "-"
		if m.Start != nil {
			to = startText(*m.Start)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\n", m.At.UTC().Format(time.RFC3339Nano), m.Kind, m.Offset, m.NextOffset, to)
	}
	return tw.Flush()
}
