// The inbox runner on promises and AbortSignal, the Go client's Runner
// (package client) in TypeScript: it leases batches over the HTTP pull
// API, runs the handler with bounded concurrency, extends the leases of
// jobs that run long, and acks or nacks each item by the handler's
// outcome. When its signal aborts it stops leasing, lets running handlers
// finish (for up to shutdownTimeoutMs, their leases extended), settles
// what they return and hands back what it leased and did not start.
import { setMaxListeners } from 'node:events';
import { ApiError, resultError } from './api.js';
import { PostboxError } from './errors.js';
import { backoffDelay, classify } from './retry.js';

/** Defaults of RunnerOptions. */
export const DEFAULT_RUNNER_CONCURRENCY = 10;
export const DEFAULT_VISIBILITY_TIMEOUT_MS = 30_000;
export const DEFAULT_RUNNER_WAIT_MS = 20_000;
export const DEFAULT_RUNNER_BACKOFF = Object.freeze({ baseMs: 1000, maxMs: 5 * 60_000 });

/** The most the server keeps of a nack's reason. */
const MAX_REASON = 1024;
/** How long a lease waits for half a batch of free slots once one is free. */
const LINGER_MS = 2;

/** A running item's lease was lost: its handler's signal aborts with this. */
export class LeaseLostError extends PostboxError {}

/**
 * @typedef {object} RunnerOptions
 * @property {AbortSignal} [signal] ends the run: stop leasing, finish, hand back
 * @property {number} [concurrency] handlers running at once (10)
 * @property {number} [batch] most items of one lease (concurrency, at most 1000)
 * @property {number} [visibilityTimeoutMs] how long a lease holds its items (30 s)
 * @property {number} [heartbeatMs] how often a running job's lease is extended (a third of the visibility timeout)
 * @property {number} [waitMs] the long poll of a lease when no item is ready (20 s, at most 60 s)
 * @property {{baseMs: number, maxMs: number}} [backoff] the wait before retrying a failed item, by its attempts (1 s doubling to 5 min, full jitter)
 * @property {number} [shutdownTimeoutMs] how long running handlers may finish once signal aborts (the visibility timeout)
 * @property {{warn: (...a: any[]) => void, error: (...a: any[]) => void}} [logger] defaults to console
 */

/**
 * Handles the items of inbox with handler until options.signal aborts;
 * resolves once every leased item is acked, nacked or handed back.
 * Rejects when the server refuses the runner for good (a wrong token,
 * an inbox name it does not take).
 *
 * The handler resolves when it is done with the item (acked) and rejects
 * when the attempt failed (nacked with the error as the item's last
 * error): after the backoff, or after retryAfter's wait, or never again
 * for permanent(err) (a dead letter at once). Its signal aborts when the
 * shutdown timeout passes or the item's lease is lost (reason
 * LeaseLostError): stop and return.
 * @param {import('./api.js').Api} api
 * @param {string} inbox
 * @param {(item: any, ctx: {signal: AbortSignal}) => Promise<unknown> | unknown} handler
 * @param {RunnerOptions} [options]
 * @returns {Promise<void>}
 */
export async function runInbox(api, inbox, handler, options = {}) {
  if (typeof handler !== 'function') throw new PostboxError('postbox: runInbox: no handler');
  const cfg = config(options);
  const signal = options.signal ?? new AbortController().signal;
  const log = options.logger ?? console;

  // Handlers, acks and nacks outlive signal by the shutdown timeout.
  const jobs = new AbortController();
  setMaxListeners(0, jobs.signal); // every running job listens to it
  let shutdownTimer;
  const onAbort = () => {
    shutdownTimer = setTimeout(() => jobs.abort(new PostboxError('the runner stopped and its shutdown timeout passed')), cfg.shutdownTimeoutMs);
  };
  if (signal.aborted) onAbort();
  else signal.addEventListener('abort', onAbort, { once: true });

  const acker = new Acker(api, inbox, log);
  const slots = new Slots(cfg.concurrency);
  /** @type {Set<Promise<void>>} */
  const running = new Set();
  let failures = 0;
  try {
    while (!signal.aborted) {
      if (!(await slots.take(signal))) break;
      const free = await slots.takeMore(cfg.batch, signal);
      let lease;
      try {
        lease = await api.lease(inbox, { max: free, visibilityTimeoutMs: cfg.visibilityTimeoutMs, waitMs: cfg.waitMs, signal });
      } catch (err) {
        slots.give(free);
        if (signal.aborted) break;
        if (err instanceof ApiError && (err.status === 401 || err.status === 400)) {
          throw new PostboxError(`postbox: lease from ${inbox}: ${err.message}`, { cause: err });
        }
        const d = backoffDelay({ baseMs: 100, maxMs: 5000 }, failures++);
        log.warn(`postbox: lease from ${inbox} failed; trying again in ${Math.round(d)} ms: ${/** @type {Error} */ (err).message}`);
        await sleep(d, signal);
        continue;
      }
      failures = 0;
      slots.give(free - lease.items.length);
      for (const item of lease.items) {
        const p = job(api, inbox, cfg, log, handler, lease.lease, item, signal, jobs.signal, acker)
          .catch((err) => log.error(`postbox: item ${item.id}: ${err?.message ?? err}`))
          .finally(() => {
            slots.give(1);
            running.delete(p);
          });
        running.add(p);
      }
    }
    while (running.size > 0) await Promise.all([...running]);
  } finally {
    while (running.size > 0) await Promise.all([...running]);
    await acker.close();
    signal.removeEventListener('abort', onAbort);
    clearTimeout(shutdownTimer);
  }
}

