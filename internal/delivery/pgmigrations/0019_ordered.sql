-- Ordered delivery per key. A subscription with order_by hands out the
-- items of one key one at a time, in offset order; on_dead_letter says
-- what a dead letter of a key does to the items after it: 'block' (they
-- wait for an operator) or 'skip' (they go on). NULL order_by: unordered.
ALTER TABLE subscriptions ADD COLUMN order_by TEXT;
ALTER TABLE subscriptions ADD COLUMN on_dead_letter TEXT;
-- The key of an item of an ordered subscription, computed when the item
-- is made; NULL for the items of an unordered one.
ALTER TABLE inbox_items ADD COLUMN order_key TEXT;
-- A lease asks, for each item it could take, whether an earlier item of
-- its key is pending or failed, or another one processing: seeks of this
-- index. It holds the unfinished items of ordered subscriptions only:
-- completed ones (kept for the retention) leave it.
CREATE INDEX inbox_items_by_order_key ON inbox_items (subscription_uid, order_key, state, "offset")
  WHERE order_key IS NOT NULL AND state <> 'completed';
