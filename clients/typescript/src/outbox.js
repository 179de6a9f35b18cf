// The transactional outbox over PostgreSQL, as package outboxpg writes it:
// rows of the table outbox, inserted in the caller's own transaction, so
// that they commit with the business write or not at all. postbox relay
// sends them on; the insert trigger's NOTIFY postbox_outbox wakes it.
import { DuplicateEventError, InvalidEventError, PostboxError, TransactionError } from './errors.js';
import { newEventId } from './ulid.js';

/** The LISTEN/NOTIFY channel the outbox's insert trigger notifies. */
export const OUTBOX_CHANNEL = 'postbox_outbox';
/** The most bytes of an event id. */
export const MAX_EVENT_ID_BYTES = 128;
/** The most bytes of an event type. */
export const MAX_EVENT_TYPE_BYTES = 128;
/** The most bytes of a tracestate. */
export const MAX_TRACESTATE_BYTES = 512;

const utf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

/**
 * @typedef {object} OutboxEvent
 * @property {string} type
 * @property {string | Uint8Array | unknown} payload
 * @property {string} [id]
 * @property {string} [correlationId]
 * @property {string} [tenantId]
 * @property {string} [traceparent]
 * @property {string} [tracestate]
 */

/**
 * @typedef {object} PreparedEvent
 * @property {string} id
 * @property {string} type
 * @property {string} payload
 * @property {string} correlationId
 * @property {string} tenantId
 * @property {string} traceparent
 * @property {string} tracestate
 */

/**
 * Fills in an event's defaults (a new id, the correlation id) and checks
 * its fields as postbox does, throwing InvalidEventError naming the field.
 * @param {OutboxEvent} e
 * @returns {PreparedEvent}
 */
export function prepare(e) {
  if (e === null || typeof e !== 'object') {
    throw new InvalidEventError('event', `outbox: an event is an object, not ${e === null ? 'null' : typeof e}`);
  }
  const id = e.id === undefined || e.id === '' ? newEventId() : e.id;
  const p = {
    id,
    type: e.type,
    payload: payloadText(e.payload),
    correlationId: e.correlationId === undefined || e.correlationId === '' ? id : e.correlationId,
    tenantId: e.tenantId ?? '',
    traceparent: e.traceparent ?? '',
    tracestate: e.tracestate ?? '',
  };
  for (const [field, v] of /** @type {const} */ ([
    ['id', p.id], ['type', p.type], ['correlationId', p.correlationId], ['tenantId', p.tenantId],
    ['traceparent', p.traceparent], ['tracestate', p.tracestate],
  ])) {
    if (typeof v !== 'string') {
      throw new InvalidEventError(field, `outbox: invalid event: ${field} is a ${typeof v}, not a string`);
    }
    if (!v.isWellFormed() || v.includes('\0')) {
      throw new InvalidEventError(field, `outbox: invalid event: ${field} ${JSON.stringify(v)} is not UTF-8 text without NUL characters`);
    }
  }
  const idBytes = Buffer.byteLength(p.id);
  const typeBytes = Buffer.byteLength(p.type);
  if (idBytes > MAX_EVENT_ID_BYTES) {
    throw new InvalidEventError('id', `outbox: invalid event: id is ${idBytes} bytes, over ${MAX_EVENT_ID_BYTES}`);
  }
  if (p.type === '') {
    throw new InvalidEventError('type', 'outbox: invalid event: type is empty');
  }
  if (typeBytes > MAX_EVENT_TYPE_BYTES) {
    throw new InvalidEventError('type', `outbox: invalid event: type is ${typeBytes} bytes, over ${MAX_EVENT_TYPE_BYTES}`);
  }
  if (p.traceparent !== '') {
    const why = checkTraceparent(p.traceparent);
    if (why) throw new InvalidEventError('traceparent', `outbox: invalid event: traceparent: ${why}`);
  } else if (p.tracestate !== '') {
    throw new InvalidEventError('tracestate', 'outbox: invalid event: tracestate given without a traceparent');
  }
  if (p.tracestate.length > MAX_TRACESTATE_BYTES) {
    throw new InvalidEventError('tracestate', `outbox: invalid event: tracestate: ${p.tracestate.length} bytes, over the limit of ${MAX_TRACESTATE_BYTES}`);
  }
  for (let i = 0; i < p.tracestate.length; i++) {
    const c = p.tracestate.charCodeAt(i);
    if (c < 0x20 || c > 0x7e) {
      throw new InvalidEventError('tracestate', `outbox: invalid event: tracestate holds the character U+${c.toString(16).padStart(4, '0').toUpperCase()}: it is printable ASCII`);
    }
  }
  return p;
}

