// The runner against the real postbox serve, each outcome counted at the
// server: a handler that fails (for good, with a retry-after, every
// time), one that outlasts its lease, a shutdown mid-job, and the errors
// of a lease that expired.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Api, ApiError, LeaseLostError, permanent, resultError, retryAfter, runInbox } from '../src/index.js';
import { postboxBin, startServe, until } from './env.js';

/**
 * Posts a webhook; it becomes an item of the inbox webhooks.
 * @param {string} base
 * @param {string} key
 * @param {unknown} body
 */
async function postWebhook(base, key, body) {
  const r = await fetch(base + '/webhooks', {
    method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': key }, body: JSON.stringify(body),
  });
  assert.equal(r.status, 202, await r.text());
}

/**
 * @param {Api} api
 * @param {string} inbox
 */
async function counts(api, inbox) {
  const all = await api.inboxes();
  const c = all.find((/** @type {any} */ c) => c.inbox === inbox);
  if (!c) return { pending: 0, processing: 0, completed: 0, failed: 0 };
  const { oldest_pending_at: _, ...byState } = c; // the counts alone
  return byState;
}

/** @param {import('node:test').TestContext} t */
async function server(t, extra = /** @type {string[]} */ ([])) {
  const bin = postboxBin(t);
  if (!bin) return null;
  const s = await startServe(t, bin, extra);
  return { base: s.base, api: new Api(s.base) };
}

const quiet = { warn() {}, error: console.error };

test('runner: acked, dead-lettered for good, retried after retry-after, dead after the last attempt', async (t) => {
  const s = await server(t, ['--max-attempts', '3']);
  if (!s) return;
  for (const kind of ['ok', 'permanent', 'flaky', 'fail']) await postWebhook(s.base, kind, { kind });
  /** @type {Record<string, number[]>} */
  const calls = { ok: [], permanent: [], flaky: [], fail: [] };
  const ctl = new AbortController();
  const done = runInbox(s.api, 'webhooks', async (item) => {
    const { kind } = item.payload;
    calls[kind].push(Date.now());
    switch (kind) {
      case 'permanent': throw permanent(new Error('not an order'));
      case 'flaky': if (calls.flaky.length === 1) throw retryAfter(300, new Error('busy')); return;
      case 'fail': throw new Error('always fails');
    }
  }, { signal: ctl.signal, concurrency: 4, waitMs: 200, backoff: { baseMs: 10, maxMs: 20 }, logger: quiet });
  await until('2 completed and 2 failed at the server', 30_000, async () => {
    const c = await counts(s.api, 'webhooks');
    return c.completed === 2 && c.failed === 2;
  });
  ctl.abort();
  await done;
  assert.deepEqual(Object.fromEntries(Object.entries(calls).map(([k, v]) => [k, v.length])), { ok: 1, permanent: 1, flaky: 2, fail: 3 });
  assert.ok(calls.flaky[1] - calls.flaky[0] >= 290, `the retry came ${calls.flaky[1] - calls.flaky[0]} ms after, not after 300 ms`);
  const dead = (await s.api.deadLetters({ inbox: 'webhooks' })).items;
  const byKind = Object.fromEntries(dead.map((/** @type {any} */ it) => [it.payload.kind, it]));
  assert.equal(byKind.permanent.attempts, 1);
  assert.match(byKind.permanent.last_error, /not an order/);
  assert.equal(byKind.fail.attempts, 3);
  assert.match(byKind.fail.last_error, /always fails/);
  assert.deepEqual(await counts(s.api, 'webhooks'), { inbox: 'webhooks', pending: 0, processing: 0, completed: 2, failed: 2 });
});

test('runner: a job that outlasts its lease keeps it and is handled once', async (t) => {
  const s = await server(t);
  if (!s) return;
  await postWebhook(s.base, 'slow', { kind: 'slow' });
  let calls = 0;
  const ctl = new AbortController();
  const done = runInbox(s.api, 'webhooks', async (_item, { signal }) => {
    calls++;
    await new Promise((resolve, reject) => {
      const t = setTimeout(resolve, 2000); // over three visibility timeouts
      signal.addEventListener('abort', () => {
        clearTimeout(t);
        reject(signal.reason);
      });
    });
  }, { signal: ctl.signal, concurrency: 2, visibilityTimeoutMs: 600, waitMs: 100, logger: quiet });
  await until('the slow item completed', 30_000, async () => (await counts(s.api, 'webhooks')).completed === 1);
  ctl.abort();
  await done;
  assert.equal(calls, 1);
  const [item] = (await s.api.items('webhooks', {})).items;
  assert.equal(item.attempts, 1);
  assert.equal(item.state, 'completed');
});

