-- Ordered delivery per key. A subscription with order_by hands out the
-- items of one key one at a time, in offset order; on_dead_letter says
-- what a dead letter of a key does to the items after it: 'block' (they
-- wait for an operator) or 'skip' (they go on). NULL order_by: unordered.
ALTER TABLE subscriptions ADD COLUMN order_by TEXT;
ALTER TABLE subscriptions ADD COLUMN on_dead_letter TEXT;
-- The key of an item of an ordered subscription, computed when the item
-- is made; NULL for the items of an unordered one.
ALTER TABLE inbox_items ADD COLUMN order_key TEXT;
-- A lease asks, for each item it could take, the state of the item
-- before it of its key (a step back in the first index, and a read of
-- that row), whether another item of its key is processing (a seek in
-- the second) and whether an earlier one an operator replayed waits (a
-- seek in the third). The first is written once per item; the second
-- holds the few items under way, the third the few replayed ones that
-- wait. Items of unordered subscriptions are in none.
CREATE INDEX inbox_items_by_order_key ON inbox_items (subscription_uid, order_key, "offset")
  WHERE order_key IS NOT NULL;
CREATE INDEX inbox_items_processing_by_key ON inbox_items (subscription_uid, order_key)
  WHERE order_key IS NOT NULL AND state = 'processing';
CREATE INDEX inbox_items_replayed_by_key ON inbox_items (subscription_uid, order_key, "offset")
  WHERE order_key IS NOT NULL AND replays > 0 AND state = 'pending';