/**
 * The payload's JSON text: bytes and strings as given (checked to be
 * UTF-8 JSON), any other value JSON.stringify'd.
 * @param {unknown} payload
 * @returns {string}
 */
function payloadText(payload) {
  let text;
  if (payload instanceof Uint8Array) {
    try {
      text = utf8.decode(payload);
    } catch {
      throw new InvalidEventError('payload', 'outbox: invalid event: payload is not valid UTF-8');
    }
  } else if (typeof payload === 'string') {
    if (!payload.isWellFormed()) {
      throw new InvalidEventError('payload', 'outbox: invalid event: payload is not valid UTF-8 (it holds a lone surrogate)');
    }
    text = payload;
  } else if (payload === undefined) {
    throw new InvalidEventError('payload', 'outbox: invalid event: payload is empty');
  } else {
    try {
      text = JSON.stringify(payload);
    } catch (err) {
      throw new InvalidEventError('payload', `outbox: invalid event: payload cannot be written as JSON: ${/** @type {Error} */ (err).message}`);
    }
    if (text === undefined) {
      throw new InvalidEventError('payload', `outbox: invalid event: payload (a ${typeof payload}) cannot be written as JSON`);
    }
  }
  if (text === '') {
    throw new InvalidEventError('payload', 'outbox: invalid event: payload is empty');
  }
  try {
    JSON.parse(text);
  } catch {
    throw new InvalidEventError('payload', `outbox: invalid event: payload is not valid JSON: ${JSON.stringify(text.slice(0, 40))}${text.length > 40 ? '…' : ''}`);
  }
  return text;
}

/**
 * Why v is not a W3C traceparent, or '' when it is one (postbox's
 * CheckTraceParent).
 * @param {string} v
 * @returns {string}
 */
export function checkTraceparent(v) {
  const shape = `${JSON.stringify(v)} is not a W3C traceparent (version-traceid-parentid-flags, 55 characters)`;
  if (v.length < 55 || (v.length > 55 && (v.slice(0, 2) === '00' || v[55] !== '-'))) return shape;
  for (let i = 0; i < 55; i++) {
    const c = v[i];
    if (i === 2 || i === 35 || i === 52) {
      if (c !== '-') return shape;
      continue;
    }
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
      return `${JSON.stringify(v)}: ${JSON.stringify(c)} is not a lower-case hex digit`;
    }
  }
  if (v.slice(0, 2) === 'ff') return `${JSON.stringify(v)}: version ff is invalid`;
  if (v.slice(3, 35) === '0'.repeat(32)) return `${JSON.stringify(v)}: the trace id is all zeros`;
  if (v.slice(36, 52) === '0'.repeat(16)) return `${JSON.stringify(v)}: the parent id is all zeros`;
  return '';
}

// One statement, as outboxpg's: the rows go in together and the trigger
// notifies once.
const insertSQL = `INSERT INTO outbox (event_id, event_type, payload, correlation_id, tenant_id, traceparent, tracestate)
	SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[])
	ON CONFLICT (event_id) DO NOTHING RETURNING event_id`;

// A client that does not tell its transaction status is asked: SAVEPOINT
// fails outside a transaction block (one simple query, one round trip).
const probeSQL = 'SAVEPOINT postbox_outbox_probe; RELEASE SAVEPOINT postbox_outbox_probe';

/**
 * @typedef {{query: (text: string, values?: unknown[]) => Promise<{rows: any[], rowCount: number | null}>}} Queryable
 */

/**
 * Writes events to the outbox inside the caller's transaction on client (a
 * pg Client or PoolClient after BEGIN): they commit with the business
 * write or not at all. Returns the events as written, ids filled in.
 * @param {Queryable} client
 * @param {OutboxEvent | OutboxEvent[]} events
 * @returns {Promise<PreparedEvent[]>}
 */
