-- Only rejected rows are indexed by state: an index of every row's state
-- cost each insert and each delete of a pending row a write to one more
-- b-tree, and Due reads pending rows by seq. Counts takes the rejected
-- rows from this index and the pending ones as the rest.
DROP INDEX idx_outbox_state;
CREATE INDEX idx_outbox_rejected ON outbox (seq) WHERE state = 'rejected';
