-- Activations recorded each batch of items the subscription's loop made,
-- and nothing ever read them: the kept counts (item_counts) and the
-- metrics say what a subscription made. Dropped, with a write fewer per
-- batch.
DROP TABLE activations;
