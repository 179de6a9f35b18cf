package delivery

import "context"

// FoldTallies folds the counts of completed items now, for tests.
func (d *Delivery) FoldTallies(ctx context.Context) error { return d.foldTallies(ctx, true) }
