-- One row the server rewrites while the store cannot commit, to learn
-- when it can again (GET /ready, postbox_store_writable).
CREATE TABLE server_store_probe (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    probed_at TEXT NOT NULL
);
INSERT INTO server_store_probe (id, probed_at) VALUES (1, '');
