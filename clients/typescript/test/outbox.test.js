import assert from 'node:assert/strict';
import { test } from 'node:test';
import pg from 'pg';
import { insert, prepare, newEventId, InvalidEventError, DuplicateEventError, TransactionError, OUTBOX_CHANNEL } from '../src/index.js';
import { postgresSchema, postboxBin, migrateOutbox } from './env.js';

const traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';

test('ids are evt_ and a ULID, sortable in the order made', () => {
  const ids = Array.from({ length: 1000 }, newEventId);
  for (const id of ids) assert.match(id, /^evt_[0-9A-HJKMNP-TV-Z]{26}$/);
  assert.deepEqual([...ids].sort(), ids);
  assert.equal(new Set(ids).size, ids.length);
});

test('prepare refuses bad events naming the field', () => {
  const cases = [
    [{ type: 'a', payload: 'not json' }, 'payload', /not valid JSON/],
    [{ type: 'a', payload: Buffer.from([0x7b, 0xff, 0x7d]) }, 'payload', /UTF-8/],
    [{ type: 'a', payload: '' }, 'payload', /empty/],
    [{ type: 'a' }, 'payload', /empty/],
    [{ type: '', payload: '{}' }, 'type', /empty/],
    [{ type: 'x'.repeat(129), payload: '{}' }, 'type', /129 bytes, over 128/],
    [{ id: 'e'.repeat(129), type: 'a', payload: '{}' }, 'id', /over 128/],
    [{ type: 'a', payload: '{}', traceparent: '00-zz' }, 'traceparent', /not a W3C traceparent/],
    [{ type: 'a', payload: '{}', traceparent: '00-00000000000000000000000000000000-00f067aa0ba902b7-01' }, 'traceparent', /all zeros/],
    [{ type: 'a', payload: '{}', tracestate: 'k=v' }, 'tracestate', /without a traceparent/],
    [{ type: 'a', payload: '{}', traceparent, tracestate: 'k=\n' }, 'tracestate', /printable ASCII/],
    [{ type: 'a', payload: '{}', tenantId: 'a\0b' }, 'tenantId', /NUL/],
  ];
  for (const [e, field, re] of cases) {
    assert.throws(() => prepare(/** @type {any} */ (e)), (err) => {
      assert.ok(err instanceof InvalidEventError, `${JSON.stringify(e)}: ${err}`);
      assert.equal(err.field, field);
      assert.match(err.message, re);
      return true;
    });
  }
  const p = prepare({ type: 'order.placed', payload: { a: 1 } });
  assert.equal(p.payload, '{"a":1}');
  assert.equal(p.correlationId, p.id);
});

/**
 * A connection in the test's schema, with the outbox table.
 * @param {import('node:test').TestContext} t
 */
async function setup(t) {
  const db = await postgresSchema(t);
  if (!db) return null;
  const bin = postboxBin(t);
  if (!bin) return null;
  migrateOutbox(bin, db.url);
  const pool = new pg.Pool({ ...db.config, max: 4 });
  /** @type {pg.PoolClient[]} */
  const taken = [];
  t.after(async () => {
    for (const c of taken) c.release();
    await pool.end();
  });
  const connect = async () => {
    const c = await pool.connect();
    taken.push(c);
    return c;
  };
  return { db, pool, connect };
}

test('insert writes rows in the caller\'s transaction, payload bytes as given', async (t) => {
  const s = await setup(t);
  if (!s) return;
  const client = await s.connect();
  const raw = '{"z": 1,  "a": [1, 2], "z": "dup", "u": "\\u00e9é"}'; // order, spacing, a duplicate key: all kept
  await client.query('BEGIN');
  const [one] = await insert(client, { type: 'order.placed', payload: Buffer.from(raw), correlationId: 'req-1', tenantId: 'shop-1', traceparent, tracestate: 'k=v' });
  const many = await insert(client, Array.from({ length: 100 }, (_, i) => ({ id: `evt-many-${i}`, type: 'order.line', payload: `{"line":${i}}` })));
  await client.query('COMMIT');
  assert.match(one.id, /^evt_/);
  assert.equal(many.length, 100);
  const { rows } = await client.query('SELECT event_id, event_type, payload, correlation_id, tenant_id, traceparent, tracestate, delivered_at FROM outbox ORDER BY seq');
  assert.equal(rows.length, 101);
  assert.deepEqual(rows[0], {
    event_id: one.id, event_type: 'order.placed', payload: raw, correlation_id: 'req-1', tenant_id: 'shop-1', traceparent, tracestate: 'k=v', delivered_at: null,
  });
  assert.equal(rows[100].event_id, 'evt-many-99');
  assert.equal(rows[100].correlation_id, 'evt-many-99');
  assert.equal(rows[100].payload, '{"line":99}');
});