test('runner: a shutdown lets a running job finish, and hands back one cut off', async (t) => {
  const s = await server(t);
  if (!s) return;
  await postWebhook(s.base, 'quick', { kind: 'quick' });
  await postWebhook(s.base, 'stuck', { kind: 'stuck' });
  /** @type {Set<string>} */
  const started = new Set();
  /** @type {unknown} */
  let stuckReason;
  const ctl = new AbortController();
  const begun = Date.now();
  const done = runInbox(s.api, 'webhooks', async (item, { signal }) => {
    started.add(item.payload.kind);
    if (item.payload.kind === 'quick') {
      await new Promise((r) => ctl.signal.aborted ? r(undefined) : ctl.signal.addEventListener('abort', r));
      await new Promise((r) => setTimeout(r, 200)); // finishes within the shutdown timeout
      return;
    }
    await new Promise((_, reject) => signal.addEventListener('abort', () => {
      stuckReason = signal.reason;
      reject(new Error('cut off'));
    }));
  }, { signal: ctl.signal, concurrency: 2, waitMs: 100, shutdownTimeoutMs: 800, logger: quiet });
  await until('both jobs running', 30_000, () => started.size === 2);
  ctl.abort();
  await done;
  assert.ok(Date.now() - begun < 20_000);
  assert.ok(!(stuckReason instanceof LeaseLostError));
  const c = await counts(s.api, 'webhooks');
  assert.deepEqual(c, { inbox: 'webhooks', pending: 1, processing: 0, completed: 1, failed: 0 });
  const stuck = (await s.api.items('webhooks', { state: 'pending' })).items[0];
  assert.equal(stuck.payload.kind, 'stuck');
  assert.equal(stuck.attempts, 1);
  assert.match(stuck.last_error, /cut off/);
  assert.ok(new Date(stuck.next_attempt_at).getTime() <= Date.now() + 1000, 'handed back without a delay');
});

test('bad input: an expired lease token, a bogus one, an inbox name the server refuses', async (t) => {
  const s = await server(t);
  if (!s) return;
  await postWebhook(s.base, 'one', { kind: 'one' });
  const lease = await s.api.lease('webhooks', { max: 1, visibilityTimeoutMs: 50 });
  assert.equal(lease.items.length, 1);
  await new Promise((r) => setTimeout(r, 150));
  const [acked] = await s.api.ack('webhooks', lease.lease, [lease.items[0].id]);
  const err = resultError(acked);
  assert.ok(err instanceof ApiError);
  assert.equal(err.code, 'lease_lost');
  assert.ok(err.leaseLost);
  const ext = await s.api.extend('webhooks', lease.lease, [lease.items[0].id], { visibilityTimeoutMs: 1000 });
  assert.equal(resultError(ext.items[0])?.code, 'lease_lost');
  const [bogus] = await s.api.ack('webhooks', 'lease_bogus', [lease.items[0].id]);
  assert.equal(resultError(bogus)?.code, 'lease_lost');
  await assert.rejects(s.api.item('webhooks', 999999), (e) => e instanceof ApiError && e.status === 404 && e.notFound);

  await assert.rejects(runInbox(s.api, 'bad name!', () => {}, { waitMs: 100, logger: quiet }), (e) => {
    assert.match(/** @type {Error} */ (e).message, /lease from bad name!: server: 400 invalid_field: .*inbox/);
    return true;
  });
  await assert.rejects(s.api.lease('webhooks', { visibilityTimeoutMs: -5 }), /positive number of milliseconds/);
});

test('runner: a job whose lease is lost is told to stop and left unsettled', async (t) => {
  const s = await server(t);
  if (!s) return;
  await postWebhook(s.base, 'taken', { kind: 'taken' });
  /** @type {unknown} */
  let reason;
  let id = 0;
  const ctl = new AbortController();
  const stopped = new Promise((resolve) => {
    const done = runInbox(s.api, 'webhooks', async (item, { signal }) => {
      id = item.id;
      await new Promise((r) => signal.addEventListener('abort', r));
      reason = signal.reason;
      resolve(undefined);
      throw new Error('stopped');
    }, { signal: ctl.signal, visibilityTimeoutMs: 600, waitMs: 100, logger: quiet });
    t.after(async () => {
      ctl.abort();
      await done;
    });
  });
  await until('the job running', 30_000, () => id !== 0);
  const [r] = await s.api.ack('webhooks', '', [id]); // an operator completes it meanwhile
  assert.equal(resultError(r), null);
  await stopped;
  assert.ok(reason instanceof LeaseLostError, String(reason));
  ctl.abort();
  const item = await s.api.item('webhooks', id);
  assert.equal(item.state, 'completed'); // the runner's nack did not undo the operator's ack
  assert.equal(item.attempts, 1);
});
