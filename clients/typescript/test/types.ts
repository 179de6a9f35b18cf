// Compiled by tsc (npm test) against the package's own types, as a user's
// code would import them: a type error here fails the tests.
import pg from 'pg';
import { Api, dedup, deliveryHandle, insert, permanent, retryAfter, runInbox, verifyWebhook, type DeliveryHandle, type Item, type PreparedEvent,
  type StreamEvent, type EventPage, type Subscription, type TestDelivery, type ItemSearchPage, type Delivery } from '@postbox-events/postbox';

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

export function replyURL(item: Item, pushed: Headers): string | undefined {
  const h: DeliveryHandle | null = item.delivery_handle ?? deliveryHandle(pushed);
  return h?.kind === 'device' ? undefined : h?.url;
}

export async function lastDeliveries(api: Api, stream: string, key: string): Promise<string[]> {
  const ev: StreamEvent = await api.eventById(stream, key);
  const page: EventPage = await api.searchEvents(stream, { type: ev.type, since: new Date(ev.stored_at), limit: 10 });
  const sub: Subscription = await api.pauseSubscription('orders', { reason: 'deploy' });
  const sent: TestDelivery = await api.testSubscription(sub.name);
  const items: ItemSearchPage = await api.searchItems(sub.inbox, { state: 'pending', before: page.next_before });
  await api.cancelItem(sub.inbox, items.items[0].id, { reason: 'wrong' });
  const { discarded }: { discarded: number } = await api.discardDeadLetters({ subscription: sub.name, all: sent.ok });
  return (ev.deliveries ?? []).map((d: Delivery) => `${d.subscription}: ${d.status} ${d.item?.state ?? ''} ${discarded}`);
}
