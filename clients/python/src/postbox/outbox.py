"""The transactional outbox: events written in the caller's own database
transaction, so that they commit with the business write they announce or
not at all, and ``postbox relay`` sends them on (docs/OUTBOX.md).

``insert`` takes a synchronous connection (psycopg 3 ``Connection``,
``sqlite3.Connection``, SQLAlchemy ``Session`` or ``Connection``) and
``insert_async`` an asynchronous one (psycopg 3 ``AsyncConnection``,
asyncpg ``Connection``, ``aiosqlite.Connection``, SQLAlchemy
``AsyncSession`` or ``AsyncConnection``). Neither commits: the caller's
transaction does. They write exactly what Go's ``outboxpg.Insert`` and
``outboxsqlite.Insert`` write, so one relay sends rows from Go and Python
producers alike.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Union

from . import _check, _drivers
from ._ids import new_event_id
from .errors import DuplicateEventError, InvalidEventError, SchemaError, TransactionError

__all__ = ["Event", "insert", "insert_async", "new_event_id", "DEFAULT_TENANT", "CHANNEL"]

#: The envelope device_id a postbox server gets for an event without a
#: tenant (Go's ``outbox.DefaultDeviceID``).
DEFAULT_TENANT = "outbox"
#: The channel the PostgreSQL outbox's insert trigger notifies.
CHANNEL = "postbox_outbox"

Payload = Union[bytes, bytearray, memoryview, str, dict, list, int, float, bool]


@dataclass(frozen=True)
class Event:
    """One event to write to the outbox.

    ``payload`` is the event's JSON: ``bytes`` (UTF-8) or ``str`` are
    stored as given, byte for byte, on PostgreSQL (on SQLite with the white
    space between tokens removed, as Go's outboxsqlite stores it); any other
    value is encoded with ``json.dumps(..., separators=(",", ":"),
    ensure_ascii=False)``. Relayed to a postbox server it must be a JSON
    object.
    """

    type: str
    payload: Payload
    #: The event's identity, which receivers deduplicate on. None: a new
    #: ``evt_`` + ULID.
    id: str | None = None
    #: Ties together the events of one request or workflow. None: the id.
    correlation_id: str | None = None
    #: Whose event this is; may be empty.
    tenant_id: str = ""
    #: The W3C trace context the event travels with ("" for none).
    traceparent: str = ""
    tracestate: str = ""


# One prepared row: id, type, payload text, correlation id, tenant id,
# traceparent, tracestate.
_Row = tuple[str, str, str, str, str, str, str]


def _bad(eid: object, msg: str) -> InvalidEventError:
    return InvalidEventError(f"event {eid!r}: {msg}")


def _prepare(e: Event, sqlite: bool) -> _Row:
    if type(e) is not Event and not isinstance(e, Event):
        raise TypeError(f"insert takes postbox.outbox.Event values, not {type(e).__name__}")
    eid = new_event_id() if e.id is None else e.id
    etype, tenant = e.type, e.tenant_id
    corr = e.correlation_id or eid
    if not eid or not isinstance(eid, str):
        raise _bad(eid, "id is empty (give None for a new one)")
    if not etype:
        raise _bad(eid, "type is empty")
    # The common case first: short ASCII text without NUL (ids postbox makes).
    if not (type(etype) is str and type(corr) is str and type(tenant) is str and len(eid) <= _check.MAX_EVENT_ID_BYTES
            and len(etype) <= _check.MAX_EVENT_TYPE_BYTES and (all4 := eid + etype + corr + tenant).isascii()
            and "\x00" not in all4):
        for name, v, limit in (("id", eid, _check.MAX_EVENT_ID_BYTES), ("type", etype, _check.MAX_EVENT_TYPE_BYTES),
                               ("correlation id", corr, 0), ("tenant id", tenant, 0)):
            if not isinstance(v, str) or not _check.is_text(v):
                raise _bad(eid, f"{name} {v!r} is not UTF-8 text without NUL characters")
            if limit and _check.utf8_len(v) > limit:
                raise _bad(eid, f"{name} is {_check.utf8_len(v)} bytes, over {limit}")

    def bad(msg: str) -> InvalidEventError:
        return _bad(eid, msg)

    try:
        text = _check.payload_text(e.payload)
    except ValueError as err:
        raise bad(str(err)) from None
    tp, ts = e.traceparent, e.tracestate
    if tp:
        why = _check.check_traceparent(tp)
        if why:
            raise bad(f"traceparent: {why}")
    elif ts:
        raise bad("tracestate given without a traceparent")
    if ts:
        why = _check.check_tracestate(ts)
        if why:
            raise bad(f"tracestate: {why}")
    if sqlite:
        # outboxsqlite.Insert stores only what fits a postbox envelope.
        text = _check.compact(text)
        if text[0] != "{":
            raise bad("payload: must be a JSON object (the SQLite outbox holds envelopes' payloads)")
        for name, v in (
            ("id", eid),
            ("type", e.type),
            ("correlation id", corr),
            ("tenant id", e.tenant_id or DEFAULT_TENANT),
        ):
            why = _check.envelope_field_problem(v)
            if why:
                raise bad(f"{name}: {why}")
            if _check.utf8_len(v) > _check.MAX_EVENT_ID_BYTES:
                raise bad(f"{name}: {_check.utf8_len(v)} bytes, over the limit of {_check.MAX_EVENT_ID_BYTES}")
    return (eid, etype, text, corr, tenant, tp, ts)


def _events(events: Event | Iterable[Event]) -> list[Event]:
    if isinstance(events, Event):
        return [events]
    return list(events)


def _prepare_all(events: list[Event], sqlite: bool) -> list[_Row]:
    rows = [_prepare(e, sqlite) for e in events]
    seen: set[str] = set()
    for r in rows:
        if r[0] in seen:
            raise InvalidEventError(f"event {r[0]!r}: the id appears twice in one insert")
        seen.add(r[0])
    return rows


# PostgreSQL: the statement of Go's outboxpg.Insert.
_PG_COLUMNS = "event_id, event_type, payload, correlation_id, tenant_id, traceparent, tracestate"
_PG_INSERT_ASYNCPG = (
    f"INSERT INTO outbox ({_PG_COLUMNS}) SELECT * FROM unnest($1::text[], $2::text[], $3::text[], "
    "$4::text[], $5::text[], $6::text[], $7::text[]) ON CONFLICT (event_id) DO NOTHING RETURNING event_id"
)
_PG_INSERT_PSYCOPG = (
    f"INSERT INTO outbox ({_PG_COLUMNS}) SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], "
    "%s::text[], %s::text[], %s::text[], %s::text[]) ON CONFLICT (event_id) DO NOTHING RETURNING event_id"
)
_PG_INSERT_SQLALCHEMY = (
    f"INSERT INTO outbox ({_PG_COLUMNS}) SELECT * FROM unnest(CAST(:c0 AS text[]), CAST(:c1 AS text[]), "
    "CAST(:c2 AS text[]), CAST(:c3 AS text[]), CAST(:c4 AS text[]), CAST(:c5 AS text[]), CAST(:c6 AS text[])) "
    "ON CONFLICT (event_id) DO NOTHING RETURNING event_id"
)

# SQLite: the statement of Go's outboxsqlite.Insert.
_SQLITE_COLUMNS = (
    "event_id, event_type, payload_json, created_at, next_attempt_at, occurred_at, "
    "correlation_id, tenant_id, source_seq, traceparent, tracestate"
)
_SQLITE_INSERT = (
    f"INSERT INTO outbox ({_SQLITE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?) "
    "ON CONFLICT (event_id) DO NOTHING"
)
_SQLITE_INSERT_NAMED = (
    f"INSERT INTO outbox ({_SQLITE_COLUMNS}) VALUES (:c0, :c1, :c2, :ts, :ts, :occurred, :c3, :c4, NULL, :c5, :c6) "
    "ON CONFLICT (event_id) DO NOTHING"
)


def _columns(rows: list[_Row]) -> list[list[str]]:
    return [list(c) for c in zip(*rows)]


def _sqlite_times(now: _dt.datetime | None = None) -> tuple[str, str]:
    """created_at/next_attempt_at (microseconds, Z) and occurred_at (RFC
    3339 with trailing zeros of the fraction dropped, as Go writes it)."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    base = now.strftime("%Y-%m-%dT%H:%M:%S")
    frac = f"{now.microsecond:06d}"
    occurred = base + ("." + frac.rstrip("0") if now.microsecond else "") + "Z"
    return base + "." + frac + "Z", occurred


def _sqlite_params(rows: list[_Row]) -> list[tuple[Any, ...]]:
    ts, occurred = _sqlite_times()
    return [(r[0], r[1], r[2], ts, ts, occurred, r[3], r[4], r[5], r[6]) for r in rows]


def _sqlite_named(rows: list[_Row]) -> list[dict[str, Any]]:
    """_sqlite_params as the named parameters of _SQLITE_INSERT_NAMED."""
    names = ("c0", "c1", "c2", "ts", None, "occurred", "c3", "c4", "c5", "c6")
    return [{n: v for n, v in zip(names, p) if n} for p in _sqlite_params(rows)]


def _missing(rows: list[_Row], inserted: Iterable[str]) -> None:
    got = set(inserted)
    dups = [r[0] for r in rows if r[0] not in got]
    if dups:
        raise DuplicateEventError(dups)


def _translate(e: BaseException, dialect: str) -> BaseException | None:
    """A clearer error for a driver's error, or None to let it go."""
    orig = getattr(e, "orig", None) or e  # SQLAlchemy wraps the driver's
    state = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    msg = str(orig)
    if state == "42P01" or "no such table: outbox" in msg:
        return SchemaError(
            f"no outbox table in this {dialect} database ({msg.strip()}): is the connection to the "
            "database postbox relay reads? Create it with `postbox relay --migrate` (the default) or "
            "the migrations of docs/OUTBOX.md"
        )
    if state == "42703" or "has no column named" in msg:
        return SchemaError(
            f"the outbox table in this {dialect} database is not postbox's ({msg.strip()}): "
            "see docs/OUTBOX.md for its columns"
        )
    if state == "25P02":
        return TransactionError("the transaction is aborted (an earlier statement failed): roll it back first")
    if "closed" in msg.lower() and ("connection" in msg.lower() or "database" in msg.lower()):
        return TransactionError(f"the connection is closed ({msg.strip()})")
    return None


def insert(conn: Any, events: Event | Iterable[Event]) -> list[str]:
    """Write events to the outbox in conn's current transaction and return
    their ids, in order. Does not commit.

    conn is a psycopg 3 ``Connection``, a ``sqlite3.Connection`` or a
    SQLAlchemy ``Session``/``Connection`` (on PostgreSQL or SQLite). Raises
    ``InvalidEventError`` (nothing written) for an event that cannot go
    in, ``TransactionError`` (nothing written) for a connection that is
    closed, aborted or in autocommit mode outside a transaction,
    ``SchemaError`` when the database has no outbox table, and
    ``DuplicateEventError`` for ids in the outbox already (the others are
    written; the transaction stays usable).
    """
    evs = _events(events)
    k = _drivers.kind(conn)
    _drivers.check_sync(k, "insert")
    if k == _drivers.SQLALCHEMY:
        dialect = _drivers.sqlalchemy_dialect(conn)
    else:
        dialect = "sqlite" if k == _drivers.SQLITE3 else "postgresql"
    rows = _prepare_all(evs, dialect == "sqlite")
    if not rows:
        return []
    try:
        if k == _drivers.PSYCOPG:
            _drivers.psycopg_state(conn, True)
            cur = conn.execute(_PG_INSERT_PSYCOPG, _columns(rows))
            _missing(rows, (r[0] for r in cur.fetchall()))
        elif k == _drivers.SQLITE3:
            _drivers.sqlite_state(conn, True)
            dups = []
            for r, p in zip(rows, _sqlite_params(rows)):
                if conn.execute(_SQLITE_INSERT, p).rowcount == 0:
                    dups.append(r[0])
            if dups:
                raise DuplicateEventError(dups)
        else:
            from sqlalchemy import text  # the caller has SQLAlchemy: it gave a Session

            _drivers.sqlalchemy_state(conn)
            if dialect == "postgresql":
                cols = _columns(rows)
                res = conn.execute(text(_PG_INSERT_SQLALCHEMY), {f"c{i}": c for i, c in enumerate(cols)})
                _missing(rows, (r[0] for r in res.fetchall()))
            else:
                dups = []
                for r, args in zip(rows, _sqlite_named(rows)):
                    if conn.execute(text(_SQLITE_INSERT_NAMED), args).rowcount == 0:
                        dups.append(r[0])
                if dups:
                    raise DuplicateEventError(dups)
    except (DuplicateEventError, TransactionError):
        raise
    except Exception as e:
        t = _translate(e, dialect)
        if t is None:
            raise
        raise t from e
    return [r[0] for r in rows]


async def insert_async(conn: Any, events: Event | Iterable[Event]) -> list[str]:
    """``insert`` for an asynchronous connection: a psycopg 3
    ``AsyncConnection``, an asyncpg ``Connection`` (inside ``async with
    conn.transaction():``), an ``aiosqlite.Connection`` or a SQLAlchemy
    ``AsyncSession``/``AsyncConnection``."""
    evs = _events(events)
    k = _drivers.kind(conn)
    _drivers.check_async(k, "insert")
    if k == _drivers.SQLALCHEMY_ASYNC:
        dialect = _drivers.sqlalchemy_dialect(conn.sync_session if hasattr(conn, "sync_session") else conn.sync_connection)
    else:
        dialect = "sqlite" if k == _drivers.AIOSQLITE else "postgresql"
    rows = _prepare_all(evs, dialect == "sqlite")
    if not rows:
        return []
    try:
        if k == _drivers.ASYNCPG:
            _drivers.asyncpg_state(conn, True)
            got = await conn.fetch(_PG_INSERT_ASYNCPG, *_columns(rows))
            _missing(rows, (r[0] for r in got))
        elif k == _drivers.PSYCOPG_ASYNC:
            _drivers.psycopg_state(conn, True)
            cur = await conn.execute(_PG_INSERT_PSYCOPG, _columns(rows))
            _missing(rows, (r[0] for r in await cur.fetchall()))
        elif k == _drivers.AIOSQLITE:
            _drivers.sqlite_state(conn, True, "aiosqlite")
            dups = []
            for r, p in zip(rows, _sqlite_params(rows)):
                cur = await conn.execute(_SQLITE_INSERT, p)
                if cur.rowcount == 0:
                    dups.append(r[0])
                await cur.close()
            if dups:
                raise DuplicateEventError(dups)
        else:
            from sqlalchemy import text

            sync = getattr(conn, "sync_session", None) or getattr(conn, "sync_connection", None)
            if sync is not None:
                _drivers.sqlalchemy_state(sync)
            if dialect == "postgresql":
                cols = _columns(rows)
                res = await conn.execute(text(_PG_INSERT_SQLALCHEMY), {f"c{i}": c for i, c in enumerate(cols)})
                _missing(rows, (r[0] for r in res.fetchall()))
            else:
                dups = []
                for r, args in zip(rows, _sqlite_named(rows)):
                    res = await conn.execute(text(_SQLITE_INSERT_NAMED), args)
                    if res.rowcount == 0:
                        dups.append(r[0])
                if dups:
                    raise DuplicateEventError(dups)
    except (DuplicateEventError, TransactionError):
        raise
    except Exception as e:
        t = _translate(e, dialect)
        if t is None:
            raise
        raise t from e
    return [r[0] for r in rows]
