// Package outboxtest is the conformance suite of the outbox's two swap
// points: RunStore checks an outbox.Store (with outbox.Admin, and
// outbox.Claimer and outbox.Notifier when the store has them) through its
// interfaces alone, and RunPublisher checks an outbox.Publisher against
// the receiver it publishes to.
//
// A store's test gives RunStore the features it differs in and a function
// that opens an empty outbox and says how to insert into it (the edge
// outbox takes envelopes, a transactional outbox events in the caller's
// transaction):
//
//	func TestSuite(t *testing.T) {
//		outboxtest.RunStore(t, outboxtest.StoreFeatures{}, func(t *testing.T) outboxtest.Store {
//			s := open(t)
//			return outboxtest.Store{Store: s, Admin: s, Insert: func(t *testing.T, events ...outbox.Event) { … }}
//		})
//	}
//
// A publisher's test gives RunPublisher a function that returns a
// publisher to a receiver of its own and a way to read back what the
// receiver holds.
//
// Each check is a subtest named after what it checks and opens its own
// store or publisher. The suite's own test runs both on minimal in-memory
// implementations, which shows that an implementation keeping every rule
// passes.
package outboxtest
