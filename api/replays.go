package api

import "time"

// ReplayDeadLetters is the body of POST /v1/dead-letters/replay: the dead
// letters to replay, by inbox, subscription and time of failure (From
// inclusive, To exclusive, RFC 3339). An empty selection must say All.
type ReplayDeadLetters struct {
	Inbox        string `json:"inbox,omitempty"`
	Subscription string `json:"subscription,omitempty"`
	From         string `json:"from,omitempty"`
	To           string `json:"to,omitempty"`
	All          bool   `json:"all,omitempty"`
}

// Replayed is the answer of POST /v1/dead-letters/replay: the items made
// pending again.
type Replayed struct {
	IDs      []int64 `json:"ids"`
	Replayed int     `json:"replayed"`
}

// ReplayRange is the body of POST /v1/subscriptions/{name}/replay: every
// item of the subscription stored in [Since, Until) (RFC 3339; no Until:
// now) is delivered again, completed ones included.
type ReplayRange struct {
	Since     string   `json:"since"`
	Until     string   `json:"until,omitempty"`
	States    []string `json:"states,omitempty"`     // completed, failed or both (the default)
	BatchSize int      `json:"batch_size,omitempty"` // items per transaction
}

// Replay is a replay job and its progress (GET /v1/replays/{id}).
type Replay struct {
	ID           string     `json:"id"`
	Subscription string     `json:"subscription"`
	Inbox        string     `json:"inbox"`
	Since        time.Time  `json:"since"`
	Until        time.Time  `json:"until"`
	States       []string   `json:"states"`
	BatchSize    int        `json:"batch_size"`
	State        string     `json:"state"` // running, completed or failed
	Matched      int64      `json:"matched"`
	Replayed     int64      `json:"replayed"`
	Batches      int64      `json:"batches"`
	Reached      time.Time  `json:"reached"` // how far in the range it got
	Error        *string    `json:"error"`
	CreatedAt    time.Time  `json:"created_at"`
	UpdatedAt    time.Time  `json:"updated_at"`
	FinishedAt   *time.Time `json:"finished_at"`
}

// ReplayList is the answer of GET /v1/replays.
type ReplayList struct {
	Replays []Replay `json:"replays"`
}
