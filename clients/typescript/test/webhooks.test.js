import assert from 'node:assert/strict';
import { test } from 'node:test';
import { DELIVERY_HANDLE_HEADER, deliveryHandle, sign, verifyWebhook, WebhookVerificationError } from '../src/index.js';

// The example of the Standard Webhooks specification; signatures the real
// server makes are verified in e2e.test.js.
const secret = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const id = 'msg_p5jXN8AQM9LWM0D4loKWxJek';
const ts = 1614265330;
const body = '{"test": 2432232314}';
const want = 'v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=';

test('signatures are Standard Webhooks\'', () => {
  assert.equal(sign(secret, id, ts, body), want);
  const headers = { 'webhook-id': id, 'webhook-timestamp': String(ts), 'webhook-signature': `v1a,xyz ${want}` };
  assert.deepEqual(verifyWebhook(secret, headers, body, { now: new Date(ts * 1000 + 1000) }), { id, timestamp: new Date(ts * 1000) });
  // Several secrets while one is rotated; Headers as fetch gives them.
  const h = new Headers(headers);
  verifyWebhook(['whsec_' + Buffer.alloc(24, 1).toString('base64'), secret], h, Buffer.from(body), { now: new Date(ts * 1000) });
});

test('a webhook that does not verify says why', () => {
  const headers = { 'webhook-id': id, 'webhook-timestamp': String(ts), 'webhook-signature': want };
  const now = new Date(ts * 1000);
  for (const [h, b, o, reason] of /** @type {const} */ ([
    [headers, body + ' ', { now }, 'signature'],
    [{ ...headers, 'webhook-id': 'msg_other' }, body, { now }, 'signature'],
    [headers, body, { now: new Date(ts * 1000 + 6 * 60_000) }, 'timestamp'],
    [headers, body, { now: new Date(ts * 1000 - 6 * 60_000) }, 'timestamp'],
    [{ ...headers, 'webhook-timestamp': 'yesterday' }, body, { now }, 'timestamp'],
    [{ ...headers, 'webhook-signature': undefined }, body, { now }, 'missing_headers'],
  ])) {
    assert.throws(() => verifyWebhook(secret, /** @type {any} */ (h), b, o), (err) => {
      assert.ok(err instanceof WebhookVerificationError);
      assert.equal(err.reason, reason);
      return true;
    });
  }
  assert.throws(() => verifyWebhook('whsec_not base64!', headers, body, { now }), /want whsec_ and base64/);
});

test('deliveryHandle reads a push\'s X-Postbox-Delivery-Handle', () => {
  const h = '{"kind":"github","repository":"o/r","issue":12,"url":"https://api.github.com/repos/o/r/issues/12/comments"}';
  assert.equal(deliveryHandle({ 'X-Postbox-Delivery-Handle': h })?.url, 'https://api.github.com/repos/o/r/issues/12/comments');
  assert.deepEqual(deliveryHandle(new Headers({ 'x-postbox-delivery-handle': '{"kind":"device","device_id":"pi","session_id":"s"}' })),
    { kind: 'device', device_id: 'pi', session_id: 's' });
  assert.equal(deliveryHandle({}), null);
  assert.equal(deliveryHandle({ 'X-Postbox-Delivery-Handle': 'not json' }), null);
  assert.equal(deliveryHandle({ 'X-Postbox-Delivery-Handle': '[1]' }), null);
  assert.equal(DELIVERY_HANDLE_HEADER, 'X-Postbox-Delivery-Handle');
});
