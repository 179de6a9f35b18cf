import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { test } from 'node:test';
import pg from 'pg';
import { dedup, InvalidEventError, TransactionError } from '../src/index.js';
import { postgresSchema, repoRoot, skip } from './env.js';

/**
 * A pool on a schema with the inbox table and a table of effects.
 * @param {import('node:test').TestContext} t
 */
async function setup(t) {
  const db = await postgresSchema(t);
  if (!db) return null;
  const pool = new pg.Pool({ ...db.config, max: 8 });
  t.after(() => pool.end());
  await dedup.migrate(pool);
  await dedup.migrate(pool); // again: harmless
  await pool.query('CREATE TABLE dedup_effects (id TEXT NOT NULL, by TEXT NOT NULL)');
  return { db, pool };
}

/**
 * @param {pg.Pool} pool
 * @param {string} id
 */
const effect = (pool, id) => (c) => c.query(`INSERT INTO dedup_effects (id, by) VALUES ($1, 'ts')`, [id]);

test('dedup runs a handler once per id, in its transaction', async (t) => {
  const s = await setup(t);
  if (!s) return;
  assert.equal(await dedup.handle(s.pool, 'shipping', 'evt_1', effect(s.pool, 'evt_1')), true);
  assert.equal(await dedup.handle(s.pool, 'shipping', 'evt_1', () => assert.fail('ran twice')), false);
  assert.equal(await dedup.handle(s.pool, 'billing', 'evt_1', effect(s.pool, 'evt_1')), true); // another handler: its own record

  // A failing function leaves neither its writes nor the record.
  await assert.rejects(dedup.handle(s.pool, 'shipping', 'evt_2', async (c) => {
    await effect(s.pool, 'evt_2')(c);
    throw new Error('boom');
  }), /boom/);
  assert.equal(await dedup.handle(s.pool, 'shipping', 'evt_2', effect(s.pool, 'evt_2')), true);

  // A client of one's own, outside BEGIN.
  const c = new pg.Client(s.db.config);
  await c.connect();
  t.after(() => c.end());
  assert.equal(await dedup.handle(c, 'shipping', 'evt_3', effect(s.pool, 'evt_3')), true);
  assert.equal(await dedup.handle(c, 'shipping', 'evt_3', effect(s.pool, 'evt_3')), false);
  await c.query('BEGIN');
  await assert.rejects(dedup.handle(c, 'shipping', 'evt_4', () => {}), (err) => err instanceof TransactionError && /in a transaction already/.test(err.message));
  await c.query('ROLLBACK');

  // Deliveries of one id at once: exactly one runs.
  const ran = await Promise.all(Array.from({ length: 6 }, () => dedup.handle(s.pool, 'shipping', 'evt_5', async (cl) => {
    await new Promise((r) => setTimeout(r, 20));
    await effect(s.pool, 'evt_5')(cl);
  })));
  assert.equal(ran.filter(Boolean).length, 1);

  const { rows } = await s.pool.query(`SELECT id, count(*)::int AS n FROM dedup_effects GROUP BY id ORDER BY id`);
  assert.deepEqual(rows, [{ id: 'evt_1', n: 2 }, { id: 'evt_2', n: 1 }, { id: 'evt_3', n: 1 }, { id: 'evt_5', n: 1 }]);

  assert.equal(await dedup.forget(s.pool, new Date(Date.now() + 60_000)), 5);
});

test('dedup refuses bad keys naming them, and writes nothing', async (t) => {
  const s = await setup(t);
  if (!s) return;
  for (const [handler, id, field, re] of [
    ['', 'evt_1', 'handler', /handler is empty/],
    ['h', '', 'id', /id is empty/],
    ['h', 'x'.repeat(256), 'id', /256 bytes, over 255/],
    ['h', 'a\0b', 'id', /NUL/],
  ]) {
    await assert.rejects(dedup.handle(s.pool, handler, id, () => {}), (err) => {
      assert.ok(err instanceof InvalidEventError);
      assert.equal(/** @type {any} */ (err).field, field);
      assert.match(err.message, re);
      return true;
    });
  }
  const closed = new pg.Client(s.db.config);
  await closed.connect();
  await closed.end();
  await assert.rejects(dedup.handle(closed, 'h', 'evt_1', () => {}), (err) => err instanceof TransactionError && /closed/.test(err.message));
  assert.equal((await s.pool.query('SELECT count(*)::int AS n FROM inbox')).rows[0].n, 0);
});

test('a Go handler and a TypeScript handler share one inbox table', async (t) => {
  const s = await setup(t);
  if (!s) return;
  const goRun = (/** @type {string[]} */ ids) => spawnSync('go', ['run', './clients/typescript/testdata/godedup', '-db', s.db.url, '-handler', 'shipping', ...ids],
    { cwd: repoRoot, encoding: 'utf8' });
  const first = goRun(['evt_go']);
  if (first.error) return skip(t, `go is needed to run Go's dedup beside this one: ${first.error.message}`);
  assert.equal(first.status, 0, first.stderr);
  assert.equal(first.stdout, 'evt_go ran\n');

  // What Go handled, TypeScript skips; what TypeScript handled, Go skips.
  assert.equal(await dedup.handle(s.pool, 'shipping', 'evt_go', () => assert.fail('ran what Go handled')), false);
  assert.equal(await dedup.handle(s.pool, 'shipping', 'evt_ts', effect(s.pool, 'evt_ts')), true);
  const second = goRun(['evt_ts', 'evt_go', 'evt_new']);
  assert.equal(second.status, 0, second.stderr);
  assert.equal(second.stdout, 'evt_ts skipped\nevt_go skipped\nevt_new ran\n');
  const { rows } = await s.pool.query('SELECT id, by FROM dedup_effects ORDER BY id');
  assert.deepEqual(rows, [{ id: 'evt_go', by: 'go' }, { id: 'evt_new', by: 'go' }, { id: 'evt_ts', by: 'ts' }]);
});

test('dedup.record records in a transaction the caller runs', async (t) => {
  const s = await setup(t);
  if (!s) return;
  const c = await s.pool.connect();
  try {
    await c.query('BEGIN');
    assert.equal(await dedup.record(c, 'shipping', 'evt_r'), true);
    await c.query(`INSERT INTO dedup_effects (id, by) VALUES ('evt_r', 'ts')`);
    await c.query('COMMIT');
    await c.query('BEGIN');
    assert.equal(await dedup.record(c, 'shipping', 'evt_r'), false);
    await c.query('ROLLBACK');
    // A rollback takes the record back: the next delivery goes on.
    await c.query('BEGIN');
    assert.equal(await dedup.record(c, 'shipping', 'evt_s'), true);
    await c.query('ROLLBACK');
    assert.equal(await dedup.handle(s.pool, 'shipping', 'evt_s', () => {}), true);
    // Outside a transaction: an error, and nothing written.
    await assert.rejects(dedup.record(c, 'shipping', 'evt_t'), (err) => err instanceof TransactionError && /not in a transaction/.test(err.message));
    const bare = { query: (/** @type {string} */ q, /** @type {any[]} */ v) => c.query(q, v) };
    await assert.rejects(dedup.record(bare, 'shipping', 'evt_t'), (err) => err instanceof TransactionError && /not in a transaction/.test(err.message));
  } finally {
    c.release(); // before the pool ends
  }
  const { rows } = await s.pool.query(`SELECT id FROM inbox ORDER BY id`);
  assert.deepEqual(rows.map((r) => r.id), ['evt_r', 'evt_s']);
});
