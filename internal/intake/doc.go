// Package intake is the ingest side of the control plane beside
// internal/ingress (devices): where events come from besides a device's
// WebSocket or gRPC connection, up to their append to a stream.
//
// It owns sources and their checkpoints (Store), kept in the SQL database
// delivery keeps its state in, with migrations of their own (component
// "intake"), so that a database delivery migrated before keeps its
// sources; the replay claims of webhook bodies (Store.ClaimDigest); the
// runner of the sources that read upstream (Runner: a REST poller of
// internal/poll or a follower of internal/feed per source, on the leader
// of a shared store); and the gate the ingress asks whether the device
// source still takes events (Gate).
//
// A source has one stream, of its name. A source that reads upstream
// keeps a checkpoint, written in the transaction that stores what it read
// where the store is the stream backend (SQLite), and after the events
// are stored elsewhere: a crash in between reads a page again, which the
// stream stores as duplicates.
//
// Intake imports nothing of delivery: deleting a source asks the
// subscriptions that read it through StoreConfig.Readers, in the transaction
// that deletes it.
package intake
