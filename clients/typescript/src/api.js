// A client of the HTTP API of postbox serve (docs/API.md): the operator's
// calls and the runtime's (lease, ack, nack, extend). Every route it calls
// is in ROUTES, which a test holds against docs/openapi.json.
import { PostboxError } from './errors.js';

/** How long one call may take unless ApiOptions.timeoutMs says. */
export const DEFAULT_API_TIMEOUT_MS = 30_000;

/**
 * The routes the client calls: method, path, query parameters, the body's
 * fields and the schema of the answer, as docs/openapi.json names them.
 */
export const ROUTES = Object.freeze({
  streams: { method: 'GET', path: '/v1/streams', response: 'StreamList' },
  stream: { method: 'GET', path: '/v1/streams/{stream}', response: 'Stream' },
  event: { method: 'GET', path: '/v1/streams/{stream}/events/{offset}', response: 'Event' },
  eventById: { method: 'GET', path: '/v1/streams/{stream}/events', query: ['id', 'variant'], response: 'Event' },
  searchEvents: { method: 'GET', path: '/v1/streams/{stream}/search', query: ['id', 'type', 'since', 'until', 'before', 'limit'], response: 'EventPage' },
  consumers: { method: 'GET', path: '/v1/consumers', response: 'ConsumerList' },
  consumer: { method: 'GET', path: '/v1/consumers/{name}', response: 'Consumer' },
  resetConsumer: { method: 'POST', path: '/v1/consumers/{name}/reset', body: ['to_offset', 'to_time', 'earliest', 'latest'], response: 'ConsumerReset' },
  sources: { method: 'GET', path: '/v1/sources', response: 'SourceList' },
  source: { method: 'GET', path: '/v1/sources/{name}', response: 'Source' },
  createSource: { method: 'POST', path: '/v1/sources', body: ['name', 'kind', 'settings'], response: 'Source' },
  deleteSource: { method: 'DELETE', path: '/v1/sources/{name}' },
  subscriptions: { method: 'GET', path: '/v1/subscriptions', response: 'SubscriptionList' },
  subscription: { method: 'GET', path: '/v1/subscriptions/{name}', response: 'Subscription' },
  createSubscription: {
    method: 'POST', path: '/v1/subscriptions', response: 'Subscription',
    body: ['name', 'source', 'types', 'metadata', 'inbox', 'start', 'start_offset', 'start_time', 'target', 'secret', 'headers',
      'timeout', 'retry_schedule', 'retry_base_delay', 'retry_max_delay', 'max_attempts', 'rate', 'concurrency', 'format',
      'order_by', 'on_dead_letter'],
  },
  updateSubscription: {
    method: 'PATCH', path: '/v1/subscriptions/{name}', response: 'Subscription',
    body: ['target', 'secret', 'secret_overlap', 'headers', 'timeout', 'retry_schedule', 'retry_base_delay', 'retry_max_delay', 'max_attempts', 'rate', 'concurrency', 'format',
      'on_dead_letter'],
  },
  deleteSubscription: { method: 'DELETE', path: '/v1/subscriptions/{name}' },
  enableSubscription: { method: 'POST', path: '/v1/subscriptions/{name}/enable', response: 'Subscription' },
  pauseSubscription: { method: 'POST', path: '/v1/subscriptions/{name}/pause', body: ['reason'], response: 'Subscription' },
  resumeSubscription: { method: 'POST', path: '/v1/subscriptions/{name}/resume', response: 'Subscription' },
  testSubscription: { method: 'POST', path: '/v1/subscriptions/{name}/test', response: 'TestDelivery' },
  replaySubscription: { method: 'POST', path: '/v1/subscriptions/{name}/replay', body: ['since', 'until', 'states', 'batch_size'], response: 'Replay' },
  replays: { method: 'GET', path: '/v1/replays', query: ['subscription'] },
  replay: { method: 'GET', path: '/v1/replays/{id}', response: 'Replay' },
  inboxes: { method: 'GET', path: '/v1/inboxes', response: 'InboxList' },
  items: { method: 'GET', path: '/v1/inboxes/{inbox}/items', query: ['state', 'after', 'limit'], response: 'ItemPage' },
  item: { method: 'GET', path: '/v1/inboxes/{inbox}/items/{id}', response: 'Item' },
  attempts: { method: 'GET', path: '/v1/inboxes/{inbox}/items/{id}/attempts', response: 'AttemptList' },
  cancelItem: { method: 'POST', path: '/v1/inboxes/{inbox}/items/{id}/cancel', body: ['reason'], response: 'Item' },
  discardItem: { method: 'POST', path: '/v1/inboxes/{inbox}/items/{id}/discard', response: 'Item' },
  reply: { method: 'POST', path: '/v1/inboxes/{inbox}/items/{id}/reply', body: ['key', 'body'], response: 'Reply' },
  replies: { method: 'GET', path: '/v1/inboxes/{inbox}/items/{id}/replies', response: 'ReplyList' },
  retryReply: { method: 'POST', path: '/v1/inboxes/{inbox}/items/{id}/replies/{key}/retry', response: 'Reply' },
  searchItems: {
    method: 'GET', path: '/v1/inboxes/{inbox}/search', query: ['id', 'type', 'state', 'since', 'until', 'before', 'limit'], response: 'ItemSearchPage',
  },
  lease: { method: 'POST', path: '/v1/inboxes/{inbox}/lease', body: ['max', 'visibility_timeout', 'wait'], response: 'Lease' },
  ack: { method: 'POST', path: '/v1/inboxes/{inbox}/ack', body: ['ids', 'lease'], response: 'SettleResults' },
  nack: { method: 'POST', path: '/v1/inboxes/{inbox}/nack', body: ['ids', 'lease', 'delay', 'reason', 'dead'], response: 'SettleResults' },
  extend: { method: 'POST', path: '/v1/inboxes/{inbox}/extend', body: ['ids', 'lease', 'visibility_timeout'], response: 'Extension' },
  deadLetters: { method: 'GET', path: '/v1/dead-letters', query: ['inbox', 'subscription', 'from', 'to', 'after', 'limit'], response: 'ItemPage' },
  deadLetter: { method: 'GET', path: '/v1/dead-letters/{id}', response: 'Item' },
  replayDeadLetter: { method: 'POST', path: '/v1/dead-letters/{id}/replay', response: 'Item' },
  replayDeadLetters: { method: 'POST', path: '/v1/dead-letters/replay', body: ['inbox', 'subscription', 'from', 'to', 'all'] },
  discardDeadLetters: { method: 'POST', path: '/v1/dead-letters/discard', body: ['ids', 'inbox', 'subscription', 'from', 'to', 'all'] },
  webhook: { method: 'GET', path: '/webhooks/{source}', response: 'Webhook' },
  webhookByKey: { method: 'GET', path: '/webhooks', query: ['idempotency_key', 'source'], response: 'Webhook' },
});

