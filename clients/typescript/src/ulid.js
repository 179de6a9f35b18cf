// Event ids as postbox makes them: "evt_" and a ULID (48 bits of
// milliseconds, 80 random bits, Crockford's base32), monotonic within a
// millisecond in this process, as github.com/oklog/ulid's Monotonic is.
import { randomBytes } from 'node:crypto';

const alphabet = '0123456789ABCDEFGHJKMNPQRSTVWXYZ';

let lastTime = -1;
/** @type {Uint8Array} */
let lastRandom = new Uint8Array(10);

/**
 * Returns a new ULID: unique, and sortable by the time it was made.
 * @param {number} [now] the time in milliseconds; defaults to Date.now()
 * @returns {string}
 */
export function ulid(now = Date.now()) {
  if (now <= lastTime) {
    now = lastTime;
    // The same millisecond (or a clock that went back): one more than the
    // last id's random part, so that ids still sort in the order made.
    let i = 9;
    while (i >= 0 && lastRandom[i] === 0xff) {
      lastRandom[i] = 0;
      i--;
    }
    if (i < 0) {
      throw new Error('ulid: random part overflowed within one millisecond');
    }
    lastRandom[i]++;
  } else {
    lastTime = now;
    lastRandom = new Uint8Array(randomBytes(10));
  }
  return encodeTime(now) + encodeRandom(lastRandom);
}

/** @param {number} t */
function encodeTime(t) {
  let s = '';
  for (let i = 0; i < 10; i++) {
    s = alphabet[t % 32] + s;
    t = Math.floor(t / 32);
  }
  return s;
}

/** @param {Uint8Array} r 80 bits */
function encodeRandom(r) {
  let n = 0n;
  for (const b of r) n = (n << 8n) | BigInt(b);
  let s = '';
  for (let i = 0; i < 16; i++) {
    s = alphabet[Number(n & 31n)] + s;
    n >>= 5n;
  }
  return s;
}

/**
 * Returns a new event id, "evt_" and a ULID, as postbox makes them.
 * @returns {string}
 */
export function newEventId() {
  return 'evt_' + ulid();
}
