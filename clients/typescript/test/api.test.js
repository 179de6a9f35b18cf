// The operator API client calls only what docs/openapi.json describes:
// every route, query parameter and body field it sends, and every field of
// the answers its types declare.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { Api, ROUTES, SCHEMA_FIELDS } from '../src/index.js';
import { repoRoot } from './env.js';

const doc = JSON.parse(readFileSync(join(repoRoot, 'docs/openapi.json'), 'utf8'));

/** @param {any} s */
function resolve(s) {
  while (s && s.$ref) s = doc.components.schemas[s.$ref.split('/').pop()];
  return s;
}

test('every route the client calls is in docs/openapi.json, with its fields', () => {
  for (const [name, r] of Object.entries(ROUTES)) {
    const op = doc.paths[r.path]?.[r.method.toLowerCase()];
    assert.ok(op, `${name}: ${r.method} ${r.path} is not in docs/openapi.json`);
    const params = [...(doc.paths[r.path].parameters ?? []), ...(op.parameters ?? [])];
    for (const q of /** @type {any} */ (r).query ?? []) {
      assert.ok(params.some((p) => p.in === 'query' && p.name === q), `${name}: query parameter ${q} is not in docs/openapi.json`);
    }
    for (const m of r.path.matchAll(/\{(\w+)\}/g)) {
      assert.ok(params.some((p) => p.in === 'path' && p.name === m[1]), `${name}: path parameter ${m[1]}`);
    }
    const body = /** @type {any} */ (r).body;
    if (body) {
      const schema = resolve(op.requestBody?.content?.['application/json']?.schema);
      assert.ok(schema, `${name}: no request body in docs/openapi.json`);
      for (const f of body) assert.ok(f in schema.properties, `${name}: body field ${f} is not in docs/openapi.json`);
    } else {
      assert.ok(!op.requestBody?.required, `${name}: docs/openapi.json requires a body`);
    }
    const response = /** @type {any} */ (r).response;
    if (response) {
      const refs = Object.entries(op.responses).filter(([code]) => code.startsWith('2'))
        .map(([, v]) => /** @type {any} */ (v).content?.['application/json']?.schema?.$ref);
      assert.ok(refs.includes(`#/components/schemas/${response}`), `${name}: answers ${refs.join(', ')}, not ${response}`);
    }
  }
});

test('every answer field the types declare is in docs/openapi.json', () => {
  for (const [schema, fields] of Object.entries(SCHEMA_FIELDS)) {
    const s = doc.components.schemas[schema];
    assert.ok(s, `schema ${schema} is not in docs/openapi.json`);
    for (const f of fields) assert.ok(f in s.properties, `${schema}.${f} is not in docs/openapi.json`);
  }
  // What the runner reads of an item and a lease is required there.
  assert.ok(['id', 'event_id', 'attempts', 'payload'].every((f) => doc.components.schemas.Item.required.includes(f)));
  assert.ok(['lease', 'items'].every((f) => doc.components.schemas.Lease.required.includes(f)));
});

test('the client sends what the routes say', async () => {
  /** @type {{url: string, init: any}[]} */
  const sent = [];
  const api = new Api('http://127.0.0.1:1/prefix/', {
    token: 'tok',
    fetch: /** @type {any} */ (async (url, init) => {
      sent.push({ url, init });
      return new Response(JSON.stringify({ items: [], lease: 'l', expires_at: '' }), { status: 200 });
    }),
  });
  await api.lease('in box', { max: 5, visibilityTimeoutMs: 1500, waitMs: 2000 });
  await api.nack('in box', 'l', [1], { delayMs: 250, reason: 'r', dead: false });
  await api.items('a', { state: 'pending', limit: 3 });
  assert.equal(sent[0].url, 'http://127.0.0.1:1/prefix/v1/inboxes/in%20box/lease');
  assert.deepEqual(JSON.parse(sent[0].init.body), { max: 5, visibility_timeout: '1500000us', wait: '2000000us' });
  assert.equal(sent[0].init.headers.authorization, 'Bearer tok');
  assert.deepEqual(JSON.parse(sent[1].init.body), { ids: [1], lease: 'l', delay: '250000us', reason: 'r' });
  assert.equal(sent[2].url, 'http://127.0.0.1:1/prefix/v1/inboxes/a/items?state=pending&limit=3');
  await api.pauseSubscription('s');
  await api.eventById('devices', 'evt 1', { variant: 'pi-7' });
  await api.searchItems('a', { id: 'k', since: new Date('2026-01-02T03:04:05Z'), before: 9 });
  await api.discardDeadLetters({ ids: [4], all: false });
  assert.equal(sent[3].url, 'http://127.0.0.1:1/prefix/v1/subscriptions/s/pause');
  assert.equal(sent[3].init.body, undefined);
  assert.equal(sent[4].url, 'http://127.0.0.1:1/prefix/v1/streams/devices/events?id=evt+1&variant=pi-7');
  assert.equal(sent[5].url, 'http://127.0.0.1:1/prefix/v1/inboxes/a/search?id=k&since=2026-01-02T03%3A04%3A05.000Z&before=9');
  assert.deepEqual(JSON.parse(sent[6].init.body), { ids: [4] });
  assert.throws(() => new Api('ftp://x'), /want http/);
  assert.throws(() => new Api('http://u:p@x:1'), /credentials/);
});