/**
 * The fields of the answers' schemas the TypeScript types declare (index.d.ts),
 * held against docs/openapi.json by a test.
 */
export const SCHEMA_FIELDS = Object.freeze({
  Item: ['id', 'inbox', 'subscription', 'stream', 'offset', 'stream_event_id', 'event_id', 'type', 'occurred_at', 'source_sequence',
    'stored_at', 'metadata', 'payload', 'delivery_handle', 'state', 'attempts', 'next_attempt_at', 'lease_expires_at', 'last_error',
    'created_at', 'updated_at', 'failed_at', 'replayed_at', 'replays', 'last_error_past', 'order_key'],
  ItemPage: ['items', 'next_after'],
  Lease: ['lease', 'expires_at', 'items'],
  SettleResults: ['items'],
  Extension: ['expires_at', 'items'],
  Inbox: ['inbox', 'pending', 'processing', 'completed', 'failed', 'oldest_pending_at'],
  InboxList: ['inboxes'],
  Subscription: ['name', 'source', 'stream', 'inbox', 'types', 'metadata', 'start', 'target', 'max_attempts', 'created_at', 'next_offset',
    'high_watermark', 'lag', 'counts', 'paused', 'paused_at', 'paused_reason', 'order_by', 'on_dead_letter', 'held'],
  SubscriptionCounts: ['inbox', 'pending', 'processing', 'completed', 'failed'],
  SubscriptionList: ['subscriptions'],
  Source: ['name', 'kind', 'stream', 'settings', 'created_at'],
  SourceList: ['sources'],
  Stream: ['stream', 'source', 'backend', 'events', 'first_offset', 'last_offset', 'created_at'],
  StreamList: ['streams'],
  Consumer: ['consumer', 'subscription', 'stream', 'next_offset', 'high_watermark', 'lag', 'updated_at'],
  ConsumerList: ['consumers'],
  Webhook: ['id', 'idempotency_key', 'type', 'status', 'created_at', 'updated_at', 'attempts', 'last_error'],
  Replay: ['id', 'subscription', 'inbox', 'since', 'until', 'states', 'batch_size', 'state', 'matched', 'replayed', 'created_at', 'updated_at', 'finished_at'],
  Attempt: ['attempt', 'attempted_at', 'endpoint_url', 'status_code', 'latency_ms', 'error', 'response_excerpt'],
  AttemptList: ['attempts'],
  Reply: ['key', 'item', 'url', 'body', 'state', 'attempts', 'next_attempt_at', 'last_error', 'created_at', 'updated_at', 'attempt_log'],
  ReplyList: ['replies'],
  TestDelivery: ['event_id', 'type', 'endpoint_url', 'attempted_at', 'ok', 'status_code', 'latency_ms', 'error', 'response_excerpt'],
  Event: ['id', 'stream', 'source', 'offset', 'event_id', 'variant', 'type', 'occurred_at', 'source_sequence', 'stored_at', 'metadata',
    'payload', 'delivery_handle', 'webhook_id', 'deliveries'],
  Delivery: ['subscription', 'inbox', 'deleted', 'paused', 'status', 'reason', 'item', 'attempts'],
  EventPage: ['events', 'next_before'],
  ItemSearchPage: ['items', 'next_before'],
  Error: ['error'],
});

