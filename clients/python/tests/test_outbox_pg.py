"""postbox.outbox on PostgreSQL: psycopg 3 (sync and async), asyncpg and
SQLAlchemy write the rows Go's outboxpg.Insert writes, in the caller's own
transaction, payload byte for byte."""

from __future__ import annotations

import asyncio

import pytest

from postbox import DuplicateEventError, InvalidEventError, SchemaError, TransactionError
from postbox.outbox import Event, insert, insert_async

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
RAW = b'{"z": 1,  "a": {"k": "\xc3\xa9\\n"}, "z": 2}'  # spacing, key order, a duplicate key: kept


def outbox_rows(pg):
    with pg.psycopg() as c:
        cur = c.execute("SELECT event_id, event_type, payload, correlation_id, tenant_id, traceparent, tracestate,"
                        " attempts, delivered_at FROM outbox ORDER BY seq")
        return cur.fetchall()


def events():
    return [
        Event("order.placed", RAW, correlation_id="chk-1", tenant_id="acme", traceparent=TP, tracestate="k=v"),
        Event("order.paid", {"order_id": 1}, id="key-1"),
    ]


def check_rows(pg, ids):
    got = outbox_rows(pg)
    assert [r[0] for r in got] == ids
    assert got[0][1:7] == ("order.placed", RAW.decode(), "chk-1", "acme", TP, "k=v")
    assert got[1][1:5] == ("order.paid", '{"order_id":1}', "key-1", "")
    assert all(r[7] == 0 and r[8] is None for r in got)


def test_psycopg(pg):
    with pg.psycopg() as c:
        with c.transaction():
            c.execute("CREATE TABLE orders (id int)")
        with c.transaction():
            c.execute("INSERT INTO orders VALUES (1)")
            ids = insert(c, events())
            assert outbox_rows(pg) == []  # the caller's transaction, not committed yet
        check_rows(pg, ids)
        with pytest.raises(RuntimeError):
            with c.transaction():
                insert(c, Event("x", b"{}"))
                raise RuntimeError("the business write failed")
        with c.transaction():
            with pytest.raises(DuplicateEventError) as e:
                insert(c, [Event("x", b"{}", id="key-1"), Event("x", b"{}", id="key-2")])
            assert e.value.ids == ["key-1"]
        with pytest.raises(InvalidEventError, match="payload is not valid JSON"):
            insert(c, [Event("x", b"{}"), Event("x", "{")])
    assert [r[0] for r in outbox_rows(pg)] == ids + ["key-2"]


def test_psycopg_bad_connections(pg):
    with pg.psycopg(autocommit=True) as c:
        with pytest.raises(TransactionError, match="autocommit mode with no transaction open"):
            insert(c, Event("x", b"{}"))
        with pytest.raises(TransactionError, match="aborted"):
            with c.transaction():
                with pytest.raises(Exception):
                    c.execute("SELECT nonsense_column FROM outbox")
                insert(c, Event("x", b"{}"))
    with pytest.raises(TransactionError, match="closed"):
        insert(c, Event("x", b"{}"))
    import psycopg

    with psycopg.connect(pg.base, options="-csearch_path=no_such_schema_here") as other:
        with pytest.raises(SchemaError, match="no outbox table"):
            insert(other, Event("x", b"{}"))
    assert outbox_rows(pg) == []


async def test_psycopg_async(pg):
    c = await pg.psycopg_async()
    async with c:
        async with c.transaction():
            ids = await insert_async(c, events())
        check_rows(pg, ids)
        with pytest.raises(TypeError, match="asynchronous: use insert_async"):
            insert(c, events())


async def test_asyncpg(pg):
    pytest.importorskip("asyncpg")
    c = await pg.asyncpg()
    try:
        async with c.transaction():
            ids = await insert_async(c, events())
        check_rows(pg, ids)
        with pytest.raises(TransactionError, match="no transaction open"):
            await insert_async(c, Event("x", b"{}"))
        with pytest.raises(ZeroDivisionError):
            async with c.transaction():
                await insert_async(c, Event("x", b"{}"))
                1 / 0
        async with c.transaction():
            with pytest.raises(DuplicateEventError):
                await insert_async(c, Event("x", b"{}", id="key-1"))
    finally:
        await c.close()
    with pytest.raises(TransactionError, match="closed"):
        await insert_async(c, Event("x", b"{}"))
    assert [r[0] for r in outbox_rows(pg)] == ids


async def test_asyncpg_many_in_one_statement(pg):
    c = await pg.asyncpg()
    try:
        async with c.transaction():
            ids = await insert_async(c, [Event("bulk", {"i": i}) for i in range(500)])
    finally:
        await c.close()
    assert [r[0] for r in outbox_rows(pg)] == ids
    assert len(set(ids)) == 500


async def test_sqlalchemy_async_session(pg):
    sa = pytest.importorskip("sqlalchemy")
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    engine = create_async_engine(
        pg.base.replace("postgres://", "postgresql+asyncpg://").split("?")[0],
        connect_args={"server_settings": {"search_path": pg.schema}},
    )
    try:
        async with AsyncSession(engine) as s:
            async with s.begin():
                ids = await insert_async(s, events())
            async with s.begin():
                with pytest.raises(DuplicateEventError):
                    await insert_async(s, Event("x", b"{}", id="key-1"))
                await s.rollback()
    finally:
        await engine.dispose()
    check_rows(pg, ids)
    assert sa is not None


def test_sqlalchemy_sync_session(pg):
    sa = pytest.importorskip("sqlalchemy")
    try:
        import psycopg2  # noqa: F401  (SQLAlchemy 1.4's PostgreSQL driver)
        url = pg.base.replace("postgres://", "postgresql+psycopg2://")
    except ImportError:
        if sa.__version__.startswith("1."):
            pytest.skip("SQLAlchemy 1.4 has no psycopg 3 dialect and psycopg2 is not installed "
                        "(the async session over asyncpg is tested)")
        url = pg.base.replace("postgres://", "postgresql+psycopg://")
    from sqlalchemy.orm import Session

    engine = sa.create_engine(url.split("?")[0], connect_args={"options": pg.libpq_options})
    with Session(engine) as s:
        ids = insert(s, events())
        s.commit()
    check_rows(pg, ids)


async def test_concurrent_producers(pg):
    async def one(n):
        c = await pg.asyncpg()
        try:
            for _ in range(5):
                async with c.transaction():
                    await insert_async(c, [Event("c", {"n": n}) for _ in range(10)])
        finally:
            await c.close()

    await asyncio.gather(*(one(n) for n in range(4)))
    assert len(outbox_rows(pg)) == 200


async def test_a_pool_is_not_a_transaction(pg):
    import asyncpg

    pool = await asyncpg.create_pool(pg.base, min_size=1, max_size=1, server_settings={"search_path": pg.schema})
    try:
        with pytest.raises(TypeError, match="is a pool, not a connection"):
            await insert_async(pool, Event("x", b"{}"))
        async with pool.acquire() as c:  # a pool's connection (a proxy) is one
            async with c.transaction():
                await insert_async(c, Event("x", b"{}"))
    finally:
        await pool.close()
    assert len(outbox_rows(pg)) == 1
