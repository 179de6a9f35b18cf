-- As on SQLite: activations recorded each batch of items the
-- subscription's loop made, and nothing ever read them. Dropped, with a
-- write fewer per batch.
DROP TABLE activations;
