"""Per-handler dedup: a redelivered event is a no-op for a handler that
has already handled it (Go's package ``dedup``, on the same table).

``handle`` records "handler H handled id X" in the ``inbox`` table and
runs the handler's function in one transaction: it inserts ``(id,
handler_name)`` first, with ``ON CONFLICT DO NOTHING``, and calls the
function only when that inserted a row, then commits. So:

- a delivery of an id the handler has already handled inserts nothing,
  is rolled back, and does not call the function (``handle`` returns
  False);
- a function that raises leaves neither its writes nor the record, so the
  next delivery runs it again (the exception goes on up);
- two deliveries of one id at the same time serialize on the table's
  primary key: the second waits for the first and then inserts nothing
  (it committed) or goes ahead (it rolled back).

A Go handler using ``dedup.Handle`` and a Python one using ``handle``
share the table: ``(id, handler_name)`` handled by either is handled.

The function gets the connection and must do its writes through it. When
the connection is already in a transaction, ``handle`` works in a
savepoint of it, and the record commits with the outer transaction.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from . import _check, _drivers
from .errors import InvalidKeyError, SchemaError

__all__ = ["handle", "handle_async", "forget", "forget_async", "migrate", "migrate_async",
           "POSTGRES_SCHEMA", "SQLITE_SCHEMA", "MAX_KEY_BYTES"]

#: Go's dedup.PostgresSchema, in the connection's search_path.
POSTGRES_SCHEMA = """SELECT pg_advisory_xact_lock(hashtext('postbox_migrations'));
CREATE TABLE IF NOT EXISTS inbox (
	id           TEXT NOT NULL,
	handler_name TEXT NOT NULL,
	processed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
	PRIMARY KEY (id, handler_name)
);
CREATE INDEX IF NOT EXISTS inbox_processed_at ON inbox (processed_at);
"""

#: Go's dedup.SQLiteSchema: processed_at is UTC text with milliseconds.
SQLITE_SCHEMA = """CREATE TABLE IF NOT EXISTS inbox (
	id           TEXT NOT NULL,
	handler_name TEXT NOT NULL,
	processed_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
	PRIMARY KEY (id, handler_name)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS inbox_processed_at ON inbox (processed_at);
"""

#: The most bytes of a handler name and of an id, each.
MAX_KEY_BYTES = 255

_INSERT_PG = "INSERT INTO inbox (id, handler_name) VALUES ($1, $2) ON CONFLICT DO NOTHING"
_INSERT_PSYCOPG = "INSERT INTO inbox (id, handler_name) VALUES (%s, %s) ON CONFLICT DO NOTHING"
_INSERT_QMARK = "INSERT INTO inbox (id, handler_name) VALUES (?, ?) ON CONFLICT DO NOTHING"
_INSERT_NAMED = "INSERT INTO inbox (id, handler_name) VALUES (:id, :handler) ON CONFLICT DO NOTHING"
_SAVEPOINT = "postbox_dedup"

T = TypeVar("T")


class _Skip(Exception):
    """Rolls back a transaction whose record was there already."""


def _check_key(handler: str, id: str) -> None:
    for name, v in (("handler", handler), ("id", id)):
        if not isinstance(v, str):
            raise InvalidKeyError(f"dedup: invalid key: {name} is a {type(v).__name__}, not a str")
        if v == "":
            raise InvalidKeyError(f"dedup: invalid key: {name} is empty")
        if not _check.is_text(v):
            raise InvalidKeyError(f"dedup: invalid key: {name} is not UTF-8 text without NUL bytes")
        if _check.utf8_len(v) > MAX_KEY_BYTES:
            raise InvalidKeyError(f"dedup: invalid key: {name} is {_check.utf8_len(v)} bytes, over {MAX_KEY_BYTES}")


def _schema_error(e: BaseException) -> SchemaError | None:
    orig = getattr(e, "orig", None) or e
    if getattr(orig, "sqlstate", None) == "42P01" or "no such table: inbox" in str(orig):
        return SchemaError(
            f"no inbox table in this database ({str(orig).strip()}): create it with dedup.migrate "
            "(or Go's dedup.Migrate, or the schema in docs/OUTBOX.md)"
        )
    return None


def handle(conn: Any, handler: str, id: str, fn: Callable[[Any], object]) -> bool:
    """Run ``fn(conn)`` in a transaction unless handler has handled id,
    and record that it has in the same transaction. Returns True when fn
    ran and the transaction committed, False (without calling fn) when the
    inbox already records (id, handler).

    conn is a psycopg 3 ``Connection``, a ``sqlite3.Connection`` or a
    SQLAlchemy ``Session``. On SQLite, open it with a busy timeout (the
    sqlite3 default is 5 s) so that concurrent deliveries wait for each
    other.
    """
    _check_key(handler, id)
    k = _drivers.kind(conn)
    _drivers.check_sync(k, "handle")
    try:
        if k == _drivers.PSYCOPG:
            _drivers.psycopg_state(conn, False)
            with conn.transaction():
                if conn.execute(_INSERT_PSYCOPG, (id, handler)).rowcount == 0:
                    raise _Skip
                fn(conn)
            return True
        if k == _drivers.SQLITE3:
            _drivers.sqlite_state(conn, False)
            nested = conn.in_transaction
            conn.execute(f"SAVEPOINT {_SAVEPOINT}" if nested else "BEGIN")
            try:
                if conn.execute(_INSERT_QMARK, (id, handler)).rowcount == 0:
                    raise _Skip
                fn(conn)
            except BaseException:
                conn.execute(f"ROLLBACK TO {_SAVEPOINT}" if nested else "ROLLBACK")
                if nested:
                    conn.execute(f"RELEASE {_SAVEPOINT}")
                raise
            conn.execute(f"RELEASE {_SAVEPOINT}" if nested else "COMMIT")
            return True
        from sqlalchemy import text

        _drivers.sqlalchemy_state(conn)
        begin = conn.begin_nested if conn.in_transaction() else conn.begin
        with begin():
            if conn.execute(text(_INSERT_NAMED), {"id": id, "handler": handler}).rowcount == 0:
                raise _Skip
            fn(conn)
        return True
    except _Skip:
        return False
    except Exception as e:
        t = _schema_error(e)
        if t is None:
            raise
        raise t from e


async def handle_async(conn: Any, handler: str, id: str, fn: Callable[[Any], Awaitable[object]]) -> bool:
    """``handle`` for an asynchronous connection: an asyncpg
    ``Connection``, a psycopg 3 ``AsyncConnection``, an
    ``aiosqlite.Connection`` or a SQLAlchemy ``AsyncSession``; fn is
    awaited."""
    _check_key(handler, id)
    k = _drivers.kind(conn)
    _drivers.check_async(k, "handle")
    try:
        if k == _drivers.ASYNCPG:
            _drivers.asyncpg_state(conn, False)
            async with conn.transaction():
                status = await conn.execute(_INSERT_PG, id, handler)
                if status.endswith(" 0"):
                    raise _Skip
                await fn(conn)
            return True
        if k == _drivers.PSYCOPG_ASYNC:
            _drivers.psycopg_state(conn, False)
            async with conn.transaction():
                cur = await conn.execute(_INSERT_PSYCOPG, (id, handler))
                if cur.rowcount == 0:
                    raise _Skip
                await fn(conn)
            return True
        if k == _drivers.AIOSQLITE:
            _drivers.sqlite_state(conn, False, "aiosqlite")
            nested = conn.in_transaction
            await conn.execute(f"SAVEPOINT {_SAVEPOINT}" if nested else "BEGIN")
            try:
                cur = await conn.execute(_INSERT_QMARK, (id, handler))
                if cur.rowcount == 0:
                    raise _Skip
                await fn(conn)
            except BaseException:
                await conn.execute(f"ROLLBACK TO {_SAVEPOINT}" if nested else "ROLLBACK")
                if nested:
                    await conn.execute(f"RELEASE {_SAVEPOINT}")
                raise
            await conn.execute(f"RELEASE {_SAVEPOINT}" if nested else "COMMIT")
            return True
        from sqlalchemy import text

        begin = conn.begin_nested if conn.in_transaction() else conn.begin
        async with begin():
            res = await conn.execute(text(_INSERT_NAMED), {"id": id, "handler": handler})
            if res.rowcount == 0:
                raise _Skip
            await fn(conn)
        return True
    except _Skip:
        return False
    except Exception as e:
        t = _schema_error(e)
        if t is None:
            raise
        raise t from e


def _sqlite_time(before: _dt.datetime) -> str:
    if before.tzinfo is None:
        raise ValueError("forget: before must be an aware datetime (with a tzinfo)")
    u = before.astimezone(_dt.timezone.utc)
    return u.strftime("%Y-%m-%dT%H:%M:%S.") + f"{u.microsecond // 1000:03d}Z"


def forget(conn: Any, before: _dt.datetime) -> int:
    """Delete the records of ids handled before ``before`` (an aware
    datetime) and return how many; a forgotten id is new again. Does not
    commit (psycopg, sqlite3, SQLAlchemy: commit as usual)."""
    k = _drivers.kind(conn)
    _drivers.check_sync(k, "forget")
    if k == _drivers.PSYCOPG:
        _sqlite_time(before)
        return conn.execute("DELETE FROM inbox WHERE processed_at < %s", (before,)).rowcount
    if k == _drivers.SQLITE3:
        return conn.execute("DELETE FROM inbox WHERE processed_at < ?", (_sqlite_time(before),)).rowcount
    from sqlalchemy import text

    arg: object = before if _drivers.sqlalchemy_dialect(conn) == "postgresql" else _sqlite_time(before)
    return conn.execute(text("DELETE FROM inbox WHERE processed_at < :t"), {"t": arg}).rowcount


async def forget_async(conn: Any, before: _dt.datetime) -> int:
    """``forget`` for an asynchronous connection."""
    k = _drivers.kind(conn)
    _drivers.check_async(k, "forget")
    if k == _drivers.ASYNCPG:
        _sqlite_time(before)
        status = await conn.execute("DELETE FROM inbox WHERE processed_at < $1", before)
        return int(status.rsplit(" ", 1)[1])
    if k == _drivers.PSYCOPG_ASYNC:
        _sqlite_time(before)
        return (await conn.execute("DELETE FROM inbox WHERE processed_at < %s", (before,))).rowcount
    if k == _drivers.AIOSQLITE:
        cur = await conn.execute("DELETE FROM inbox WHERE processed_at < ?", (_sqlite_time(before),))
        return cur.rowcount
    from sqlalchemy import text

    arg: object = before if _drivers.sqlalchemy_dialect(conn.sync_session) == "postgresql" else _sqlite_time(before)
    return (await conn.execute(text("DELETE FROM inbox WHERE processed_at < :t"), {"t": arg})).rowcount


def migrate(conn: Any) -> None:
    """Create the inbox table if it is missing (``POSTGRES_SCHEMA`` or
    ``SQLITE_SCHEMA``) and commit. conn: psycopg 3 or sqlite3."""
    k = _drivers.kind(conn)
    if k == _drivers.PSYCOPG:
        with conn.transaction():
            conn.execute(POSTGRES_SCHEMA)
    elif k == _drivers.SQLITE3:
        conn.executescript(SQLITE_SCHEMA)
    else:
        raise TypeError(f"migrate takes a psycopg or sqlite3 connection, not {k} (migrate_async for async ones)")


async def migrate_async(conn: Any) -> None:
    """``migrate`` for an asyncpg, psycopg 3 async or aiosqlite connection."""
    k = _drivers.kind(conn)
    if k == _drivers.ASYNCPG:
        async with conn.transaction():
            await conn.execute(POSTGRES_SCHEMA)
    elif k == _drivers.PSYCOPG_ASYNC:
        async with conn.transaction():
            await conn.execute(POSTGRES_SCHEMA)
    elif k == _drivers.AIOSQLITE:
        await conn.executescript(SQLITE_SCHEMA)
    else:
        raise TypeError(f"migrate_async takes an asyncpg, psycopg async or aiosqlite connection, not {k}")