/** An error answer of the server (status 400 and above). */
export class ApiError extends PostboxError {
  /**
   * @param {number} status
   * @param {string} code the API's error code ('' when the answer was not its JSON error)
   * @param {string} message
   * @param {string} method
   * @param {string} path
   */
  constructor(status, code, message, method, path) {
    super(code ? `server: ${status} ${code}: ${message}` : `server: ${status}: ${message}`);
    this.status = status;
    this.code = code;
    this.method = method;
    this.path = path;
  }

  /** The item is no longer the caller's: its lease expired, was settled, or another holds it. */
  get leaseLost() {
    return this.code === 'lease_lost';
  }

  get notFound() {
    return this.status === 404 || this.code === 'not_found';
  }
}

/** A call that got no answer: the connection failed, or it timed out. */
export class CallError extends PostboxError {
  /**
   * @param {string} method
   * @param {string} path
   * @param {unknown} cause
   */
  constructor(method, path, cause) {
    super(`${method} ${path}: ${/** @type {any} */ (cause)?.message ?? cause}`, { cause });
    this.method = method;
    this.path = path;
  }
}

/**
 * The error of one item's result of an ack, nack or extend, or null when
 * it was settled.
 * @param {{id: number, state?: string, error?: {code: string, message: string}}} r
 * @returns {ApiError | null}
 */
export function resultError(r) {
  if (!r.error) return null;
  return new ApiError(r.error.code === 'not_found' ? 404 : 409, r.error.code, r.error.message, '', '');
}

/**
 * A duration in milliseconds as the API reads it (a Go duration).
 * @param {number | undefined} ms
 * @returns {string | undefined}
 */
export function duration(ms) {
  if (ms === undefined || ms === 0) return undefined;
  if (!Number.isFinite(ms) || ms < 0) throw new PostboxError(`postbox: a duration of ${ms} ms: want a positive number of milliseconds`);
  return `${Math.round(ms * 1000)}us`;
}

