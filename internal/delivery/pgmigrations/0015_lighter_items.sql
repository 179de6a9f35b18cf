-- As on SQLite: two indexes fewer on inbox_items, so that writing an item
-- costs two B-trees less.
--
-- An event's items in every subscription are found by UNIQUE
-- (subscription_uid, offset) of each subscription that holds items (a
-- walk of that index, one step a subscription), not by (stream, offset).
DROP INDEX inbox_items_by_event;
-- An inbox's items by time, or all of them, are read by
-- inbox_items_by_created (subscription_uid, created_at, item_id) of each
-- subscription that filled the inbox, merged.
DROP INDEX inbox_items_by_time;
