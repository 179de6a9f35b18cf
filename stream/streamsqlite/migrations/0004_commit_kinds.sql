-- The audit tells a commit from a reset: a reset records the start it was
-- given (stream.Start as JSON) and the offset before the consumer's new
-- next offset, as a commit does.
ALTER TABLE consumer_commits ADD COLUMN kind TEXT NOT NULL DEFAULT 'commit' CHECK (kind IN ('commit', 'reset'));
ALTER TABLE consumer_commits ADD COLUMN start_json TEXT;