/** A client of postbox serve's HTTP API. */
export class Api {
  /**
   * @param {string} baseUrl http://HOST:PORT or https://HOST:PORT, with the path the server is mounted at if any
   * @param {{token?: string, timeoutMs?: number, fetch?: typeof fetch}} [options]
   */
  constructor(baseUrl, options = {}) {
    let u;
    try {
      u = new URL(baseUrl);
    } catch {
      throw new PostboxError(`postbox: server URL ${JSON.stringify(baseUrl)}: want http://HOST:PORT or https://HOST:PORT`);
    }
    if ((u.protocol !== 'http:' && u.protocol !== 'https:') || u.host === '') {
      throw new PostboxError(`postbox: server URL ${JSON.stringify(baseUrl)}: want http://HOST:PORT or https://HOST:PORT`);
    }
    if (u.search !== '' || u.hash !== '') {
      throw new PostboxError(`postbox: server URL ${JSON.stringify(baseUrl)}: want no query or fragment, only http(s)://HOST:PORT and a path prefix`);
    }
    if (u.username !== '' || u.password !== '') {
      throw new PostboxError('postbox: server URL: credentials in the URL are not sent: use the API token (options.token)');
    }
    if (options.timeoutMs !== undefined && !(options.timeoutMs > 0)) {
      throw new PostboxError('postbox: options.timeoutMs must be positive');
    }
    this.baseUrl = baseUrl.replace(/\/+$/, '');
    this.token = options.token ?? '';
    this.timeoutMs = options.timeoutMs ?? DEFAULT_API_TIMEOUT_MS;
    this.fetch = options.fetch ?? globalThis.fetch;
  }

  /**
   * Sends a request and decodes the JSON answer; an error answer is an ApiError.
   * @param {string} method
   * @param {string} path with its query
   * @param {unknown} [body]
   * @param {{signal?: AbortSignal, extraMs?: number}} [opts]
   * @returns {Promise<any>}
   */
  async request(method, path, body, opts = {}) {
    const timeout = AbortSignal.timeout(this.timeoutMs + (opts.extraMs ?? 0));
    const signal = opts.signal ? AbortSignal.any([opts.signal, timeout]) : timeout;
    /** @type {Record<string, string>} */
    const headers = { accept: 'application/json' };
    if (this.token) headers.authorization = `Bearer ${this.token}`;
    let data;
    if (body !== undefined) {
      headers['content-type'] = 'application/json';
      data = JSON.stringify(body);
    }
    let res;
    let text;
    try {
      res = await this.fetch(this.baseUrl + path, { method, headers, body: data, signal });
      text = await res.text();
    } catch (err) {
      throw new CallError(method, path, err);
    }
    if (res.status >= 300) {
      let code = '';
      let message = text.trim().slice(0, 200);
      try {
        const e = JSON.parse(text);
        if (e?.error?.code) {
          code = e.error.code;
          message = e.error.message;
        }
      } catch {}
      throw new ApiError(res.status, code, message, method, path);
    }
    if (res.status === 204 || text === '') return undefined;
    try {
      return JSON.parse(text);
    } catch (err) {
      throw new PostboxError(`the answer to ${method} ${path} is not JSON (${/** @type {Error} */ (err).message}): ${text.slice(0, 200)}`);
    }
  }

