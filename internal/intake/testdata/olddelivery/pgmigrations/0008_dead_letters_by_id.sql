-- Dead letters in id order (GET /v1/dead-letters without an inbox, the
-- console's dead-letter page), as on SQLite: without this index the list
-- walks every item below the first dead letter.
CREATE INDEX inbox_items_failed_by_id ON inbox_items (item_id) WHERE state = 'failed';
