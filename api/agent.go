package api

// The agent's intake (postbox agent, POST /v1/events on its --listen
// address) answers one AgentEvent for an event object, and AgentEvents
// for an array; a refused request gets an ErrorResponse.

// Statuses of an AgentEvent.
const (
	AgentQueued    = "queued"    // stored in the outbox: the relay sends it
	AgentDuplicate = "duplicate" // in the outbox already with this type and payload
	AgentConflict  = "conflict"  // in the outbox already with another type or payload: not queued
	AgentRejected  = "rejected"  // in the outbox already, refused by the server: not sent again
)

// AgentEvent is the agent intake's answer for one event.
type AgentEvent struct {
	EventID string `json:"event_id"`
	Status  string `json:"status"`            // AgentQueued, AgentDuplicate, AgentConflict or AgentRejected
	Message string `json:"message,omitempty"` // why, for conflict and rejected
}

// AgentEvents is the agent intake's answer for an array of events, in
// their order.
type AgentEvents struct {
	Events []AgentEvent `json:"events"`
}
