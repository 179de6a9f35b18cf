package main

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/intake"
	"github.com/postbox-events/postbox/internal/migrate"
	"github.com/postbox-events/postbox/internal/pgmigrate"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/outbox/outboxpg"
	"github.com/postbox-events/postbox/outbox/outboxsqlite"
	"github.com/postbox-events/postbox/stream/streamkafka"
	"github.com/postbox-events/postbox/stream/streampg"
	"github.com/postbox-events/postbox/stream/streamsqlite"
)

// component is one set of migrations a database may hold, named as its
// applier records it.
type component struct {
	name       string
	migrations fs.FS
}

// schemaTarget is one database (a SQLite file, or a PostgreSQL schema)
// and the components postbox keeps in it.
type schemaTarget struct {
	label      string // for output: the file, or the redacted URL and the schema
	path       string // a SQLite file, or
	pgURL      string // a PostgreSQL URL,
	schema     string // in this schema ("" for the search_path)
	components []component
}

// knownComponents are the components a target takes into its plan when
// the database records them, though the flags did not name them: every
// component postbox writes, in the dialect of the target.
func knownComponents(postgres bool) []component {
	if postgres {
		return []component{
			{"streams", streampg.Migrations},
			{"delivery", delivery.Migrations(true)},
			{intake.Component, intake.Migrations(true)},
			{"streamkafka", streamkafka.PostgresMigrations},
			{"outbox", outboxpg.Migrations},
		}
	}
	return []component{
		{"streams", streamsqlite.Migrations},
		{"server", server.Migrations()},
		{"delivery", delivery.Migrations(false)},
		{intake.Component, intake.Migrations(false)},
		{"streamkafka", streamkafka.SQLiteMigrations},
		{"outbox", outboxsqlite.Migrations},
	}
}

// addComponent adds the named known component to t, once.
func (t *schemaTarget) addComponent(name string) {
	for _, c := range t.components {
		if c.name == name {
			return
		}
	}
	for _, c := range knownComponents(t.pgURL != "") {
		if c.name == name {
			t.components = append(t.components, c)
			return
		}
	}
}

// plannedComponent is a component's state in a database.
type plannedComponent struct {
	name    string
	applied int                 // the version the database records, 0 for none
	latest  int                 // the last migration this binary embeds
	pending []migrate.Migration // what up applies
	tooNew  error               // a *migrate.TooNewError, or nil
	fsys    fs.FS
}

func runMigrate(ctx context.Context, env *cmdEnv, args []string) error {
	if len(args) == 0 {
		env.offer("status", "up")
	}
	sub := ""
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		sub, args = args[0], args[1:]
	}
	switch sub {
	case "status", "up":
	case "", "help":
		if sub == "" && (len(args) == 0 || !slices.Contains([]string{"-h", "--help", "-help"}, args[0])) {
			return usagef("migrate: no command given (status, up)")
		}
		args = []string{"--help"}
		sub = "status|up"
	default:
		hint := ""
		if near := nearest(sub, []string{"status", "up"}); near != "" {
			hint = fmt.Sprintf(" (did you mean %s?)", near)
		}
		return usagef("migrate: unknown command %q%s (status, up)", sub, hint)
	}
	fs := newFlags(env, "migrate "+sub, "[flags]", `status prints, for each component of a database (streams, server, delivery, intake,
streamkafka, outbox), the version it records and the migrations this postbox would apply, by
file name. up applies them, component by component, and prints what it ran; with --dry-run it
prints what it would run and changes nothing. serve, agent and relay apply the same migrations
when they open a database; migrate does it ahead, or shows what they would do.

A database written by a newer postbox (a component's version above the last migration this
binary has) is refused by status, up, serve, agent and relay alike, before anything is
applied: run that newer version, or restore a backup.

The database is serve's store, named as serve takes it (--db, --streams, --store), or an
outbox with --outbox: an agent's outbox file, a relay's SQLite outbox file or a relay's
PostgreSQL outbox (postgres://...). up takes a SQLite file's lock, so it refuses a file a
running serve, agent or relay holds: stop it first.`)
	db := fs.String("db", server.DefaultDBPath, "serve's SQLite database `file` [DB_PATH]")
	streams := fs.String("streams", "sqlite", "serve's stream `backend`: sqlite (the file under --db), postgres://…[?schema=postbox], kafka://… (its identity index), nats://… (nothing to migrate) [POSTBOX_STREAMS]")
	store := fs.String("store", "sqlite", "serve's delivery `store`: sqlite (the file under --db) or postgres://…[?schema=postbox] [POSTBOX_STORE]")
	outboxAt := fs.String("outbox", "", "an outbox instead of serve's store: an agent's or relay's SQLite `file`, or a relay's postgres://…")
	dryRun := fs.Bool("dry-run", false, "up: print the migrations it would apply and change nothing")
	if err := parse(env, fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	if *dryRun && sub != "up" {
		return usagef("migrate status: --dry-run is up's; status changes nothing")
	}
	var targets []*schemaTarget
	if *outboxAt != "" {
		for _, f := range []string{"db", "streams", "store"} {
			if onCommandLine(fs, f) {
				return usagef("migrate: --outbox and --%s name two databases; give one", f)
			}
		}
		targets = outboxTargets(*outboxAt)
	} else {
		var err error
		if targets, err = serveTargets(*db, *streams, *store); err != nil {
			return err
		}
	}
	if sub == "status" {
		return migrateStatus(ctx, env.stdout, targets)
	}
	return migrateUp(ctx, env.stdout, targets, *dryRun)
}

