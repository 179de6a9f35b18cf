// The client's operating calls against a real postbox serve: pause and
// resume, a test event, an event's deliveries, search, cancel and discard.
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { test } from 'node:test';
import { Api } from '../src/index.js';
import { postboxBin, startServe, until } from './env.js';

/**
 * An HTTP target that records the headers it is sent and answers 200.
 * @param {import('node:test').TestContext} t
 */
async function target(t) {
  /** @type {import('node:http').IncomingHttpHeaders[]} */
  const got = [];
  const srv = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      got.push(req.headers);
      res.writeHead(200).end();
    });
  });
  await new Promise((r) => srv.listen(0, '127.0.0.1', () => r(undefined)));
  t.after(() => new Promise((r) => srv.close(r)));
  const { port } = /** @type {import('node:net').AddressInfo} */ (srv.address());
  return { url: `http://127.0.0.1:${port}/hook`, got };
}

/**
 * @param {string} base
 * @param {number} n
 */
async function postWebhooks(base, n) {
  for (let i = 0; i < n; i++) {
    const r = await fetch(`${base}/webhooks`, {
      method: 'POST', body: '{"n":1}', headers: { 'content-type': 'application/json', 'idempotency-key': `ops-${i}` },
    });
    assert.equal(r.status, 202);
  }
}

/**
 * @param {Promise<unknown>} p
 * @param {number} status
 * @param {string} [code]
 */
async function rejects(p, status, code) {
  await assert.rejects(p, (/** @type {any} */ e) => e.status === status && (code === undefined || e.code === code));
}

test('pause, resume, a test event, an event with its deliveries, search, cancel and discard', async (t) => {
  const bin = postboxBin(t);
  if (!bin) return;
  const serve = await startServe(t, bin);
  const api = new Api(serve.base);

  let sub = await api.pauseSubscription('webhooks', { reason: 'handler deploy' });
  assert.equal(sub.paused, true);
  assert.equal(sub.paused_reason, 'handler deploy');
  assert.ok(sub.paused_at);
  await postWebhooks(serve.base, 3);
  await until('3 pending items', 30_000, async () => (sub = await api.subscription('webhooks')).counts?.pending === 3);
  assert.equal(sub.paused, true);
  assert.equal(sub.counts?.inbox, 'webhooks');
  assert.deepEqual((await api.lease('webhooks', { max: 3 })).items, [], 'a paused subscription leases nothing');
  sub = await api.resumeSubscription('webhooks');
  assert.equal(sub.paused, false);
  assert.equal(sub.paused_at, null);
  assert.equal(sub.paused_reason, null);

  // A test event goes to the target and is stored nowhere.
  const hook = await target(t);
  await api.createSubscription({ name: 'hook', source: 'webhooks', target: hook.url });
  const sent = await api.testSubscription('hook');
  assert.equal(sent.ok, true);
  assert.equal(sent.status_code, 200);
  assert.equal(sent.type, 'postbox.test');
  assert.equal(sent.error, null);
  assert.match(sent.event_id, /^test_/);
  await until('the test event at the target', 30_000, () => hook.got.length > 0);
  assert.equal(hook.got[0]['idempotency-key'], sent.event_id);
  await rejects(api.testSubscription('webhooks'), 400); // no target: runtimes lease it

  // An event and what each subscription made of it.
  const ev = await api.eventById('webhooks', 'ops-0');
  assert.equal(ev.event_id, 'ops-0');
  const d = ev.deliveries?.find((x) => x.subscription === 'webhooks');
  assert.equal(d?.status, 'item');
  assert.equal(d?.item?.state, 'pending');
  assert.equal(d?.paused, false);
  assert.equal((await api.event('webhooks', ev.offset)).id, ev.id);
  await rejects(api.event('webhooks', 10_000), 404, 'not_found');

  // Search, newest first.
  let page = await api.searchEvents('webhooks', { id: 'ops-1' });
  assert.deepEqual(page.events.map((e) => e.event_id), ['ops-1']);
  assert.equal(page.events[0].deliveries, undefined);
  page = await api.searchEvents('webhooks', { limit: 2 });
  assert.deepEqual(page.events.map((e) => e.event_id), ['ops-2', 'ops-1']);
  assert.ok(page.next_before > 0);
  const pending = await api.searchItems('webhooks', { state: 'pending' });
  assert.deepEqual(pending.items.map((i) => i.event_id).sort(), ['ops-0', 'ops-1', 'ops-2']);
  const [i0] = (await api.searchItems('webhooks', { id: 'ops-0' })).items;
  const [i1] = (await api.searchItems('webhooks', { id: 'ops-1' })).items;

  // Cancel: a dead letter; discard: gone.
  const cancelled = await api.cancelItem('webhooks', i0.id, { reason: 'wrong customer' });
  assert.equal(cancelled.state, 'failed');
  assert.match(cancelled.last_error ?? '', /cancelled/);
  await rejects(api.cancelItem('webhooks', i0.id), 409, 'invalid_state');
  assert.equal((await api.discardItem('webhooks', i1.id)).id, i1.id);
  await rejects(api.item('webhooks', i1.id), 404, 'not_found');
  await rejects(api.discardDeadLetters({}), 400, 'missing_field');
  assert.deepEqual(await api.discardDeadLetters({ inbox: 'webhooks', ids: [i0.id] }), { discarded: 1, ids: [i0.id] });
  assert.deepEqual((await api.deadLetters({ inbox: 'webhooks' })).items, []);
});

