package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/client"
)

var inboxCommands = []subcommand{
	{"list", "list an inbox's items (without INBOX: the inboxes and their counts)", runInboxList},
	{"show", "show one item with its payload", runInboxShow},
	{"search", "find an inbox's items by event id (or key), type, state and time, newest first", runInboxSearch},
	{"attempts", "show the attempts of the workers to deliver an item to its target", runInboxAttempts},
	{"lease", "take items to work on, as a runtime does", runInboxLease},
	{"ack", "mark items completed", runInboxAck},
	{"nack", "return items to pending, due after a delay", runInboxNack},
	{"extend", "extend the lease of items still being worked on", runInboxExtend},
	{"cancel", "make a pending item a dead letter at once, undelivered", runInboxCancel},
	{"discard", "delete an item for good", runInboxDiscard},
	{"reply", "reply to an item's event, at the url of its delivery handle", runInboxReply},
	{"replies", "list the replies to an item's event, with their state", runInboxReplies},
	{"reply-retry", "send a failed reply again", runInboxReplyRetry},
}

func runInbox(ctx context.Context, env *cmdEnv, args []string) error {
	return runGroup(ctx, env, "inbox", inboxCommands, args)
}

// Limits of the inbox endpoints (docs/API.md).
const (
	maxItemsPerCall = 1000
	maxLeaseWait    = 60 * time.Second
)

// lastError is an item's last error for a person, or "-".
func lastError(s *string) string {
	if s == nil {
		return "-"
	}
	return orDash(*s)
}

// currentError is the last error of it while it is its state: "-" for a
// completed item, whose error is from an attempt before it was delivered
// (earlierError).
func currentError(it api.Item) string {
	if it.LastErrorPast {
		return "-"
	}
	return lastError(it.LastError)
}

// earlierError is the last error of a completed item, from an attempt
// before it was delivered, or "-".
func earlierError(it api.Item) string {
	if !it.LastErrorPast {
		return "-"
	}
	return lastError(it.LastError)
}

// sourceSequence is the source's sequence number of an item's event, or
// "-" when it sent none.
func sourceSequence(n *int64) string {
	if n == nil {
		return "-"
	}
	return strconv.FormatInt(*n, 10)
}

// itemIDs parses positional item ids.
func itemIDs(cmd string, args []string) ([]int64, error) {
	if len(args) == 0 {
		return nil, usagef("%s: name at least one item ID", cmd)
	}
	ids := make([]int64, len(args))
	for i, a := range args {
		id, err := strconv.ParseInt(a, 10, 64)
		if err != nil || id <= 0 {
			return nil, usagef("%s: item ID %q is not a positive whole number", cmd, a)
		}
		ids[i] = id
	}
	return ids, nil
}

func runInboxList(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "inbox list", "[INBOX] [flags]", `Lists the items of INBOX in id order, one page of --limit items from after --after.
When more are left it says so on stderr; --all-pages fetches every page.
An unknown inbox has no items.

Without INBOX, lists the inboxes with how many items each holds in each state.`)
	af := addAPIFlags(fs, "print the items (without INBOX: the inboxes) as a JSON array")
	state := fs.String("state", "", "only items in this `state`: pending, processing, completed or failed (default: all)")
	limit := positiveInt(100)
	fs.Var(&limit, "limit", fmt.Sprintf("most `items` per page (at most %d)", maxItemsPerCall))
	var after positiveInt
	fs.Var(&after, "after", "list items after this item `ID`")
	all := fs.Bool("all-pages", false, "follow the pages until the last")
	oldSpelling(fs, "all", "all-pages")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	switch fs.NArg() {
	case 0:
		for _, f := range []string{"state", "limit", "after", "all-pages"} {
			if flagSource(fs, f) != "" {
				return usagef("inbox list: --%s goes with an INBOX", f)
			}
		}
		return listInboxes(ctx, env, c, af)
	case 1:
	default:
		return usagef("inbox list: takes one INBOX, got %d arguments: %s", fs.NArg(), strings.Join(fs.Args(), " "))
	}
	inbox := fs.Arg(0)
	switch *state {
	case "", "pending", "processing", "completed", "failed":
	default:
		return usagef("inbox list: --state must be pending, processing, completed or failed, not %q", *state)
	}
	if limit > maxItemsPerCall {
		return usagef("inbox list: --limit is at most %d, not %d", maxItemsPerCall, limit)
	}

	items, err := itemPages(env, "inbox list", "--all-pages", int64(after), *all, func(after int64) (api.ItemPage, error) {
		page, err := c.Items(ctx, inbox, client.ItemsQuery{State: *state, After: after, Limit: int(limit)})
		return page, c.explain(err)
	})
	if err != nil {
		return fmt.Errorf("inbox list %s: %w", inbox, err)
	}
	if af.json {
		return printJSON(env, jsonArray(items))
	}
	tw := tabwriter.NewWriter(env.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tTYPE\tEVENT_ID\tSUBSCRIPTION\tOFFSET\tATTEMPTS\tNEXT_ATTEMPT\tLAST_ERROR")
	for _, it := range items {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", it.ID, it.State, it.Type, it.EventID, it.Subscription,
			it.Offset, it.Attempts, when(it.NextAttemptAt), shorten(currentError(it), 60))
	}
	return tw.Flush()
}

