package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/postbox-events/postbox/internal/sqlitedb"
)

// backup and restore copy any SQLite file of postbox: serve's database,
// an agent's outbox, the relay's SQLite outbox.

func runBackup(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "backup", "--db FILE --to BACKUP | --server URL --to BACKUP [flags]", `Takes a consistent snapshot of a postbox SQLite database while it is in use (serve
taking traffic, an agent or relay sending) and writes it to BACKUP. Works on any postbox
SQLite file: serve's database (--db), an agent's outbox, the relay's SQLite outbox; it
names which it found. The copy is SQLite's online backup inside one read transaction:
writers go on while it runs, and it holds every transaction committed when it began
(WAL included). It is written to BACKUP.*.partial beside BACKUP, synced, and renamed to
BACKUP only when complete: a backup killed halfway leaves no file at BACKUP, and the
next backup removes the partial one. An existing BACKUP is replaced.

With --server instead of --db, fetches the snapshot of serve's database through its
API (GET /v1/backup, with --token), the same way.

Then prints what the snapshot holds: its kind and schema versions, the last offset
of each stream, the inbox items by state, the sources, outbox rows, and its size.
Restore it with postbox restore.`)
	db := fs.String("db", "", "the SQLite `file` to back up (serve's --db, an agent's --outbox, a relay's SQLite outbox)")
	to := fs.String("to", "", "the backup `file` to write (required)")
	af := addAPIFlags(fs, "print what the backup holds as one JSON object")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	if *to == "" {
		return usagef("backup: --to FILE is required: where to write the backup")
	}
	if fi, err := os.Stat(*to); err == nil && fi.IsDir() {
		return usagef("backup: --to %s is a directory: name the backup file", *to)
	}
	remote := onCommandLine(fs, "server") || (*db == "" && isSet(fs, "server"))
	switch {
	case *db != "" && onCommandLine(fs, "server"):
		return usagef("backup: give --db FILE or --server URL, not both")
	case *db == "" && !remote:
		return usagef("backup: give --db FILE (a SQLite file of postbox on this machine) or --server URL (serve's API)")
	}
	start := time.Now()
	if remote {
		fmt.Fprintf(env.stderr, "backup: fetching a snapshot from %s to %s\n", c.base, *to)
		if err := fetchBackup(ctx, c, *to); err != nil {
			return err
		}
	} else {
		if _, err := os.Stat(*db); err != nil {
			return fmt.Errorf("backup: --db %s: %w", *db, errors.Unwrap(err))
		}
		if same(*db, *to) {
			return usagef("backup: --to %s is the database itself", *to)
		}
		src, err := sqlitedb.OpenReadOnly(*db)
		if err != nil {
			return fmt.Errorf("backup: --db %s: %w", *db, err)
		}
		_, kind, err := fileKind(ctx, src, *db)
		src.Close()
		if err != nil {
			return fmt.Errorf("backup: --db %w", err)
		}
		size := storeBytes(*db)
		fmt.Fprintf(env.stderr, "backup: copying %s, a %s (%s with its WAL), to %s\n", *db, kind, bytesText(size), *to)
		progress := func(copied, total int64) {
			fmt.Fprintf(env.stderr, "backup: %s of %s copied\n", bytesText(copied), bytesText(total))
		}
		if err := sqlitedb.Backup(ctx, *db, *to, progress); err != nil {
			return fmt.Errorf("backup: %w", err)
		}
	}
	took := time.Since(start)
	sum, err := summarize(ctx, *to)
	if err != nil {
		return fmt.Errorf("backup: written to %s, but %w", *to, err)
	}
	fmt.Fprintf(env.stderr, "backup: done in %v: %s, %s\n", took.Round(time.Millisecond), *to, bytesText(sum.Bytes))
	sum.Took = took.Round(time.Millisecond).String()
	return printSummary(env, sum, af.json)
}