/** @param {RunnerOptions} o */
function config(o) {
  const concurrency = o.concurrency && o.concurrency > 0 ? Math.floor(o.concurrency) : DEFAULT_RUNNER_CONCURRENCY;
  const batch = Math.min(o.batch && o.batch > 0 ? Math.floor(o.batch) : concurrency, 1000);
  const visibilityTimeoutMs = o.visibilityTimeoutMs && o.visibilityTimeoutMs > 0 ? o.visibilityTimeoutMs : DEFAULT_VISIBILITY_TIMEOUT_MS;
  let heartbeatMs = o.heartbeatMs ?? 0;
  if (heartbeatMs <= 0 || heartbeatMs >= visibilityTimeoutMs) heartbeatMs = visibilityTimeoutMs / 3;
  const waitMs = Math.min(o.waitMs && o.waitMs > 0 ? o.waitMs : DEFAULT_RUNNER_WAIT_MS, 60_000);
  const backoff = o.backoff ?? DEFAULT_RUNNER_BACKOFF;
  const shutdownTimeoutMs = o.shutdownTimeoutMs && o.shutdownTimeoutMs > 0 ? o.shutdownTimeoutMs : visibilityTimeoutMs;
  return { concurrency, batch, visibilityTimeoutMs, heartbeatMs, waitMs, backoff, shutdownTimeoutMs };
}

/**
 * Runs handler on item, extending its lease while it runs, and acks or
 * nacks it.
 * @param {import('./api.js').Api} api
 * @param {string} inbox
 * @param {ReturnType<typeof config>} cfg
 * @param {any} log
 * @param {Function} handler
 * @param {string} lease
 * @param {any} item
 * @param {AbortSignal} runSignal
 * @param {AbortSignal} jobsSignal
 * @param {Acker} acker
 */
async function job(api, inbox, cfg, log, handler, lease, item, runSignal, jobsSignal, acker) {
  if (runSignal.aborted) { // leased as the shutdown began: give it back
    await nack(api, inbox, lease, item, { reason: 'not started: the runner stopped' }, log);
    return;
  }
  const ctl = new AbortController();
  const onJobsAbort = () => ctl.abort(jobsSignal.reason);
  jobsSignal.addEventListener('abort', onJobsAbort, { once: true });
  let done = false;
  /** @type {NodeJS.Timeout | undefined} */
  let beat;
  const heartbeat = async () => {
    let err = null;
    try {
      const ext = await api.extend(inbox, lease, [item.id], { visibilityTimeoutMs: cfg.visibilityTimeoutMs, signal: jobsSignal });
      if (ext.items.length === 1) err = resultError(ext.items[0]);
    } catch (e) {
      err = e;
    }
    if (done) return;
    if (err instanceof ApiError && (err.leaseLost || err.notFound)) {
      log.warn(`postbox: lost the lease of running item ${item.id} (${item.event_id}); its handler is told to stop: ${err.message}`);
      ctl.abort(new LeaseLostError(`postbox: lost the lease of item ${item.id}: ${err.message}`, { cause: err }));
      return;
    }
    if (err) log.warn(`postbox: extending the lease of item ${item.id} failed; trying again: ${/** @type {Error} */ (err).message}`);
    beat = setTimeout(heartbeat, cfg.heartbeatMs);
  };
  beat = setTimeout(heartbeat, cfg.heartbeatMs);

  let error = null;
  let failed = false;
  try {
    await handler(item, { signal: ctl.signal });
  } catch (err) {
    failed = true;
    error = err;
  } finally {
    done = true;
    clearTimeout(beat);
    jobsSignal.removeEventListener('abort', onJobsAbort);
  }
  if (ctl.signal.aborted && ctl.signal.reason instanceof LeaseLostError) return; // not ours to settle any more
  if (!failed) {
    acker.add(lease, item.id);
    return;
  }
  const msg = /** @type {any} */ (error)?.message ?? String(error);
  const o = classify(error);
  if (o.permanent) {
    log.warn(`postbox: handler failed for good on item ${item.id} (${item.event_id}); nacked as a dead letter: ${msg}`);
    await nack(api, inbox, lease, item, { dead: true, reason: msg }, log);
    return;
  }
  let delay = Math.max(backoffDelay(cfg.backoff, item.attempts - 1), o.afterMs);
  if (jobsSignal.aborted) delay = 0; // cut off by the shutdown: give it back at once
  await nack(api, inbox, lease, item, { delayMs: delay, reason: msg }, log);
}

/**
 * @param {import('./api.js').Api} api
 * @param {string} inbox
 * @param {string} lease
 * @param {any} item
 * @param {{delayMs?: number, reason?: string, dead?: boolean}} o
 * @param {any} log
 */
