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


def redis_command(url: str, *args: str):
    """One command to the Redis at url over RESP, with the socket module
    alone; returns the decoded reply (bulk strings as bytes)."""
    import socket

    u = urllib.parse.urlsplit(url)
    with socket.create_connection((u.hostname or "127.0.0.1", u.port or 6379), timeout=10) as s:
        f = s.makefile("rb")

        def send(*parts: str) -> None:
            out = [f"*{len(parts)}\r\n".encode()]
            for p in parts:
                b = p.encode()
                out.append(b"$%d\r\n%s\r\n" % (len(b), b))
            s.sendall(b"".join(out))

        def read():
            line = f.readline()
            kind, rest = line[:1], line[1:-2]
            if kind == b"*":
                n = int(rest)
                return None if n < 0 else [read() for _ in range(n)]
            if kind == b"$":
                n = int(rest)
                return None if n < 0 else f.read(n + 2)[:-2]
            if kind == b":":
                return int(rest)
            if kind == b"-":
                raise AssertionError(f"redis: {rest.decode()}")
            return rest

        db = (u.path or "/0").strip("/") or "0"
        if db != "0":
            send("SELECT", db)
            read()
        send(*args)
        return read()


async def test_relayed_to_redis_with_the_bytes_as_written(pg, postbox_bin, tmp_path):
    """To Redis Streams the relay sends the payload as the producer wrote
    it: spacing, key order, duplicate keys, line breaks."""
    import os
    import uuid

    from conftest import need

    url = os.environ.get("POSTBOX_TEST_REDIS", "")
    if not url:
        need("POSTBOX_TEST_REDIS is not set; this test needs a real Redis (see README, Development)")
    stream = f"py-outbox-{uuid.uuid4().hex[:12]}"
    raw = b'{"b": 1,\n  "a": [1, 2.50, "caf\xc3\xa9"],  "b": 2}'
    events = [Event("order.placed", raw, correlation_id="chk-9", tenant_id="acme", traceparent=TP, tracestate="k=v"),
              Event("order.paid", b' {"n":1} ')]
    c = await pg.asyncpg()
    try:
        async with c.transaction():
            ids = await insert_async(c, events)
    finally:
        await c.close()
    sep = "&" if "?" in url else "?"
    relay = Proc([postbox_bin, "relay", "--db", pg.url, "--to", f"{url}{sep}stream={stream}", "--listen",
                  f"127.0.0.1:{free_port()}", "--poll", "100ms", "--log-level", "warn"], tmp_path / "relay.log")
    try:
        deadline = time.monotonic() + 60
        while True:
            entries = redis_command(url, "XRANGE", stream, "-", "+")
            if entries and len(entries) >= 2:
                break
            assert time.monotonic() < deadline, f"the stream has {entries!r}:\n{relay.output()}"
            await asyncio.sleep(0.05)
    finally:
        relay.stop()
        redis_command(url, "DEL", stream)
    got = [dict(zip(fields[::2], fields[1::2])) for _, fields in entries]
    assert [g[b"event_id"].decode() for g in got] == ids
    assert got[0][b"payload"] == raw and got[1][b"payload"] == b' {"n":1} '
    assert (got[0][b"type"], got[0][b"correlation_id"], got[0][b"tenant_id"]) == (b"order.placed", b"chk-9", b"acme")
    assert (got[0][b"traceparent"], got[0][b"tracestate"]) == (TP.encode(), b"k=v")
    assert got[1][b"correlation_id"] == ids[1].encode() and b"tenant_id" not in got[1]
