// Package retry is how postbox waits between attempts and how a handler
// says what its error means for the next one.
//
// Backoff computes exponential waits with a jitter mode (full, equal or
// none, in the terms of the AWS Architecture Blog's "Exponential Backoff
// And Jitter"). The outbox relay, the delivery workers and the Redis
// consumer all pace their retries with it.
//
// A handler (a server.Handler run by the delivery workers, an
// outboxredis.Handler) returns nil when it is done with a message, and an
// error when the attempt failed. A plain error is retried: the message
// is attempted again after a backoff, and the attempt counts towards the
// maximum, after which the message is a dead letter. Three wrappers say
// more:
//
//   - Permanent(err): retrying cannot help (the message is malformed, the
//     target answered 410 Gone); the message is a dead letter at once.
//   - Transient(err): the failure is not the message's fault (a database
//     the handler writes to is down); the message is retried, and the
//     attempt does not count towards the maximum, so an outage dead-letters
//     nothing. A message that fails transiently every time is retried for
//     ever: mark only the errors that end when an outage does.
//   - RetryAfter(d, err): the next attempt waits at least d (a target's
//     Retry-After), as far as the caller's longest wait allows.
//
// The wrappers compose (RetryAfter(d, Transient(err))) and keep err in
// the chain for errors.Is and errors.As. Classify reads them back; it is
// the one classifier every site that retries uses.
package retry
