package api

import "time"

// ResetRequest is the body of POST /v1/consumers/{name}/reset: exactly one
// of its fields, the position the consumer starts from again.
type ResetRequest struct {
	ToOffset *int64  `json:"to_offset,omitempty"` // the first offset to read again (≥ 1, at most the high watermark + 1)
	ToTime   *string `json:"to_time,omitempty"`   // RFC 3339: the first event the stream stored at or after it
	Earliest *bool   `json:"earliest,omitempty"`  // true: the oldest event the stream still holds
	Latest   *bool   `json:"latest,omitempty"`    // true: after the newest event (skip the backlog)
}

// StartPosition is where a consumer was started or reset to: a policy
// (latest, earliest, at_offset, at_time) and the offset or time it needs.
type StartPosition struct {
	Policy string     `json:"policy"`
	Offset int64      `json:"offset,omitempty"` // at_offset
	Time   *time.Time `json:"time,omitempty"`   // at_time
}

// ConsumerReset is the answer of POST /v1/consumers/{name}/reset: the
// consumer where it is now, and where it was.
type ConsumerReset struct {
	Consumer
	PreviousNextOffset int64         `json:"previous_next_offset"`
	Start              StartPosition `json:"start"`
}

// Move kinds in a consumer's history.
const (
	MoveCommit = "commit" // the consumer's subscription materialised events up to Offset
	MoveReset  = "reset"  // an operator (or the API) reset it
)

// ConsumerMove is one entry of a consumer's history: a commit or a reset
// that set its next offset to NextOffset.
type ConsumerMove struct {
	Kind       string         `json:"kind"`            // MoveCommit or MoveReset
	Offset     int64          `json:"offset"`          // the offset committed: NextOffset - 1
	NextOffset int64          `json:"next_offset"`     // the next offset after the move
	Start      *StartPosition `json:"start,omitempty"` // a reset's position
	At         time.Time      `json:"at"`
}

// ConsumerHistory is the answer of GET /v1/consumers/{name}/commits: the
// newest moves first.
type ConsumerHistory struct {
	Consumer string         `json:"consumer"`
	Stream   string         `json:"stream"`
	Commits  []ConsumerMove `json:"commits"`
}
