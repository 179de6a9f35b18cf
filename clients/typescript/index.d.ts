// Types of @postbox-events/postbox (the JavaScript is in src/).

/** The part of a node-postgres Client, PoolClient or Pool the package uses. */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<{ rows: any[]; rowCount: number | null }>;
}

// ---- errors

/** The base of every error this package throws. */
export class PostboxError extends Error {}
/** An outbox event or a dedup key is refused; field names what is wrong. Nothing was written. */
export class InvalidEventError extends PostboxError {
  readonly field: string;
}
/** Event ids already in the outbox: those were not written (the others were); the transaction stays usable. */
export class DuplicateEventError extends PostboxError {
  readonly ids: string[];
}
/** Not a connection inside an open transaction (no BEGIN, committed, rolled back, failed, closed, a Pool). Nothing was written. */
export class TransactionError extends PostboxError {}

// ---- outbox

/** What a service writes to its outbox, in the transaction of the business write it announces. */
export interface OutboxEvent {
  /** Names what happened ("order.placed"); 1 to 128 bytes. */
  type: string;
  /**
   * The event's JSON. A string or bytes (Buffer, Uint8Array) is the JSON
   * text, stored byte for byte; any other value is JSON.stringify'd.
   * Relayed to a postbox server it must be a JSON object.
   */
  payload: string | Uint8Array | object | number | boolean | null;
  /** The event's identity, the key receivers deduplicate on; default "evt_" + a new ULID. At most 128 bytes. */
  id?: string;
  /** Ties together the events of one request or workflow; default the id. */
  correlationId?: string;
  /** Whose event this is; "" by default (a postbox server's device_id "outbox"). */
  tenantId?: string;
  /** W3C trace context the event travels with. */
  traceparent?: string;
  tracestate?: string;
}

/** An event as written: defaults filled in, payload as its JSON text. */
export interface PreparedEvent {
  id: string;
  type: string;
  payload: string;
  correlationId: string;
  tenantId: string;
  traceparent: string;
  tracestate: string;
}

/**
 * Writes events to the outbox inside the caller's transaction on client (a
 * pg Client or PoolClient after BEGIN), in one statement; the insert
 * trigger's NOTIFY postbox_outbox wakes the relays when it commits.
 * Rejects with InvalidEventError (nothing written), TransactionError
 * (nothing written) or DuplicateEventError.
 */
export function insert(client: Queryable, events: OutboxEvent | OutboxEvent[]): Promise<PreparedEvent[]>;
/** Fills in an event's defaults and checks it; throws InvalidEventError. */
export function prepare(event: OutboxEvent): PreparedEvent;
/** Why v is not a W3C traceparent, or "" when it is one. */
export function checkTraceparent(v: string): string;
/** "evt_" and a new ULID. */
export function newEventId(): string;
/** A new ULID, monotonic within a millisecond in this process. */
export function ulid(now?: number): string;
export const OUTBOX_CHANNEL: 'postbox_outbox';
export const MAX_EVENT_ID_BYTES: number;
export const MAX_EVENT_TYPE_BYTES: number;
export const MAX_TRACESTATE_BYTES: number;

// ---- dedup

export namespace dedup {
  /** The most bytes of a handler name and of an id. */
  const MAX_KEY_BYTES: number;
  /** The inbox table, as Go's dedup.PostgresSchema. */
  const POSTGRES_SCHEMA: string;
  /** Creates the inbox table if it is missing. */
  function migrate(db: Queryable): Promise<void>;
  /**
   * Runs fn in a transaction unless handler has already handled id, and
   * records that it has in the same transaction. db is a pg Pool or a
   * connected Client/PoolClient outside a transaction; fn gets the client
   * the transaction runs on. Resolves true when fn ran and committed,
   * false (fn not called) when (id, handler) was handled already.
   */
  function handle<C = any>(db: any, handler: string, id: string, fn: (client: C) => unknown): Promise<boolean>;
  /**
   * Records (id, handler) in the transaction the caller runs on client (a
   * pg Client or PoolClient after BEGIN): true to go on (do the writes,
   * then COMMIT), false when handler has handled id already. Rejects with
   * TransactionError outside a transaction.
   */
  function record(client: Queryable, handler: string, id: string): Promise<boolean>;
  /** Deletes the records of ids handled before `before`; returns how many. */
  function forget(db: Queryable, before: Date): Promise<number>;
}

