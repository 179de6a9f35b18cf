"""postbox.dedup: the semantics of Go's dedup package, with every driver;
and a Go handler (dedup.Handle, run as a program) and a Python handler
sharing one inbox table."""

from __future__ import annotations

import asyncio
import datetime as dt
import sqlite3
import subprocess

import pytest

from postbox import InvalidKeyError, SchemaError, TransactionError, dedup

EFFECTS = "CREATE TABLE IF NOT EXISTS effects (handler TEXT NOT NULL, id TEXT NOT NULL)"


class Boom(Exception):
    pass


def check_sync(conn, effects):
    """The contract, on a sync connection; effects() counts the handler's
    committed writes."""
    calls = []

    def fn(c):
        calls.append(1)
        c.execute(*write("billing", "evt_1"))

    write = writer(conn)
    assert dedup.handle(conn, "billing", "evt_1", fn) is True
    assert dedup.handle(conn, "billing", "evt_1", fn) is False  # a redelivery: skipped
    assert len(calls) == 1 and effects() == 1

    def fails(c):
        c.execute(*write("billing", "evt_2"))
        raise Boom("the handler failed")

    with pytest.raises(Boom):
        dedup.handle(conn, "billing", "evt_2", fails)
    assert effects() == 1  # neither the write nor the record
    assert dedup.handle(conn, "billing", "evt_2", fn) is True  # so it runs again
    assert dedup.handle(conn, "shipping", "evt_1", fn) is True  # another handler, the same id
    assert effects() == 3
    for h, i, says in (("", "x", "handler is empty"), ("h", "", "id is empty"), ("h", "x" * 256, "id is 256 bytes"),
                       ("h\x00", "x", "not UTF-8 text without NUL")):
        with pytest.raises(InvalidKeyError, match=says):
            dedup.handle(conn, h, i, fn)


def writer(conn):
    mod = type(conn).__module__
    if mod.startswith("psycopg"):
        return lambda h, i: ("INSERT INTO effects (handler, id) VALUES (%s, %s)", (h, i))
    if mod.startswith("sqlalchemy"):
        from sqlalchemy import text

        return lambda h, i: (text("INSERT INTO effects (handler, id) VALUES (:h, :i)"), {"h": h, "i": i})
    return lambda h, i: ("INSERT INTO effects (handler, id) VALUES (?, ?)", (h, i))


def count_sqlite(path):
    def n():
        c = sqlite3.connect(path)
        try:
            return c.execute("SELECT count(*) FROM effects").fetchone()[0]
        finally:
            c.close()

    return n


def count_pg(pg):
    def n():
        with pg.psycopg() as c:
            return c.execute("SELECT count(*) FROM effects").fetchone()[0]

    return n


def test_sqlite3(sqlite_path):
    c = sqlite3.connect(sqlite_path)
    c.execute(EFFECTS)
    c.commit()
    check_sync(c, count_sqlite(sqlite_path))
    # Inside the caller's transaction: a savepoint, committed with it.
    c.execute("INSERT INTO effects VALUES ('outer', 'o')")
    assert dedup.handle(c, "nested", "n1", lambda c: None) is True
    c.rollback()
    assert dedup.handle(c, "nested", "n1", lambda c: None) is True  # the record went with the rollback
    c.commit()
    old = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=1)
    assert dedup.forget(c, old) == 0
    assert dedup.forget(c, dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=1)) == 4
    c.commit()
    assert dedup.handle(c, "billing", "evt_1", lambda c: None) is True  # forgotten: new again
    c.close()
    with pytest.raises(TransactionError, match="closed"):
        dedup.handle(c, "billing", "evt_9", lambda c: None)


def test_sqlite3_no_table(tmp_path):
    with pytest.raises(SchemaError, match="no inbox table"):
        dedup.handle(sqlite3.connect(tmp_path / "x.db"), "h", "i", lambda c: None)


async def test_aiosqlite(sqlite_path):
    aiosqlite = pytest.importorskip("aiosqlite")
    async with aiosqlite.connect(sqlite_path) as c:
        await c.execute(EFFECTS)
        await c.commit()

        async def fn(c):
            await c.execute("INSERT INTO effects VALUES ('h', 'x')")

        assert await dedup.handle_async(c, "h", "x", fn) is True
        assert await dedup.handle_async(c, "h", "x", fn) is False

        async def fails(c):
            await fn(c)
            raise Boom

        with pytest.raises(Boom):
            await dedup.handle_async(c, "h", "y", fails)
    assert count_sqlite(sqlite_path)() == 1


def test_sqlalchemy_sqlite(sqlite_path):
    sa = pytest.importorskip("sqlalchemy")
    from sqlalchemy.orm import Session

    c = sqlite3.connect(sqlite_path)
    c.execute(EFFECTS)
    c.commit()
    c.close()
    with Session(sa.create_engine(f"sqlite:///{sqlite_path}")) as s:
        check_sync(s, count_sqlite(sqlite_path))


