package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxpg"
	"github.com/postbox-events/postbox/outbox/outboxsqlite"
)

var outboxCommands = []subcommand{
	{"list", "show the outbox's rows (default: the rejected ones, with the receiver's reason)", runOutboxList},
	{"requeue", "make rejected (refused or parked) rows pending again, so the relay sends them again", runOutboxRequeue},
	{"drop", "delete rejected rows the receiver refused for good, so the rejected gauge clears", runOutboxDrop},
	{"emit", "insert events into a transactional outbox, for trials and tests", runOutboxEmit},
	{"migrate", "create or upgrade the outbox table in a PostgreSQL database", runOutboxMigrate},
}

func init() {
	groupNotes["outbox"] = `list, requeue and drop work on the edge agent's outbox (--outbox FILE) or on a
transactional outbox (--db postgres://... or --db FILE); emit and migrate on a
transactional outbox (--db). postbox migrate status|up --outbox shows or applies
any outbox's migrations.`
}

func runOutbox(ctx context.Context, env *cmdEnv, args []string) error {
	return runGroup(ctx, env, "outbox", outboxCommands, args)
}

// outboxFlags declares --outbox and --db and returns a function that opens
// the outbox they name. A flag on the command line wins over both
// variables; of the variables, DATABASE_URL wins.
func outboxFlags(env *cmdEnv, fs *flag.FlagSet) func(ctx context.Context) (*outboxDB, error) {
	path := fs.String("outbox", "outbox.db", "the edge agent's outbox SQLite file [POSTBOX_OUTBOX]")
	dsn := fs.String("db", "", "a transactional outbox instead: postgres://... or a SQLite file [DATABASE_URL]")
	return func(ctx context.Context) (*outboxDB, error) {
		target := *dsn // parse set both from the environment unless given
		switch {
		case onCommandLine(fs, "outbox") && onCommandLine(fs, "db"):
			return nil, usagef("%s: --outbox and --db name two outboxes; give one", fs.Name())
		case onCommandLine(fs, "outbox"), target == "":
			target = *path
		}
		if target == "outbox.db" && flagSource(fs, "outbox") == "" {
			if _, err := os.Stat(target); errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("%s: no outbox.db here, the default of --outbox: name the agent's outbox file with --outbox, or a transactional outbox with --db", fs.Name())
			}
		}
		return openOutboxDB(ctx, target, false, outboxpg.Config{})
	}
}

