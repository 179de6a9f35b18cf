// How a handler says what its error means for the next attempt, as Go's
// package retry does: a plain error is retried after a backoff,
// permanent(err) dead-letters the item at once, retryAfter(ms, err) waits
// at least ms, transient(err) is not the item's fault.
import { PostboxError } from './errors.js';

/** Retrying cannot help: the item is a dead letter at once. */
export class PermanentError extends PostboxError {
  /** @param {unknown} err */
  constructor(err) {
    super(messageOf(err), { cause: err });
  }
}

/** Not the item's fault (a dependency is down). */
export class TransientError extends PostboxError {
  /** @param {unknown} err */
  constructor(err) {
    super(messageOf(err), { cause: err });
  }
}

/** The next attempt waits at least afterMs. */
export class RetryAfterError extends PostboxError {
  /**
   * @param {number} afterMs
   * @param {unknown} err
   */
  constructor(afterMs, err) {
    super(messageOf(err), { cause: err });
    this.afterMs = afterMs;
  }
}

/** @param {unknown} err */
function messageOf(err) {
  return err instanceof Error ? err.message : String(err);
}

/** @param {unknown} err */
export const permanent = (err) => new PermanentError(err);
/** @param {unknown} err */
export const transient = (err) => new TransientError(err);
/** @param {number} ms @param {unknown} err */
export const retryAfter = (ms, err) => new RetryAfterError(ms, err);

/**
 * What an error asks of the next attempt, reading the markers along its
 * cause chain (the outermost RetryAfterError counts).
 * @param {unknown} err
 * @returns {{permanent: boolean, transient: boolean, afterMs: number}}
 */
export function classify(err) {
  const o = { permanent: false, transient: false, afterMs: 0 };
  let seenAfter = false;
  for (let e = /** @type {any} */ (err), depth = 0; e != null && depth < 32; e = e.cause, depth++) {
    if (e instanceof PermanentError) o.permanent = true;
    if (e instanceof TransientError) o.transient = true;
    if (e instanceof RetryAfterError && !seenAfter) {
      o.afterMs = Math.max(0, e.afterMs);
      seenAfter = true;
    }
  }
  return o;
}

/**
 * The wait before attempt n (from 0): full jitter under min(maxMs, baseMs·2^n).
 * @param {{baseMs: number, maxMs: number}} b
 * @param {number} n
 */
export function backoffDelay(b, n) {
  const ceiling = Math.min(b.maxMs, b.baseMs * 2 ** Math.max(0, Math.min(n, 62)));
  return ceiling > 0 ? Math.random() * ceiling : 0;
}
