package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

var inboxCommands = []subcommand{
	{"list", "list an inbox's items (without INBOX: the inboxes and their counts)", runInboxList},
	{"show", "show one item with its payload", runInboxShow},
	{"attempts", "show the attempts of the workers to deliver an item to its target", runInboxAttempts},
	{"lease", "take items to work on, as a runtime does", runInboxLease},
	{"ack", "mark items completed", runInboxAck},
	{"nack", "return items to pending, due after a delay", runInboxNack},
}

func runInbox(ctx context.Context, env *cmdEnv, args []string) error {
	return runGroup(ctx, env, "inbox", inboxCommands, args)
}

// Limits of the inbox endpoints (docs/API.md).
const (
	maxItemsPerCall = 1000
	maxLeaseWait    = 60 * time.Second
)

// inboxItem is an item as the API answers it.
type inboxItem struct {
	ID             int64           `json:"id"`
	Inbox          string          `json:"inbox"`
	Subscription   string          `json:"subscription"`
	Stream         string          `json:"stream"`
	Offset         int64           `json:"offset"`
	StreamEventID  string          `json:"stream_event_id"`
	EventID        string          `json:"event_id"`
	Type           string          `json:"type"`
	OccurredAt     apiTime         `json:"occurred_at"`
	SourceSequence *int64          `json:"source_sequence"`
	StoredAt       apiTime         `json:"stored_at"`
	Metadata       map[string]any  `json:"metadata"`
	Payload        json.RawMessage `json:"payload"`
	State          string          `json:"state"`
	Attempts       int             `json:"attempts"`
	NextAttemptAt  apiTime         `json:"next_attempt_at"`
	LeaseExpiresAt apiTime         `json:"lease_expires_at"`
	LastError      *string         `json:"last_error"`
	CreatedAt      apiTime         `json:"created_at"`
	UpdatedAt      apiTime         `json:"updated_at"`
}

// sourceSequence is the source's sequence number of the item's event, or
// "-" when it sent none.
func (it inboxItem) sourceSequence() string {
	if it.SourceSequence == nil {
		return "-"
	}
	return strconv.FormatInt(*it.SourceSequence, 10)
}

