package server

import (
	"errors"
	"fmt"

	"github.com/postbox-events/postbox/stream/streamsqlite"
)

// ConfigError is a Config that New or Run refuses. Its message names the
// fields at fault as Go code writes them (Config.TLSCert,
// Config.Webhooks.Secrets), so that a caller that sets them from
// elsewhere can name them as its users know them: postbox serve
// rewrites them to its flags.
type ConfigError struct {
	// Msg says what is wrong, without the "server: " prefix of Error.
	Msg string
}

func (e *ConfigError) Error() string { return "server: " + e.Msg }

func configErrorf(format string, args ...any) error {
	return &ConfigError{Msg: fmt.Sprintf(format, args...)}
}

// OpenSQLite opens (creating and migrating) the SQLite file at cfg.DBPath
// (DefaultDBPath when empty) with cfg.Synchronous and the writer's bounds
// cfg.MaxBatch, cfg.QueueSize and cfg.QueueBytes: the default stream
// backend and store. The server that uses it runs its writer and closes
// it.
func OpenSQLite(cfg Config) (*streamsqlite.Backend, error) {
	if cfg.DBPath == "" {
		cfg.DBPath = DefaultDBPath
	}
	db, err := streamsqlite.Open(cfg.DBPath, streamsqlite.Config{
		Synchronous: cfg.Synchronous,
		Checkpoint:  cfg.WALCheckpoint,
		MaxBatch:    cfg.MaxBatch,
		QueueSize:   cfg.QueueSize,
		QueueBytes:  cfg.QueueBytes,
	})
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	return db, nil
}

// NewDefault is New with the default wiring for what cfg leaves nil:
// without cfg.Streams, the SQLite file at cfg.DBPath (OpenSQLite) is both
// Streams and Store; with Streams alone, the file holds the delivery
// state beside them. What it opened is closed when it fails.
func NewDefault(cfg Config) (*Server, error) {
	if cfg.Streams != nil && cfg.Store != nil {
		return New(cfg)
	}
	if cfg.Streams == nil && cfg.Store != nil {
		return nil, configErrorf("Config.Store without Config.Streams: set both, or Streams alone, or neither (SQLite for both); " +
			"servers sharing a PostgreSQL store need streams they share too")
	}
	db, err := OpenSQLite(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.Streams == nil {
		cfg.Streams = db
	}
	cfg.Store = db
	srv, err := New(cfg)
	if err != nil {
		return nil, errors.Join(err, closeErr(db.Close()))
	}
	return srv, nil
}

// closeErr is nil for a close that succeeded, so that it does not add to
// the error of New.
func closeErr(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("close store: %w", err)
}