// ---- the operator API

export interface ApiOptions {
  /** The server's API token, sent as a bearer token. */
  token?: string;
  /** Bounds one call; a lease adds its wait. Default 30 s. */
  timeoutMs?: number;
  fetch?: typeof fetch;
}
export interface CallOptions {
  signal?: AbortSignal;
}

export interface ItemResult {
  id: number;
  state?: string;
  error?: { code: string; message: string };
}
/**
 * An event's delivery handle (docs/API.md, Delivery handles): where it
 * came from and where a reply goes, captured at intake. `kind` is github,
 * stripe, cloudevents, poll, webhook or device; `url`, when a reply can
 * go somewhere, is an absolute http(s) URL. Other members describe the
 * target by kind (repository and issue, object and id, source and
 * subject, target, device_id and session_id, a poll source's own). A
 * device's event has one made from its device_id and session_id, which
 * postbox cannot reply to.
 */
export interface DeliveryHandle {
  kind: string;
  url?: string;
  [member: string]: unknown;
}
export interface Item {
  id: number;
  inbox: string;
  subscription: string;
  stream: string;
  offset: number;
  stream_event_id: string;
  /** The same on every attempt: the key of an idempotent handler. */
  event_id: string;
  type: string;
  occurred_at: string;
  source_sequence: number | null;
  stored_at: string;
  metadata: Record<string, any>;
  payload: any;
  /** Where the event came from and where a reply goes; null when it has none. */
  delivery_handle: DeliveryHandle | null;
  state: 'pending' | 'processing' | 'completed' | 'failed';
  attempts: number;
  next_attempt_at: string;
  lease_expires_at: string | null;
  last_error: string | null;
  created_at: string;
  updated_at: string;
  failed_at: string | null;
  replayed_at: string | null;
  replays: number;
  /** True when the item completed after last_error: the error is history. */
  last_error_past: boolean;
  /** The item's key in an ordered subscription (order_by); null in an unordered one. */
  order_key: string | null;
}
export interface ItemPage {
  items: Item[];
  next_after: number;
}
export interface Lease {
  lease: string;
  expires_at: string;
  items: Item[];
}
export interface Extension {
  expires_at: string;
  items: ItemResult[];
}
export interface InboxCounts {
  inbox: string;
  pending: number;
  processing: number;
  completed: number;
  failed: number;
  /** When the oldest pending item reached the inbox; null when none is pending. */
  oldest_pending_at: string | null;
}
export interface Subscription {
  name: string;
  source: string;
  stream: string;
  inbox: string;
  types?: string[];
  metadata?: Record<string, string>;
  start: string;
  target?: string;
  max_attempts?: number;
  created_at: string;
  next_offset: number;
  high_watermark: number;
  lag: number;
  /** Its items by state; in the list and a get, absent in other answers. */
  counts?: SubscriptionCounts;
  /** An operator paused its delivery (pauseSubscription). */
  paused: boolean;
  paused_at: string | null;
  paused_reason: string | null;
  /** Ordered delivery per key: where the key comes from; null when unordered. */
  order_by: string | null;
  /** With order_by: what a key's dead letter does to its next items. */
  on_dead_letter: 'block' | 'skip' | null;
  /** In the list and a get of an ordered subscription. */
  held?: SubscriptionHeld;
  [field: string]: unknown;
}
/** What holds back the keys of an ordered subscription. */
export interface SubscriptionHeld {
  /** Keys whose next items wait behind a failed item of theirs (a retry, or a dead letter under block). */
  keys: number;
  /** When the oldest item waiting behind one was made; null when none waits. */
  oldest_at: string | null;
}
/** A subscription's items by state: its share of its inbox's. */
export interface SubscriptionCounts {
  inbox: string;
  pending: number;
  processing: number;
  completed: number;
  failed: number;
}
/** What a subscription's endpoint answered a test event. */
export interface TestDelivery {
  /** test_<ULID>: its webhook-id and Idempotency-Key. */
  event_id: string;
  type: string;
  endpoint_url: string;
  attempted_at: string;
  /** The endpoint answered 2xx. */
  ok: boolean;
  /** 0 when no answer came. */
  status_code: number;
  latency_ms: number;
  error: string | null;
  response_excerpt: string | null;
}
/** What one subscription made of one event. */
export interface Delivery {
  subscription: string;
  inbox: string;
  /** The subscription that made the item was deleted. */
  deleted: boolean;
  paused: boolean;
  /** item: it holds an item of the event; unread: it has yet to read it; none: it holds none (reason says why). */
  status: 'item' | 'unread' | 'none';
  reason?: string;
  item: Item | null;
  attempts: Attempt[];
}
/** An event stored in a stream (docs/openapi.json: Event). */
export interface StreamEvent {
  /** stream/offset */
  id: string;
  stream: string;
  source: string;
  offset: number;
  event_id: string;
  variant?: string;
  type: string;
  occurred_at: string;
  source_sequence: number | null;
  stored_at: string;
  metadata: unknown;
  payload: any;
  /** Where the event came from and where a reply goes; null when it has none. */
  delivery_handle: DeliveryHandle | null;
  webhook_id?: string;
  /** In the answers about one event; a search leaves it out. */
  deliveries?: Delivery[];
}
export interface EventPage {
  events: StreamEvent[];
  /** Pass as before for the next page; 0: there are no more. */
  next_before: number;
}
export interface ItemSearchPage {
  items: Item[];
  next_before: number;
}
export interface SearchQuery {
  /** The source's id of the event: an event_id, an idempotency key. */
  id?: string;
  type?: string;
  /** Stored (items: materialised) at or after. */
  since?: Date;
  /** Stored (items: materialised) before. */
  until?: Date;
  /** The previous page's next_before. */
  before?: number;
  /** 1 to 1000 (default 100). */
  limit?: number;
}
export interface CreateSubscription {
  name: string;
  source: string;
  types?: string[];
  metadata?: Record<string, string>;
  inbox?: string;
  start?: 'latest' | 'earliest' | 'at_offset' | 'at_time';
  start_offset?: number;
  start_time?: string;
  target?: string;
  secret?: string;
  headers?: Record<string, string>;
  timeout?: string;
  retry_schedule?: string[];
  retry_base_delay?: string;
  retry_max_delay?: string;
  max_attempts?: number;
  rate?: string;
  concurrency?: number;
  format?: string;
  /** Ordered delivery per key: device_id, session_id, metadata.NAME, header.NAME or a JSON pointer (/order/id). */
  order_by?: string;
  /** With order_by: 'block' (the default) or 'skip'. */
  on_dead_letter?: 'block' | 'skip';
}
export interface UpdateSubscription {
  target?: string;
  secret?: string;
  secret_overlap?: string;
  headers?: Record<string, string>;
  timeout?: string;
  retry_schedule?: string[];
  retry_base_delay?: string;
  retry_max_delay?: string;
  max_attempts?: number;
  rate?: string;
  concurrency?: number;
  format?: string;
  /** Of an ordered subscription: 'block' or 'skip' from now on. */
  on_dead_letter?: 'block' | 'skip';
}
export interface Source {
  name: string;
  kind: string;
  stream: string;
  settings?: Record<string, unknown>;
  created_at: string;
  [field: string]: unknown;
}
export interface Stream {
  stream: string;
  source: string;
  backend: string;
  events: number;
  first_offset: number;
  last_offset: number;
  created_at: string;
  [field: string]: unknown;
}
export interface Consumer {
  consumer: string;
  subscription: string;
  stream: string;
  next_offset: number;
  high_watermark: number;
  lag: number;
  updated_at: string;
}
export interface Webhook {
  id: string;
  idempotency_key: string;
  type: string;
  status: string;
  created_at: string;
  updated_at: string;
  attempts: number;
  last_error?: string;
}
export interface Replay {
  id: string;
  subscription: string;
  inbox: string;
  since: string;
  until: string;
  states: string[];
  batch_size: number;
  state: string;
  matched: number;
  replayed: number;
  created_at: string;
  updated_at: string;
  finished_at: string | null;
  [field: string]: unknown;
}
export interface Attempt {
  attempt: number;
  attempted_at: string;
  endpoint_url: string;
  status_code: number;
  latency_ms: number;
  error: string | null;
  response_excerpt: string | null;
}