// listInboxes prints GET /v1/inboxes.
func listInboxes(ctx context.Context, env *cmdEnv, c *apiClient, af *apiFlags) error {
	inboxes, err := c.Inboxes(ctx)
	if err != nil {
		return fmt.Errorf("inbox list: %w", c.explain(err))
	}
	if af.json {
		return printJSON(env, jsonArray(inboxes))
	}
	tw := tabwriter.NewWriter(env.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INBOX\tPENDING\tPROCESSING\tCOMPLETED\tFAILED")
	for _, in := range inboxes {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\n", in.Inbox, in.Pending, in.Processing, in.Completed, in.Failed)
	}
	return tw.Flush()
}

// shorten cuts s to n runes, marking the cut.
func shorten(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

func runInboxShow(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "inbox show", "INBOX ID [flags]", "Shows the item ID of INBOX: where it came from, its state, attempts, last error and payload.")
	af := addAPIFlags(fs, "print the item's JSON")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	if fs.NArg() != 2 {
		return usagef("inbox show: takes INBOX and one item ID, got %d arguments", fs.NArg())
	}
	inbox := fs.Arg(0)
	ids, err := itemIDs("inbox show", fs.Args()[1:])
	if err != nil {
		return err
	}
	it, err := c.Item(ctx, inbox, ids[0])
	if err != nil {
		return fmt.Errorf("inbox show %s %d: %w", inbox, ids[0], c.explain(err))
	}
	if af.json {
		return printValue(env, it)
	}
	tw := tabwriter.NewWriter(env.stdout, 2, 4, 1, ' ', 0)
	for _, kv := range [][2]string{
		{"id", strconv.FormatInt(it.ID, 10)}, {"inbox", it.Inbox}, {"subscription", it.Subscription},
		{"stream", it.Stream}, {"offset", strconv.FormatInt(it.Offset, 10)}, {"stream_event_id", it.StreamEventID},
		{"event_id", it.EventID}, {"type", it.Type}, {"occurred_at", when(it.OccurredAt)},
		{"source_sequence", sourceSequence(it.SourceSequence)}, {"stored_at", when(it.StoredAt)},
		{"state", it.State}, {"attempts", strconv.Itoa(it.Attempts)},
		{"next_attempt_at", when(it.NextAttemptAt)}, {"lease_expires_at", whenPtr(it.LeaseExpiresAt)},
		{"last_error", currentError(it)}, {"earlier_error", earlierError(it)},
		{"created_at", when(it.CreatedAt)}, {"updated_at", when(it.UpdatedAt)},
	} {
		fmt.Fprintf(tw, "%s:\t%s\n", kv[0], kv[1])
	}
	if err := tw.Flush(); err != nil {
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

func runInboxAttempts(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "inbox attempts", "INBOX ID [flags]", `Shows every attempt of the server's workers to POST the item ID of INBOX to its target,
oldest first: when, to which URL, the answer's status (0: none came, such as a refused
connection or a timeout), how long it took, the error and the start of the answer's
body. Items that runtimes lease have none. Retention deletes them with the item.`)
	af := addAPIFlags(fs, "print the attempts as a JSON array")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	if fs.NArg() != 2 {
		return usagef("inbox attempts: takes INBOX and one item ID, got %d arguments", fs.NArg())
	}
	inbox := fs.Arg(0)
	if err := checkName("inbox attempts", "INBOX", inbox); err != nil {
		return err
	}
	ids, err := itemIDs("inbox attempts", fs.Args()[1:])
	if err != nil {
		return err
	}
	log, err := c.Attempts(ctx, inbox, ids[0])
	if err != nil {
		return fmt.Errorf("inbox attempts %s %d: %w", inbox, ids[0], c.explain(err))
	}
	if af.json {
		return printJSON(env, jsonArray(log))
	}
	if len(log) == 0 {
		fmt.Fprintf(env.stdout, "item %d of %s has no attempts to a target\n", ids[0], inbox)
		return nil
	}
	tw := tabwriter.NewWriter(env.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ATTEMPT\tAT\tURL\tSTATUS\tLATENCY\tERROR\tRESPONSE")
	for _, a := range log {
		errText, excerpt := "-", "-"
		if a.Error != nil {
			errText = shorten(oneLine(*a.Error), 60)
		}
		if a.ResponseExcerpt != nil {
			excerpt = shorten(oneLine(*a.ResponseExcerpt), 60)
		}
		latency := time.Duration(a.LatencyMS * float64(time.Millisecond)).Round(100 * time.Microsecond)
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%s\n", a.Attempt, when(a.AttemptedAt), a.EndpointURL, a.StatusCode, latency, errText, excerpt)
	}
	return tw.Flush()
}

// oneLine replaces the line breaks and tabs of s with spaces.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

func runInboxLease(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "inbox lease", "INBOX [flags]", `Leases up to --max items of INBOX, oldest first, as a runtime does: they become
processing and their attempts grow by one. Ack or nack them with the printed lease
before it expires (--visibility), or they become available again. With --wait, waits
that long for an item when none is ready.`)
	af := addAPIFlags(fs, "print the server's answer: {lease, expires_at, items}")
	maxItems := positiveInt(10)
	fs.Var(&maxItems, "max", fmt.Sprintf("most `items` to lease (at most %d)", maxItemsPerCall))
	visibility := durationVar(fs, "visibility", 30*time.Second, 1, "how long the lease lasts")
	wait := durationVar(fs, "wait", 0, 0, fmt.Sprintf("how long to wait for an item when none is ready (at most %v)", maxLeaseWait))
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	inbox, err := args1(fs, "INBOX")
	if err != nil {
		return err
	}
	switch {
	case maxItems > maxItemsPerCall:
		return usagef("inbox lease: --max is at most %d, not %d", maxItemsPerCall, maxItems)
	case *wait > maxLeaseWait: // the flag refuses under 0
		return usagef("inbox lease: --wait must be 0s to %v, not %v", maxLeaseWait, *wait)
	}
	c.timeout += *wait
	out, err := c.Lease(ctx, inbox, client.LeaseOptions{Max: int(maxItems), VisibilityTimeout: *visibility, Wait: *wait})
	if err != nil {
		return fmt.Errorf("inbox lease %s: %w", inbox, c.explain(err))
	}
	if af.json {
		return printValue(env, out)
	}
	if len(out.Items) == 0 {
		fmt.Fprintf(env.stdout, "no items ready in inbox %s%s\n", inbox, unknownInbox(ctx, c, inbox))
		return nil
	}
	noun := "items"
	if len(out.Items) == 1 {
		noun = "item"
	}
	fmt.Fprintf(env.stdout, "lease %s expires %s: %d %s\n", out.Lease, when(out.ExpiresAt), len(out.Items), noun)
	tw := tabwriter.NewWriter(env.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTYPE\tEVENT_ID\tATTEMPTS")
	for _, it := range out.Items {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\n", it.ID, it.Type, it.EventID, it.Attempts)
	}
	return tw.Flush()
}

// unknownInbox says, for an inbox with nothing to lease, when it is not
// one the server knows (a name mistyped, or a subscription not created
// yet): "" for an inbox that exists or when the list could not be read.
func unknownInbox(ctx context.Context, c *apiClient, inbox string) string {
	all, err := c.Inboxes(ctx)
	if err != nil || slices.ContainsFunc(all, func(ic api.InboxCounts) bool { return ic.Inbox == inbox }) {
		return ""
	}
	return " (no subscription fills an inbox of that name and it holds no items: see postbox subscriptions list)"
}

func runInboxAck(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "inbox ack", "INBOX ID [ID...] [flags]", `Marks the items completed. With --lease, each must still hold that lease; without it
(an operator), any pending or processing item may be acked. Prints one line per ID
with its result; if any failed, the exit status is 1.`)
	af := addAPIFlags(fs, "print the server's answer: {items: [{id, state} or {id, error}]}")
	lease := fs.String("lease", "", "the `token` of the lease the items hold")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	return settle(ctx, env, c, af, fs.Name(), "ack", fs.Args(), func(inbox string, ids []int64) ([]api.ItemResult, error) {
		return c.Ack(ctx, inbox, *lease, ids...)
	})
}

func runInboxNack(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "inbox nack", "INBOX ID [ID...] [flags]", `Returns the items to pending, due again after --delay, with --reason as their last
error. With --lease, each must still hold that lease. Prints one line per ID with its
result; if any failed, the exit status is 1.`)
	af := addAPIFlags(fs, "print the server's answer: {items: [{id, state} or {id, error}]}")
	lease := fs.String("lease", "", "the `token` of the lease the items hold")
	delay := durationVar(fs, "delay", 0, 0, "how long until the items are due again")
	reason := fs.String("reason", "", "why, kept as the items' last error")
	dead := fs.Bool("dead", false, "no further attempt can help: the items become dead letters (failed) at once")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	if *delay < 0 {
		return usagef("inbox nack: --delay must not be negative, not %v", *delay)
	}
	if *dead && *delay != 0 {
		return usagef("inbox nack: --dead and --delay: a dead letter has no next attempt")
	}
	return settle(ctx, env, c, af, fs.Name(), "nack", fs.Args(), func(inbox string, ids []int64) ([]api.ItemResult, error) {
		return c.Nack(ctx, inbox, *lease, client.NackOptions{Delay: *delay, Reason: *reason, Dead: *dead}, ids...)
	})
}

func runInboxExtend(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "inbox extend", "INBOX ID [ID...] --lease TOKEN [flags]", `Extends the lease of items a runtime holds (a heartbeat for a job that runs long): it
then ends --visibility from now, and no one else leases them meanwhile. Each item must
still hold the lease: one whose lease expired or was settled says lease_lost. Prints
one line per ID with its result; if any failed, the exit status is 1.`)
	af := addAPIFlags(fs, "print the server's answer: {expires_at, items: [{id, state} or {id, error}]}")
	lease := fs.String("lease", "", "the `token` of the lease the items hold (required)")
	visibility := durationVar(fs, "visibility", 30*time.Second, 1, "how long from now the lease lasts")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	if *lease == "" {
		return usagef("inbox extend: --lease is required: the token of the lease the items hold")
	}
	return settle(ctx, env, c, af, fs.Name(), "extend", fs.Args(), func(inbox string, ids []int64) ([]api.ItemResult, error) {
		ext, err := c.Extend(ctx, inbox, *lease, *visibility, ids...)
		extended := slices.ContainsFunc(ext.Items, func(r api.ItemResult) bool { return r.Error == nil })
		if err == nil && extended && !af.json { // when every item failed, the lease was not extended
			fmt.Fprintf(env.stdout, "lease %s now expires %s\n", *lease, when(ext.ExpiresAt))
		}
		return ext.Items, err
	})
}

