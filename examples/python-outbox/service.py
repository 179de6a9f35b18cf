"""An order service on asyncio and asyncpg that uses postbox end to end:

1. It places orders: each order row and its "order.placed" event are
   written in one transaction (postbox.outbox.insert_async), so an order
   whose transaction fails leaves neither; every fifth order fails on
   purpose, after its event was written, and is rolled back.
2. ``postbox relay`` (started by you) sends the events from the outbox
   table to ``postbox serve``.
3. A shipping consumer (postbox.runner.Runner) leases the events from the
   inbox of the subscription "shipping" and creates one shipment per order
   inside postbox.dedup.handle_async, so an event delivered twice ships
   once: the first delivery of order 3 "crashes" after its shipment
   committed, the server delivers it again, and dedup skips it.

It keeps its tables in a schema of its own (python_outbox_example). See
README.md for the commands.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

try:
    import postbox  # noqa: F401
except ImportError:  # run from a checkout without pip install ./clients/python
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python", "src"))

import asyncpg

from postbox import dedup
from postbox.api import API, APIError
from postbox.outbox import Event, insert_async
from postbox.runner import Runner

SCHEMA = "python_outbox_example"


class PaymentDeclined(Exception):
    pass


async def place_order(conn: asyncpg.Connection, n: int) -> str:
    """The service's business write and its event, in one transaction."""
    async with conn.transaction():
        order_id = await conn.fetchval("INSERT INTO orders (total_cents) VALUES ($1) RETURNING id", 1000 + n)
        payload = json.dumps({"order_id": order_id, "total_cents": 1000 + n}).encode()
        (event_id,) = await insert_async(conn, Event("order.placed", payload, correlation_id=f"checkout-{n}"))
        if n % 5 == 0:
            raise PaymentDeclined(f"order {order_id}: payment declined")  # rolls back the order and its event
    return event_id


async def setup(conn: asyncpg.Connection) -> None:
    await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    await conn.execute("""
        CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, total_cents int NOT NULL);
        CREATE TABLE IF NOT EXISTS shipments (order_id bigint PRIMARY KEY, event_id text NOT NULL);
    """)
    await dedup.migrate_async(conn)  # the inbox table of per-handler dedup


async def wait_for_outbox(conn: asyncpg.Connection) -> None:
    said = False
    while not await conn.fetchval("SELECT to_regclass('outbox') IS NOT NULL"):
        if not said:
            print(f"waiting for the outbox table in schema {SCHEMA}: start postbox relay (see README.md)")
            said = True
        await asyncio.sleep(0.5)


async def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db", default=os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test"))
    p.add_argument("--server", default=os.environ.get("POSTBOX_URL", "http://127.0.0.1:8000"))
    p.add_argument("--orders", type=int, default=20)
    p.add_argument("--setup-only", action="store_true", help="create the schema and tables, then exit")
    args = p.parse_args()

    pool = await asyncpg.create_pool(args.db, min_size=2, max_size=8, server_settings={"search_path": SCHEMA})
    async with pool.acquire() as conn:
        # The schema first, then its tables (search_path names it).
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
        await setup(conn)
        if args.setup_only:
            print(f"schema {SCHEMA} ready")
            return 0
        await wait_for_outbox(conn)

    placed, declined = [], 0
    async with pool.acquire() as conn:
        for n in range(1, args.orders + 1):
            try:
                placed.append(await place_order(conn, n))
            except PaymentDeclined:
                declined += 1
    print(f"placed {len(placed)} orders ({declined} declined and rolled back: their events never leave)")

    shipped, skipped, crashed = 0, 0, set()

    async def ship(item) -> None:
        nonlocal shipped, skipped
        order = item["payload"]

        async def create_shipment(conn: asyncpg.Connection) -> None:
            await conn.execute("INSERT INTO shipments (order_id, event_id) VALUES ($1, $2)",
                               order["order_id"], item["event_id"])

        async with pool.acquire() as conn:
            ran = await dedup.handle_async(conn, "shipping", item["event_id"], create_shipment)
        if not ran:
            skipped += 1
            return
        shipped += 1
        if order["order_id"] == 3 and item["event_id"] not in crashed:
            crashed.add(item["event_id"])
            raise RuntimeError("crashed after the shipment committed")  # nacked: delivered again

    async with API(args.server, token=os.environ.get("POSTBOX_API_TOKEN")) as api:
        try:
            await api.create_subscription("shipping", "devices", types=["order.placed"], start="earliest")
        except APIError as e:
            if e.status != 409:
                raise
        runner = Runner(api, "shipping", ship, concurrency=8, wait=1.0, backoff_base=0.2, backoff_max=1.0)
        task = asyncio.ensure_future(runner.run())
        # Until every placed order shipped and the redelivery of order 3's
        # event was skipped (a minute at most).
        need_skip = args.orders >= 3
        async with pool.acquire() as conn:
            for _ in range(600):
                done = await conn.fetchval("SELECT count(*) FROM shipments WHERE event_id = ANY($1::text[])", placed)
                if done == len(placed) and (skipped or not need_skip):
                    break
                await asyncio.sleep(0.1)
        runner.stop()
        await task
    async with pool.acquire() as conn:
        total = await conn.fetchval("SELECT count(*) FROM shipments WHERE event_id = ANY($1::text[])", placed)
    await pool.close()
    print(f"shipped {total} orders once each ({shipped} handled, {skipped} redelivery skipped by dedup)")
    return 0 if total == len(placed) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