/** A reply to an item's event, sent to the url of its delivery handle. */
export interface Reply {
  key: string;
  item: number;
  url: string;
  body: unknown;
  /** pending until the target answers 2xx (completed); failed is a dead letter. */
  state: 'pending' | 'completed' | 'failed';
  attempts: number;
  next_attempt_at: string | null;
  last_error: string | null;
  created_at: string;
  updated_at: string;
  attempt_log: Attempt[];
}

/** An error answer of the server. */
export class ApiError extends PostboxError {
  readonly status: number;
  /** The API's error code ("lease_lost", "invalid_field", ...); "" when the answer was not its JSON error. */
  readonly code: string;
  readonly method: string;
  readonly path: string;
  /** The item is no longer the caller's. */
  readonly leaseLost: boolean;
  readonly notFound: boolean;
}
/** A call that got no answer: the connection failed or it timed out. */
export class CallError extends PostboxError {
  readonly method: string;
  readonly path: string;
}
/** The error of one item's result of an ack, nack or extend; null when it was settled. */
export function resultError(r: ItemResult): ApiError | null;

export interface Route {
  method: 'GET' | 'POST' | 'PATCH' | 'DELETE';
  path: string;
  query?: string[];
  body?: string[];
  response?: string;
}
/** The routes the client calls (checked against docs/openapi.json). */
export const ROUTES: Readonly<Record<string, Route>>;
/** The fields of the answers the types declare (checked against docs/openapi.json). */
export const SCHEMA_FIELDS: Readonly<Record<string, string[]>>;
export const DEFAULT_API_TIMEOUT_MS: number;

