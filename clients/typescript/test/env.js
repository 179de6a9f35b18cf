// What the tests need from their surroundings: the PostgreSQL of
// POSTBOX_TEST_POSTGRES (a schema per test), the postbox binary
// (POSTBOX_BIN, or built once from this repository with go build), and
// postbox serve and postbox relay run from it. A test whose service is
// missing skips saying what it lacks, and fails instead under
// POSTBOX_REQUIRE_SERVICES=1, as the Go tests do.
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, existsSync, mkdirSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';

export const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '../../..');

/**
 * Skips t with msg, or fails it under POSTBOX_REQUIRE_SERVICES=1.
 * @param {import('node:test').TestContext} t
 * @param {string} msg
 * @returns {false}
 */
export function skip(t, msg) {
  if (process.env.POSTBOX_REQUIRE_SERVICES === '1') {
    assert.fail(`${msg}; POSTBOX_REQUIRE_SERVICES=1 forbids skipping`);
  }
  t.skip(msg);
  return false;
}

let schemaSeq = 0;

/**
 * A new, empty PostgreSQL schema, dropped when t ends: pg config for it,
 * and a URL with search_path for postbox's own commands. null when the
 * test skipped.
 * @param {import('node:test').TestContext} t
 */
export async function postgresSchema(t) {
  const base = process.env.POSTBOX_TEST_POSTGRES;
  if (!base) {
    skip(t, 'POSTBOX_TEST_POSTGRES is not set; this test needs a real PostgreSQL (see README, Development)');
    return null;
  }
  const schema = `t_ts_${process.pid}_${Date.now() % 1e9}_${++schemaSeq}`;
  const admin = new pg.Client({ connectionString: base });
  await admin.connect();
  await admin.query(`CREATE SCHEMA ${schema}`);
  await admin.end();
  t.after(async () => {
    const c = new pg.Client({ connectionString: base });
    await c.connect();
    await c.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
    await c.end();
  });
  const u = new URL(base);
  u.searchParams.set('search_path', schema);
  return {
    schema,
    /** pg config of a connection whose search_path is the schema */
    config: { connectionString: base, options: `-c search_path=${schema}` },
    /** the schema's URL for postbox relay, outbox migrate and Go programs (pgx reads search_path) */
    url: u.toString(),
  };
}

let built = '';

/**
 * The postbox binary: POSTBOX_BIN, or built once per test process into a
 * temporary directory. '' when the test skipped.
 * @param {import('node:test').TestContext} t
 */
export function postboxBin(t) {
  if (process.env.POSTBOX_BIN) return process.env.POSTBOX_BIN;
  if (built) return built;
  const dir = mkdtempSync(join(tmpdir(), 'postbox-ts-'));
  const out = join(dir, 'postbox');
  const r = spawnSync('go', ['build', '-o', out, './cmd/postbox'], { cwd: repoRoot, stdio: ['ignore', 'inherit', 'inherit'] });
  if (r.error || r.status !== 0) {
    skip(t, `the postbox binary: set POSTBOX_BIN, or have go build it (go build -o X ./cmd/postbox failed: ${r.error?.message ?? 'exit ' + r.status})`);
    return '';
  }
  process.on('exit', () => rmSync(dir, { recursive: true, force: true }));
  built = out;
  return out;
}

/** A free TCP port on the loopback. */
export function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = /** @type {import('node:net').AddressInfo} */ (s.address());
      s.close(() => resolve(port));
    });
  });
}

/**
 * Runs a postbox command until t ends, its output kept for failures.
 * @param {import('node:test').TestContext} t
 * @param {string} bin
 * @param {string[]} args
 */
export function run(t, bin, args) {
  const p = spawn(bin, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  p.stdout.on('data', (d) => { out += d; });
  p.stderr.on('data', (d) => { out += d; });
  const exited = new Promise((resolve) => p.on('exit', resolve));
  t.after(async () => {
    if (p.exitCode === null && p.signalCode === null) {
      p.kill('SIGTERM');
      await exited;
    }
  });
  return { process: p, exited, output: () => out };
}

/**
 * Starts postbox serve on a SQLite file of its own; resolves its base URL
 * once /ready answers 200.
 * @param {import('node:test').TestContext} t
 * @param {string} bin
 * @param {string[]} [extra]
 */
export async function startServe(t, bin, extra = []) {
  const dir = mkdtempSync(join(tmpdir(), 'postbox-ts-serve-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  const srv = run(t, bin, ['serve', '--addr', `127.0.0.1:${port}`, '--db', join(dir, 'postbox.db'), '--log-level', 'warn', ...extra]);
  await until(`postbox serve ready at ${base}`, 60_000, async () => {
    if (srv.process.exitCode !== null) throw new Error(`postbox serve exited: ${srv.output()}`);
    try {
      const r = await fetch(base + '/ready');
      return r.status === 200;
    } catch {
      return false;
    }
  });
  return { base, output: srv.output };
}

/**
 * Polls cond until it is true, failing after timeoutMs with what.
 * @param {string} what
 * @param {number} timeoutMs
 * @param {() => Promise<boolean> | boolean} cond
 */
export async function until(what, timeoutMs, cond) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await cond()) return;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

/**
 * Creates the outbox table in the schema with postbox outbox migrate.
 * @param {string} bin
 * @param {string} url
 */
export function migrateOutbox(bin, url) {
  const r = spawnSync(bin, ['outbox', 'migrate', '--db', url], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`postbox outbox migrate: ${r.stdout}${r.stderr}`);
}

export { mkdirSync, existsSync };
