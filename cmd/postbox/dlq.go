package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/client"
)

// The dead-letter commands: failed items (their last attempt failed, or
// their target answered 410 Gone), listed, shown and replayed through
// /v1/dead-letters.

var dlqCommands = []subcommand{
	{"list", "list dead letters by inbox, subscription and time of failure", runDLQList},
	{"show", "show one dead letter with its last error and payload", runDLQShow},
	{"replay", "return dead letters to pending: one ID, or a selection", runDLQReplay},
	{"discard", "delete dead letters for good: IDs, or a selection", runDLQDiscard},
}

func runDLQ(ctx context.Context, env *cmdEnv, args []string) error {
	return runGroup(ctx, env, "dlq", dlqCommands, args)
}

// whenHelp says which times --since and --until take.
const whenHelp = "an RFC 3339 `time` (2026-11-21T10:00:00Z) or how long ago (90m, 2h, 7d)"

// maxDaysAgo bounds a relative time in days.
const maxDaysAgo = 36500

// parseWhen reads a time: RFC 3339, or a duration before now (Go's
// 90s, 15m, 2h30m, or a whole number of days such as 7d).
func parseWhen(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, nerr := strconv.Atoi(days)
		if nerr == nil && n >= 0 && n <= maxDaysAgo {
			d, err = time.Duration(n)*24*time.Hour, nil
		}
	}
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time (2026-11-21T10:00:00Z) nor how long ago (90m, 2h, 7d)", s)
	}
	return now.Add(-d), nil
}

// dlqSelection is the flags that select dead letters.
type dlqSelection struct {
	inbox, subscription, since, until string
}

func addSelectionFlags(fs *flag.FlagSet, verb string) *dlqSelection {
	s := &dlqSelection{}
	fs.StringVar(&s.inbox, "inbox", "", verb+" only the dead letters of this `inbox`")
	fs.StringVar(&s.subscription, "subscription", "", verb+" only the dead letters of this `subscription`")
	fs.StringVar(&s.since, "since", "", verb+" only those that failed at or after "+whenHelp)
	fs.StringVar(&s.until, "until", "", verb+" only those that failed before "+whenHelp)
	oldSpelling(fs, "from", "since")
	oldSpelling(fs, "to", "until")
	return s
}

// empty reports whether the selection selects every dead letter.
func (s *dlqSelection) empty() bool { return *s == dlqSelection{} }

// query checks the selection and returns it as the client's query.
func (s *dlqSelection) query(cmd string, now time.Time) (client.DeadLetterQuery, error) {
	var q client.DeadLetterQuery
	for _, f := range []struct {
		flag, value string
		to          *string
	}{{"--inbox", s.inbox, &q.Inbox}, {"--subscription", s.subscription, &q.Subscription}} {
		if f.value == "" {
			continue
		}
		if err := checkName(cmd, f.flag, f.value); err != nil {
			return q, err
		}
		*f.to = f.value
	}
	for _, f := range []struct {
		name, value string
		t           *time.Time
	}{{"since", s.since, &q.From}, {"until", s.until, &q.To}} {
		if f.value == "" {
			continue
		}
		t, err := parseWhen(f.value, now)
		if err != nil {
			return q, usagef("%s: --%s %v", cmd, f.name, err)
		}
		*f.t = t
	}
	if !q.From.IsZero() && !q.To.IsZero() && !q.From.Before(q.To) {
		return q, usagef("%s: --since %s is not before --until %s", cmd, q.From.UTC().Format(time.RFC3339), q.To.UTC().Format(time.RFC3339))
	}
	return q, nil
}