func (it inboxItem) lastError() string {
	if it.LastError == nil {
		return "-"
	}
	return orDash(*it.LastError)
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

// inboxPath is the path of inbox's endpoint rest.
func inboxPath(inbox, rest string) string {
	return "/v1/inboxes/" + url.PathEscape(inbox) + rest
}

func runInboxList(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "inbox list", "[INBOX] [flags]", `Lists the items of INBOX in id order, one page of --limit items from after --after.
When more are left it says so on stderr; --all fetches every page.
An unknown inbox has no items.

Without INBOX, lists the inboxes with how many items each holds in each state.`)
	af := addAPIFlags(fs, "print the items (without INBOX: the inboxes) as a JSON array")
	state := fs.String("state", "", "only items in this `state`: pending, processing, completed or failed (default: all)")
	limit := positiveInt(100)
	fs.Var(&limit, "limit", fmt.Sprintf("most `items` per page (at most %d)", maxItemsPerCall))
	var after positiveInt
	fs.Var(&after, "after", "list items after this item `ID`")
	all := fs.Bool("all", false, "follow the pages until the last")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	switch fs.NArg() {
	case 0:
		for _, f := range []string{"state", "limit", "after", "all"} {
			if given[f] {
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

	var items []json.RawMessage
	next := int64(after)
	for {
		q := url.Values{}
		if *state != "" {
			q.Set("state", *state)
		}
		q.Set("limit", strconv.Itoa(int(limit)))
		if next > 0 {
			q.Set("after", strconv.FormatInt(next, 10))
		}
		var page struct {
			Items     []json.RawMessage `json:"items"`
			NextAfter int64             `json:"next_after"`
		}
		if _, err := c.get(ctx, inboxPath(inbox, "/items?"+q.Encode()), &page); err != nil {
			return fmt.Errorf("inbox list %s: %w", inbox, err)
		}
		items = append(items, page.Items...)
		if page.NextAfter == 0 {
			break
		}
		if page.NextAfter <= next {
			return fmt.Errorf("inbox list %s: the server's next_after %d does not move past %d", inbox, page.NextAfter, next)
		}
		next = page.NextAfter
		if !*all {
			fmt.Fprintf(env.stderr, "inbox list: more items: --after %d, or --all\n", next)
			break
		}
	}
	raw := jsonArray(items)
	if af.json {
		return printJSON(env, raw)
	}
	var list []inboxItem
	if err := json.Unmarshal(raw, &list); err != nil {
		return fmt.Errorf("inbox list %s: the server's answer: %w", inbox, err)
	}
	tw := tabwriter.NewWriter(env.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tTYPE\tEVENT_ID\tSUBSCRIPTION\tOFFSET\tATTEMPTS\tNEXT_ATTEMPT\tLAST_ERROR")
	for _, it := range list {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", it.ID, it.State, it.Type, it.EventID, it.Subscription,
			it.Offset, it.Attempts, it.NextAttemptAt, shorten(it.lastError(), 60))
	}
	return tw.Flush()
}

// listInboxes prints GET /v1/inboxes.
func listInboxes(ctx context.Context, env *cmdEnv, c *apiClient, af *apiFlags) error {
	inboxes, printed, err := getList[struct {
		Inbox                                  string `json:"inbox"`
		Pending, Processing, Completed, Failed int64
	}](ctx, env, c, af, "/v1/inboxes", "inboxes")
	if err != nil || printed {
		return wrapErr("inbox list", err)
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
	var it inboxItem
	raw, err := c.get(ctx, inboxPath(inbox, "/items/"+strconv.FormatInt(ids[0], 10)), &it)
	if err != nil {
		return fmt.Errorf("inbox show %s %d: %w", inbox, ids[0], err)
	}
	if af.json {
		return printJSON(env, raw)
	}
	tw := tabwriter.NewWriter(env.stdout, 2, 4, 1, ' ', 0)
	for _, kv := range [][2]string{
		{"id", strconv.FormatInt(it.ID, 10)}, {"inbox", it.Inbox}, {"subscription", it.Subscription},
		{"stream", it.Stream}, {"offset", strconv.FormatInt(it.Offset, 10)}, {"stream_event_id", it.StreamEventID},
		{"event_id", it.EventID}, {"type", it.Type}, {"occurred_at", it.OccurredAt.String()},
		{"source_sequence", it.sourceSequence()}, {"stored_at", it.StoredAt.String()}, {"metadata", pairs(it.Metadata)},
		{"state", it.State}, {"attempts", strconv.Itoa(it.Attempts)},
		{"next_attempt_at", it.NextAttemptAt.String()}, {"lease_expires_at", it.LeaseExpiresAt.String()},
		{"last_error", it.lastError()}, {"created_at", it.CreatedAt.String()}, {"updated_at", it.UpdatedAt.String()},
	} {
		fmt.Fprintf(tw, "%s:\t%s\n", kv[0], kv[1])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(env.stdout, "payload:")
	if len(it.Payload) == 0 {
		it.Payload = json.RawMessage("null")
	}
	return printJSON(env, it.Payload)
}

// attempt is one attempt of an item's attempt log as the API answers it.
type attempt struct {
	Attempt         int     `json:"attempt"`
	AttemptedAt     apiTime `json:"attempted_at"`
	EndpointURL     string  `json:"endpoint_url"`
	StatusCode      int     `json:"status_code"`
	LatencyMS       float64 `json:"latency_ms"`
	Error           *string `json:"error"`
	ResponseExcerpt *string `json:"response_excerpt"`
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
	log, printed, err := getList[attempt](ctx, env, c, af, inboxPath(inbox, "/items/"+strconv.FormatInt(ids[0], 10)+"/attempts"), "attempts")
	if err != nil || printed {
		return wrapErr(fmt.Sprintf("inbox attempts %s %d", inbox, ids[0]), err)
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
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%s\n", a.Attempt, a.AttemptedAt, a.EndpointURL, a.StatusCode, latency, errText, excerpt)
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
	visibility := fs.Duration("visibility", 30*time.Second, "how long the lease lasts")
	wait := fs.Duration("wait", 0, fmt.Sprintf("how long to wait for an item when none is ready (at most %v)", maxLeaseWait))
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
	case *visibility <= 0:
		return usagef("inbox lease: --visibility must be above 0, not %v", *visibility)
	case *wait < 0 || *wait > maxLeaseWait:
		return usagef("inbox lease: --wait must be 0s to %v, not %v", maxLeaseWait, *wait)
	}
	c.timeout += *wait
	body := map[string]any{"max": int(maxItems), "visibility_timeout": visibility.String(), "wait": wait.String()}
	var raw json.RawMessage
	if _, err := c.do(ctx, http.MethodPost, inboxPath(inbox, "/lease"), body, &raw); err != nil {
		return fmt.Errorf("inbox lease %s: %w", inbox, err)
	}
	if af.json {
		return printJSON(env, raw)
	}
	var out struct {
		Lease     string      `json:"lease"`
		ExpiresAt apiTime     `json:"expires_at"`
		Items     []inboxItem `json:"items"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return fmt.Errorf("inbox lease %s: the server's answer: %w", inbox, err)
	}
	if len(out.Items) == 0 {
		fmt.Fprintf(env.stdout, "no items ready in inbox %s\n", inbox)
		return nil
	}
	noun := "items"
	if len(out.Items) == 1 {
		noun = "item"
	}
	fmt.Fprintf(env.stdout, "lease %s expires %s: %d %s\n", out.Lease, out.ExpiresAt, len(out.Items), noun)
	tw := tabwriter.NewWriter(env.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTYPE\tEVENT_ID\tATTEMPTS")
	for _, it := range out.Items {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\n", it.ID, it.Type, it.EventID, it.Attempts)
	}
	return tw.Flush()
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
	body := map[string]any{}
	if *lease != "" {
		body["lease"] = *lease
	}
	return settle(ctx, env, c, af, fs.Name(), "ack", fs.Args(), body)
}

func runInboxNack(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "inbox nack", "INBOX ID [ID...] [flags]", `Returns the items to pending, due again after --delay, with --reason as their last
error. With --lease, each must still hold that lease. Prints one line per ID with its
result; if any failed, the exit status is 1.`)
	af := addAPIFlags(fs, "print the server's answer: {items: [{id, state} or {id, error}]}")
	lease := fs.String("lease", "", "the `token` of the lease the items hold")
	delay := fs.Duration("delay", 0, "how long until the items are due again")
	reason := fs.String("reason", "", "why, kept as the items' last error")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	if *delay < 0 {
		return usagef("inbox nack: --delay must not be negative, not %v", *delay)
	}
	body := map[string]any{"delay": delay.String()}
	if *lease != "" {
		body["lease"] = *lease
	}
	if *reason != "" {
		body["reason"] = *reason
	}
	return settle(ctx, env, c, af, fs.Name(), "nack", fs.Args(), body)
}

// maxSettle is how many ids one ack or nack request carries; more are
// sent in several requests.
const maxSettle = 1000

// settle posts an ack or nack of the items named by args (INBOX ID...) and
// prints each item's result; an error if any item failed.
func settle(ctx context.Context, env *cmdEnv, c *apiClient, af *apiFlags, cmd, verb string, args []string, body map[string]any) error {
	if len(args) == 0 {
		return usagef("%s: INBOX and at least one item ID are required", cmd)
	}
	inbox := args[0]
	ids, err := itemIDs(cmd, args[1:])
	if err != nil {
		return err
	}
	var results []json.RawMessage
	for chunk := range slices.Chunk(ids, maxSettle) {
		body["ids"] = chunk
		var out struct {
			Items []json.RawMessage `json:"items"`
		}
		if _, err := c.do(ctx, http.MethodPost, inboxPath(inbox, "/"+verb), body, &out); err != nil {
			return fmt.Errorf("%s %s: %w", cmd, inbox, err)
		}
		if len(out.Items) != len(chunk) {
			return fmt.Errorf("%s %s: the server answered %d results for %d ids", cmd, inbox, len(out.Items), len(chunk))
		}
		results = append(results, out.Items...)
	}
	if af.json {
		b, _ := json.Marshal(map[string]any{"items": results})
		if err := printJSON(env, b); err != nil {
			return err
		}
	}
	failed := 0
	tw := tabwriter.NewWriter(env.stdout, 2, 4, 2, ' ', 0)
	for _, raw := range results {
		var r struct {
			ID    int64  `json:"id"`
			State string `json:"state"`
			Error *struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(raw, &r); err != nil {
			return fmt.Errorf("%s %s: the server's answer: %w", cmd, inbox, err)
		}
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