async function nack(api, inbox, lease, item, o, log) {
  try {
    const res = await api.nack(inbox, lease, [item.id], {
      ...o, delayMs: Math.min(o.delayMs ?? 0, 24 * 3600_000), reason: cleanReason(o.reason ?? ''),
    });
    const err = res.length === 1 ? resultError(res[0]) : null;
    if (err) throw err;
  } catch (err) {
    log.warn(`postbox: nack of item ${item.id} failed; it is attempted again when its lease ends: ${/** @type {Error} */ (err).message}`);
  }
}

/**
 * A reason the server takes: no control characters, at most MAX_REASON bytes.
 * @param {string} s
 */
export function cleanReason(s) {
  s = s.toWellFormed().replace(/\p{Cc}/gu, ' ');
  if (Buffer.byteLength(s) <= MAX_REASON) return s;
  let out = '';
  let n = 0;
  for (const ch of s) {
    const b = Buffer.byteLength(ch);
    if (n + b > MAX_REASON - 3) break;
    out += ch;
    n += b;
  }
  return out + '…';
}

/** Acks in as few requests as it can: every ack waiting, one request per lease. */
class Acker {
  /**
   * @param {import('./api.js').Api} api
   * @param {string} inbox
   * @param {any} log
   */
  constructor(api, inbox, log) {
    this.api = api;
    this.inbox = inbox;
    this.log = log;
    /** @type {Map<string, number[]>} */
    this.pending = new Map();
    this.count = 0;
    /** @type {Promise<void> | null} */
    this.flushing = null;
  }

  /** @param {string} lease @param {number} id */
  add(lease, id) {
    const ids = this.pending.get(lease);
    if (ids) ids.push(id);
    else this.pending.set(lease, [id]);
    this.count++;
    if (!this.flushing) this.flushing = this.flush();
  }

  async flush() {
    await new Promise((r) => setImmediate(r)); // gather what the other jobs finish meanwhile
    while (this.pending.size > 0) {
      const batch = this.pending;
      this.pending = new Map();
      this.count = 0;
      await Promise.all([...batch].flatMap(([lease, ids]) => chunks(ids, 1000).map((c) => this.ack(lease, c))));
    }
    this.flushing = null;
  }

  /** @param {string} lease @param {number[]} ids */
  async ack(lease, ids) {
    try {
      const res = await this.api.ack(this.inbox, lease, ids);
      for (const r of res) {
        const err = resultError(r);
        if (err) this.log.warn(`postbox: ack of item ${r.id} refused; it is attempted again: ${err.message}`);
      }
    } catch (err) {
      this.log.warn(`postbox: ack of ${ids.length} items failed; they are attempted again when their lease ends: ${/** @type {Error} */ (err).message}`);
    }
  }

  async close() {
    while (this.flushing) await this.flushing;
  }
}

/**
 * @param {number[]} a
 * @param {number} n
 */
function chunks(a, n) {
  const out = [];
  for (let i = 0; i < a.length; i += n) out.push(a.slice(i, i + n));
  return out;
}

/** A counting semaphore of handler slots. */
class Slots {
  /** @param {number} n */
  constructor(n) {
    this.free = n;
    /** @type {(() => void)[]} */
    this.waiters = [];
  }

  /**
   * Takes one slot, waiting for it; false when signal aborted first.
   * @param {AbortSignal} signal
   */
  async take(signal) {
    while (this.free === 0) {
      if (signal.aborted) return false;
      await new Promise((resolve) => {
        const done = () => {
          signal.removeEventListener('abort', done);
          resolve(undefined);
        };
        this.waiters.push(done);
        signal.addEventListener('abort', done, { once: true });
      });
    }
    if (signal.aborted) return false;
    this.free--;
    return true;
  }

  /**
   * Beside the one taken, takes the free slots up to batch, waiting up to
   * LINGER_MS for half of one; returns how many it holds.
   * @param {number} batch
   * @param {AbortSignal} signal
   */
  async takeMore(batch, signal) {
    let held = 1;
    const grab = () => {
      const n = Math.min(this.free, batch - held);
      this.free -= n;
      held += n;
    };
    grab();
    if (held * 2 >= batch) return held;
    const deadline = Date.now() + LINGER_MS;
    while (held * 2 < batch && !signal.aborted && Date.now() < deadline) {
      await new Promise((resolve) => {
        const t = setTimeout(done, Math.max(0, deadline - Date.now()));
        function done() {
          clearTimeout(t);
          resolve(undefined);
        }
        this.waiters.push(done);
      });
      grab();
    }
    return held;
  }

  /** @param {number} n */
  give(n) {
    this.free += n;
    const w = this.waiters;
    this.waiters = [];
    for (const f of w) f();
  }
}

/**
 * @param {number} ms
 * @param {AbortSignal} signal
 */
function sleep(ms, signal) {
  return new Promise((resolve) => {
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal.removeEventListener('abort', done);
      resolve(undefined);
    }
    signal.addEventListener('abort', done, { once: true });
  });
}
