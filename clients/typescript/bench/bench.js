// Benchmarks of the TypeScript client (BENCHMARKS.md, "TypeScript client").
//
//   node bench/bench.js outbox [--rounds 10] [--tx 200]   # needs POSTBOX_TEST_POSTGRES
//   node bench/bench.js runner [--items 20000] [--concurrency 64,256] [--go]
//
// outbox: transactions of 100 events each, insert() against the same
// INSERT ... SELECT FROM unnest written by hand (ids made the same way),
// alternating A and B round by round in one sitting, on a schema of its own.
// runner: a postbox serve (the binary of POSTBOX_BIN, or go build) with
// --items webhooks waiting in the inbox webhooks, untimed; then runInbox
// with a do-nothing handler, timed from its start until the server counts
// every item completed. With --go, the Go client's runner
// (testdata/gorunner) does the same on a fresh server of its own after
// each TypeScript run.
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { Api, insert, newEventId, runInbox } from '../src/index.js';

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '../../..');
const { values: opts, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    rounds: { type: 'string', default: '10' },
    tx: { type: 'string', default: '200' },
    items: { type: 'string', default: '20000' },
    concurrency: { type: 'string', default: '64,256' },
    go: { type: 'boolean', default: false },
  },
});

function postboxBin() {
  if (process.env.POSTBOX_BIN) return process.env.POSTBOX_BIN;
  const out = join(mkdtempSync(join(tmpdir(), 'postbox-bench-')), 'postbox');
  const r = spawnSync('go', ['build', '-o', out, './cmd/postbox'], { cwd: repoRoot, stdio: 'inherit' });
  if (r.status !== 0) throw new Error('go build ./cmd/postbox failed');
  return out;
}

const payload = (i) => `{"order":"ord-${i}","total":${i * 10},"currency":"EUR","lines":[{"sku":"sku-1","qty":2},{"sku":"sku-2","qty":1}]}`;

async function benchOutbox() {
  const base = process.env.POSTBOX_TEST_POSTGRES;
  if (!base) throw new Error('set POSTBOX_TEST_POSTGRES');
  const schema = `bench_ts_${process.pid}`;
  const admin = new pg.Client({ connectionString: base });
  await admin.connect();
  await admin.query(`CREATE SCHEMA ${schema}`);
  const u = new URL(base);
  u.searchParams.set('search_path', schema);
  const m = spawnSync(postboxBin(), ['outbox', 'migrate', '--db', u.toString()], { encoding: 'utf8' });
  if (m.status !== 0) throw new Error(m.stderr);
  const client = new pg.Client({ connectionString: base, options: `-c search_path=${schema}` });
  await client.connect();
  const rounds = Number(opts.rounds);
  const txs = Number(opts.tx);
  const byHandSQL = `INSERT INTO outbox (event_id, event_type, payload, correlation_id, tenant_id, traceparent, tracestate)
	SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[])`;
  let n = 0;
  const a = async () => {
    for (let t = 0; t < txs; t++) {
      await client.query('BEGIN');
      const events = [];
      for (let i = 0; i < 100; i++, n++) events.push({ type: 'order.placed', payload: payload(n), tenantId: 'shop-1' });
      await insert(client, events);
      await client.query('COMMIT');
    }
  };
  const b = async () => {
    for (let t = 0; t < txs; t++) {
      await client.query('BEGIN');
      const cols = [[], [], [], [], [], [], []];
      for (let i = 0; i < 100; i++, n++) {
        const id = newEventId();
        cols[0].push(id); cols[1].push('order.placed'); cols[2].push(payload(n)); cols[3].push(id);
        cols[4].push('shop-1'); cols[5].push(''); cols[6].push('');
      }
      await client.query(byHandSQL, cols);
      await client.query('COMMIT');
    }
  };
  await a(); await b(); // warm up
  const rate = { a: [], b: [] };
  for (let r = 0; r < rounds; r++) {
    for (const [k, f] of r % 2 === 0 ? [['a', a], ['b', b]] : [['b', b], ['a', a]]) {
      const t0 = performance.now();
      await f();
      rate[k].push((txs * 100) / ((performance.now() - t0) / 1000));
    }
  }
  const median = (xs) => [...xs].sort((x, y) => x - y)[Math.floor(xs.length / 2)];
  const ratios = rate.a.map((x, i) => x / rate.b[i]);
  console.log(JSON.stringify({
    bench: 'outbox', rows_per_tx: 100, tx_per_round: txs, rounds,
    insert_rows_per_s: rate.a.map(Math.round), by_hand_rows_per_s: rate.b.map(Math.round),
    median_insert: Math.round(median(rate.a)), median_by_hand: Math.round(median(rate.b)),
    ratio_per_round: ratios.map((x) => +x.toFixed(3)), median_ratio: +median(ratios).toFixed(3),
  }));
  await client.end();
  await admin.query(`DROP SCHEMA ${schema} CASCADE`);
  await admin.end();
}

