// Verification of the Standard Webhooks signatures postbox puts on what
// it pushes to an endpoint with a secret (webhook-id, webhook-timestamp,
// webhook-signature: "v1,<base64 HMAC-SHA256 of id.timestamp.body>",
// several separated by spaces while a secret is rotated).
import { createHmac, timingSafeEqual } from 'node:crypto';
import { PostboxError } from './errors.js';

/** How far a webhook's timestamp may be from now, either way. */
export const DEFAULT_TOLERANCE_MS = 5 * 60_000;

/** A webhook that does not verify; reason says why. */
export class WebhookVerificationError extends PostboxError {
  /**
   * @param {'missing_headers' | 'timestamp' | 'signature' | 'secret'} reason
   * @param {string} message
   */
  constructor(reason, message) {
    super(message);
    this.reason = reason;
  }
}

/**
 * The key of a secret as Standard Webhooks writes it: "whsec_" and base64
 * (without the prefix, base64 too).
 * @param {string | Uint8Array} secret
 * @returns {Buffer}
 */
export function parseSecret(secret) {
  if (secret instanceof Uint8Array) return Buffer.from(secret);
  const b64 = String(secret).trim().replace(/^whsec_/, '');
  const key = Buffer.from(b64, 'base64');
  if (key.length === 0 || !/^[A-Za-z0-9+/]+={0,2}$/.test(b64) || key.toString('base64').replace(/=+$/, '') !== b64.replace(/=+$/, '')) {
    throw new WebhookVerificationError('secret', 'webhook secret: want whsec_ and base64');
  }
  return key;
}

/**
 * @param {Buffer} key
 * @param {string} id
 * @param {string} timestamp
 * @param {Uint8Array} body
 */
function mac(key, id, timestamp, body) {
  return createHmac('sha256', key).update(`${id}.${timestamp}.`).update(body).digest();
}

/**
 * Signs body as postbox does: the webhook-signature value for message id at
 * timestamp (Unix seconds).
 * @param {string | Uint8Array} secret
 * @param {string} id
 * @param {number} timestamp
 * @param {string | Uint8Array} body
 */
export function sign(secret, id, timestamp, body) {
  const b = typeof body === 'string' ? Buffer.from(body) : body;
  return 'v1,' + mac(parseSecret(secret), id, String(timestamp), b).toString('base64');
}

/**
 * @param {Headers | Record<string, string | string[] | undefined>} headers
 * @param {string} name
 * @returns {string}
 */
function header(headers, name) {
  if (typeof (/** @type {any} */ (headers).get) === 'function') return /** @type {Headers} */ (headers).get(name) ?? '';
  const rec = /** @type {Record<string, string | string[] | undefined>} */ (headers);
  let v = rec[name];
  if (v === undefined) {
    const k = Object.keys(rec).find((k) => k.toLowerCase() === name);
    v = k === undefined ? undefined : rec[k];
  }
  return Array.isArray(v) ? v.join(' ') : (v ?? '');
}

/**
 * Verifies a webhook postbox pushed: one of the signatures in
 * webhook-signature must be the HMAC of webhook-id, webhook-timestamp and
 * the raw body (the bytes as received, before any JSON parsing) under one
 * of secrets, and webhook-timestamp within toleranceMs of now. Returns the
 * webhook's id and time; throws WebhookVerificationError otherwise.
 * @param {string | Uint8Array | (string | Uint8Array)[]} secrets
 * @param {Headers | Record<string, string | string[] | undefined>} headers
 * @param {string | Uint8Array} body
 * @param {{toleranceMs?: number, now?: Date}} [options]
 * @returns {{id: string, timestamp: Date}}
 */
export function verifyWebhook(secrets, headers, body, options = {}) {
  const id = header(headers, 'webhook-id');
  const ts = header(headers, 'webhook-timestamp');
  const sigs = header(headers, 'webhook-signature');
  if (id === '' || ts === '' || sigs === '') {
    throw new WebhookVerificationError('missing_headers', 'webhook: missing webhook-id, webhook-timestamp or webhook-signature');
  }
  if (!/^-?\d{1,15}$/.test(ts)) {
    throw new WebhookVerificationError('timestamp', `webhook: webhook-timestamp ${JSON.stringify(ts)} is not Unix seconds`);
  }
  const tolerance = options.toleranceMs ?? DEFAULT_TOLERANCE_MS;
  const now = (options.now ?? new Date()).getTime();
  const d = now - Number(ts) * 1000;
  if (d > tolerance || d < -tolerance) {
    throw new WebhookVerificationError('timestamp', `webhook: webhook-timestamp ${ts} is ${Math.round(d / 1000)} s from now (at most ${tolerance / 1000} s)`);
  }
  const raw = typeof body === 'string' ? Buffer.from(body) : body;
  const keys = (Array.isArray(secrets) ? secrets : [secrets]).map(parseSecret);
  for (const key of keys) {
    const want = mac(key, id, ts, raw);
    for (const sig of sigs.split(/\s+/)) {
      const comma = sig.indexOf(',');
      if (comma < 0 || sig.slice(0, comma) !== 'v1') continue; // other schemes (v1a) are not postbox's
      const got = Buffer.from(sig.slice(comma + 1), 'base64');
      if (got.length === want.length && timingSafeEqual(got, want)) {
        return { id, timestamp: new Date(Number(ts) * 1000) };
      }
    }
  }
  throw new WebhookVerificationError('signature', 'webhook: no signature matches the body under the secret(s) given');
}

/** The header a push carries its item's delivery handle in (compact JSON). */
export const DELIVERY_HANDLE_HEADER = 'X-Postbox-Delivery-Handle';

/**
 * The delivery handle of a pushed item, decoded from its
 * X-Postbox-Delivery-Handle header: where its event came from and where a
 * reply goes (`kind`, and `url` when a reply can go somewhere; see the
 * item's `delivery_handle`). null when the push carries none, or the
 * header is not a JSON object.
 * @param {Headers | Record<string, string | string[] | undefined>} headers
 * @returns {import('../index.js').DeliveryHandle | null}
 */
export function deliveryHandle(headers) {
  const raw = header(headers, DELIVERY_HANDLE_HEADER.toLowerCase());
  if (raw === '') return null;
  try {
    const v = JSON.parse(raw);
    return v !== null && typeof v === 'object' && !Array.isArray(v) ? v : null;
  } catch {
    return null;
  }
}
