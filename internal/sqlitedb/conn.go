package sqlitedb

import (
	"context"
	"database/sql"
	"sync"
)

// Execer is what a transaction and a database have in common.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
}

// Conn runs queries written with SQLite's ? and ?N parameters on a
// transaction or database (Tx), rewriting the parameters to PostgreSQL's
// $N when PostgreSQL is set (Rebind). On a SQLite writer's transaction
// with Stmts, a query is run from its statement prepared on the writer's
// connection once there is one.
type Conn struct {
	Tx         Execer // a transaction, or a database for reads
	PostgreSQL bool
	Stmts      *StmtCache // nil: every query runs as text
}

func (c Conn) q(query string) string {
	if c.PostgreSQL {
		return Rebind(query)
	}
	return query
}

// stmt returns query's prepared statement on the transaction c.Tx, or
// nil: run it as text.
func (c Conn) stmt(ctx context.Context, query string) *sql.Stmt {
	if st := c.Stmts.get(query); st != nil {
		return c.Tx.(*sql.Tx).StmtContext(ctx, st)
	}
	return nil
}

// ExecContext runs query (see Conn).
func (c Conn) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if st := c.stmt(ctx, query); st != nil {
		return st.ExecContext(ctx, args...)
	}
	return c.Tx.ExecContext(ctx, c.q(query), args...)
}

// QueryContext runs query (see Conn).
func (c Conn) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if st := c.stmt(ctx, query); st != nil {
		return st.QueryContext(ctx, args...)
	}
	return c.Tx.QueryContext(ctx, c.q(query), args...)
}

// QueryRowContext runs query (see Conn).
func (c Conn) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if st := c.stmt(ctx, query); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return c.Tx.QueryRowContext(ctx, c.q(query), args...)
}

// PrepareContext prepares query on c.Tx, its parameters rewritten.
func (c Conn) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	return c.Tx.PrepareContext(ctx, c.q(query))
}

// WritePreparer is a store whose writer's connection prepares statements
// for its transactions (streamsqlite.Backend).
type WritePreparer interface {
	PrepareWrite(ctx context.Context, query string) (*sql.Stmt, error)
}

// StmtCache keeps the statements of the queries run in a SQLite
// writer's transactions, prepared on the writer's one connection: the
// driver parses every query it is given as text anew, which costs more
// than many queries' own work. A query is prepared the second time it is
// run, by a goroutine of its own, since the connection is busy with the
// transaction that ran it; until then it runs as text. The cache holds at
// most MaxCachedStmts queries (a few are built with lists of varying
// length).
type StmtCache struct {
	p WritePreparer

	mu    sync.Mutex
	stmts map[string]*sql.Stmt
	seen  map[string]bool // run as text: once (false), or twice and being prepared (true)
}

// MaxCachedStmts is how many queries a StmtCache prepares at most.
const MaxCachedStmts = 256

// NewStmtCache returns a cache of statements prepared by store, or nil
// (no cache: run every query as text) when store is not a WritePreparer.
func NewStmtCache(store any) *StmtCache {
	p, ok := store.(WritePreparer)
	if !ok {
		return nil
	}
	return &StmtCache{p: p, stmts: map[string]*sql.Stmt{}, seen: map[string]bool{}}
}

// get returns the prepared statement of query, or nil: run it as text.
func (c *StmtCache) get(query string) *sql.Stmt {
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
	case len(c.seen) < MaxCachedStmts:
		c.seen[query] = false
	}
	return nil
}

// prepare prepares query once the writer's connection is free.
func (c *StmtCache) prepare(query string) {
	st, err := c.p.PrepareWrite(context.Background(), query)
	if err != nil {
		return // the store closed, or the query does not prepare alone: it stays text
	}
	c.mu.Lock()
	c.stmts[query] = st
	c.mu.Unlock()
}
