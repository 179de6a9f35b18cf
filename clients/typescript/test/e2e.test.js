// Rows written by this package in a committed transaction are relayed by
// the real postbox relay to the real postbox serve and arrive byte for
// byte, ids and trace context with them, signed as Standard Webhooks
// sign; rows of a rolled-back transaction never leave.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { createServer } from 'node:http';
import { test } from 'node:test';
import pg from 'pg';
import { Api, insert, verifyWebhook, WebhookVerificationError } from '../src/index.js';
import { migrateOutbox, postgresSchema, postboxBin, run, startServe, until } from './env.js';

const traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';

/**
 * An HTTP target that records what it is sent.
 * @param {import('node:test').TestContext} t
 */
async function target(t) {
  /** @type {{headers: import('node:http').IncomingHttpHeaders, body: Buffer}[]} */
  const got = [];
  const srv = createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      got.push({ headers: req.headers, body: Buffer.concat(chunks) });
      res.writeHead(200).end();
    });
  });
  await new Promise((r) => srv.listen(0, '127.0.0.1', () => r(undefined)));
  t.after(() => new Promise((r) => srv.close(r)));
  const { port } = /** @type {import('node:net').AddressInfo} */ (srv.address());
  return { url: `http://127.0.0.1:${port}/hook`, got };
}

test('TypeScript outbox rows are relayed to postbox serve byte for byte; a rollback never leaves', async (t) => {
  const db = await postgresSchema(t);
  if (!db) return;
  const bin = postboxBin(t);
  if (!bin) return;
  migrateOutbox(bin, db.url);
  const serve = await startServe(t, bin);
  const api = new Api(serve.base);
  const hook = await target(t);
  const secret = 'whsec_' + randomBytes(32).toString('base64');
  await api.createSubscription({ name: 'ts-push', source: 'devices', start: 'earliest', target: hook.url, secret });
  await api.createSubscription({ name: 'ts-pull', source: 'devices', start: 'earliest' });

  const pool = new pg.Pool({ ...db.config, max: 2 });
  const relay = run(t, bin, ['relay', '--db', db.url, '--to', serve.base.replace('http:', 'ws:'), '--listen', '', '--poll', '100ms', '--log-level', 'warn']);

  // Payloads whose bytes JSON re-encoding would change. postbox's ingress
  // stores an envelope's payload compacted (insignificant whitespace out,
  // every other byte kept: key order, duplicate keys, number forms,
  // escapes), so the second arrives as compacted.
  const payloads = [
    '{"order":1,"total":42.50,"note":"caf\\u00e9 é"}',
    '{ "b": 2,\n  "a": [1, 2.0, 1e3] }',
    '{"z":1,"z":2}',
  ];
  const arrived = [payloads[0], '{"b":2,"a":[1,2.0,1e3]}', payloads[2]];
  const rolledBack = 'evt_ts_rolled_back';
  const client = await pool.connect();
  t.after(async () => {
    client.release();
    await pool.end();
  });
  await client.query('BEGIN');
  await insert(client, { id: rolledBack, type: 'order.placed', payload: '{"never":true}' });
  await client.query('ROLLBACK');
  await client.query('BEGIN');
  const written = await insert(client, payloads.map((p, i) => ({
    type: 'order.placed', payload: Buffer.from(p), correlationId: `req-${i}`, tenantId: i === 0 ? 'shop-1' : undefined,
    traceparent: i < 2 ? traceparent : undefined, tracestate: i === 0 ? 'vendor=x' : undefined,
  })));
  await client.query('COMMIT');

  await until('the three events at the target', 60_000, () => {
    if (relay.process.exitCode !== null) throw new Error(`postbox relay exited: ${relay.output()}`);
    return hook.got.length >= 3;
  });
  const byId = new Map(hook.got.map((g) => [String(g.headers['idempotency-key']), g]));
  for (const [i, e] of written.entries()) {
    const device = i === 0 ? 'shop-1' : 'outbox';
    const g = byId.get(`${device}/${e.id}`);
    assert.ok(g, `event ${e.id} at the target (got ${[...byId.keys()].join(', ')})`);
    assert.equal(g.body.toString('utf8'), arrived[i], 'payload byte for byte');
    assert.equal(g.headers['x-event-type'], 'order.placed');
    assert.equal(g.headers.traceparent, i < 2 ? traceparent : undefined);
    assert.equal(g.headers.tracestate, i === 0 ? 'vendor=x' : undefined);
    // Signed as Standard Webhooks sign, by the server's own code.
    const v = verifyWebhook(secret, g.headers, g.body);
    assert.ok(Math.abs(v.timestamp.getTime() - Date.now()) < 120_000);
    assert.throws(() => verifyWebhook(secret, g.headers, Buffer.concat([g.body, Buffer.from(' ')])), WebhookVerificationError);
    assert.throws(() => verifyWebhook('whsec_' + randomBytes(32).toString('base64'), g.headers, g.body), /no signature matches/);
  }

  // Ids, correlation and tenant as the server stored them.
  const page = await api.items('ts-pull', {});
  const items = new Map(page.items.map((it) => [it.event_id, it]));
  for (const [i, e] of written.entries()) {
    const it = items.get(e.id);
    assert.ok(it, `item of ${e.id}`);
    assert.equal(it.type, 'order.placed');
    assert.equal(it.metadata.session_id, `req-${i}`);
    assert.equal(it.metadata.device_id, i === 0 ? 'shop-1' : 'outbox');
    assert.deepEqual(it.payload, JSON.parse(payloads[i]));
  }
  assert.ok(!items.has(rolledBack));

  // The relay has marked them delivered, and the rolled-back row is nowhere.
  await until('the rows marked delivered', 30_000, async () =>
    (await pool.query('SELECT count(*)::int AS n FROM outbox WHERE delivered_at IS NOT NULL')).rows[0].n === 3);
  assert.equal((await pool.query('SELECT count(*)::int AS n FROM outbox')).rows[0].n, 3);
  const stream = await api.stream('devices');
  assert.equal(stream.events, 3);
  assert.ok(!hook.got.some((g) => String(g.headers['idempotency-key']).endsWith(rolledBack)));
});
