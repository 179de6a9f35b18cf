package delivery

import (
	"context"
	"database/sql"
	"io/fs"
	"sync"

	"github.com/postbox-events/postbox/internal/sqlitedb"
)

// Store is the SQL database delivery keeps its own state in:
// subscriptions, inbox items, activations and each subscription's read
// position. It is SQLite (streamsqlite.Backend is one) unless it is a
// SharedStore.
type Store interface {
	// Update runs fn in a write transaction; fn's error undoes its writes.
	// A store may run fn again when its transaction must be retried.
	Update(ctx context.Context, fn func(tx *sql.Tx) error) error
	// Migrate applies a component's migrations to the database.
	Migrate(ctx context.Context, component string, fsys fs.FS) error
	// ReadDB returns read-only connections to the database.
	ReadDB() *sql.DB
}

// SharedStore is a Store that several processes share: a PostgreSQL
// database, whose SQL dialect delivery speaks to it. Delivery on a shared
// store runs each subscription's consumption loop in one process at a
// time, under a lease in the store, and the processes wake each other
// through Listen.
type SharedStore interface {
	Store
	// Listen calls fn with the payload of each notification sent on
	// channel (pg_notify) by any process, this one too, until ctx ends.
	// It connects again after a failure; notifications sent meanwhile
	// are lost, which delivery makes good by polling.
	Listen(ctx context.Context, channel string, fn func(payload string)) error
}

// execer is what a transaction and a database have in common.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
}

// conn runs delivery's queries, written with SQLite's ? and ?N
// parameters, on a transaction or database of the store, rewriting the
// parameters to PostgreSQL's $N on PostgreSQL.
type conn struct {
	c  execer
	pg bool
	// On a SQLite writer's transaction (c): the statements prepared on
	// its connection, by which c runs queries without parsing them.
	stmts *stmtCache
}

func (c conn) q(query string) string {
	if c.pg {
		return sqlitedb.Rebind(query)
	}
	return query
}

// stmt returns query's prepared statement on the transaction c, or nil:
// run it as text.
func (c conn) stmt(ctx context.Context, query string) *sql.Stmt {
	if st := c.stmts.get(query); st != nil {
		return c.c.(*sql.Tx).StmtContext(ctx, st)
	}
	return nil
}

func (c conn) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if st := c.stmt(ctx, query); st != nil {
		return st.ExecContext(ctx, args...)
	}
	return c.c.ExecContext(ctx, c.q(query), args...)
}

func (c conn) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if st := c.stmt(ctx, query); st != nil {
		return st.QueryContext(ctx, args...)
	}
	return c.c.QueryContext(ctx, c.q(query), args...)
}

func (c conn) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if st := c.stmt(ctx, query); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return c.c.QueryRowContext(ctx, c.q(query), args...)
}

func (c conn) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	return c.c.PrepareContext(ctx, c.q(query))
}

// update runs fn in a write transaction of the store.
func (d *Delivery) update(ctx context.Context, fn func(tx conn) error) error {
	return d.store.Update(ctx, func(tx *sql.Tx) error { return fn(conn{c: tx, pg: d.pg, stmts: d.stmts}) })
}

// stmtCache keeps the statements of the queries delivery runs in a SQLite
// writer's transactions, prepared on the writer's one connection: the
// driver parses every query it is given as text anew, which cost more
// than many of the queries' own work. A query is prepared the second time
// it is run, by a goroutine of its own, since the connection is busy with
// the transaction that ran it; until then it runs as text. The cache
// holds at most maxCachedStmts queries (a few are built with lists of
// varying length).
type stmtCache struct {
	p writePreparer

	mu    sync.Mutex
	stmts map[string]*sql.Stmt
	seen  map[string]bool // run as text: once (false), or twice and being prepared (true)
}

const maxCachedStmts = 256

// newStmtCache returns a cache of statements prepared by p, or nil (no
// cache) when store is not a SQLite writer that prepares statements.
func newStmtCache(store Store, pg bool) *stmtCache {
	p, ok := store.(writePreparer)
	if !ok || pg {
		return nil
	}
	return &stmtCache{p: p, stmts: map[string]*sql.Stmt{}, seen: map[string]bool{}}
}

// get returns the prepared statement of query, or nil: run it as text.
func (c *stmtCache) get(query string) *sql.Stmt {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if st := c.stmts[query]; st != nil {
		return st
	}
	preparing, ok := c.seen[query]
	switch {
	case preparing:
	case ok:
		c.seen[query] = true
		go c.prepare(query)
	case len(c.seen) < maxCachedStmts:
		c.seen[query] = false
	}
	return nil
}

// prepare prepares query once the writer's connection is free.
func (c *stmtCache) prepare(query string) {
	st, err := c.p.PrepareWrite(context.Background(), query)
	if err != nil {
		return // the store closed, or the query does not prepare alone: it stays text
	}
	c.mu.Lock()
	c.stmts[query] = st
	c.mu.Unlock()
}

// forUpdate is the clause that locks the rows a read in a write
// transaction selects: needed on PostgreSQL, where writers run at once;
// SQLite has one writer.
func (d *Delivery) forUpdate() string {
	if d.pg {
		return ` FOR UPDATE`
	}
	return ``
}