// outboxTargets is the outbox at spec: a SQLite file or a PostgreSQL URL.
func outboxTargets(spec string) []*schemaTarget {
	t := &schemaTarget{label: spec, path: spec}
	if isPostgres(spec) {
		t = &schemaTarget{label: redactURL(spec), pgURL: spec}
	}
	t.addComponent("outbox")
	return []*schemaTarget{t}
}

// serveTargets are the databases serve opens with --db dbPath, --streams
// streamsSpec and --store storeSpec, with the components it keeps in each,
// in the order serve applies them.
func serveTargets(dbPath, streamsSpec, storeSpec string) ([]*schemaTarget, error) {
	kind, err := streamsKind(streamsSpec)
	if err != nil {
		return nil, err
	}
	shared, err := storeKind(storeSpec)
	if err != nil {
		return nil, err
	}
	var targets []*schemaTarget
	// target returns the target of a file or of a PostgreSQL schema, one
	// per database, so that a store and streams in one schema are one.
	target := func(path, pgURL, schema string) *schemaTarget {
		for _, t := range targets {
			if t.path == path && t.pgURL == pgURL && t.schema == schema {
				return t
			}
		}
		t := &schemaTarget{label: path, path: path, pgURL: pgURL, schema: schema}
		if pgURL != "" {
			t.label = redactURL(pgURL) + " schema " + schema
		}
		targets = append(targets, t)
		return t
	}
	pgTarget := func(spec, flag, defaultSchema string) (*schemaTarget, error) {
		u, schema, err := splitSchema(spec, flag)
		if err != nil {
			return nil, err
		}
		if schema == "" {
			schema = defaultSchema
		}
		return target("", u, schema), nil
	}
	switch kind {
	case "sqlite":
		t := target(dbPath, "", "")
		t.addComponent("streams")
		t.addComponent("server")
	case "postgres":
		t, err := pgTarget(streamsSpec, "--streams (POSTBOX_STREAMS)", streampg.DefaultSchema)
		if err != nil {
			return nil, err
		}
		t.addComponent("streams")
	case "kafka":
		kcfg, err := parseKafkaStreams(streamsSpec, kafkaIndex(dbPath, storeSpec, shared))
		if err != nil {
			return nil, err
		}
		var t *schemaTarget
		if isPostgres(kcfg.Index) {
			if t, err = pgTarget(kcfg.Index, "--streams (POSTBOX_STREAMS) index=", ""); err != nil {
				return nil, err
			}
			if t.schema == "" {
				t.schema = kcfg.IndexSchema
				if t.schema == "" {
					t.schema = streamkafka.DefaultIndexSchema
				}
				t.label = redactURL(t.pgURL) + " schema " + t.schema
			}
		} else {
			t = target(kcfg.Index, "", "")
		}
		t.addComponent("streamkafka")
	}
	var st *schemaTarget
	if shared {
		if st, err = pgTarget(storeSpec, "--store (POSTBOX_STORE)", "postbox"); err != nil {
			return nil, err
		}
	} else {
		st = target(dbPath, "", "")
	}
	st.addComponent("delivery")
	st.addComponent(intake.Component)
	return targets, nil
}

