package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
)

func runInboxReply(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "inbox reply", "INBOX ID --body JSON [flags]", `Replies to the event of item ID of INBOX: the server POSTs the JSON body to the url of
the event's delivery handle (a GitHub issue's comments, a Stripe object, a webhook's
reply-to) with the headers and signing secret of the source's reply settings, and
retries it as it retries deliveries; after its last attempt it is a dead letter
(postbox inbox replies, postbox inbox reply-retry). The reply is stored once per
--key (default: a digest of the body): running the command again sends nothing twice.
An item whose handle names no url (a device's event, a CloudEvent) is refused.`)
	body := fs.String("body", "", "the reply's JSON, e.g. '{\"body\":\"Thanks!\"}'; @FILE reads it from FILE, @- from standard input")
	key := fs.String("key", "", "the reply's idempotency key (at most 200 bytes; default: a digest of the body)")
	af := addAPIFlags(fs, "print the reply's JSON")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	if fs.NArg() != 2 {
		return usagef("inbox reply: takes INBOX and one item ID, got %d arguments", fs.NArg())
	}
	inbox := fs.Arg(0)
	if err := checkName("inbox reply", "INBOX", inbox); err != nil {
		return err
	}
	ids, err := itemIDs("inbox reply", fs.Args()[1:])
	if err != nil {
		return err
	}
	if *body == "" {
		return usagef("inbox reply: --body: the JSON to send (or @FILE)")
	}
	raw := []byte(*body)
	if name, ok := strings.CutPrefix(*body, "@"); ok {
		if name == "-" {
			raw, err = io.ReadAll(os.Stdin)
		} else {
			raw, err = os.ReadFile(name)
		}
		if err != nil {
			return usagef("inbox reply: --body: %v", err)
		}
	}
	if !json.Valid(raw) {
		return usagef("inbox reply: --body is not valid JSON: %.60q", raw)
	}
	r, err := c.Reply(ctx, inbox, ids[0], *key, raw)
	if err != nil {
		return fmt.Errorf("inbox reply %s %d: %w", inbox, ids[0], c.explain(err))
	}
	if af.json {
		return printValue(env, r)
	}
	fmt.Fprintf(env.stdout, "reply %s to item %d of %s: %s, to %s\n", r.Key, ids[0], inbox, r.State, r.URL)
	return nil
}

func runInboxReplies(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "inbox replies", "INBOX ID [flags]", `Lists the replies to the event of item ID of INBOX, oldest first: key, state (pending,
completed, failed: a dead letter), attempts, url and last error. --json adds each
reply's body and attempt log.`)
	af := addAPIFlags(fs, "print the replies as a JSON array")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	if fs.NArg() != 2 {
		return usagef("inbox replies: takes INBOX and one item ID, got %d arguments", fs.NArg())
	}
	inbox := fs.Arg(0)
	if err := checkName("inbox replies", "INBOX", inbox); err != nil {
		return err
	}
	ids, err := itemIDs("inbox replies", fs.Args()[1:])
	if err != nil {
		return err
	}
	rs, err := c.Replies(ctx, inbox, ids[0])
	if err != nil {
		return fmt.Errorf("inbox replies %s %d: %w", inbox, ids[0], c.explain(err))
	}
	if af.json {
		return printJSON(env, jsonArray(rs))
	}
	if len(rs) == 0 {
		fmt.Fprintf(env.stdout, "item %d of %s has no replies\n", ids[0], inbox)
		return nil
	}
	tw := tabwriter.NewWriter(env.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tSTATE\tATTEMPTS\tURL\tLAST ERROR")
	for _, r := range rs {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", r.Key, r.State, r.Attempts, r.URL, shorten(oneLine(lastError(r.LastError)), 60))
	}
	return tw.Flush()
}

func runInboxReplyRetry(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "inbox reply-retry", "INBOX ID KEY [flags]", `Sends the failed reply KEY to item ID of INBOX again, with a fresh count of attempts.
A reply that is not failed is refused (exit status 1).`)
	af := addAPIFlags(fs, "print the reply's JSON")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	if fs.NArg() != 3 {
		return usagef("inbox reply-retry: takes INBOX, an item ID and the reply's KEY, got %d arguments", fs.NArg())
	}
	inbox := fs.Arg(0)
	if err := checkName("inbox reply-retry", "INBOX", inbox); err != nil {
		return err
	}
	ids, err := itemIDs("inbox reply-retry", fs.Args()[1:2])
	if err != nil {
		return err
	}
	r, err := c.RetryReply(ctx, inbox, ids[0], fs.Arg(2))
	if err != nil {
		return fmt.Errorf("inbox reply-retry %s %d %s: %w", inbox, ids[0], fs.Arg(2), c.explain(err))
	}
	if af.json {
		return printValue(env, r)
	}
	fmt.Fprintf(env.stdout, "reply %s to item %d of %s: %s\n", r.Key, ids[0], inbox, r.State)
	return nil
}