func runOutboxList(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "outbox list", "[flags]", "Lists outbox rows, oldest first. Works while the agent or relay runs.")
	open := outboxFlags(env, fs)
	state := fs.String("state", "rejected", "rejected, pending, delivered (transactional outbox) or all")
	limit := positiveInt(100)
	fs.Var(&limit, "limit", "most `rows` to show")
	asJSON := fs.Bool("json", false, "print a JSON array")
	if err := parse(env, fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	switch *state {
	case "all":
		*state = ""
	case outbox.StatePending, outbox.StateRejected, outbox.StateDelivered:
	default:
		return usagef("outbox list: --state must be rejected, pending, delivered or all, not %q", *state)
	}
	db, err := open(ctx)
	if err != nil {
		return err
	}
	defer db.close()
	if *state == outbox.StateDelivered && db.pg == nil {
		return usagef("outbox list: --state delivered: this outbox deletes rows when they are delivered")
	}
	rows, err := db.admin.List(ctx, *state, int(limit))
	if err != nil {
		return err
	}
	if *asJSON {
		if rows == nil {
			rows = []outbox.Row{}
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
	fs := newFlags(env, "outbox requeue", "(EVENT_ID... | --all) [flags]", `Makes rejected (refused or parked) rows pending and due now; a running agent or relay sends
them within its poll interval. Says what happened to each EVENT_ID named: requeued, not in the
outbox, or not rejected (pending or delivered: nothing to requeue).`)
	open := outboxFlags(env, fs)
	all := fs.Bool("all", false, "requeue every rejected row")
	if err := parse(env, fs, args); err != nil {
		return err
	}
	if *all == (fs.NArg() > 0) {
		return usagef("outbox requeue: name event ids or pass --all (not both)")
	}
	db, err := open(ctx)
	if err != nil {
		return err
	}
	defer db.close()
	var before map[string]string
	if fs.NArg() > 0 {
		if before, err = rowStates(ctx, db, fs.Args()); err != nil {
			return err
		}
	}
	n, err := db.admin.Requeue(ctx, fs.Args())
	if err != nil {
		return err
	}
	for _, id := range fs.Args() {
		if before[id] == outbox.StateRejected {
			fmt.Fprintf(env.stdout, "%s: requeued\n", id)
		}
	}
	notes := rowNotes(env, "outbox requeue", fs.Args(), before, "requeue")
	fmt.Fprintf(env.stdout, "%d rejected events requeued\n", n)
	switch {
	case n == 0 && fs.NArg() > 0:
		return fmt.Errorf("outbox requeue: none of %s is a rejected row", strings.Join(fs.Args(), ", "))
	case notes > 0:
		fmt.Fprintf(env.stderr, "outbox requeue: %d of the %d ids named are not rejected rows (unknown, pending or delivered)\n", notes, fs.NArg())
	}
	return nil
}

func runOutboxDrop(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "outbox drop", "(EVENT_ID... | --all) [flags]", `Deletes rejected rows for good: events the receiver refused (a NACK it will not change its mind
on, such as invalid_payload) or that the relay parked, once an operator decided they are not to be
sent. The rejected count of /metrics (postbox_outbox_events{state="rejected"}) and an alert on it
clear. Only rejected rows are dropped: a pending or delivered row named stays, and is said so.
Name the rows' event ids, or pass --all to drop every rejected row; postbox outbox list shows
them first. To send a row again instead, use postbox outbox requeue.`)
	open := outboxFlags(env, fs)
	all := fs.Bool("all", false, "drop every rejected row")
	asJSON := fs.Bool("json", false, `print {"dropped": [EVENT_ID...]}`)
	if err := parse(env, fs, args); err != nil {
		return err
	}
	if *all == (fs.NArg() > 0) {
		return usagef("outbox drop: name event ids or pass --all to drop every rejected row (not both)")
	}
	db, err := open(ctx)
	if err != nil {
		return err
	}
	defer db.close()
	ra, ok := db.admin.(outbox.RowAdmin)
	if !ok {
		return fmt.Errorf("outbox drop: this outbox cannot drop rows")
	}
	var before map[string]string
	if fs.NArg() > 0 {
		if before, err = rowStates(ctx, db, fs.Args()); err != nil {
			return err
		}
	}
	dropped, err := ra.Drop(ctx, fs.Args())
	if err != nil {
		return err
	}
	if *asJSON {
		b, _ := json.Marshal(map[string]any{"dropped": jsonArray(dropped)})
		fmt.Fprintln(env.stdout, string(b))
	} else {
		for _, id := range dropped {
			fmt.Fprintf(env.stdout, "%s: dropped\n", id)
		}
	}
	rowNotes(env, "outbox drop", fs.Args(), before, "drop")
	if !*asJSON {
		fmt.Fprintf(env.stdout, "%d rejected events dropped\n", len(dropped))
	}
	if len(dropped) == 0 && fs.NArg() > 0 {
		return fmt.Errorf("outbox drop: none of %s is a rejected row", strings.Join(fs.Args(), ", "))
	}
	return nil
}

// rowStates returns the state of each row of ids the outbox holds.
func rowStates(ctx context.Context, db *outboxDB, ids []string) (map[string]string, error) {
	ra, ok := db.admin.(outbox.RowAdmin)
	if !ok {
		return nil, nil
	}
	rows, err := ra.Rows(ctx, ids)
	if err != nil {
		return nil, err
	}
	states := make(map[string]string, len(rows))
	for _, r := range rows {
		states[r.EventID] = r.State
	}
	return states, nil
}

// rowNotes says on stderr, for each id that was not a rejected row, what
// it was instead, and returns how many it named.
func rowNotes(env *cmdEnv, cmd string, ids []string, states map[string]string, verb string) int {
	n := 0
	for _, id := range ids {
		switch st := states[id]; st {
		case outbox.StateRejected:
		case "":
			fmt.Fprintf(env.stderr, "%s: %s: not in the outbox\n", cmd, id)
			n++
		default:
			fmt.Fprintf(env.stderr, "%s: %s: %s, not rejected: nothing to %s\n", cmd, id, st, verb)
			n++
		}
	}
	return n
}

func runOutboxEmit(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "outbox emit", "--db DSN --type TYPE --payload JSON [flags]", `Inserts events into a transactional outbox, as a service would in its own transactions, for
trials and tests: --count events, --batch per transaction, each with a new id unless --id is given.
The table is created if missing. A relay on PostgreSQL sends them at once (LISTEN/NOTIFY); on
SQLite, within its poll interval.`)
	dsn := fs.String("db", "", "the outbox's database: postgres://... or a SQLite file [DATABASE_URL]")
	typ := fs.String("type", "", "event type, e.g. order.created")
	payload := fs.String("payload", "", "event payload, JSON")
	id := fs.String("id", "", "event id (only with --count 1); default: a new evt_ id per event")
	corr := fs.String("correlation-id", "", "correlation id; default: the event's id")
	tenant := fs.String("tenant", "", "tenant id")
	count := positiveInt(1)
	fs.Var(&count, "count", "how many `events` to insert")
	batch := positiveInt(500)
	fs.Var(&batch, "batch", "`events` per transaction")
	if err := parse(env, fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	switch {
	case *dsn == "" || *typ == "" || *payload == "":
		return usagef("outbox emit: --db, --type and --payload are required")
	case *id != "" && count > 1:
		return usagef("outbox emit: --id names one event; it cannot go with --count %d", count)
	}
	proto := outbox.Event{ID: *id, Type: *typ, Payload: []byte(*payload), CorrelationID: *corr, TenantID: *tenant}
	if err := (&outbox.Event{ID: "check", Type: proto.Type, Payload: proto.Payload}).Prepare(); err != nil {
		return usagef("outbox emit: %v", err)
	}
	insert, closeDB, err := openEmitter(ctx, *dsn)
	if err != nil {
		return err
	}
	defer closeDB()
	start, lastLog := time.Now(), time.Now()
	var first, last string
	for done := 0; done < int(count); {
		n := min(int(batch), int(count)-done)
		events := make([]outbox.Event, n)
		for i := range events {
			events[i] = proto
		}
		if err := insert(ctx, events); err != nil {
			return fmt.Errorf("outbox emit: after %d events: %w", done, err)
		}
		if first == "" {
			first = events[0].ID
		}
		last = events[n-1].ID
		done += n
		if time.Since(lastLog) > 2*time.Second {
			fmt.Fprintf(env.stderr, "%d/%d events inserted\n", done, count)
			lastLog = time.Now()
		}
	}
	elapsed := time.Since(start)
	if count == 1 {
		fmt.Fprintf(env.stdout, "inserted %s\n", first)
		return nil
	}
	fmt.Fprintf(env.stdout, "inserted %d events (%s … %s) in %s, %.0f/s\n", count, first, last, elapsed.Round(time.Millisecond), float64(count)/elapsed.Seconds())
	return nil
}

// openEmitter returns a function inserting events in one transaction of
// the database at dsn, creating the outbox table if missing.
func openEmitter(ctx context.Context, dsn string) (func(context.Context, []outbox.Event) error, func(), error) {
	if err := checkDB(dsn); err != nil {
		return nil, nil, err
	}
	if isPostgres(dsn) {
		pool, err := pgxpool.New(ctx, dsn)
		if err != nil {
			return nil, nil, fmt.Errorf("--db: %w", err)
		}
		if err := outboxpg.Migrate(ctx, pool); err != nil {
			pool.Close()
			return nil, nil, fmt.Errorf("--db %s: %w", redact(dsn), err)
		}
		return func(ctx context.Context, events []outbox.Event) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outboxpg.InsertPgx(ctx, tx, events...) })
		}, pool.Close, nil
	}
	db, err := sqlitedb.Open(dsn, sqlitedb.Options{})
	if err != nil {
		return nil, nil, err
	}
	if err := outboxsqlite.Migrate(ctx, db); err != nil {
		db.Close()
		return nil, nil, err
	}
	return func(ctx context.Context, events []outbox.Event) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := outboxsqlite.Insert(ctx, tx, events...); err != nil {
			return err
		}
		return tx.Commit()
	}, func() { db.Close() }, nil
}

func runOutboxMigrate(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "outbox migrate", "--db postgres://...", `Creates or upgrades the transactional outbox table (and its LISTEN/NOTIFY trigger) in a PostgreSQL
database. Safe to run again, and from several places at once. postbox relay does this at start
unless --migrate=false.`)
	dsn := fs.String("db", "", "postgres://... [DATABASE_URL]")
	if err := parse(env, fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	switch {
	case *dsn == "":
		return usagef("outbox migrate: --db is required (or DATABASE_URL)")
	case !isPostgres(*dsn):
		return usagef("outbox migrate: --db must be a postgres:// URL (a SQLite outbox is created by the program that writes it)")
	}
	pool, err := pgxpool.New(ctx, *dsn)
	if err != nil {
		return fmt.Errorf("--db: %w", err)
	}
	defer pool.Close()
	if err := outboxpg.Migrate(ctx, pool); err != nil {
		return err
	}
	fmt.Fprintf(env.stdout, "outbox table ready in %s\n", redact(*dsn))
	return nil
}
