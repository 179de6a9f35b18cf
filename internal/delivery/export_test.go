package delivery

import "context"

// FoldCounts folds the kept item counts now, for tests.
func (d *Delivery) FoldCounts(ctx context.Context) error { return d.foldCounts(ctx, true) }

// DispatchRound is one round of an inbox's dispatcher, as its test signal
// reports it.
type DispatchRound = dispatchRound

// TestSignals are the signals a Delivery sends when it finished a step.
type TestSignals struct {
	// Dispatched receives each round of a dispatcher that leased, paused
	// or found nothing due; it holds up to 64 nobody read, and drops
	// later ones until they are read.
	Dispatched <-chan DispatchRound
	// Stopping is closed once Run has stopped its loops and waits for the
	// attempts in flight.
	Stopping <-chan struct{}
}

// WithTestSignals returns cfg with the test signals of the Delivery it
// configures turned on, and those signals.
func WithTestSignals(cfg Config) (Config, TestSignals) {
	s := newTestSignals()
	cfg.testSignals = s
	return cfg, TestSignals{Dispatched: s.dispatched, Stopping: s.stopping}
}

// SearchSQL is the query Search runs for q (created: the creation time
// of the item q.Before), and its arguments, for EXPLAIN.
func SearchSQL(q ItemQuery, created string) (string, []any) { return searchSQL(q, created) }

// EventItemsSQL is the query of an event's items in Deliveries.
const EventItemsSQL = eventItemsSQL

// ItemSubscriptionsSQL is the query of the subscriptions that hold items.
const ItemSubscriptionsSQL = itemSubscriptionsSQL

// SetSearchScan sets how many items of a state a Search reads for a page
// until the test ends.
func SetSearchScan(t interface{ Cleanup(func()) }, n int) {
	old := searchScan
	searchScan = n
	t.Cleanup(func() { searchScan = old })
}

// Reap ends the leases that expired now, as the reap loop does each
// ReapInterval.
func (d *Delivery) Reap(ctx context.Context) error { return d.reap(ctx) }

// LeaseDueSQL is the statement a SQLite lease takes due pending items
// with, for EXPLAIN.
const LeaseDueSQL = leaseDueSQLite

// LeasePostgresSQL is the statement of a lease on PostgreSQL, for EXPLAIN.
const LeasePostgresSQL = leasePostgres
