// Package deliverypg keeps delivery's state in PostgreSQL: a
// delivery.SharedStore that any number of postbox processes share.
//
// Its tables live in one schema (Config.Schema), created if needed and
// migrated once however many processes start at the same time. A write
// transaction that PostgreSQL aborts as a deadlock or a serialization
// failure is run again.
package deliverypg

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/pgmigrate"
)

// DefaultSchema is the schema of Config.Schema's default.
const DefaultSchema = "postbox"

// Config configures a Store.
type Config struct {
	// URL is a PostgreSQL connection string.
	URL string
	// Schema holds the tables: letters, digits and _, at most 63 bytes.
	// Defaults to DefaultSchema.
	Schema string
	// MaxConns bounds the connections of the pool; 0 is pgx's default
	// (the larger of 4 and the number of CPUs).
	MaxConns int32
	// Logger says when Listen's connection fails and comes back; nil
	// logs nothing.
	Logger *slog.Logger
}

// Store is delivery's state in one schema of a PostgreSQL database.
type Store struct {
	pool   *pgxpool.Pool
	db     *sql.DB
	schema string
	log    *slog.Logger
}

var _ delivery.SharedStore = (*Store)(nil)

var schemaName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// Open connects to cfg.URL, with cfg.Schema first in every connection's
// search_path, and checks the database answers. Delivery migrates it.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.Schema == "" {
		cfg.Schema = DefaultSchema
	}
	if !schemaName.MatchString(cfg.Schema) {
		return nil, fmt.Errorf("deliverypg: schema %q: want letters, digits and _, at most 63 bytes, not starting with a digit", cfg.Schema)
	}
	pcfg, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("deliverypg: %w", err)
	}
	pcfg.ConnConfig.RuntimeParams["search_path"] = cfg.Schema
	if cfg.MaxConns > 0 {
		pcfg.MaxConns = cfg.MaxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("deliverypg: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("deliverypg: %w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Store{pool: pool, db: stdlib.OpenDBFromPool(pool), schema: cfg.Schema, log: cfg.Logger}, nil
}

// Schema returns the schema of the tables.
func (s *Store) Schema() string { return s.schema }

// retries is how often Update runs a transaction PostgreSQL aborted.
const retries = 10

// Update runs fn in a transaction and commits it. A deadlock or a
// serialization failure runs fn again, in a new transaction.
func (s *Store) Update(ctx context.Context, fn func(tx *sql.Tx) error) error {
	for attempt := 1; ; attempt++ {
		err := s.update(ctx, fn)
		if err == nil || attempt == retries || !retryable(err) || ctx.Err() != nil {
			return err
		}
		time.Sleep(time.Duration(attempt) * time.Millisecond)
	}
}

func (s *Store) update(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return orCanceled(ctx, err)
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return orCanceled(ctx, err)
	}
	return orCanceled(ctx, tx.Commit())
}

// orCanceled returns ctx's error for an error that ctx's end caused:
// database/sql rolls a transaction back when its context ends, and its
// next statement then fails with sql.ErrTxDone, which says less.
func orCanceled(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return err
}

// retryable reports whether err aborted a transaction that may succeed
// when run again: a deadlock or a serialization failure.
func retryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001")
}

// Migrate applies component's migrations to the schema.
func (s *Store) Migrate(ctx context.Context, component string, fsys fs.FS) error {
	return pgmigrate.Apply(ctx, s.pool, component, fsys, s.schema)
}

// ReadDB returns the pool as a database/sql database.
func (s *Store) ReadDB() *sql.DB { return s.db }

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error { return s.pool.Ping(ctx) }

// Close closes the pool.
func (s *Store) Close() error {
	err := s.db.Close()
	s.pool.Close()
	return err
}

// listenRetry is how long Listen waits before connecting again.
const listenRetry = time.Second

// Listen holds one connection that LISTENs on channel and calls fn with
// each notification's payload, until ctx ends. It connects again after a
// failure, and then calls fn with "" so that the caller looks for what it
// missed.
func (s *Store) Listen(ctx context.Context, channel string, fn func(payload string)) error {
	reconnected, failing := false, false
	for ctx.Err() == nil {
		listened, err := s.listen(ctx, channel, fn, reconnected)
		if ctx.Err() != nil {
			break
		}
		if listened || !failing { // once per outage
			s.log.Warn("deliverypg: listening for the other nodes failed; polling until it is back", "channel", channel, "err", err)
		}
		reconnected, failing = true, !listened || failing
		select {
		case <-ctx.Done():
		case <-time.After(listenRetry):
		}
	}
	return nil
}

func (s *Store) listen(ctx context.Context, channel string, fn func(string), reconnected bool) (listened bool, _ error) {
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	// The connection waits in LISTEN for as long as the process lives:
	// it leaves the pool rather than going back to it in that state.
	conn := c.Hijack()
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return false, err
	}
	if reconnected {
		s.log.Info("deliverypg: listening for the other nodes again", "channel", channel)
		fn("")
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return true, err
		}
		fn(n.Payload)
	}
}