/** A client of postbox serve's HTTP API (docs/API.md). */
export class Api {
  constructor(baseUrl: string, options?: ApiOptions);
  readonly baseUrl: string;
  /** Sends a request (path with its query) and decodes the JSON answer. */
  request(method: string, path: string, body?: unknown, opts?: CallOptions & { extraMs?: number }): Promise<any>;
  streams(o?: CallOptions): Promise<Stream[]>;
  stream(stream: string, o?: CallOptions): Promise<Stream>;
  /** The event at offset of a stream, with its deliveries and their attempt logs. */
  event(stream: string, offset: number, o?: CallOptions): Promise<StreamEvent>;
  /** The event of the source's id (an event_id, an idempotency key), with its deliveries. */
  eventById(stream: string, id: string, o?: { variant?: string } & CallOptions): Promise<StreamEvent>;
  /** A page of a stream's events, newest first, without deliveries. */
  searchEvents(stream: string, q?: SearchQuery & CallOptions): Promise<EventPage>;
  consumers(o?: CallOptions): Promise<Consumer[]>;
  consumer(name: string, o?: CallOptions): Promise<Consumer>;
  resetConsumer(name: string, req: { to_offset?: number; to_time?: string; earliest?: boolean; latest?: boolean }, o?: CallOptions): Promise<any>;
  sources(o?: CallOptions): Promise<Source[]>;
  source(name: string, o?: CallOptions): Promise<Source>;
  createSource(req: { name: string; kind: string; settings?: Record<string, unknown> }, o?: CallOptions): Promise<Source>;
  deleteSource(name: string, o?: CallOptions): Promise<void>;
  subscriptions(o?: CallOptions): Promise<Subscription[]>;
  subscription(name: string, o?: CallOptions): Promise<Subscription>;
  createSubscription(req: CreateSubscription, o?: CallOptions): Promise<Subscription>;
  updateSubscription(name: string, req: UpdateSubscription, o?: CallOptions): Promise<Subscription>;
  deleteSubscription(name: string, o?: CallOptions): Promise<void>;
  enableSubscription(name: string, o?: CallOptions): Promise<Subscription>;
  /** Pauses the delivery of a subscription until resumeSubscription; its inbox keeps filling. */
  pauseSubscription(name: string, o?: { reason?: string } & CallOptions): Promise<Subscription>;
  resumeSubscription(name: string, o?: CallOptions): Promise<Subscription>;
  /** Sends a postbox.test event to the subscription's target: what it answered, whatever it answered. */
  testSubscription(name: string, o?: CallOptions): Promise<TestDelivery>;
  replaySubscription(name: string, req: { since?: string; until?: string; states?: string[]; batch_size?: number }, o?: CallOptions): Promise<Replay>;
  replays(subscription?: string, o?: CallOptions): Promise<Replay[]>;
  replay(id: string, o?: CallOptions): Promise<Replay>;
  inboxes(o?: CallOptions): Promise<InboxCounts[]>;
  items(inbox: string, q?: { state?: string; after?: number; limit?: number } & CallOptions): Promise<ItemPage>;
  item(inbox: string, id: number, o?: CallOptions): Promise<Item>;
  attempts(inbox: string, id: number, o?: CallOptions): Promise<Attempt[]>;
  /** Moves a pending item to failed at once: a dead letter, which can be replayed. */
  cancelItem(inbox: string, id: number, o?: { reason?: string } & CallOptions): Promise<Item>;
  /** Deletes an item that is not processing, with its attempt log; resolves it as it was. */
  discardItem(inbox: string, id: number, o?: CallOptions): Promise<Item>;
  /**
   * Replies to an item's event: the server POSTs body to the url of its delivery handle, with the source's
   * reply settings and retries. Stored once per key (default: a digest of the body).
   */
  reply(inbox: string, id: number, body: unknown, o?: { key?: string } & CallOptions): Promise<Reply>;
  /** The replies to an item's event, oldest first, with their attempt logs. */
  replies(inbox: string, id: number, o?: CallOptions): Promise<Reply[]>;
  /** Sends a failed reply (a dead letter) again. */
  retryReply(inbox: string, id: number, key: string, o?: CallOptions): Promise<Reply>;
  /** A page of an inbox's items, newest first. */
  searchItems(inbox: string, q?: SearchQuery & { state?: string } & CallOptions): Promise<ItemSearchPage>;
  /** Leases up to max ready items, each now processing with an attempt counted. */
  lease(inbox: string, o?: { max?: number; visibilityTimeoutMs?: number; waitMs?: number } & CallOptions): Promise<Lease>;
  /** Completes items lease holds ("" for an operator); one result per id. */
  ack(inbox: string, lease: string, ids: number[], o?: CallOptions): Promise<ItemResult[]>;
  /** Records a failed attempt: pending again after delayMs, or a dead letter. */
  nack(inbox: string, lease: string, ids: number[], o?: { delayMs?: number; reason?: string; dead?: boolean } & CallOptions): Promise<ItemResult[]>;
  /** Moves the end of lease, for the items it still holds, to visibilityTimeoutMs from now. */
  extend(inbox: string, lease: string, ids: number[], o?: { visibilityTimeoutMs?: number } & CallOptions): Promise<Extension>;
  deadLetters(q?: { inbox?: string; subscription?: string; from?: Date; to?: Date; after?: number; limit?: number } & CallOptions): Promise<ItemPage>;
  deadLetter(id: number, o?: CallOptions): Promise<Item>;
  replayDeadLetter(id: number, o?: CallOptions): Promise<Item>;
  replayDeadLetters(sel: { inbox?: string; subscription?: string; from?: Date; to?: Date; all?: boolean }, o?: CallOptions): Promise<{ replayed: number; ids?: number[] }>;
  /** Deletes, for good, the dead letters sel names (each field narrows it); one that names nothing must say all. */
  discardDeadLetters(sel: { ids?: number[]; inbox?: string; subscription?: string; from?: Date; to?: Date; all?: boolean }, o?: CallOptions): Promise<{ discarded: number; ids: number[] }>;
  webhook(id: string, o?: CallOptions): Promise<Webhook>;
  webhookByKey(key: string, o?: { source?: string } & CallOptions): Promise<Webhook>;
}

