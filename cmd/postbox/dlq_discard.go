package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/postbox-events/postbox/api"
)

func runDLQDiscard(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "dlq discard", "ID... | --inbox I | --subscription S | --since T --until T | --all [flags]", `Deletes dead letters for good, with their attempt logs: they cannot be replayed
afterwards. Name IDs (at most 1000), or select them with --inbox, --subscription, --since
and --until (together they narrow the selection, and narrow the IDs too; the times select by
when the item failed, and take an RFC 3339 time or how long ago: 90m, 2h30m, 7d). --all
discards every dead letter and goes alone. An ID that is not a dead letter is left alone.

Prints how many it discarded.`)
	af := addAPIFlags(fs, `print {"discarded": N, "ids": [...]}`)
	sel := addSelectionFlags(fs, "discard")
	all := fs.Bool("all", false, "discard every dead letter")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	var pick api.DiscardDeadLetters
	if fs.NArg() > 0 {
		if pick.IDs, err = itemIDs(fs.Name(), fs.Args()); err != nil {
			return err
		}
	}
	switch {
	case *all && (!sel.empty() || len(pick.IDs) > 0):
		return usagef("dlq discard: --all discards every dead letter; leave out IDs, --inbox, --subscription, --since and --until, or --all")
	case !*all && sel.empty() && len(pick.IDs) == 0:
		return usagef("dlq discard: name IDs, or select dead letters with --inbox, --subscription, --since or --until, or discard every one with --all")
	}
	q, err := sel.query("dlq discard", time.Now())
	if err != nil {
		return err
	}
	pick.Inbox, pick.Subscription, pick.From, pick.To, pick.All = q.Inbox, q.Subscription, apiTime(q.From), apiTime(q.To), *all
	out, err := c.DiscardDeadLetters(ctx, pick)
	if err != nil {
		return fmt.Errorf("dlq discard: %w", c.explain(err))
	}
	if af.json {
		b, _ := json.Marshal(map[string]any{"discarded": out.Discarded, "ids": jsonArray(out.IDs)})
		return printJSON(env, b)
	}
	switch out.Discarded {
	case 0:
		fmt.Fprintln(env.stdout, "no dead letters selected: discarded none")
	case 1:
		fmt.Fprintf(env.stdout, "discarded 1 dead letter (item %d)\n", out.IDs[0])
	default:
		fmt.Fprintf(env.stdout, "discarded %d dead letters\n", out.Discarded)
	}
	return nil
}