// fetchBackup writes the snapshot serve's API answers to a partial file
// beside to, syncs it, checks it and renames it to to.
func fetchBackup(ctx context.Context, c *apiClient, to string) error {
	dir, base := filepath.Dir(to), filepath.Base(to)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	f, err := os.CreateTemp(dir, base+".*"+sqlitedb.PartialSuffix)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	tmp := f.Name()
	fail := func(err error) error {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if _, err := c.Backup(ctx, f); err != nil {
		return fail(fmt.Errorf("backup: %w", c.explain(err)))
	}
	if err := f.Sync(); err != nil {
		return fail(fmt.Errorf("backup: sync %s: %w", tmp, err))
	}
	if err := f.Close(); err != nil {
		return fail(fmt.Errorf("backup: %w", err))
	}
	db, err := sqlitedb.OpenReadOnly(tmp)
	if err == nil {
		err = sqlitedb.IntegrityCheck(ctx, db)
		db.Close()
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("backup: the snapshot the server sent: %w", err)
	}
	if err := os.Rename(tmp, to); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("backup: %w", err)
	}
	return sqlitedb.SyncDir(dir)
}

func runRestore(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "restore", "--from BACKUP --db FILE [--force] [flags]", `Puts a backup written by postbox backup in place as the SQLite database FILE (serve's
--db, an agent's outbox, a relay's SQLite outbox), to be started on.

Checks the backup first (PRAGMA integrity_check), refuses a database in use (a running
serve, agent or relay holds its lock: stop it first), and refuses to replace an existing
database unless --force. The backup is copied beside FILE, synced and renamed into
place; the WAL and shared-memory files of the database it replaces are removed. Then
prints what the restored database holds, as postbox backup does.`)
	from := fs.String("from", "", "the backup `file` to restore (required)")
	db := fs.String("db", "", "the database `file` to restore to (required)")
	force := fs.Bool("force", false, "replace an existing database at --db (never one in use)")
	asJSON := fs.Bool("json", false, "print what the restored database holds as one JSON object")
	if err := parse(env, fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	if *from == "" || *db == "" {
		return usagef("restore: --from BACKUP and --db FILE are required")
	}
	if fi, err := os.Stat(*from); err != nil {
		return fmt.Errorf("restore: --from %s: %w", *from, errors.Unwrap(err))
	} else if fi.IsDir() {
		return usagef("restore: --from %s is a directory: name the backup file", *from)
	}
	if fi, err := os.Stat(*db); err == nil && fi.IsDir() {
		return usagef("restore: --db %s is a directory: name the database file", *db)
	}
	src, err := sqlitedb.OpenReadOnly(*from)
	if err == nil {
		err = sqlitedb.IntegrityCheck(ctx, src)
		src.Close()
	}
	if err != nil {
		return fmt.Errorf("restore: --from %s: %w", *from, err)
	}
	if _, err := summarize(ctx, *from); err != nil {
		return fmt.Errorf("restore: --from %s: %w", *from, err)
	}
	err = sqlitedb.Restore(*from, *db, *force)
	switch {
	case errors.Is(err, sqlitedb.ErrLocked):
		return fmt.Errorf("restore: %w: stop the process that has it open first", err)
	case errors.Is(err, sqlitedb.ErrExists):
		return fmt.Errorf("restore: %w: give --force to replace it, or another --db", err)
	case err != nil:
		return fmt.Errorf("restore: %w", err)
	}
	sum, err := summarize(ctx, *db)
	if err != nil {
		return fmt.Errorf("restore: restored %s, but %w", *db, err)
	}
	fmt.Fprintf(env.stderr, "restore: %s restored from %s\n", *db, *from)
	return printSummary(env, sum, *asJSON)
}

// storeSummary is what a postbox SQLite file holds, as backup and
// restore print it.
type storeSummary struct {
	File   string         `json:"file"`
	Kind   string         `json:"kind"`
	Bytes  int64          `json:"bytes"`
	Schema map[string]int `json:"schema"`
	// Streams, Inboxes, Subscriptions and Sources: serve's database.
	Streams       []streamSummary       `json:"streams,omitempty"`
	Inboxes       []inboxSummary        `json:"inboxes,omitempty"`
	Subscriptions []subscriptionSummary `json:"subscriptions,omitempty"`
	Sources       []string              `json:"sources,omitempty"`
	// Outbox: an agent's or relay's outbox, by state.
	Outbox map[string]int64 `json:"outbox,omitempty"`
	Took   string           `json:"took,omitempty"`
}