// maxSettle is how many ids one ack or nack request carries; more are
// sent in several requests.
const maxSettle = 1000

// settle posts an ack or nack of the items named by args (INBOX ID...) and
// prints each item's result; an error if any item failed.
func settle(ctx context.Context, env *cmdEnv, c *apiClient, af *apiFlags, cmd, verb string, args []string,
	call func(inbox string, ids []int64) ([]api.ItemResult, error)) error {
	if len(args) == 0 {
		return usagef("%s: INBOX and at least one item ID are required", cmd)
	}
	inbox := args[0]
	ids, err := itemIDs(cmd, args[1:])
	if err != nil {
		return err
	}
	var results []api.ItemResult
	for chunk := range slices.Chunk(ids, maxSettle) {
		res, err := call(inbox, chunk)
		if err != nil {
			return fmt.Errorf("%s %s: %w", cmd, inbox, c.explain(err))
		}
		if len(res) != len(chunk) {
			return fmt.Errorf("%s %s: the server answered %d results for %d ids", cmd, inbox, len(res), len(chunk))
		}
		results = append(results, res...)
	}
	if af.json {
		if err := printValue(env, api.Results{Items: results}); err != nil {
			return err
		}
	}
	failed := 0
	tw := tabwriter.NewWriter(env.stdout, 2, 4, 2, ' ', 0)
	for _, r := range results {
		line := r.State
		if r.Error != nil {
			failed++
			line = fmt.Sprintf("error %s: %s", r.Error.Code, r.Error.Message)
		}
		if !af.json {
			fmt.Fprintf(tw, "%d\t%s\n", r.ID, line)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("%s %s: %d of %d items failed", cmd, inbox, failed, len(ids))
	}
	return nil
}
