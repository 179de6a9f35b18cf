package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/client"
)

var eventsCommands = []subcommand{
	{"get", "show a stored event and its deliveries: each subscription's item, state, attempts and the endpoint's answers", runEventsGet},
	{"search", "find a stream's events by id (or key), type and stored time, newest first", runEventsSearch},
}

func runEvents(ctx context.Context, env *cmdEnv, args []string) error {
	return runGroup(ctx, env, "events", eventsCommands, args)
}

func runEventsGet(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "events get", "STREAM (OFFSET | --id ID | --key KEY) [flags]",
		`Shows an event of STREAM (a stream has its source's name: devices, webhooks, ...), by
its OFFSET or by the source's id of it (--id: an envelope's event_id, a polled
item's id; --key: a webhook's idempotency key, the same thing), and what each
subscription made of it: its item, state, attempts and last attempt, and the
endpoint's answer to every attempt. Subscriptions deleted since are listed with
the items the store keeps of them; a subscription that takes the event and holds
no item of it says why.`)
	af := addAPIFlags(fs, "print the event and its deliveries as JSON")
	id := fs.String("id", "", "the source's `id` of the event")
	key := fs.String("key", "", "a webhook's idempotency `key` (the same as --id)")
	variant := fs.String("variant", "", "with --id in the device stream, the `device_id` that sent it (one event_id may come from several devices)")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	if *id != "" && *key != "" {
		return usagef("events get: give --id or --key, not both (they name the same id)")
	}
	byID := *id + *key
	if *variant != "" && byID == "" {
		return usagef("events get: --variant goes with --id")
	}
	var ev api.Event
	switch {
	case fs.NArg() == 0:
		return usagef("events get: STREAM is required")
	case fs.NArg() == 1 && byID == "":
		return usagef("events get: name the event: STREAM OFFSET, or STREAM --id ID (--key KEY)")
	case fs.NArg() == 1:
		if err := checkName("events get", "STREAM", fs.Arg(0)); err != nil {
			return err
		}
		ev, err = c.EventByID(ctx, fs.Arg(0), byID, *variant)
	case fs.NArg() == 2 && byID != "":
		return usagef("events get: name the event by OFFSET or by --id/--key, not both")
	case fs.NArg() == 2:
		if err := checkName("events get", "STREAM", fs.Arg(0)); err != nil {
			return err
		}
		offset, perr := strconv.ParseInt(fs.Arg(1), 10, 64)
		if perr != nil || offset < 1 {
			return usagef("events get: OFFSET %q is not a positive whole number", fs.Arg(1))
		}
		ev, err = c.Event(ctx, fs.Arg(0), offset)
	default:
		return usagef("events get: takes STREAM and OFFSET, got %d arguments: %s", fs.NArg(), strings.Join(fs.Args(), " "))
	}
	if err != nil {
		return fmt.Errorf("events get %s: %w", fs.Arg(0), c.explain(err))
	}
	if af.json {
		return printValue(env, ev)
	}
	return printEvent(env, ev)
}

