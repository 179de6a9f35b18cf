"""Which database driver a connection belongs to, and what state it is
in, without importing any driver."""

from __future__ import annotations

from typing import Any

from .errors import TransactionError

PSYCOPG = "psycopg"
PSYCOPG_ASYNC = "psycopg-async"
ASYNCPG = "asyncpg"
SQLITE3 = "sqlite3"
AIOSQLITE = "aiosqlite"
SQLALCHEMY = "sqlalchemy"
SQLALCHEMY_ASYNC = "sqlalchemy-async"

SYNC = (PSYCOPG, SQLITE3, SQLALCHEMY)
ASYNC = (PSYCOPG_ASYNC, ASYNCPG, AIOSQLITE, SQLALCHEMY_ASYNC)


def kind(conn: Any) -> str:
    """Name the driver of conn; TypeError for anything else."""
    name = type(conn).__name__
    if "Pool" in name and "Proxy" not in name:
        raise TypeError(
            f"a {type(conn).__module__}.{name} is a pool, not a connection: acquire a connection and open "
            "your transaction on it, so that the events commit with your own writes"
        )
    for cls in type(conn).__mro__:
        mod = cls.__module__ or ""
        root = mod.split(".", 1)[0]
        if root == "psycopg":
            if cls.__name__.startswith("Async"):
                return PSYCOPG_ASYNC
            return PSYCOPG
        if root == "asyncpg":
            return ASYNCPG
        if root in ("sqlite3", "_sqlite3"):
            return SQLITE3
        if root == "aiosqlite":
            return AIOSQLITE
        if root == "sqlalchemy":
            if mod.startswith("sqlalchemy.ext.asyncio"):
                return SQLALCHEMY_ASYNC
            return SQLALCHEMY
    raise TypeError(
        f"{type(conn).__module__}.{type(conn).__qualname__} is not a connection postbox knows: give a "
        "psycopg (3) Connection or AsyncConnection, an asyncpg Connection, a sqlite3 or aiosqlite "
        "Connection, or a SQLAlchemy Session, AsyncSession, Connection or AsyncConnection"
    )


def check_sync(k: str, fn: str) -> None:
    if k not in SYNC:
        raise TypeError(f"{fn}: a {k} connection is asynchronous: use {fn}_async and await it")


def check_async(k: str, fn: str) -> None:
    if k not in ASYNC:
        raise TypeError(f"{fn}_async: a {k} connection is synchronous: use {fn}")


def psycopg_state(conn: Any, need_tx: bool) -> None:
    """Raise TransactionError when a psycopg connection cannot take a
    write of the caller's transaction."""
    if conn.closed:
        raise TransactionError("the psycopg connection is closed")
    status = conn.info.transaction_status
    name = getattr(status, "name", str(status))
    if name == "INERROR":
        raise TransactionError(
            "the psycopg connection's transaction is aborted (an earlier statement failed): roll it back first"
        )
    if need_tx and name == "IDLE" and conn.autocommit:
        raise TransactionError(
            "the psycopg connection is in autocommit mode with no transaction open: "
            "write inside `with conn.transaction():` so the events commit with your own writes"
        )


def asyncpg_state(conn: Any, need_tx: bool) -> None:
    if conn.is_closed():
        raise TransactionError("the asyncpg connection is closed")
    if need_tx and not conn.is_in_transaction():
        raise TransactionError(
            "the asyncpg connection has no transaction open: write inside "
            "`async with conn.transaction():` so the events commit with your own writes"
        )


def sqlite_state(conn: Any, need_tx: bool, what: str = "sqlite3") -> None:
    """For sqlite3 and aiosqlite connections."""
    try:
        in_tx = conn.in_transaction
        autocommit = getattr(conn, "autocommit", None)
        iso = conn.isolation_level
    except Exception as e:  # sqlite3.ProgrammingError, aiosqlite's ValueError
        raise TransactionError(f"the {what} connection is closed ({e})") from None
    if what == "sqlite3":
        try:
            conn.total_changes  # raises on a closed connection
        except Exception as e:
            raise TransactionError(f"the sqlite3 connection is closed ({e})") from None
    if need_tx and not in_tx and (autocommit is True or iso is None):
        raise TransactionError(
            f"the {what} connection is in autocommit mode with no transaction open: "
            "BEGIN a transaction first so the events commit with your own writes"
        )


def sqlalchemy_dialect(conn: Any) -> str:
    """"postgresql" or "sqlite" for a SQLAlchemy Session or Connection."""
    bind = conn.get_bind() if hasattr(conn, "get_bind") else conn
    name = bind.dialect.name
    if name not in ("postgresql", "sqlite"):
        raise TypeError(f"SQLAlchemy dialect {name!r}: postbox's tables live in PostgreSQL or SQLite")
    return name


def sqlalchemy_state(conn: Any) -> None:
    closed = getattr(conn, "closed", False)
    if closed is True:
        raise TransactionError("the SQLAlchemy connection is closed")
    tx = conn.get_transaction() if hasattr(conn, "get_transaction") else None
    if tx is not None and hasattr(tx, "is_active") and not tx.is_active:
        raise TransactionError(
            "the SQLAlchemy transaction is inactive (an earlier statement failed or it was rolled back): roll it back first"
        )