  /**
   * @param {keyof typeof ROUTES} route
   * @param {Record<string, string | number>} [params]
   * @param {Record<string, string | number | undefined>} [query]
   */
  path(route, params = {}, query = {}) {
    let p = ROUTES[route].path.replace(/\{(\w+)\}/g, (_, k) => encodeURIComponent(String(params[k])));
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(query)) {
      if (v !== undefined && v !== '' && v !== 0) q.set(k, String(v));
    }
    const s = q.toString();
    return s ? `${p}?${s}` : p;
  }

  /**
   * @param {keyof typeof ROUTES} route
   * @param {Record<string, string | number>} [params]
   * @param {{query?: Record<string, any>, body?: unknown, signal?: AbortSignal, extraMs?: number}} [o]
   */
  async call(route, params, o = {}) {
    return this.request(ROUTES[route].method, this.path(route, params, o.query), o.body, o);
  }

  /** @param {{signal?: AbortSignal}} [o] */
  async streams(o) { return (await this.call('streams', {}, o)).streams; }
  /** @param {string} stream @param {{signal?: AbortSignal}} [o] */
  stream(stream, o) { return this.call('stream', { stream }, o); }
  /**
   * The event at offset of a stream with its deliveries: what every subscription made of it, with the attempt logs.
   * @param {string} stream @param {number} offset @param {{signal?: AbortSignal}} [o]
   */
  event(stream, offset, o) { return this.call('event', { stream, offset }, o); }
  /**
   * The event of the source's id (an event_id, an idempotency key) with its deliveries; variant names the device in the device stream.
   * @param {string} stream @param {string} id @param {{variant?: string, signal?: AbortSignal}} [o]
   */
  eventById(stream, id, o = {}) { return this.call('eventById', { stream }, { signal: o.signal, query: { id, variant: o.variant } }); }
  /**
   * A page of a stream's events, newest first, without deliveries; pass next_before as before for the next.
   * @param {string} stream
   * @param {{id?: string, type?: string, since?: Date, until?: Date, before?: number, limit?: number, signal?: AbortSignal}} [q]
   */
  searchEvents(stream, q = {}) {
    return this.call('searchEvents', { stream }, {
      signal: q.signal,
      query: { id: q.id, type: q.type, since: q.since?.toISOString(), until: q.until?.toISOString(), before: q.before, limit: q.limit },
    });
  }
  /** @param {{signal?: AbortSignal}} [o] */
  async consumers(o) { return (await this.call('consumers', {}, o)).consumers; }
  /** @param {string} name @param {{signal?: AbortSignal}} [o] */
  consumer(name, o) { return this.call('consumer', { name }, o); }
  /** @param {string} name @param {object} req @param {{signal?: AbortSignal}} [o] */
  resetConsumer(name, req, o) { return this.call('resetConsumer', { name }, { ...o, body: req }); }
  /** @param {{signal?: AbortSignal}} [o] */
  async sources(o) { return (await this.call('sources', {}, o)).sources; }
  /** @param {string} name @param {{signal?: AbortSignal}} [o] */
  source(name, o) { return this.call('source', { name }, o); }
  /** @param {object} req @param {{signal?: AbortSignal}} [o] */
  createSource(req, o) { return this.call('createSource', {}, { ...o, body: req }); }
  /** @param {string} name @param {{signal?: AbortSignal}} [o] */
  async deleteSource(name, o) { await this.call('deleteSource', { name }, o); }
  /** @param {{signal?: AbortSignal}} [o] */
  async subscriptions(o) { return (await this.call('subscriptions', {}, o)).subscriptions; }
  /** @param {string} name @param {{signal?: AbortSignal}} [o] */
  subscription(name, o) { return this.call('subscription', { name }, o); }
  /** @param {object} req @param {{signal?: AbortSignal}} [o] */
  createSubscription(req, o) { return this.call('createSubscription', {}, { ...o, body: req }); }
  /** @param {string} name @param {object} req @param {{signal?: AbortSignal}} [o] */
  updateSubscription(name, req, o) { return this.call('updateSubscription', { name }, { ...o, body: req }); }
  /** @param {string} name @param {{signal?: AbortSignal}} [o] */
  async deleteSubscription(name, o) { await this.call('deleteSubscription', { name }, o); }
  /** @param {string} name @param {{signal?: AbortSignal}} [o] */
  enableSubscription(name, o) { return this.call('enableSubscription', { name }, o); }
  /**
   * Pauses the delivery of a subscription: none of its items is leased,
   * by the server's workers or a runtime, until resumeSubscription; its
   * inbox keeps filling.
   * @param {string} name @param {{reason?: string, signal?: AbortSignal}} [o]
   */
  pauseSubscription(name, o = {}) {
    return this.call('pauseSubscription', { name }, { signal: o.signal, body: o.reason ? { reason: o.reason } : undefined });
  }
  /** @param {string} name @param {{signal?: AbortSignal}} [o] */
  resumeSubscription(name, o) { return this.call('resumeSubscription', { name }, o); }
  /**
   * Sends a postbox.test event to the subscription's target; resolves what it answered, whatever it answered.
   * @param {string} name @param {{signal?: AbortSignal}} [o]
   */
  testSubscription(name, o) { return this.call('testSubscription', { name }, o); }
  /** @param {string} name @param {object} req @param {{signal?: AbortSignal}} [o] */
  replaySubscription(name, req, o) { return this.call('replaySubscription', { name }, { ...o, body: req }); }
  /** @param {string} [subscription] @param {{signal?: AbortSignal}} [o] */
  async replays(subscription, o) { return (await this.call('replays', {}, { ...o, query: { subscription } })).replays; }
  /** @param {string} id @param {{signal?: AbortSignal}} [o] */
  replay(id, o) { return this.call('replay', { id }, o); }
  /** @param {{signal?: AbortSignal}} [o] */
  async inboxes(o) { return (await this.call('inboxes', {}, o)).inboxes; }
  /** @param {string} inbox @param {{state?: string, after?: number, limit?: number, signal?: AbortSignal}} [q] */
  items(inbox, q = {}) { return this.call('items', { inbox }, { signal: q.signal, query: { state: q.state, after: q.after, limit: q.limit } }); }
  /** @param {string} inbox @param {number} id @param {{signal?: AbortSignal}} [o] */
  item(inbox, id, o) { return this.call('item', { inbox, id }, o); }
  /** @param {string} inbox @param {number} id @param {{signal?: AbortSignal}} [o] */
  async attempts(inbox, id, o) { return (await this.call('attempts', { inbox, id }, o)).attempts; }
  /**
   * Moves a pending item to failed at once (a dead letter, which can be replayed).
   * @param {string} inbox @param {number} id @param {{reason?: string, signal?: AbortSignal}} [o]
   */
  cancelItem(inbox, id, o = {}) {
    return this.call('cancelItem', { inbox, id }, { signal: o.signal, body: o.reason ? { reason: o.reason } : undefined });
  }
  /**
   * Deletes an item that is not processing, with its attempt log, for good; resolves it as it was.
   * @param {string} inbox @param {number} id @param {{signal?: AbortSignal}} [o]
   */
  discardItem(inbox, id, o) { return this.call('discardItem', { inbox, id }, o); }
  /**
   * Replies to an item's event: the server POSTs body (JSON) to the url of the event's delivery handle with the
   * source's reply settings, retrying it as it retries deliveries. Stored once per key (default: a digest of the
   * body); another body under a key is ApiError 409 conflict, a handle without a url (a device's) 400 invalid_field.
   * @param {string} inbox @param {number} id @param {unknown} body @param {{key?: string, signal?: AbortSignal}} [o]
   */
  reply(inbox, id, body, o = {}) {
    return this.call('reply', { inbox, id }, { signal: o.signal, body: { key: o.key || undefined, body } });
  }
  /** @param {string} inbox @param {number} id @param {{signal?: AbortSignal}} [o] */
  async replies(inbox, id, o) { return (await this.call('replies', { inbox, id }, o)).replies; }
  /**
   * Sends a failed reply (a dead letter) again.
   * @param {string} inbox @param {number} id @param {string} key @param {{signal?: AbortSignal}} [o]
   */
  retryReply(inbox, id, key, o) { return this.call('retryReply', { inbox, id, key }, o); }
  /**
   * A page of an inbox's items, newest first; pass next_before as before for the next.
   * @param {string} inbox
   * @param {{id?: string, type?: string, state?: string, since?: Date, until?: Date, before?: number, limit?: number, signal?: AbortSignal}} [q]
   */
  searchItems(inbox, q = {}) {
    return this.call('searchItems', { inbox }, {
      signal: q.signal,
      query: { id: q.id, type: q.type, state: q.state, since: q.since?.toISOString(), until: q.until?.toISOString(), before: q.before, limit: q.limit },
    });
  }

  /**
   * Leases up to max ready items of inbox, each now processing with an attempt counted.
   * @param {string} inbox
   * @param {{max?: number, visibilityTimeoutMs?: number, waitMs?: number, signal?: AbortSignal}} [o]
   */
  async lease(inbox, o = {}) {
    const body = { max: o.max || undefined, visibility_timeout: duration(o.visibilityTimeoutMs), wait: duration(o.waitMs) };
    return this.call('lease', { inbox }, { body, signal: o.signal, extraMs: o.waitMs ?? 0 });
  }

  /**
   * Completes items lease holds; one result per id.
   * @param {string} inbox
   * @param {string} lease
   * @param {number[]} ids
   * @param {{signal?: AbortSignal}} [o]
   */
  async ack(inbox, lease, ids, o) {
    return (await this.call('ack', { inbox }, { ...o, body: { ids, lease: lease || undefined } })).items;
  }

  /**
   * Records a failed attempt of items lease holds: pending again after
   * delayMs, or a dead letter (dead, or after the last attempt).
   * @param {string} inbox
   * @param {string} lease
   * @param {number[]} ids
   * @param {{delayMs?: number, reason?: string, dead?: boolean, signal?: AbortSignal}} [o]
   */
  async nack(inbox, lease, ids, o = {}) {
    const body = { ids, lease: lease || undefined, delay: duration(o.delayMs), reason: o.reason || undefined, dead: o.dead || undefined };
    return (await this.call('nack', { inbox }, { signal: o.signal, body })).items;
  }

  /**
   * Moves the end of lease, for the items ids it still holds, to
   * visibilityTimeoutMs from now.
   * @param {string} inbox
   * @param {string} lease
   * @param {number[]} ids
   * @param {{visibilityTimeoutMs?: number, signal?: AbortSignal}} [o]
   */
  async extend(inbox, lease, ids, o = {}) {
    return this.call('extend', { inbox }, { signal: o.signal, body: { ids, lease, visibility_timeout: duration(o.visibilityTimeoutMs) } });
  }

  /** @param {{inbox?: string, subscription?: string, from?: Date, to?: Date, after?: number, limit?: number, signal?: AbortSignal}} [q] */
  deadLetters(q = {}) {
    return this.call('deadLetters', {}, {
      signal: q.signal,
      query: { inbox: q.inbox, subscription: q.subscription, from: q.from?.toISOString(), to: q.to?.toISOString(), after: q.after, limit: q.limit },
    });
  }
  /** @param {number} id @param {{signal?: AbortSignal}} [o] */
  deadLetter(id, o) { return this.call('deadLetter', { id }, o); }
  /** @param {number} id @param {{signal?: AbortSignal}} [o] */
  replayDeadLetter(id, o) { return this.call('replayDeadLetter', { id }, o); }
  /** @param {{inbox?: string, subscription?: string, from?: Date, to?: Date, all?: boolean}} sel @param {{signal?: AbortSignal}} [o] */
  replayDeadLetters(sel, o) {
    const body = { inbox: sel.inbox, subscription: sel.subscription, from: sel.from?.toISOString(), to: sel.to?.toISOString(), all: sel.all };
    return this.call('replayDeadLetters', {}, { ...o, body });
  }
  /**
   * Deletes, for good, the dead letters sel names (each field narrows it); one that names nothing must say all.
   * @param {{ids?: number[], inbox?: string, subscription?: string, from?: Date, to?: Date, all?: boolean}} sel
   * @param {{signal?: AbortSignal}} [o]
   */
  discardDeadLetters(sel, o) {
    const body = { ids: sel.ids?.length ? sel.ids : undefined, inbox: sel.inbox || undefined, subscription: sel.subscription || undefined,
      from: sel.from?.toISOString(), to: sel.to?.toISOString(), all: sel.all || undefined };
    return this.call('discardDeadLetters', {}, { ...o, body });
  }
  /** @param {string} id "wh_42" @param {{signal?: AbortSignal}} [o] */
  webhook(id, o) { return this.call('webhook', { source: id }, o); }
  /** @param {string} key @param {{source?: string, signal?: AbortSignal}} [o] */
  webhookByKey(key, o = {}) { return this.call('webhookByKey', {}, { signal: o.signal, query: { idempotency_key: key, source: o.source } }); }
}
