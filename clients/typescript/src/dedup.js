// Per-handler dedup in the handler's own transaction, as Go's package
// dedup does it, on the same table (inbox): insert (id, handler) first
// with ON CONFLICT DO NOTHING, and only when that inserted a row run the
// handler's function in the same transaction and commit. A Go handler and
// a TypeScript handler share one table.
import { InvalidEventError, PostboxError, TransactionError } from './errors.js';
import { checkClient, queryError } from './outbox.js';

/** The most bytes of a handler name and of an id. */
export const MAX_KEY_BYTES = 255;

/**
 * The inbox table and its index, created if missing: Go's
 * dedup.PostgresSchema, under the advisory lock postbox's migrations take.
 */
export const POSTGRES_SCHEMA = `SELECT pg_advisory_xact_lock(hashtext('postbox_migrations'));
CREATE TABLE IF NOT EXISTS inbox (
	id           TEXT NOT NULL,
	handler_name TEXT NOT NULL,
	processed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
	PRIMARY KEY (id, handler_name)
);
CREATE INDEX IF NOT EXISTS inbox_processed_at ON inbox (processed_at);
`;

const insertSQL = 'INSERT INTO inbox (id, handler_name) VALUES ($1, $2) ON CONFLICT DO NOTHING';

/**
 * Creates the inbox table if it is missing. Harmless to run again, or from
 * several processes at once.
 * @param {{query: (text: string) => Promise<unknown>}} db a pg Pool, Client or PoolClient
 */
export async function migrate(db) {
  try {
    // Several statements in one simple query: one implicit transaction,
    // so the advisory lock is held until they are done.
    await db.query(POSTGRES_SCHEMA);
  } catch (err) {
    throw queryError('dedup migrate', err);
  }
}

/**
 * @param {string} handler
 * @param {string} id
 */
function checkKey(handler, id) {
  for (const [name, v] of [['handler', handler], ['id', id]]) {
    if (typeof v !== 'string') {
      throw new InvalidEventError(name, `dedup: invalid key: ${name} is a ${typeof v}, not a string`);
    }
    if (v === '') throw new InvalidEventError(name, `dedup: invalid key: ${name} is empty`);
    const n = Buffer.byteLength(v);
    if (n > MAX_KEY_BYTES) throw new InvalidEventError(name, `dedup: invalid key: ${name} is ${n} bytes, over ${MAX_KEY_BYTES}`);
    if (!v.isWellFormed() || v.includes('\0')) {
      throw new InvalidEventError(name, `dedup: invalid key: ${name} is not UTF-8 text without NUL bytes`);
    }
  }
}

/**
 * Runs fn in a transaction unless handler has already handled id, and
 * records that it has in the same transaction.
 *
 * db is a pg Pool (a client is taken for the transaction and released) or
 * a connected Client or PoolClient that is not in a transaction (BEGIN
 * and COMMIT are run on it). Resolves true when fn ran and the
 * transaction committed, false, without calling fn, when the inbox
 * already records (id, handler). An error from fn rolls back fn's writes
 * and the record, and is thrown as it is, so a redelivery runs fn again.
 *
 * fn must write through the client it is given: that is the transaction.
 * @template T
 * @param {any} db
 * @param {string} handler
 * @param {string} id
 * @param {(client: any) => Promise<T> | T} fn
 * @returns {Promise<boolean>}
 */
export async function handle(db, handler, id, fn) {
  checkKey(handler, id);
  if (typeof fn !== 'function') throw new PostboxError('dedup: no handler function');
  const pooled = typeof db?.totalCount === 'number' && typeof db?.connect === 'function' && typeof db?.release !== 'function';
  const client = pooled ? await db.connect() : db;
  if (!pooled) {
    if (typeof client?.query !== 'function') throw new TransactionError('dedup: want a pg Pool, Client or PoolClient');
    if (client._ending || client._ended || client._queryable === false) {
      throw new TransactionError(`dedup ${handler}: the client is closed`);
    }
    if (typeof client.getTransactionStatus === 'function' && client.getTransactionStatus() !== 'I' && client.getTransactionStatus() != null) {
      throw new TransactionError(`dedup ${handler}: the client is in a transaction already: handle begins and commits its own (pass a pool, or a client outside BEGIN)`);
    }
  }
  let began = false;
  let done = false;
  try {
    try {
      await client.query('BEGIN');
      began = true;
    } catch (err) {
      throw queryError(`dedup ${handler}: begin`, err);
    }
    let res;
    try {
      res = await client.query(insertSQL, [id, handler]);
    } catch (err) {
      throw queryError(`dedup ${handler}: record ${id}`, err);
    }
    if (res.rowCount === 0) return false;
    await fn(client);
    try {
      await client.query('COMMIT');
      done = true;
    } catch (err) {
      throw queryError(`dedup ${handler}: commit ${id}`, err);
    }
    return true;
  } finally {
    let broken = false;
    if (began && !done) {
      await client.query('ROLLBACK').catch(() => { broken = true; });
    }
    // A connection whose ROLLBACK failed is not given back to the pool.
    if (pooled) client.release(broken);
  }
}

/**
 * Records that handler handles id, inside a transaction the caller runs
 * on client (a pg Client or PoolClient after BEGIN): the first half of
 * handle, for a handler that manages its own transaction. Resolves true
 * when the record was inserted (go on: do the writes, then COMMIT; a
 * ROLLBACK takes the record back too), false when handler has handled id
 * already (do nothing). A concurrent delivery of the same id waits on the
 * record's key until this transaction ends.
 * @param {any} client
 * @param {string} handler
 * @param {string} id
 * @returns {Promise<boolean>}
 */
export async function record(client, handler, id) {
  checkKey(handler, id);
  checkClient(client);
  if (typeof client.getTransactionStatus !== 'function') {
    // As insert does: SAVEPOINT fails outside a transaction block.
    try {
      await client.query('SAVEPOINT postbox_dedup_probe; RELEASE SAVEPOINT postbox_dedup_probe');
    } catch (err) {
      if (/** @type {any} */ (err)?.code === '25P01') {
        throw new TransactionError(`dedup ${handler}: the client is not in a transaction: BEGIN first; nothing was written`, { cause: err });
      }
      throw queryError(`dedup ${handler}: record ${id}`, err);
    }
  }
  try {
    const res = await client.query(insertSQL, [id, handler]);
    return res.rowCount === 1;
  } catch (err) {
    throw queryError(`dedup ${handler}: record ${id}`, err);
  }
}

/**
 * Deletes the records of ids handled before the given time and returns
 * how many; a forgotten id is new again.
 * @param {{query: (text: string, values?: unknown[]) => Promise<{rowCount: number | null}>}} db
 * @param {Date} before
 * @returns {Promise<number>}
 */
export async function forget(db, before) {
  try {
    const res = await db.query('DELETE FROM inbox WHERE processed_at < $1', [before]);
    return res.rowCount ?? 0;
  } catch (err) {
    throw queryError('dedup forget', err);
  }
}
