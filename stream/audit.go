package stream

import (
	"context"
	"time"
)

// Kinds of an audited consumer move.
const (
	// MoveCommit: Commit moved the consumer forwards.
	MoveCommit = "commit"
	// MoveReset: Reset moved the consumer to a start position.
	MoveReset = "reset"
)

// Move is one change of a consumer's offset, as an Auditor keeps it.
type Move struct {
	ConsumerID string
	StreamID   string
	Kind       string // MoveCommit or MoveReset
	// Offset is the offset the move committed: the consumer's next
	// offset became Offset+1 (for a reset to an empty position, the
	// offset just before where it now starts).
	Offset int64
	Start  *Start // a reset's start position (canonical); nil for a commit
	At     time.Time
}

// Auditor is implemented by backends that keep an audit of the moves of
// their consumers' offsets: every Commit that moved one (a retried commit
// that changed nothing records nothing) and every Reset.
type Auditor interface {
	// Moves returns up to limit (≥ 1) of the newest moves of consumerID,
	// newest first. A backend keeps a bounded number per consumer (at
	// least the newest 100), and deletes a consumer's moves with it. An
	// unknown consumer is ErrConsumerNotFound.
	Moves(ctx context.Context, consumerID string, limit int) ([]Move, error)
}
