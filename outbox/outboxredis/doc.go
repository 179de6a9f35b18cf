// Package outboxredis connects the outbox to Redis Streams, in both
// directions.
//
// Publisher is an outbox.Publisher: a Relay sends its rows to a stream,
// one XADD per event, each entry holding the fields named by the Field…
// constants. An ACK means Redis appended the entry (with the durability
// the server is configured for: appendfsync decides whether an ACKed entry
// survives a crash of Redis itself).
//
// Consumer reads a stream through a consumer group and calls a Handler for
// each entry: at least once per group, acknowledged (XACK) only after the
// handler returned nil. A new group starts, by default, with the entries
// the stream already holds. Entries the handler refused are retried after
// MinIdle, entries of consumers that died are claimed by the live ones
// (XAUTOCLAIM), and an entry refused MaxDeliveries times, or one that is
// not an event at all, is moved to a dead-letter stream instead of being
// retried for ever. Entries delivered before (left pending by a crash, or
// claimed) are handled one at a time, so an entry that crashes its
// consumer every time is dead-lettered alone; and after handler errors in
// a row (the handler's database is down) the consumer pauses, for longer
// each time, so that an outage spends the entries' deliveries slowly, and
// not at all if the handler marks its errors retry.Transient; a handler
// marks an entry that can never succeed retry.Permanent to dead-letter it
// at once.
//
// Delivery is at least once at both ends: a relay that resends after a
// lost reply appends the event again, and a consumer that dies before its
// XACK handles the entry again. A handler that must apply each event once
// records its event ID in the same transaction as its effect (package
// dedup); see the Consumer example. On Redis 8.6 and later the Publisher
// also asks Redis to drop resent events itself (XADD IDMP), which narrows
// but does not close the window: see Config.IDMP.
package outboxredis