type streamSummary struct {
	Stream     string `json:"stream"`
	Events     int64  `json:"events"`
	LastOffset int64  `json:"last_offset"`
}

type inboxSummary struct {
	Inbox  string           `json:"inbox"`
	Items  int64            `json:"items"`
	States map[string]int64 `json:"states"`
}

type subscriptionSummary struct {
	Subscription string `json:"subscription"`
	Stream       string `json:"stream"`
	NextOffset   int64  `json:"next_offset"`
}

// Kinds of postbox SQLite file, told by the components of their
// schema_migrations.
const (
	kindServe  = "serve database"
	kindOutbox = "outbox (an agent's, or a relay's SQLite outbox)"
	kindKafka  = "Kafka identity index"
)

// summarize reads what the postbox SQLite file at path holds.
func summarize(ctx context.Context, path string) (storeSummary, error) {
	sum := storeSummary{File: path, Bytes: storeBytes(path), Schema: map[string]int{}}
	db, err := sqlitedb.OpenReadOnly(path)
	if err != nil {
		return sum, err
	}
	defer db.Close()
	if sum.Schema, sum.Kind, err = fileKind(ctx, db, path); err != nil {
		return sum, err
	}
	switch sum.Kind {
	case kindServe:
		err = summarizeServe(ctx, db, &sum)
	case kindOutbox:
		sum.Outbox = map[string]int64{}
		err = query(ctx, db, `SELECT state, count(*) FROM outbox GROUP BY state`, func(r *sql.Rows) error {
			var s string
			var n int64
			err := r.Scan(&s, &n)
			sum.Outbox[s] = n
			return err
		})
	}
	if err != nil {
		return sum, fmt.Errorf("%s: %w", path, err)
	}
	return sum, nil
}

// fileKind reads the schema versions of the postbox SQLite file db (at
// path) and tells its kind by them.
func fileKind(ctx context.Context, db *sql.DB, path string) (map[string]int, string, error) {
	schema := map[string]int{}
	err := query(ctx, db, `SELECT component, version FROM schema_migrations`, func(r *sql.Rows) error {
		var c string
		var v int
		err := r.Scan(&c, &v)
		schema[c] = v
		return err
	})
	if err != nil {
		if strings.Contains(err.Error(), "no such table") {
			return nil, "", fmt.Errorf("%s is not a postbox database: it has no table schema_migrations", path)
		}
		return nil, "", fmt.Errorf("%s: %w", path, err)
	}
	has := func(c string) bool { _, ok := schema[c]; return ok }
	switch {
	case has("streams") || has("delivery"):
		return schema, kindServe, nil
	case has("outbox"):
		return schema, kindOutbox, nil
	case has("streamkafka"):
		return schema, kindKafka, nil
	}
	return nil, "", fmt.Errorf("%s is not a postbox database: schema_migrations names none of postbox's components", path)
}

