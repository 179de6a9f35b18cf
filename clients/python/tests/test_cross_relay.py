"""Python producers, the real relay and server: rows written by Python in
a committed transaction are relayed by ``postbox relay`` to ``postbox
serve`` and arrive at a target byte for byte (payload, ids, trace
context), signed; rows of a rolled-back transaction never leave."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import time
import urllib.parse

import pytest
from conftest import SECRET, Proc, free_port, start_server

from postbox import webhooks
from postbox.api import API
from postbox.outbox import Event, insert, insert_async

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
COMMITTED = [
    Event("order.placed", b'{"order_id": 1,  "lines": [{"sku": "A-1", "qty": 2}], "note": "caf\xc3\xa9 \\u00e9"}',
          correlation_id="checkout-1", tenant_id="acme", traceparent=TP, tracestate="congo=t61rcWkgMzE"),
    Event("order.paid", {"order_id": 1, "amount": 1990}),
    Event("order.shipped", b'{"order_id":1,"carrier":"ups"}', tenant_id="pi/01", id="ship-key-1"),
]
ROLLED_BACK = [Event("order.placed", b'{"order_id": 2}'), Event("order.placed", b'{"order_id": 3}')]


def expected_body(e: Event) -> bytes:
    """The payload as written, with the white space between tokens
    removed: what a postbox server stores and pushes (docs/OUTBOX.md)."""
    from postbox._check import compact
    from postbox.outbox import _prepare

    return compact(_prepare(e, False)[2]).encode()


async def write_postgres(pg):
    """asyncpg and psycopg, each one committed and one rolled-back
    transaction."""
    c = await pg.asyncpg()
    try:
        async with c.transaction():
            ids = await insert_async(c, COMMITTED[:2])
        with pytest.raises(RuntimeError):
            async with c.transaction():
                await insert_async(c, ROLLED_BACK[0])
                raise RuntimeError("the business write failed")
    finally:
        await c.close()
    with pg.psycopg() as s:
        with s.transaction():
            ids += insert(s, COMMITTED[2])
        s.rollback()
        insert(s, ROLLED_BACK[1])
        s.rollback()
    return ids


def write_sqlite(path):
    c = sqlite3.connect(path)
    ids = insert(c, COMMITTED)
    c.commit()
    insert(c, ROLLED_BACK)
    c.rollback()
    c.close()
    return ids


def outbox_drained(db, dsn_or_path, pg) -> bool:
    if db == "sqlite":
        c = sqlite3.connect(dsn_or_path)
        try:
            return c.execute("SELECT count(*) FROM outbox").fetchone()[0] == 0
        finally:
            c.close()
    with pg.psycopg() as c:
        return c.execute("SELECT count(*) FROM outbox WHERE delivered_at IS NULL").fetchone()[0] == 0


@pytest.mark.parametrize("db", ["postgres", "sqlite"])
async def test_python_rows_are_relayed_byte_for_byte(db, request, postbox_bin, tmp_path, target):
    pg = request.getfixturevalue("pg") if db == "postgres" else None
    if db == "postgres":
        ids = await write_postgres(pg)
        source = pg.url
    else:
        # The file as postbox makes it: the migrations and their versions.
        source = str(tmp_path / "service.db")
        sqlite3.connect(source).close()  # the service's own database
        subprocess.run([postbox_bin, "migrate", "up", "--outbox", source], check=True, capture_output=True, timeout=60)
        ids = write_sqlite(source)
    server = start_server(postbox_bin, tmp_path)
    relay = None
    try:
        async with API(server.base) as api:
            await api.create_subscription("orders", "devices", target=target.url, secret=SECRET, start="earliest")
            relay = Proc([postbox_bin, "relay", "--db", source, "--to", "ws://" + server.addr, "--listen",
                          f"127.0.0.1:{free_port()}", "--poll", "100ms", "--log-level", "warn"], tmp_path / "relay.log")
            got = await asyncio.to_thread(target.take, len(COMMITTED), 90.0, relay)
            deadline = time.monotonic() + 30
            while not outbox_drained(db, source, pg):
                assert time.monotonic() < deadline, f"the outbox did not drain:\n{relay.output()}"
                await asyncio.sleep(0.05)
            # Everything committed was relayed; a rolled-back row never left.
            assert (await api.stream("devices"))["events"] == len(COMMITTED)
            items = {i["event_id"]: i for i in (await api.items("orders"))["items"]}
    finally:
        if relay:
            relay.stop()
        server.proc.stop()
    assert target.received.empty()
    by_key = {h["idempotency-key"]: (h, body) for h, body in got}
    for e, eid in zip(COMMITTED, ids):
        tenant = e.tenant_id or "outbox"
        key = urllib.parse.quote(tenant, safe="") + "/" + eid
        assert key in by_key, f"{key} not among {sorted(by_key)}"
        h, body = by_key[key]
        assert body == expected_body(e), (body, e.payload)
        assert h["x-event-type"] == e.type
        assert h.get("traceparent", "") == e.traceparent and h.get("tracestate", "") == e.tracestate
        webhooks.verify(SECRET, h, body)
        meta = items[eid]["metadata"]
        assert meta["session_id"] == (e.correlation_id or eid) and meta["device_id"] == tenant
        assert meta.get("traceparent", "") == e.traceparent
    assert ids[2] == "ship-key-1"
