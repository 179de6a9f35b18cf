// examples/typescript-outbox runs as its README says, against the real
// PostgreSQL, postbox serve and postbox relay.
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { migrateOutbox, postgresSchema, postboxBin, repoRoot, run, skip, startServe } from './env.js';

const dir = join(repoRoot, 'examples/typescript-outbox');

test('examples/typescript-outbox places, relays and ships orders once', async (t) => {
  const db = await postgresSchema(t);
  if (!db) return;
  const bin = postboxBin(t);
  if (!bin) return;
  if (!existsSync(join(dir, 'node_modules'))) {
    const r = spawnSync('npm', ['ci', '--no-audit', '--no-fund', '--prefer-offline'], { cwd: dir, encoding: 'utf8' });
    if (r.status !== 0) return skip(t, `npm ci in examples/typescript-outbox failed (is the npm registry reachable?): ${r.stderr.slice(-500)}`);
  }
  const serve = await startServe(t, bin);
  const sub = spawnSync(bin, ['subscriptions', 'create', 'shipping', '--source', 'devices', '--types', 'order.*', '--start', 'earliest', '--server', serve.base], { encoding: 'utf8' });
  assert.equal(sub.status, 0, sub.stderr);
  migrateOutbox(bin, db.url);
  run(t, bin, ['relay', '--db', db.url, '--to', serve.base.replace('http:', 'ws:'), '--listen', '', '--poll', '100ms']);
  const dsn = new URL(process.env.POSTBOX_TEST_POSTGRES ?? '');
  dsn.searchParams.set('options', `-c search_path=${db.schema}`);
  const p = spawn(process.execPath, ['main.js', '--orders', '5', '--db', dsn.toString(), '--server', serve.base], { cwd: dir });
  let out = '';
  p.stdout.on('data', (d) => { out += d; });
  p.stderr.on('data', (d) => { out += d; });
  const timer = setTimeout(() => p.kill(), 60_000);
  const code = await new Promise((r) => p.on('exit', r));
  clearTimeout(timer);
  assert.equal(code, 0, out);
  assert.match(out, /declined rolled back \(payment declined\)/);
  assert.equal(out.match(/^shipped order /gm)?.length, 5, out);
  assert.match(out, /shipments of this run: 5 \(redelivery of evt_\S+ ran again: false/);
});
