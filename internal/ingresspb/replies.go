package ingresspb

import "github.com/postbox-events/postbox"

// NewReplies returns replies as the gRPC transport's message.
func NewReplies(replies []postbox.Reply) *Replies {
	out := &Replies{Replies: make([]*Reply, len(replies))}
	for i, r := range replies {
		out.Replies[i] = &Reply{EventId: r.EventID, Status: r.Status, AckTs: r.AckTS, Duplicate: r.Duplicate,
			Code: string(r.Code), Field: r.Field, Message: r.Message, Retryable: r.Retryable}
	}
	return out
}

// Postbox returns the replies m holds.
func (m *Replies) Postbox() []postbox.Reply {
	out := make([]postbox.Reply, len(m.GetReplies()))
	for i, r := range m.GetReplies() {
		out[i] = postbox.Reply{EventID: r.GetEventId(), Status: r.GetStatus(), AckTS: r.GetAckTs(), Duplicate: r.GetDuplicate(),
			Code: postbox.Code(r.GetCode()), Field: r.GetField(), Message: r.GetMessage(), Retryable: r.GetRetryable()}
	}
	return out
}