// apiTime is t as the API reads it (RFC 3339, UTC), "" for none.
func apiTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func runDLQList(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "dlq list", "[flags]", `Lists the dead letters (failed items) in id order, one page of --limit items from after
--after: of every inbox, or only those --inbox, --subscription, --since and --until select.
--since and --until select by when the item failed; each takes an RFC 3339 time or how long
ago (a Go duration such as 90m or 2h30m, or whole days such as 7d). When more are left
it says so on stderr; --all-pages fetches every page.`)
	af := addAPIFlags(fs, "print the dead letters as a JSON array")
	sel := addSelectionFlags(fs, "list")
	limit := positiveInt(100)
	fs.Var(&limit, "limit", fmt.Sprintf("most `items` per page (at most %d)", maxItemsPerCall))
	var after positiveInt
	fs.Var(&after, "after", "list dead letters after this item `ID`")
	allPages := fs.Bool("all-pages", false, "follow the pages until the last")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	if limit > maxItemsPerCall {
		return usagef("dlq list: --limit is at most %d, not %d", maxItemsPerCall, limit)
	}
	q, err := sel.query("dlq list", time.Now())
	if err != nil {
		return err
	}
	q.Limit = int(limit)
	list, err := itemPages(env, "dlq list", "--all-pages", int64(after), *allPages, func(after int64) (api.ItemPage, error) {
		q.After = after
		page, err := c.DeadLetters(ctx, q)
		return page, c.explain(err)
	})
	if err != nil {
		return fmt.Errorf("dlq list: %w", err)
	}
	if af.json {
		return printJSON(env, jsonArray(list))
	}
	tw := tabwriter.NewWriter(env.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tINBOX\tSUBSCRIPTION\tATTEMPTS\tFAILED_AT\tLAST_ERROR")
	for _, it := range list {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\n", it.ID, it.Inbox, it.Subscription, it.Attempts, whenPtr(it.FailedAt), shorten(lastError(it.LastError), 60))
	}
	return tw.Flush()
}

// itemPages gets the page of items after the item after with page; with all, the
// pages that follow until the last. When it stops early it says on
// stderr how to go on: --after N, or allFlag.
func itemPages(env *cmdEnv, cmd, allFlag string, after int64, all bool, page func(after int64) (api.ItemPage, error)) ([]api.Item, error) {
	var items []api.Item
	for {
		p, err := page(after)
		if err != nil {
			return nil, err
		}
		items = append(items, p.Items...)
		switch {
		case p.NextAfter == 0:
			return items, nil
		case p.NextAfter <= after:
			return nil, fmt.Errorf("the server's next_after %d does not move past %d", p.NextAfter, after)
		}
		after = p.NextAfter
		if !all {
			fmt.Fprintf(env.stderr, "%s: more items: --after %d, or %s\n", cmd, after, allFlag)
			return items, nil
		}
	}
}

// printFields prints name: value lines, the values aligned.
func printFields(env *cmdEnv, fields [][2]string) error {
	tw := tabwriter.NewWriter(env.stdout, 2, 4, 1, ' ', 0)
	for _, kv := range fields {
		fmt.Fprintf(tw, "%s:\t%s\n", kv[0], kv[1])
	}
	return tw.Flush()
}

// deadLetterID returns the one positional item ID of fs.
func deadLetterID(fs *flag.FlagSet) (int64, error) {
	arg, err := args1(fs, "ID")
	if err != nil {
		return 0, err
	}
	ids, err := itemIDs(fs.Name(), []string{arg})
	if err != nil {
		return 0, err
	}
	return ids[0], nil
}