// printEvent prints an event, its deliveries and their attempt logs.
func printEvent(env *cmdEnv, ev api.Event) error {
	fields := [][2]string{
		{"id", ev.ID}, {"stream", ev.Stream}, {"offset", strconv.FormatInt(ev.Offset, 10)}, {"event_id", ev.EventID},
	}
	if ev.Variant != "" {
		fields = append(fields, [2]string{"variant", ev.Variant})
	}
	if ev.WebhookID != "" {
		fields = append(fields, [2]string{"webhook_id", ev.WebhookID})
	}
	fields = append(fields, [][2]string{{"type", ev.Type}, {"occurred_at", when(ev.OccurredAt)}, {"stored_at", when(ev.StoredAt)},
		{"metadata", metadataPairs(ev.Metadata)}, {"payload", shorten(string(ev.Payload), 200)}}...)
	if err := printFields(env, fields); err != nil {
		return err
	}
	fmt.Fprintln(env.stdout)
	if len(ev.Deliveries) == 0 {
		fmt.Fprintln(env.stdout, "deliveries: none (no subscription of this stream takes this event)")
		return nil
	}
	fmt.Fprintln(env.stdout, "deliveries:")
	tw := tabwriter.NewWriter(env.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SUBSCRIPTION\tINBOX\tITEM\tSTATE\tATTEMPTS\tLAST_ATTEMPT\tLAST_ERROR")
	for _, d := range ev.Deliveries {
		sub := d.Subscription
		if d.Deleted {
			sub += " (deleted)"
		}
		if d.Paused {
			sub += " (paused)"
		}
		if d.Item == nil {
			fmt.Fprintf(tw, "%s\t%s\t-\t%s\t-\t-\t%s\n", sub, d.Inbox, d.Status, shorten(d.Reason, 60))
			continue
		}
		last := "-"
		if n := len(d.Attempts); n > 0 {
			last = when(d.Attempts[n-1].AttemptedAt)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%s\t%s\n", sub, d.Inbox, d.Item.ID, d.Item.State, d.Item.Attempts, last,
			shorten(currentError(*d.Item), 60))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, d := range ev.Deliveries {
		if len(d.Attempts) == 0 {
			continue
		}
		fmt.Fprintf(env.stdout, "\nattempts of %s (item %d):\n", d.Subscription, d.Item.ID)
		tw := tabwriter.NewWriter(env.stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ATTEMPT\tAT\tSTATUS\tLATENCY\tERROR\tANSWER")
		for _, a := range d.Attempts {
			status := "-"
			if a.StatusCode != 0 {
				status = strconv.Itoa(a.StatusCode)
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%.1fms\t%s\t%s\n", a.Attempt, when(a.AttemptedAt), status, a.LatencyMS,
				shorten(lastError(a.Error), 50), shorten(lastError(a.ResponseExcerpt), 50))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// searchFlags are the flags of a search of a stream or an inbox.
type searchFlags struct {
	id, key, typ, since, until string
	before                     positiveInt
	limit                      positiveInt
	all                        *bool
}

// addSearchFlags adds the flags of a search of what (events or items);
// stored says what its time range selects by.
func addSearchFlags(fs *flag.FlagSet, what, stored string) *searchFlags {
	s := &searchFlags{limit: 100}
	fs.StringVar(&s.id, "id", "", "only "+what+" of the event of this `id` (an envelope's event_id, a polled item's id)")
	fs.StringVar(&s.key, "key", "", "only "+what+" of the webhook of this idempotency `key` (the same as --id)")
	fs.StringVar(&s.typ, "type", "", "only "+what+" of events of this `type`")
	fs.StringVar(&s.since, "since", "", "only "+what+" "+stored+" at or after "+whenHelp)
	fs.StringVar(&s.until, "until", "", "only "+what+" "+stored+" before "+whenHelp)
	fs.Var(&s.before, "before", "the page after this `position`: what the previous page said (--before N)")
	fs.Var(&s.limit, "limit", fmt.Sprintf("most `results` per page (at most %d)", maxItemsPerCall))
	s.all = fs.Bool("all-pages", false, "follow the pages until the last")
	return s
}

// query checks the flags and returns them as the client's query.
func (s *searchFlags) query(cmd string, now time.Time) (client.SearchQuery, error) {
	q := client.SearchQuery{ID: s.id, Type: s.typ, Before: int64(s.before), Limit: int(s.limit)}
	switch {
	case s.id != "" && s.key != "":
		return q, usagef("%s: give --id or --key, not both (they name the same id)", cmd)
	case s.key != "":
		q.ID = s.key
	}
	if s.limit > maxItemsPerCall {
		return q, usagef("%s: --limit is at most %d, not %d", cmd, maxItemsPerCall, s.limit)
	}
	for _, f := range []struct {
		name, value string
		t           *time.Time
	}{{"since", s.since, &q.Since}, {"until", s.until, &q.Until}} {
		if f.value == "" {
			continue
		}
		t, err := parseWhen(f.value, now)
		if err != nil {
			return q, usagef("%s: --%s %v", cmd, f.name, err)
		}
		*f.t = t
	}
	if !q.Since.IsZero() && !q.Until.IsZero() && !q.Since.Before(q.Until) {
		return q, usagef("%s: --since %s is not before --until %s", cmd, apiTime(q.Since), apiTime(q.Until))
	}
	return q, nil
}

// searchPages follows the pages of a search from before (0: the newest):
// one page, or every page with all.
func searchPages[T any](env *cmdEnv, cmd string, before int64, all bool, page func(before int64) ([]T, int64, error)) ([]T, error) {
	var out []T
	for {
		got, next, err := page(before)
		if err != nil {
			return nil, err
		}
		out = append(out, got...)
		switch {
		case next == 0:
			return out, nil
		case before != 0 && next >= before:
			return nil, fmt.Errorf("the server's next_before %d does not move past %d", next, before)
		}
		before = next
		if !all {
			fmt.Fprintf(env.stderr, "%s: more results: --before %d, or --all-pages\n", cmd, before)
			return out, nil
		}
	}
}

func runEventsSearch(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "events search", "STREAM [flags]",
		`Lists the events of STREAM that every given flag selects, newest first: by the
source's id (--id, or a webhook's --key), --type, and the time they were stored
(--since, --until), one page of --limit; --all-pages follows the pages. Each filter
reads an index on the SQLite and PostgreSQL stream backends; NATS and Kafka
streams page by offset and search by id alone. postbox events get STREAM OFFSET shows an event's
deliveries.`)
	af := addAPIFlags(fs, "print the events as a JSON array")
	sf := addSearchFlags(fs, "events", "stored")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	name, err := args1(fs, "STREAM")
	if err != nil {
		return err
	}
	if err := checkName("events search", "STREAM", name); err != nil {
		return err
	}
	q, err := sf.query("events search", time.Now())
	if err != nil {
		return err
	}
	evs, err := searchPages(env, "events search", q.Before, *sf.all, func(before int64) ([]api.Event, int64, error) {
		q.Before = before
		p, err := c.SearchEvents(ctx, name, q)
		return p.Events, p.NextBefore, c.explain(err)
	})
	if err != nil {
		return fmt.Errorf("events search %s: %w", name, err)
	}
	if af.json {
		return printJSON(env, jsonArray(evs))
	}
	tw := tabwriter.NewWriter(env.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "OFFSET\tSTORED_AT\tTYPE\tEVENT_ID\tVARIANT")
	for _, ev := range evs {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", ev.Offset, when(ev.StoredAt), ev.Type, ev.EventID, orDash(ev.Variant))
	}
	return tw.Flush()
}

func runInboxSearch(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "inbox search", "INBOX [flags]",
		`Lists the items of INBOX that every given flag selects, newest first: by the
event's id (--id, or a webhook's --key), its --type, the item's --state and the
time it was made (--since, --until), one page of --limit; --all-pages follows the
pages. Each filter reads an index of the inbox's items.`)
	af := addAPIFlags(fs, "print the items as a JSON array")
	sf := addSearchFlags(fs, "items", "made")
	state := fs.String("state", "", "only items in this `state`: pending, processing, completed or failed (default: all)")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	inbox, err := args1(fs, "INBOX")
	if err != nil {
		return err
	}
	if err := checkName("inbox search", "INBOX", inbox); err != nil {
		return err
	}
	switch *state {
	case "", "pending", "processing", "completed", "failed":
	default:
		return usagef("inbox search: --state must be pending, processing, completed or failed, not %q", *state)
	}
	q, err := sf.query("inbox search", time.Now())
	if err != nil {
		return err
	}
	q.State = *state
	items, err := searchPages(env, "inbox search", q.Before, *sf.all, func(before int64) ([]api.Item, int64, error) {
		q.Before = before
		p, err := c.SearchItems(ctx, inbox, q)
		return p.Items, p.NextBefore, c.explain(err)
	})
	if err != nil {
		return fmt.Errorf("inbox search %s: %w", inbox, err)
	}
	if af.json {
		return printJSON(env, jsonArray(items))
	}
	tw := tabwriter.NewWriter(env.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tCREATED\tSTATE\tTYPE\tEVENT_ID\tSUBSCRIPTION\tOFFSET\tATTEMPTS\tLAST_ERROR")
	for _, it := range items {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", it.ID, when(it.CreatedAt), it.State, it.Type, it.EventID, it.Subscription,
			it.Offset, it.Attempts, shorten(currentError(it), 60))
	}
	return tw.Flush()
}