test('a rolled-back transaction leaves nothing', async (t) => {
  const s = await setup(t);
  if (!s) return;
  const client = await s.connect();
  await client.query('BEGIN');
  await insert(client, { type: 'order.placed', payload: '{}' });
  await client.query('ROLLBACK');
  const { rows } = await client.query('SELECT count(*)::int AS n FROM outbox');
  assert.equal(rows[0].n, 0);
});

test('the insert trigger notifies the relays\' channel', async (t) => {
  const s = await setup(t);
  if (!s) return;
  const listener = new pg.Client(s.db.config);
  await listener.connect();
  t.after(() => listener.end());
  await listener.query(`LISTEN ${OUTBOX_CHANNEL}`);
  const got = new Promise((resolve) => listener.once('notification', resolve));
  const client = await s.connect();
  await client.query('BEGIN');
  await insert(client, [{ type: 'a', payload: '{}' }, { type: 'b', payload: '{}' }]);
  await client.query('COMMIT');
  const n = /** @type {any} */ (await got);
  assert.equal(n.channel, OUTBOX_CHANNEL);
});

test('bad input: a clear error and nothing written', async (t) => {
  const s = await setup(t);
  if (!s) return;
  const count = async () => (await s.pool.query('SELECT count(*)::int AS n FROM outbox')).rows[0].n;

  // Not JSON, inside a transaction that stays usable.
  const client = await s.connect();
  await client.query('BEGIN');
  await assert.rejects(insert(client, [{ type: 'ok', payload: '{}' }, { type: 'bad', payload: '{"a":' }]), (err) => {
    assert.ok(err instanceof InvalidEventError);
    assert.equal(/** @type {any} */ (err).field, 'payload');
    assert.match(err.message, /payload is not valid JSON/);
    return true;
  });
  await client.query('COMMIT');
  assert.equal(await count(), 0);

  // Not in a transaction: no BEGIN, or after COMMIT.
  await assert.rejects(insert(client, { type: 'a', payload: '{}' }), (err) => err instanceof TransactionError && /not in a transaction/.test(err.message));
  // A driver that does not tell its transaction status: the statement itself checks.
  const bare = { query: (/** @type {string} */ q, /** @type {any[]} */ v) => client.query(q, v) };
  await assert.rejects(insert(bare, { type: 'a', payload: '{}' }), (err) => err instanceof TransactionError && /not in a transaction/.test(err.message));
  // A pool.
  await assert.rejects(insert(s.pool, { type: 'a', payload: '{}' }), (err) => err instanceof TransactionError && /Pool/.test(err.message));
  // A failed transaction.
  await client.query('BEGIN');
  await client.query('SELECT 1/0').catch(() => {});
  await assert.rejects(insert(client, { type: 'a', payload: '{}' }), (err) => err instanceof TransactionError && /failed/.test(err.message));
  await client.query('ROLLBACK');
  // A closed client, in the middle of its transaction.
  const closed = new pg.Client(s.db.config);
  await closed.connect();
  await closed.query('BEGIN');
  await closed.end();
  await assert.rejects(insert(closed, { type: 'a', payload: '{}' }), (err) => err instanceof TransactionError && /closed/.test(err.message));
  assert.equal(await count(), 0);
});

test('a duplicate id is not written and names the id; the transaction stays usable', async (t) => {
  const s = await setup(t);
  if (!s) return;
  const client = await s.connect();
  await client.query('BEGIN');
  await insert(client, { id: 'evt-dup', type: 'a', payload: '{"v":1}' });
  await assert.rejects(insert(client, [{ id: 'evt-new', type: 'a', payload: '{}' }, { id: 'evt-dup', type: 'a', payload: '{"v":2}' }]), (err) => {
    assert.ok(err instanceof DuplicateEventError);
    assert.deepEqual(/** @type {any} */ (err).ids, ['evt-dup']);
    return true;
  });
  await client.query('COMMIT');
  const { rows } = await client.query('SELECT event_id, payload FROM outbox ORDER BY seq');
  assert.deepEqual(rows, [{ event_id: 'evt-dup', payload: '{"v":1}' }, { event_id: 'evt-new', payload: '{}' }]);
});

test('no outbox table: the error says how to make one', async (t) => {
  const db = await postgresSchema(t);
  if (!db) return;
  const client = new pg.Client(db.config);
  await client.connect();
  t.after(() => client.end());
  await client.query('BEGIN');
  await assert.rejects(insert(client, { type: 'a', payload: '{}' }), /outbox.*does not exist.*postbox outbox migrate/);
  await client.query('ROLLBACK');
});

test('an id\'s ULID carries the time it was made, in Crockford base32', () => {
  const alphabet = '0123456789ABCDEFGHJKMNPQRSTVWXYZ';
  const before = Date.now();
  const id = newEventId();
  const after = Date.now();
  let ms = 0;
  for (const c of id.slice(4, 14)) ms = ms * 32 + alphabet.indexOf(c);
  assert.ok(ms >= before && ms <= after, `${id}: ${ms} not in [${before}, ${after}]`);
});