// openedTarget is a target's database, open.
type openedTarget struct {
	*schemaTarget
	sqlite *sql.DB
	pg     *pgxpool.Pool
	lock   *sqlitedb.FileLock
}

func (o *openedTarget) close() {
	if o.sqlite != nil {
		o.sqlite.Close()
	}
	if o.pg != nil {
		o.pg.Close()
	}
	if o.lock != nil {
		o.lock.Unlock()
	}
}

// open opens t's database; with lock, a SQLite file's lock first, so that
// a running serve, agent or relay is not migrated under its feet. A
// SQLite file that is not there is an error: migrate creates no database.
func (t *schemaTarget) open(ctx context.Context, lock bool) (*openedTarget, error) {
	o := &openedTarget{schemaTarget: t}
	if t.pgURL != "" {
		pool, err := pgxpool.New(ctx, t.pgURL)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", t.label, err)
		}
		o.pg = pool
		return o, nil
	}
	if _, err := os.Stat(t.path); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%s: no database there (postbox creates it at its first start): name the file with --db or --outbox", t.path)
		}
		return nil, err
	}
	if lock {
		l, err := sqlitedb.Lock(t.path)
		if err != nil {
			return nil, fmt.Errorf("%w: stop the serve, agent or relay that has it open first", err)
		}
		o.lock = l
	}
	// Only a locked target is written: a look (status, serve's check of a
	// newer schema) opens the file read-only, so that it leaves a backup's
	// journal mode, and the log of a file in use, as they were.
	var db *sql.DB
	var err error
	if lock {
		db, err = sqlitedb.Open(t.path, sqlitedb.Options{})
	} else {
		db, err = sqlitedb.OpenReadOnly(t.path)
	}
	if err != nil {
		o.close()
		return nil, err
	}
	o.sqlite = db
	return o, nil
}

// plan reads the versions the database records and plans each component:
// those t names, then any other known one the database records.
func (o *openedTarget) plan(ctx context.Context) ([]plannedComponent, error) {
	var versions map[string]int
	var err error
	if o.pg != nil {
		versions, err = pgmigrate.Versions(ctx, o.pg, o.schema)
	} else {
		versions, err = sqlitedb.Versions(ctx, o.sqlite)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.label, err)
	}
	for _, c := range knownComponents(o.pgURL != "") {
		if _, ok := versions[c.name]; ok {
			o.addComponent(c.name)
		}
	}
	var out []plannedComponent
	for _, c := range o.components {
		all, err := migrate.Read(c.migrations)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.name, err)
		}
		p := plannedComponent{name: c.name, applied: versions[c.name], latest: migrate.Latest(all), fsys: c.migrations}
		p.tooNew = migrate.Check(c.name, all, p.applied)
		if p.tooNew == nil {
			p.pending = migrate.Pending(all, p.applied)
		}
		out = append(out, p)
	}
	return out, nil
}

// apply applies the pending migrations of p.
func (o *openedTarget) apply(ctx context.Context, p plannedComponent) error {
	if o.pg != nil {
		return pgmigrate.Apply(ctx, o.pg, p.name, p.fsys, o.schema)
	}
	return sqlitedb.Migrate(ctx, o.sqlite, p.name, p.fsys)
}

func names(ms []migrate.Migration) string {
	if len(ms) == 0 {
		return "-"
	}
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Name
	}
	return strings.Join(out, " ")
}

