// Package intake is the ingest side of the control plane beside
// internal/ingress (devices): where events come from besides a device's
// WebSocket or gRPC connection, up to their append to a stream.
//
// Webhooks are a function from a request and its source's settings to
// the event to append or a refusal (WebhookSettings.Webhook,
// Webhook.Read, Webhook.Parse, with CloudEvents and the providers'
// presets), table-testable without a store or a writer; the server reads
// the source, appends and answers.
//
// Sources and their checkpoints are kept by Store, in the SQL database
// delivery keeps its state in, with migrations of their own (component
// "intake"), so that a database delivery migrated before keeps its
// sources; Store also claims webhook bodies against replays
// (Store.ClaimDigest). Runner runs the sources that read upstream: a REST
// poller of internal/poll or a follower of internal/feed per source, on
// the leader of a shared store. Gate tells the ingress whether the device
// source was deleted.
//
// A source has one stream, of its name. A source that reads upstream
// keeps a checkpoint, written in the transaction that stores what it read
// where the store is the stream backend (SQLite), and after the events
// are stored elsewhere: a crash in between reads a page again, which the
// stream stores as duplicates.
//
// The store needs nothing of delivery: deleting a source asks which
// subscriptions read it through StoreConfig.Readers, in the transaction
// that deletes it.
package intake