// ---- the runner

export interface Logger {
  warn(...a: any[]): void;
  error(...a: any[]): void;
}
export interface RunnerOptions {
  /** Ends the run: stop leasing, let running handlers finish, hand back the rest. */
  signal?: AbortSignal;
  /** Handlers running at once. Default 10. */
  concurrency?: number;
  /** Most items of one lease. Default concurrency (at most 1000). */
  batch?: number;
  /** How long a lease holds its items; running jobs' leases are extended. Default 30 s. */
  visibilityTimeoutMs?: number;
  /** How often a running job's lease is extended. Default a third of the visibility timeout. */
  heartbeatMs?: number;
  /** The long poll of a lease when no item is ready. Default 20 s, at most 60 s. */
  waitMs?: number;
  /** The wait before retrying a failed item, by its attempts: full jitter under min(maxMs, baseMs·2^n). Default 1 s to 5 min. */
  backoff?: { baseMs: number; maxMs: number };
  /** How long running handlers may finish once signal aborts; then their signals abort. Default the visibility timeout. */
  shutdownTimeoutMs?: number;
  /** Default console. */
  logger?: Logger;
}
/** A handler: resolve to ack, reject to nack (see permanent, retryAfter, transient). */
export type Handler = (item: Item, ctx: { signal: AbortSignal }) => unknown;
/**
 * Handles inbox's items until options.signal aborts; resolves once every
 * leased item is settled or handed back. Rejects when the server refuses
 * the runner for good (401, 400).
 */