func migrateStatus(ctx context.Context, w io.Writer, targets []*schemaTarget) error {
	var refused error
	for _, t := range targets {
		o, err := t.open(ctx, false)
		if err != nil {
			return err
		}
		plan, err := o.plan(ctx)
		o.close()
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "%s\n", t.label)
		tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  COMPONENT\tAPPLIED\tLATEST\tPENDING")
		for _, p := range plan {
			pending := names(p.pending)
			if p.tooNew != nil {
				pending = "refused: written by a newer postbox"
				refused = cmp.Or(refused, fmt.Errorf("%s: %w", t.label, p.tooNew))
			}
			fmt.Fprintf(tw, "  %s\t%d\t%d\t%s\n", p.name, p.applied, p.latest, pending)
		}
		tw.Flush()
	}
	return refused
}

func migrateUp(ctx context.Context, w io.Writer, targets []*schemaTarget, dryRun bool) error {
	opened := make([]*openedTarget, 0, len(targets))
	defer func() {
		for _, o := range opened {
			o.close()
		}
	}()
	plans := make([][]plannedComponent, 0, len(targets))
	// Every database and component is planned, and a newer one refused,
	// before anything is applied anywhere.
	for _, t := range targets {
		o, err := t.open(ctx, !dryRun)
		if err != nil {
			return err
		}
		opened = append(opened, o)
		plan, err := o.plan(ctx)
		if err != nil {
			return err
		}
		for _, p := range plan {
			if p.tooNew != nil {
				return fmt.Errorf("%s: %w; nothing was applied", t.label, p.tooNew)
			}
		}
		plans = append(plans, plan)
	}
	verb := "applied"
	if dryRun {
		verb = "would apply"
	}
	for i, o := range opened {
		n := 0
		for _, p := range plans[i] {
			if len(p.pending) == 0 {
				continue
			}
			if !dryRun {
				if err := o.apply(ctx, p); err != nil {
					return fmt.Errorf("%s: %w", o.label, err)
				}
			}
			for _, m := range p.pending {
				fmt.Fprintf(w, "%s: %s %s %s\n", o.label, verb, p.name, m.Name)
				n++
			}
		}
		if n == 0 {
			fmt.Fprintf(w, "%s: up to date\n", o.label)
		}
	}
	return nil
}

// refuseNewer checks the databases serve is about to open with --db
// dbPath, --streams and --store, and returns the error of the first
// component a newer postbox wrote, before serve applies any migration to
// any of them: each applier refuses its own component too, but serve
// applies the streams' before delivery's, and a file must not be half
// migrated. A SQLite file not there yet has nothing to check, and a
// database this cannot read is left to serve's own open to report, in its
// words.
func refuseNewer(ctx context.Context, dbPath, streamsSpec, storeSpec string) error {
	targets, err := serveTargets(dbPath, streamsSpec, storeSpec)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, t := range targets {
		if t.pgURL == "" {
			if _, err := os.Stat(t.path); errors.Is(err, os.ErrNotExist) {
				continue
			}
		}
		o, err := t.open(ctx, false)
		if err != nil {
			continue
		}
		plan, err := o.plan(ctx)
		o.close()
		if err != nil {
			continue
		}
		for _, p := range plan {
			if p.tooNew != nil {
				return fmt.Errorf("%s: %w", t.label, p.tooNew)
			}
		}
	}
	return nil
}

// refuseNewerOutbox returns the error of a PostgreSQL outbox (in the
// search_path) a newer postbox migrated, for the relay that does not
// migrate it (--migrate=false): with migrations, pgmigrate.Apply refuses
// it.
func refuseNewerOutbox(ctx context.Context, pool *pgxpool.Pool) error {
	versions, err := pgmigrate.Versions(ctx, pool, "")
	if err != nil {
		return err
	}
	all, err := migrate.Read(outboxpg.Migrations)
	if err != nil {
		return err
	}
	return migrate.Check("outbox", all, versions["outbox"])
}
