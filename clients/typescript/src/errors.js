// The errors of the package, one class per kind a caller branches on.

/** The base of every error this package throws. */
export class PostboxError extends Error {
  /**
   * @param {string} message
   * @param {{cause?: unknown}} [options]
   */
  constructor(message, options) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** An outbox event or a dedup key is refused; field names what is wrong. Nothing was written. */
export class InvalidEventError extends PostboxError {
  /**
   * @param {string} field
   * @param {string} message
   */
  constructor(field, message) {
    super(message);
    /** @type {string} */
    this.field = field;
  }
}

/**
 * An outbox insert met event ids that are in the outbox already: those
 * were not written (the others were), and the transaction stays usable.
 */
export class DuplicateEventError extends PostboxError {
  /** @param {string[]} ids */
  constructor(ids) {
    super(`outbox: event id already in the outbox: ${ids.join(', ')}`);
    /** @type {string[]} */
    this.ids = ids;
  }
}

/**
 * The connection given is not inside an open transaction (no BEGIN, a
 * transaction already committed or rolled back, a pool instead of a
 * client, a closed client). Nothing was written.
 */
export class TransactionError extends PostboxError {}
