"""Event ids as postbox makes them: "evt_" and a ULID."""

from __future__ import annotations

import os
import threading
import time

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
# Every pair of digits (10 bits), so that 13 lookups make a ULID.
_PAIRS = tuple(a + b for a in _CROCKFORD for b in _CROCKFORD)
_SHIFTS = tuple(range(120, -1, -10))
_lock = threading.Lock()
_last_ms = -1
_last_rand = 0


def _ulid(ms: int, rand: int) -> str:
    """The 26 Crockford base32 digits of the 128 bits ms·2^80 + rand (130
    bits of digits: the top two are zero)."""
    v = (ms << 80) | rand
    return "".join([_PAIRS[(v >> s) & 1023] for s in _SHIFTS])


def new_event_id() -> str:
    """Return a new event id: ``evt_`` and a ULID (26 characters of
    Crockford base32: 48 bits of Unix milliseconds, 80 random bits).

    Ids made in one process sort by the order they were made: within one
    millisecond the random part is incremented, as Go's
    ``outbox.NewEventID`` (ulid.Monotonic) does.
    """
    global _last_ms, _last_rand
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            ms = _last_ms
            rand = _last_rand + 1
            if rand >> 80:  # the random part overflowed: take the next millisecond
                ms += 1
                rand = int.from_bytes(os.urandom(10), "big")
        else:
            rand = int.from_bytes(os.urandom(10), "big")
        _last_ms, _last_rand = ms, rand
    return "evt_" + _ulid(ms, rand)
