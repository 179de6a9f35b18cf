package delivery

import (
	"context"
	"database/sql"
	"io/fs"

	"github.com/postbox-events/postbox/internal/sqlitedb"
)

// Store is the SQL database delivery keeps its own state in:
// subscriptions, inbox items, their counts and each subscription's read
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

// conn runs delivery's queries, written with SQLite's ? and ?N
// parameters, on a transaction or database of the store: PostgreSQL's $N
// on PostgreSQL, prepared statements on a SQLite writer's transaction
// (sqlitedb.Conn).
type conn = sqlitedb.Conn

// update runs fn in a write transaction of the store.
func (d *Delivery) update(ctx context.Context, fn func(tx conn) error) error {
	return d.store.Update(ctx, func(tx *sql.Tx) error { return fn(conn{Tx: tx, PostgreSQL: d.pg, Stmts: d.stmts}) })
}

// stmtCache returns the statement cache of store's writer, or nil on
// PostgreSQL and on a store that does not prepare statements.
func stmtCache(store Store, pg bool) *sqlitedb.StmtCache {
	if pg {
		return nil
	}
	return sqlitedb.NewStmtCache(store)
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