export function runInbox(api: Api, inbox: string, handler: Handler, options?: RunnerOptions): Promise<void>;
/** The reason a handler's signal aborts with when its item's lease was lost. */
export class LeaseLostError extends PostboxError {}
export const DEFAULT_RUNNER_CONCURRENCY: number;
export const DEFAULT_VISIBILITY_TIMEOUT_MS: number;
export const DEFAULT_RUNNER_WAIT_MS: number;
export const DEFAULT_RUNNER_BACKOFF: Readonly<{ baseMs: number; maxMs: number }>;

export class PermanentError extends PostboxError {}
export class TransientError extends PostboxError {}
export class RetryAfterError extends PostboxError {
  readonly afterMs: number;
}
/** Retrying cannot help: the item is a dead letter at once. */
export function permanent(err: unknown): PermanentError;
/** Not the item's fault: retried after the backoff. */
export function transient(err: unknown): TransientError;
/** The next attempt waits at least ms. */
export function retryAfter(ms: number, err: unknown): RetryAfterError;
/** What an error (and its causes) asks of the next attempt. */
export function classify(err: unknown): { permanent: boolean; transient: boolean; afterMs: number };

// ---- webhook signatures

export const DEFAULT_TOLERANCE_MS: number;
export class WebhookVerificationError extends PostboxError {
  readonly reason: 'missing_headers' | 'timestamp' | 'signature' | 'secret';
}
export type Secret = string | Uint8Array;
/**
 * Verifies a webhook postbox pushed (Standard Webhooks): one signature of
 * webhook-signature must be the HMAC of webhook-id, webhook-timestamp and
 * the raw body under one of secrets, the timestamp within toleranceMs of
 * now. Throws WebhookVerificationError.
 */
export function verifyWebhook(
  secrets: Secret | Secret[],
  headers: Headers | Record<string, string | string[] | undefined>,
  body: string | Uint8Array,
  options?: { toleranceMs?: number; now?: Date },
): { id: string; timestamp: Date };
/** The webhook-signature value postbox sends for body as message id at timestamp (Unix seconds). */
export function sign(secret: Secret, id: string, timestamp: number, body: string | Uint8Array): string;
/** The key of a "whsec_" + base64 secret. */
export function parseSecret(secret: Secret): Buffer;
/** The header a push carries its item's delivery handle in (compact JSON). */
export const DELIVERY_HANDLE_HEADER: 'X-Postbox-Delivery-Handle';
/**
 * The delivery handle of a pushed item, decoded from its
 * X-Postbox-Delivery-Handle header; null when the push carries none.
 */
export function deliveryHandle(headers: Headers | Record<string, string | string[] | undefined>): DeliveryHandle | null;
