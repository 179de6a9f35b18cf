// postbox from TypeScript: the transactional outbox and per-handler dedup
// in the caller's own node-postgres transaction, the inbox runner, a
// client of the operator API and verification of postbox's Standard
// Webhooks signatures.
export { PostboxError, InvalidEventError, DuplicateEventError, TransactionError } from './errors.js';
export { insert, prepare, checkTraceparent, OUTBOX_CHANNEL, MAX_EVENT_ID_BYTES, MAX_EVENT_TYPE_BYTES, MAX_TRACESTATE_BYTES } from './outbox.js';
export { newEventId, ulid } from './ulid.js';
export * as dedup from './dedup.js';
export { Api, ApiError, CallError, ROUTES, SCHEMA_FIELDS, DEFAULT_API_TIMEOUT_MS, resultError } from './api.js';
export {
  runInbox, LeaseLostError, DEFAULT_RUNNER_CONCURRENCY, DEFAULT_VISIBILITY_TIMEOUT_MS, DEFAULT_RUNNER_WAIT_MS, DEFAULT_RUNNER_BACKOFF,
} from './runner.js';
export { permanent, transient, retryAfter, classify, PermanentError, TransientError, RetryAfterError } from './retry.js';
export { verifyWebhook, sign, parseSecret, WebhookVerificationError, DEFAULT_TOLERANCE_MS, deliveryHandle, DELIVERY_HANDLE_HEADER } from './webhooks.js';