func runDLQShow(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "dlq show", "ID [flags]", `Shows the dead letter ID: where it came from, its attempts, when it failed, its last
error in full, how often it was replayed, and its payload. An item that is not failed
(never, or no longer: replayed) is not a dead letter; postbox inbox show INBOX ID shows
any item.`)
	af := addAPIFlags(fs, "print the item's JSON")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	id, err := deadLetterID(fs)
	if err != nil {
		return err
	}
	it, err := c.DeadLetter(ctx, id)
	if err != nil {
		return fmt.Errorf("dlq show %d: %w", id, c.explain(err))
	}
	if af.json {
		return printValue(env, it)
	}
	err = printFields(env, [][2]string{
		{"id", strconv.FormatInt(it.ID, 10)}, {"inbox", it.Inbox}, {"subscription", it.Subscription},
		{"stream", it.Stream}, {"offset", strconv.FormatInt(it.Offset, 10)}, {"event_id", it.EventID},
		{"type", it.Type}, {"occurred_at", when(it.OccurredAt)},
		{"state", it.State}, {"attempts", strconv.Itoa(it.Attempts)}, {"failed_at", whenPtr(it.FailedAt)},
		{"replays", strconv.Itoa(it.Replays)}, {"replayed_at", whenPtr(it.ReplayedAt)}, {"last_error", lastError(it.LastError)},
	})
	if err != nil {
		return err
	}
	if err := printMetadata(env, it.Metadata); err != nil {
		return err
	}
	fmt.Fprintln(env.stdout, "payload:")
	if len(it.Payload) == 0 {
		it.Payload = json.RawMessage("null")
	}
	return printJSON(env, it.Payload)
}

func runDLQReplay(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "dlq replay", "ID | --inbox I | --subscription S | --since T --until T | --all [flags]", `Returns dead letters to pending, due now with their attempts reset, so that the
workers (or runtimes) try them again; each keeps its last error and counts the replay.
Name one ID, or select them with --inbox, --subscription, --since and --until (together they
narrow the selection; the times select by when the item failed, and take an RFC 3339
time or how long ago: 90m, 2h30m, 7d). --all replays every dead letter and goes alone.

Prints how many it replayed; an ID that is not a dead letter is an error (exit status 1).`)
	af := addAPIFlags(fs, `print {"replayed": N, "ids": [...]}`)
	sel := addSelectionFlags(fs, "replay")
	all := fs.Bool("all", false, "replay every dead letter")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	var out api.Replayed
	switch {
	case fs.NArg() > 0:
		if *all || !sel.empty() {
			return usagef("dlq replay: an ID goes alone, without --all, --inbox, --subscription, --since or --until")
		}
		id, err := deadLetterID(fs)
		if err != nil {
			return err
		}
		if _, err := c.ReplayDeadLetter(ctx, id); err != nil {
			return fmt.Errorf("dlq replay %d: %w", id, c.explain(err))
		}
		out.Replayed, out.IDs = 1, []int64{id}
	case *all && !sel.empty():
		return usagef("dlq replay: --all replays every dead letter; leave out --inbox, --subscription, --since and --until, or --all")
	case !*all && sel.empty():
		return usagef("dlq replay: name an ID, or select dead letters with --inbox, --subscription, --since or --until, or replay every one with --all")
	default:
		q, err := sel.query("dlq replay", time.Now())
		if err != nil {
			return err
		}
		pick := api.ReplayDeadLetters{Inbox: q.Inbox, Subscription: q.Subscription, From: apiTime(q.From), To: apiTime(q.To), All: *all}
		if out, err = c.ReplayDeadLetters(ctx, pick); err != nil {
			return fmt.Errorf("dlq replay: %w", c.explain(err))
		}
		if out.Replayed != len(out.IDs) {
			return fmt.Errorf("dlq replay: the server says it replayed %d items but names %d", out.Replayed, len(out.IDs))
		}
	}
	if af.json {
		b, _ := json.Marshal(map[string]any{"replayed": out.Replayed, "ids": jsonArray(out.IDs)})
		return printJSON(env, b)
	}
	switch out.Replayed {
	case 0:
		fmt.Fprintln(env.stdout, "no dead letters selected: replayed none")
	case 1:
		fmt.Fprintf(env.stdout, "replayed 1 dead letter (item %d): pending again\n", out.IDs[0])
	default:
		fmt.Fprintf(env.stdout, "replayed %d dead letters: pending again\n", out.Replayed)
	}
	return nil
}
