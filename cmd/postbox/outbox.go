package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/postbox-events/postbox/outbox/outboxsqlite"
)

func runOutbox(ctx context.Context, env *cmdEnv, args []string) error {
	sub := ""
	if len(args) > 0 {
		sub, args = args[0], args[1:]
	}
	switch sub {
	case "list":
		return runOutboxList(ctx, env, args)
	case "requeue":
		return runOutboxRequeue(ctx, env, args)
	case "", "-h", "--help", "help":
		fmt.Fprint(env.stdout, `Usage: postbox outbox list|requeue [flags]

  list      show the outbox's rows (default: the rejected ones, with the server's reason)
  requeue   make rejected rows pending again, so the agent sends them again

postbox outbox COMMAND --help shows a command's flags.
`)
		if sub == "" {
			return usagef("outbox: no command given")
		}
		return nil
	}
	return usagef("outbox: unknown command %q (list, requeue)", sub)
}

func openOutbox(path string) (*outboxsqlite.Store, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("outbox %s: %w", path, err)
	}
	return outboxsqlite.Open(path, outboxsqlite.Config{})
}

func runOutboxList(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "outbox list", "[flags]", "Lists outbox rows, oldest first. Works while the agent runs.")
	path := fs.String("outbox", "outbox.db", "outbox SQLite file [POSTBOX_OUTBOX]")
	state := fs.String("state", "rejected", "rejected, pending or all")
	limit := positiveInt(100)
	fs.Var(&limit, "limit", "most `rows` to show")
	asJSON := fs.Bool("json", false, "print a JSON array")
	if err := parse(env, fs, args); err != nil {
		return err
	}
	if err := envDefaults(env, fs, map[string]string{"outbox": "POSTBOX_OUTBOX"}); err != nil {
		return err
	}
	switch *state {
	case "all":
		*state = ""
	case outboxsqlite.StatePending, outboxsqlite.StateRejected:
	default:
		return usagef("outbox list: --state must be rejected, pending or all, not %q", *state)
	}
	store, err := openOutbox(*path)
	if err != nil {
		return err
	}
	defer store.Close()
	rows, err := store.List(ctx, *state, int(limit))
	if err != nil {
		return err
	}
	if *asJSON {
		if rows == nil {
			rows = []outboxsqlite.Row{}
		}
		b, _ := json.Marshal(rows)
		fmt.Fprintln(env.stdout, string(b))
		return nil
	}
	tw := tabwriter.NewWriter(env.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "EVENT_ID\tTYPE\tSTATE\tATTEMPTS\tCREATED\tLAST_ERROR")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", r.EventID, r.Type, r.State, r.Attempts, r.CreatedAt.Format(time.RFC3339), r.LastError)
	}
	return tw.Flush()
}

func runOutboxRequeue(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "outbox requeue", "(EVENT_ID... | --all) [flags]", "Makes rejected rows pending and due now; a running agent sends them within its poll interval.")
	path := fs.String("outbox", "outbox.db", "outbox SQLite file [POSTBOX_OUTBOX]")
	all := fs.Bool("all", false, "requeue every rejected row")
	if err := parse(env, fs, args); err != nil {
		return err
	}
	if err := envDefaults(env, fs, map[string]string{"outbox": "POSTBOX_OUTBOX"}); err != nil {
		return err
	}
	if *all == (fs.NArg() > 0) {
		return usagef("outbox requeue: name event ids or pass --all (not both)")
	}
	store, err := openOutbox(*path)
	if err != nil {
		return err
	}
	defer store.Close()
	n, err := store.Requeue(ctx, fs.Args())
	if err != nil {
		return err
	}
	fmt.Fprintf(env.stdout, "%d rejected events requeued\n", n)
	if n == 0 && fs.NArg() > 0 {
		return fmt.Errorf("outbox requeue: none of %v is a rejected row", fs.Args())
	}
	return nil
}