test('a reply to an item goes to the url of its delivery handle, once per key', async (t) => {
  const bin = postboxBin(t);
  if (!bin) return;
  const serve = await startServe(t, bin);
  const api = new Api(serve.base);
  /** @type {string[]} */
  const bodies = [];
  const srv = createServer((req, res) => {
    let body = '';
    req.on('data', (c) => { body += c; });
    req.on('end', () => {
      bodies.push(body);
      res.writeHead(201).end();
    });
  });
  await new Promise((r) => srv.listen(0, '127.0.0.1', () => r(undefined)));
  t.after(() => new Promise((r) => srv.close(r)));
  const { port } = /** @type {import('node:net').AddressInfo} */ (srv.address());
  const url = `http://127.0.0.1:${port}/replies`;

  const created = await fetch(`${serve.base}/v1/sources`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ name: 'talk', kind: 'webhook', settings: { handle_header: 'X-Reply-To' } }),
  });
  assert.equal(created.status, 201);
  await api.createSubscription({ name: 'talk-in', source: 'talk' });
  const hook = await fetch(`${serve.base}/webhooks/talk`, {
    method: 'POST', body: '{"n":1}', headers: { 'content-type': 'application/json', 'idempotency-key': 't-1', 'x-reply-to': url },
  });
  assert.equal(hook.status, 202);
  /** @type {import('../index.js').Item[]} */
  let items = [];
  await until('the item of t-1', 30_000, async () => (items = (await api.items('talk-in')).items).length === 1);
  assert.deepEqual(items[0].delivery_handle, { kind: 'webhook', url });

  const r = await api.reply('talk-in', items[0].id, { text: 'hi' }, { key: 'k' });
  assert.equal(r.key, 'k');
  assert.equal(r.url, url);
  assert.equal((await api.reply('talk-in', items[0].id, { text: 'hi' }, { key: 'k' })).key, 'k');
  await rejects(api.reply('talk-in', items[0].id, { text: 'other' }, { key: 'k' }), 409, 'conflict');
  await until('the reply to complete', 30_000, async () => (await api.replies('talk-in', items[0].id))[0].state === 'completed');
  assert.deepEqual(bodies, ['{"text":"hi"}']);
  await rejects(api.retryReply('talk-in', items[0].id, 'k'), 409, 'invalid_state');
});
