"""postbox.outbox on SQLite: sqlite3, aiosqlite and SQLAlchemy write the
rows Go's outboxsqlite.Insert writes, in the caller's transaction."""

from __future__ import annotations

import re
import sqlite3

import pytest

from postbox import DuplicateEventError, InvalidEventError, SchemaError, TransactionError
from postbox.outbox import Event, insert, insert_async

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def rows(path):
    c = sqlite3.connect(path)
    c.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in c.execute("SELECT * FROM outbox ORDER BY seq")]
    finally:
        c.close()


def test_sqlite3_insert_commits_with_the_business_write(sqlite_path):
    c = sqlite3.connect(sqlite_path)
    c.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, total TEXT)")
    c.commit()
    c.execute("INSERT INTO orders (id, total) VALUES (1, '9.90')")
    ids = insert(c, [
        Event("order.placed", b'{"order_id": 1, "total": "9.90"}', correlation_id="chk-1", tenant_id="acme",
              traceparent=TP, tracestate="congo=t61rcWkgMzE"),
        Event("order.paid", {"order_id": 1}, id="my-key-1"),
    ])
    assert re.fullmatch(r"evt_[0-9A-Z]{26}", ids[0]) and ids[1] == "my-key-1"
    assert rows(sqlite_path) == []  # not committed yet
    c.commit()
    got = rows(sqlite_path)
    assert [r["event_id"] for r in got] == ids
    r = got[0]
    assert r["event_type"] == "order.placed"
    assert r["payload_json"] == '{"order_id":1,"total":"9.90"}'  # compact, as outboxsqlite stores it
    assert (r["correlation_id"], r["tenant_id"], r["traceparent"], r["tracestate"]) == ("chk-1", "acme", TP, "congo=t61rcWkgMzE")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", r["created_at"])
    assert r["next_attempt_at"] == r["created_at"] and r["state"] == "pending" and r["attempt_count"] == 0
    assert r["source_seq"] is None and r["occurred_at"].endswith("Z")
    assert got[1]["correlation_id"] == "my-key-1" and got[1]["payload_json"] == '{"order_id":1}'
    c.close()


def test_sqlite3_rollback_leaves_nothing(sqlite_path):
    c = sqlite3.connect(sqlite_path)
    insert(c, Event("order.placed", b"{}"))
    c.rollback()
    assert rows(sqlite_path) == []


def test_sqlite3_bad_input_writes_nothing(sqlite_path, tmp_path):
    c = sqlite3.connect(sqlite_path)
    with pytest.raises(InvalidEventError, match="payload is not valid JSON"):
        insert(c, [Event("a", b"{}"), Event("b", b"{oops")])
    assert not c.in_transaction  # refused before the first row
    insert(c, Event("a", b"{}", id="dup"))
    c.commit()
    with pytest.raises(DuplicateEventError) as e:
        insert(c, [Event("a", b"{}", id="dup"), Event("a", b"{}", id="new")])
    assert e.value.ids == ["dup"]
    c.commit()  # the transaction stays usable: the caller decides
    assert [r["event_id"] for r in rows(sqlite_path)] == ["dup", "new"]

    auto = sqlite3.connect(sqlite_path, isolation_level=None)
    with pytest.raises(TransactionError, match="autocommit mode with no transaction open"):
        insert(auto, Event("a", b"{}"))
    auto.close()
    c.close()
    with pytest.raises(TransactionError, match="closed"):
        insert(c, Event("a", b"{}"))
    other = sqlite3.connect(tmp_path / "other.db")
    with pytest.raises(SchemaError, match="no outbox table"):
        insert(other, Event("a", b"{}"))
    assert len(rows(sqlite_path)) == 2


async def test_aiosqlite(sqlite_path):
    aiosqlite = pytest.importorskip("aiosqlite")
    async with aiosqlite.connect(sqlite_path) as c:
        ids = await insert_async(c, [Event("a", b'{"x": 1}'), Event("b", b'{"y": 2}')])
        await c.commit()
        await insert_async(c, Event("c", b"{}"))
        await c.rollback()
        with pytest.raises(TypeError, match="use insert_async"):
            insert(c, Event("a", b"{}"))
    assert [r["event_id"] for r in rows(sqlite_path)] == ids
    assert [r["payload_json"] for r in rows(sqlite_path)] == ['{"x":1}', '{"y":2}']
    with pytest.raises(TransactionError, match="closed"):
        await insert_async(c, Event("a", b"{}"))


def test_sqlalchemy_session(sqlite_path):
    sa = pytest.importorskip("sqlalchemy")
    from sqlalchemy.orm import Session

    engine = sa.create_engine(f"sqlite:///{sqlite_path}")
    with Session(engine) as s:
        ids = insert(s, Event("a", b'{"x": 1}', tenant_id="t1"))
        s.commit()
        insert(s, Event("b", b"{}"))
        s.rollback()
        with pytest.raises(DuplicateEventError):
            insert(s, Event("a", b"{}", id=ids[0]))
    got = rows(sqlite_path)
    assert [(r["event_id"], r["tenant_id"], r["payload_json"]) for r in got] == [(ids[0], "t1", '{"x":1}')]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", got[0]["created_at"])
