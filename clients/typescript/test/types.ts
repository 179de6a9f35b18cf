// Compiled by tsc (npm test) against the package's own types, as a user's
// code would import them: a type error here fails the tests.
import pg from 'pg';
import { Api, dedup, insert, permanent, retryAfter, runInbox, verifyWebhook, type Item, type PreparedEvent } from '@postbox-events/postbox';

export async function placeOrder(pool: pg.Pool, total: number): Promise<string> {
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    await client.query('INSERT INTO orders (total) VALUES ($1)', [total]);
    const [e]: PreparedEvent[] = await insert(client, { type: 'order.placed', payload: { total }, tenantId: 'shop-1' });
    await client.query('COMMIT');
    return e.id;
  } catch (err) {
    await client.query('ROLLBACK');
    throw err;
  } finally {
    client.release();
  }
}

export async function consume(pool: pg.Pool, signal: AbortSignal): Promise<void> {
  const api = new Api('http://127.0.0.1:8000', { token: process.env.POSTBOX_API_TOKEN });
  await runInbox(api, 'orders', async (item: Item, { signal: jobSignal }) => {
    if (typeof item.payload?.total !== 'number') throw permanent(new Error('not an order'));
    if (jobSignal.aborted) throw retryAfter(1000, new Error('stopping'));
    await dedup.handle<pg.PoolClient>(pool, 'shipping', item.event_id, async (tx) => {
      await tx.query('INSERT INTO shipments (event_id) VALUES ($1)', [item.event_id]);
    });
  }, { signal, concurrency: 16 });
}

export function check(headers: Headers, body: Buffer): string {
  return verifyWebhook(['whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw'], headers, body).id;
}
