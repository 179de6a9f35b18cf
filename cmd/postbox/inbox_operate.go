package main

import (
	"context"
	"fmt"
)

func runInboxCancel(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "inbox cancel", "INBOX ID [flags]", `Cancels the pending item ID of INBOX: it becomes a dead letter at once, with the last
error "cancelled by an operator" (and --reason), and is not delivered unless it is
replayed (postbox dlq replay ID). A scheduled item (its event's deliver_at, shown as its
next attempt) is cancelled so before it is due. An item that is not pending is refused
(exit status 1): a processing one is under an attempt; cancel it once it settles.`)
	reason := fs.String("reason", "", "why, added to the item's last error (at most 500 bytes)")
	af := addAPIFlags(fs, "print the item's JSON")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	if fs.NArg() != 2 {
		return usagef("inbox cancel: takes INBOX and one item ID, got %d arguments", fs.NArg())
	}
	inbox := fs.Arg(0)
	ids, err := itemIDs("inbox cancel", fs.Args()[1:])
	if err != nil {
		return err
	}
	it, err := c.CancelItem(ctx, inbox, ids[0], *reason)
	if err != nil {
		return fmt.Errorf("inbox cancel %s %d: %w", inbox, ids[0], c.explain(err))
	}
	if af.json {
		return printValue(env, it)
	}
	fmt.Fprintf(env.stdout, "item %d of %s: %s, %s\n", it.ID, inbox, it.State, lastError(it.LastError))
	return nil
}

func runInboxDiscard(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "inbox discard", "INBOX ID [flags]", `Deletes the item ID of INBOX for good, with its attempt log: a pending, completed or
failed one. A processing item is refused (exit status 1): its attempt is under way.`)
	af := addAPIFlags(fs, "print the item's JSON as it was")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	if fs.NArg() != 2 {
		return usagef("inbox discard: takes INBOX and one item ID, got %d arguments", fs.NArg())
	}
	inbox := fs.Arg(0)
	ids, err := itemIDs("inbox discard", fs.Args()[1:])
	if err != nil {
		return err
	}
	it, err := c.DiscardItem(ctx, inbox, ids[0])
	if err != nil {
		return fmt.Errorf("inbox discard %s %d: %w", inbox, ids[0], c.explain(err))
	}
	if af.json {
		return printValue(env, it)
	}
	fmt.Fprintf(env.stdout, "item %d of %s discarded (it was %s)\n", it.ID, inbox, it.State)
	return nil
}