def test_psycopg(pg):
    with pg.psycopg() as c:
        c.execute(EFFECTS)
        c.commit()
        check_sync(c, count_pg(pg))


async def test_asyncpg(pg):
    c = await pg.asyncpg()
    try:
        await c.execute(EFFECTS)

        async def fn(c):
            await c.execute("INSERT INTO effects VALUES ('h', 'x')")

        assert await dedup.handle_async(c, "h", "x", fn) is True
        assert await dedup.handle_async(c, "h", "x", fn) is False

        async def fails(c):
            await fn(c)
            raise Boom

        with pytest.raises(Boom):
            await dedup.handle_async(c, "h", "y", fails)
        assert await dedup.forget_async(c, dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=1)) == 0
    finally:
        await c.close()
    assert count_pg(pg)() == 1


async def test_psycopg_async(pg):
    c = await pg.psycopg_async(autocommit=True)
    async with c:
        await c.execute(EFFECTS)

        async def fn(c):
            await c.execute("INSERT INTO effects VALUES ('h', 'x')")

        assert await dedup.handle_async(c, "h", "x", fn) is True
        assert await dedup.handle_async(c, "h", "x", fn) is False
    assert count_pg(pg)() == 1


async def test_concurrent_deliveries_run_once(pg):
    """Two deliveries of one id at once: the second's insert waits for the
    first transaction, then inserts nothing."""
    conns = [await pg.asyncpg() for _ in range(2)]
    await conns[0].execute(EFFECTS)
    first_in = asyncio.Event()
    release = asyncio.Event()
    ran = []

    async def slow(c):
        ran.append(1)
        first_in.set()
        await c.execute("INSERT INTO effects VALUES ('h', 'same')")
        await release.wait()

    try:
        a = asyncio.ensure_future(dedup.handle_async(conns[0], "h", "same", slow))
        await first_in.wait()
        b = asyncio.ensure_future(dedup.handle_async(conns[1], "h", "same", slow))
        done, _ = await asyncio.wait({b}, timeout=0.3)
        assert not done  # waiting on the first's row lock
        release.set()
        assert await a is True and await b is False and len(ran) == 1
    finally:
        for c in conns:
            await c.close()


def go(godedup_bin, db, handler, id):
    r = subprocess.run([godedup_bin, "-db", str(db), "-handler", handler, "-id", id], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def check_shared(godedup_bin, db, py_handle, effects):
    """A Go handler and a Python handler on one table see each other's
    records."""
    assert py_handle("orders", "evt_py") is True
    assert go(godedup_bin, db, "orders", "evt_py") == "skipped"
    assert go(godedup_bin, db, "orders", "evt_go") == "ran"
    assert py_handle("orders", "evt_go") is False
    assert go(godedup_bin, db, "audit", "evt_py") == "ran"  # another handler
    assert py_handle("audit", "evt_go") is True
    assert effects() == 4


def test_go_and_python_share_one_table_sqlite(godedup_bin, tmp_path):
    path = tmp_path / "shared.db"
    subprocess.run([godedup_bin, "-db", str(path), "-migrate"], check=True, timeout=60)  # Go's dedup.Migrate
    c = sqlite3.connect(path, timeout=5)
    c.execute(EFFECTS)
    c.commit()
    write = writer(c)
    check_shared(godedup_bin, path, lambda h, i: dedup.handle(c, h, i, lambda c: c.execute(*write(h, i))),
                 count_sqlite(path))
    c.close()


def test_go_and_python_share_one_table_postgres(godedup_bin, pg):
    with pg.psycopg() as c:
        c.execute(EFFECTS)
        c.commit()
        write = writer(c)
        check_shared(godedup_bin, pg.url, lambda h, i: dedup.handle(c, h, i, lambda c: c.execute(*write(h, i))),
                     count_pg(pg))


async def test_sqlalchemy_async_session(pg):
    pytest.importorskip("sqlalchemy")
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    engine = create_async_engine(pg.base.replace("postgres://", "postgresql+asyncpg://").split("?")[0],
                                 connect_args={"server_settings": {"search_path": pg.schema}})
    try:
        async with AsyncSession(engine) as s:
            await s.execute(text(EFFECTS))
            await s.commit()

            async def fn(s):
                await s.execute(text("INSERT INTO effects VALUES ('h', 'x')"))

            assert await dedup.handle_async(s, "h", "x", fn) is True
            assert await dedup.handle_async(s, "h", "x", fn) is False

            async def fails(s):
                await fn(s)
                raise Boom

            with pytest.raises(Boom):
                await dedup.handle_async(s, "h", "y", fails)
            assert await dedup.handle_async(s, "h", "y", fn) is True
    finally:
        await engine.dispose()
    assert count_pg(pg)() == 2