export async function insert(client, events) {
  const list = Array.isArray(events) ? events : [events];
  const prepared = list.map(prepare);
  if (prepared.length === 0) return prepared;
  checkClient(client);
  if (typeof (/** @type {any} */ (client).getTransactionStatus) !== 'function') {
    try {
      await client.query(probeSQL);
    } catch (err) {
      if (/** @type {any} */ (err)?.code === '25P01') { // no_active_sql_transaction
        throw new TransactionError('outbox insert: the client is not in a transaction: BEGIN first (the outbox is written in the transaction of the business write it announces); nothing was written', { cause: err });
      }
      throw queryError('outbox insert', err);
    }
  }
  const n = prepared.length;
  const cols = [new Array(n), new Array(n), new Array(n), new Array(n), new Array(n), new Array(n), new Array(n)];
  for (let i = 0; i < n; i++) {
    const e = prepared[i];
    cols[0][i] = e.id;
    cols[1][i] = e.type;
    cols[2][i] = e.payload;
    cols[3][i] = e.correlationId;
    cols[4][i] = e.tenantId;
    cols[5][i] = e.traceparent;
    cols[6][i] = e.tracestate;
  }
  let res;
  try {
    res = await client.query(insertSQL, cols);
  } catch (err) {
    throw queryError('outbox insert', err);
  }
  /** @type {string[]} */
  const ids = res.rows.map((r) => r.event_id);
  if (ids.length !== n) {
    const got = new Set(ids);
    const dups = prepared.map((e) => e.id).filter((id) => !got.has(id));
    throw new DuplicateEventError(dups.length > 0 ? [...new Set(dups)] : ['(an id appears twice in one insert)']);
  }
  return prepared;
}

/**
 * Throws TransactionError when client is plainly not a connection inside
 * an open transaction (node-postgres tells its transaction status).
 * @param {any} client
 */
export function checkClient(client) {
  if (client === null || typeof client !== 'object' || typeof client.query !== 'function') {
    throw new TransactionError('postbox: want a pg Client or PoolClient inside a transaction (BEGIN), not ' + (client === null ? 'null' : typeof client));
  }
  if (typeof client.totalCount === 'number' && typeof client.release !== 'function') {
    throw new TransactionError('postbox: a pg Pool runs each query on any connection, outside your transaction: pass the client you ran BEGIN on (await pool.connect())');
  }
  if (client._ending || client._ended) {
    throw new TransactionError('postbox: the client is closed (end() was called): its transaction is over; nothing was written');
  }
  if (client._queryable === false) {
    throw new TransactionError('postbox: the client lost its connection: its transaction is over; nothing was written');
  }
  if (typeof client.getTransactionStatus === 'function') {
    switch (client.getTransactionStatus()) {
      case 'I':
        throw new TransactionError('postbox: the client is not in a transaction (BEGIN first, or it was already committed or rolled back); nothing was written');
      case 'E':
        throw new TransactionError('postbox: the client\'s transaction has failed (an earlier statement failed): roll it back; nothing was written');
      case null:
      case undefined:
        if (client._connected === false) {
          throw new TransactionError('postbox: the client is not connected (connect() and BEGIN first); nothing was written');
        }
    }
  }
}

/**
 * A pg error as this package's, with what it means for the caller.
 * @param {string} what
 * @param {any} err
 * @returns {Error}
 */
export function queryError(what, err) {
  if (err instanceof PostboxError) return err;
  const msg = err?.message ?? String(err);
  if (err?.code === '42P01') {
    return new PostboxError(`${what}: ${msg}: create the table first (postbox outbox migrate --db ..., the relay at its start, or docs/OUTBOX.md's SQL)`, { cause: err });
  }
  if (err?.code === '25P02') {
    return new TransactionError(`${what}: the transaction has failed (an earlier statement failed): roll it back: ${msg}`, { cause: err });
  }
  if (/not queryable|Connection terminated/.test(msg)) {
    return new TransactionError(`${what}: the client is closed: its transaction is over; nothing was written (${msg})`, { cause: err });
  }
  return new PostboxError(`${what}: ${msg}`, { cause: err });
}