// summarizeServe reads the streams, inboxes, subscriptions and sources
// of serve's database.
func summarizeServe(ctx context.Context, db *sql.DB, sum *storeSummary) error {
	if _, ok := sum.Schema["streams"]; ok {
		// An event's pos is its stream's number << 40 | its offset: each
		// stream is a range of the primary key.
		err := query(ctx, db, `SELECT s.stream_id,
			(SELECT count(*) FROM stream_events e WHERE e.pos >= s.stream_no << 40 AND e.pos < (s.stream_no + 1) << 40),
			COALESCE((SELECT max(e.pos) FROM stream_events e WHERE e.pos >= s.stream_no << 40 AND e.pos < (s.stream_no + 1) << 40) & 1099511627775, 0)
			FROM streams s ORDER BY s.stream_id`, func(r *sql.Rows) error {
			var s streamSummary
			err := r.Scan(&s.Stream, &s.Events, &s.LastOffset)
			sum.Streams = append(sum.Streams, s)
			return err
		})
		if err != nil {
			return err
		}
		err = query(ctx, db, `SELECT c.subscription_id, c.stream_id, c.next_offset FROM consumers c ORDER BY 1`, func(r *sql.Rows) error {
			var s subscriptionSummary
			err := r.Scan(&s.Subscription, &s.Stream, &s.NextOffset)
			sum.Subscriptions = append(sum.Subscriptions, s)
			return err
		})
		if err != nil {
			return err
		}
	}
	if _, ok := sum.Schema["delivery"]; !ok {
		return nil
	}
	inboxes := map[string]*inboxSummary{}
	err := query(ctx, db, `SELECT inbox_id, state, count(*) FROM inbox_items GROUP BY inbox_id, state`, func(r *sql.Rows) error {
		var inbox, state string
		var n int64
		if err := r.Scan(&inbox, &state, &n); err != nil {
			return err
		}
		ib := inboxes[inbox]
		if ib == nil {
			ib = &inboxSummary{Inbox: inbox, States: map[string]int64{}}
			inboxes[inbox] = ib
		}
		ib.States[state] += n
		ib.Items += n
		return nil
	})
	if err != nil {
		return err
	}
	for _, name := range slices.Sorted(maps.Keys(inboxes)) {
		sum.Inboxes = append(sum.Inboxes, *inboxes[name])
	}
	if len(sum.Subscriptions) == 0 { // streams of another backend: delivery's own positions
		query(ctx, db, `SELECT subscription_id, stream_id, 0 FROM subscriptions ORDER BY 1`, func(r *sql.Rows) error {
			var s subscriptionSummary
			err := r.Scan(&s.Subscription, &s.Stream, &s.NextOffset)
			sum.Subscriptions = append(sum.Subscriptions, s)
			return err
		})
	}
	return query(ctx, db, `SELECT source_id || ' (' || kind || ')' FROM sources ORDER BY 1`, func(r *sql.Rows) error {
		var s string
		err := r.Scan(&s)
		sum.Sources = append(sum.Sources, s)
		return err
	})
}

// query runs q on db and calls scan for each row.
func query(ctx context.Context, db *sql.DB, q string, scan func(*sql.Rows) error) error {
	rows, err := db.QueryContext(ctx, q)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// printSummary prints sum for a person, or as JSON.
func printSummary(env *cmdEnv, sum storeSummary, asJSON bool) error {
	if asJSON {
		return printValue(env, sum)
	}
	tw := tabwriter.NewWriter(env.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "file\t%s\n", sum.File)
	fmt.Fprintf(tw, "kind\t%s\n", sum.Kind)
	fmt.Fprintf(tw, "size\t%s\n", bytesText(sum.Bytes))
	var schema []string
	for c, v := range sum.Schema {
		schema = append(schema, fmt.Sprintf("%s %d", c, v))
	}
	sort.Strings(schema)
	fmt.Fprintf(tw, "schema\t%s\n", strings.Join(schema, ", "))
	if sum.Kind == kindServe {
		fmt.Fprintf(tw, "sources\t%s\n", orDash(strings.Join(sum.Sources, ", ")))
	}
	for _, s := range sum.Streams {
		fmt.Fprintf(tw, "stream %s\t%d events, last offset %d\n", s.Stream, s.Events, s.LastOffset)
	}
	for _, s := range sum.Subscriptions {
		fmt.Fprintf(tw, "subscription %s\tstream %s, next offset %d\n", s.Subscription, s.Stream, s.NextOffset)
	}
	for _, ib := range sum.Inboxes {
		fmt.Fprintf(tw, "inbox %s\t%d items (%s)\n", ib.Inbox, ib.Items, pairs(anyMap(ib.States)))
	}
	if sum.Outbox != nil {
		fmt.Fprintf(tw, "outbox\t%d pending, %d rejected\n", sum.Outbox["pending"], sum.Outbox["rejected"])
	}
	return tw.Flush()
}

func anyMap(m map[string]int64) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// storeBytes is the size of the database at path with its WAL.
func storeBytes(path string) int64 {
	var n int64
	for _, p := range []string{path, path + "-wal"} {
		if fi, err := os.Stat(p); err == nil {
			n += fi.Size()
		}
	}
	return n
}

// bytesText is n bytes for a person: 1.5 MiB.
func bytesText(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// same reports whether a and b name one existing file.
func same(a, b string) bool {
	fa, err1 := os.Stat(a)
	fb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(fa, fb)
}