async function benchRunner() {
  const bin = postboxBin();
  const items = Number(opts.items);
  let gorunner = '';
  if (opts.go) {
    gorunner = join(mkdtempSync(join(tmpdir(), 'postbox-bench-go-')), 'gorunner');
    const r = spawnSync('go', ['build', '-o', gorunner, './clients/typescript/testdata/gorunner'], { cwd: repoRoot, stdio: 'inherit' });
    if (r.status !== 0) throw new Error('go build gorunner failed');
  }
  for (const conc of opts.concurrency.split(',').map(Number)) {
    await withServer(bin, items, async (base) => {
      const api = new Api(base);
      const ctl = new AbortController();
      let handled = 0;
      const cpu0 = process.cpuUsage();
      const t0 = performance.now();
      const done = runInbox(api, 'webhooks', () => { handled++; }, { signal: ctl.signal, concurrency: conc, waitMs: 1000 });
      for (;;) {
        const c = (await api.inboxes()).find((x) => x.inbox === 'webhooks');
        if (c && c.completed === items) break;
        await new Promise((r) => setTimeout(r, 1));
      }
      const secs = (performance.now() - t0) / 1000;
      const cpu = process.cpuUsage(cpu0);
      ctl.abort();
      await done;
      console.log(JSON.stringify({ bench: 'runner', concurrency: conc, items, handled, seconds: +secs.toFixed(3), items_per_s: Math.round(items / secs),
        runner_cpu_seconds: +((cpu.user + cpu.system) / 1e6).toFixed(2) }));
    });
    if (gorunner) {
      await withServer(bin, items, async (base) => {
        const r = spawnSync(gorunner, ['-server', base, '-n', String(items), '-concurrency', String(conc)], { encoding: 'utf8' });
        if (r.status !== 0) throw new Error(`gorunner: ${r.stderr}`);
        process.stdout.write(r.stdout);
      });
    }
  }
}

/**
 * Runs f on a fresh postbox serve whose inbox webhooks holds items webhooks.
 * @param {string} bin
 * @param {number} items
 * @param {(base: string) => Promise<void>} f
 */
async function withServer(bin, items, f) {
  const dir = mkdtempSync(join(tmpdir(), 'postbox-bench-serve-'));
  const port = 20000 + Math.floor(Math.random() * 20000);
  const base = `http://127.0.0.1:${port}`;
  const srv = spawn(bin, ['serve', '--addr', `127.0.0.1:${port}`, '--db', join(dir, 'postbox.db'), '--log-level', 'error'], { stdio: 'inherit' });
  try {
    for (;;) {
      try {
        if ((await fetch(base + '/ready')).status === 200) break;
      } catch {}
      await new Promise((r) => setTimeout(r, 50));
    }
    // Preload, untimed.
    let next = 0;
    await Promise.all(Array.from({ length: 32 }, async () => {
      while (next < items) {
        const i = next++;
        const r = await fetch(base + '/webhooks', {
          method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': `k-${i}` }, body: `{"n":${i}}`,
        });
        if (r.status !== 202) throw new Error(`webhook ${i}: ${r.status} ${await r.text()}`);
      }
    }));
    await f(base);
  } finally {
    srv.kill('SIGTERM');
    await new Promise((r) => srv.on('exit', r));
    rmSync(dir, { recursive: true, force: true });
  }
}

const which = positionals[0];
if (which === 'outbox') await benchOutbox();
else if (which === 'runner') await benchRunner();
else {
  console.error('usage: node bench/bench.js outbox|runner [flags]');
  process.exit(2);
}
