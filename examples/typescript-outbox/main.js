// A small order service on PostgreSQL: it writes each order and its
// order.placed event in one transaction (the transactional outbox),
// postbox relay sends the events to postbox serve, and a runner leases
// them from the inbox "shipping" and ships each order once, deduplicated
// in the shipment's own transaction. See README.md.
//
//   node main.js --orders 20
import { parseArgs } from 'node:util';
import pg from 'pg';
import { Api, dedup, insert, permanent, runInbox } from '@postbox-events/postbox';

const { values: opts } = parseArgs({
  options: {
    db: { type: 'string', default: process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres' },
    server: { type: 'string', default: process.env.POSTBOX_API_URL ?? 'http://127.0.0.1:8000' },
    token: { type: 'string', default: process.env.POSTBOX_API_TOKEN ?? '' },
    inbox: { type: 'string', default: 'shipping' },
    orders: { type: 'string', default: '20' },
  },
});
const orders = Number(opts.orders);

const pool = new pg.Pool({ connectionString: opts.db });
await pool.query(`CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, total NUMERIC NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS shipments (order_id TEXT PRIMARY KEY, event_id TEXT NOT NULL, shipped_at TIMESTAMPTZ NOT NULL DEFAULT now())`);
await dedup.migrate(pool); // the inbox table the shipping handler records what it handled in

/**
 * Writes an order and its event in one transaction: both commit or neither.
 * @param {string} id
 * @param {number} total
 * @param {{fail?: boolean}} [o]
 */
async function placeOrder(id, total, o = {}) {
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    await client.query('INSERT INTO orders (id, total) VALUES ($1, $2)', [id, total]);
    const [event] = await insert(client, { type: 'order.placed', payload: { order: id, total }, correlationId: id, tenantId: 'shop-1' });
    if (o.fail) throw new Error('payment declined');
    await client.query('COMMIT');
    return event.id;
  } catch (err) {
    await client.query('ROLLBACK');
    throw err;
  } finally {
    client.release();
  }
}

const run = Date.now().toString(36);
for (let i = 1; i <= orders; i++) await placeOrder(`${run}-${i}`, 10 * i);
try {
  await placeOrder(`${run}-declined`, 99, { fail: true });
} catch (err) {
  console.log(`order ${run}-declined rolled back (${err.message}): neither the order nor its event exists`);
}
console.log(`placed ${orders} orders; postbox relay sends their events to ${opts.server}`);

// The consumer: lease order.placed events from the inbox and ship each
// order once. A redelivered event is skipped by dedup.
const api = new Api(opts.server, { token: opts.token || undefined });
const stop = new AbortController();
process.once('SIGINT', () => stop.abort());
let shipped = 0;
let skipped = 0;
await runInbox(api, opts.inbox, async (item) => {
  const { order } = item.payload;
  if (typeof order !== 'string') throw permanent(new Error(`event ${item.event_id} is not an order`));
  const ran = await dedup.handle(pool, 'shipping', item.event_id, async (tx) => {
    await tx.query('INSERT INTO shipments (order_id, event_id) VALUES ($1, $2)', [order, item.event_id]);
  });
  if (!ran) {
    skipped++;
    return;
  }
  console.log(`shipped order ${order} (event ${item.event_id}, attempt ${item.attempts})`);
  if (order.startsWith(run + '-') && ++shipped === orders) stop.abort(); // every order of this run shipped
}, { signal: stop.signal, concurrency: 8, waitMs: 2000 });

// A delivery of an event already handled changes nothing.
const { rows: [one] } = await pool.query('SELECT event_id FROM shipments WHERE order_id = $1', [`${run}-1`]);
const again = await dedup.handle(pool, 'shipping', one.event_id, () => { throw new Error('never runs'); });
const { rows: [{ n }] } = await pool.query('SELECT count(*)::int AS n FROM shipments WHERE order_id LIKE $1', [`${run}-%`]);
console.log(`shipments of this run: ${n} (redelivery of ${one.event_id} ran again: ${again}; skipped while running: ${skipped})`);
await pool.end();
