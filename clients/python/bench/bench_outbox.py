"""Outbox insert from Python (asyncpg): postbox.outbox.insert_async against
the same INSERT written by hand, in batches of --batch events per
transaction, alternating A/B rounds in one sitting.

    POSTBOX_TEST_POSTGRES=postgres://... /usr/bin/python3 clients/python/bench/bench_outbox.py

Both sides make their ids with postbox.new_event_id and send the same
statement (one unnest INSERT per transaction, RETURNING the ids); the
difference is what insert_async adds: checking each event (JSON, sizes,
trace context) and the connection's state, and comparing what came back.
It runs in a schema of its own, dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

import asyncpg  # noqa: E402

from postbox import new_event_id  # noqa: E402
from postbox.outbox import Event, insert_async  # noqa: E402

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
HAND = (
    "INSERT INTO outbox (event_id, event_type, payload, correlation_id, tenant_id, traceparent, tracestate) "
    "SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[]) "
    "ON CONFLICT (event_id) DO NOTHING RETURNING event_id"
)
PAYLOAD = json.dumps({"order_id": 42, "customer": "c-1001", "lines": [{"sku": "A-1", "qty": 2}], "total": "19.90"}).encode()


async def postbox_round(conn, txs, batch):
    for _ in range(txs):
        async with conn.transaction():
            await insert_async(conn, [Event("order.placed", PAYLOAD, tenant_id="acme") for _ in range(batch)])


async def hand_round(conn, txs, batch):
    text = PAYLOAD.decode()
    for _ in range(txs):
        ids = [new_event_id() for _ in range(batch)]
        async with conn.transaction():
            await conn.fetch(HAND, ids, ["order.placed"] * batch, [text] * batch, ids, ["acme"] * batch,
                             [""] * batch, [""] * batch)


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--db", default=os.environ.get("POSTBOX_TEST_POSTGRES", ""))
    p.add_argument("--rounds", type=int, default=6, help="rounds of each side, alternating")
    p.add_argument("--txs", type=int, default=50, help="transactions per round")
    p.add_argument("--batch", type=int, default=100, help="events per transaction")
    args = p.parse_args()
    if not args.db:
        sys.exit("set POSTBOX_TEST_POSTGRES or --db")
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(args.db)
    await admin.execute(f"CREATE SCHEMA {schema}")
    try:
        conn = await asyncpg.connect(args.db, server_settings={"search_path": schema})
        for f in sorted(os.listdir(os.path.join(REPO, "outbox", "outboxpg", "migrations"))):
            await conn.execute(open(os.path.join(REPO, "outbox", "outboxpg", "migrations", f)).read())
        await hand_round(conn, 5, args.batch)  # warm up both
        await postbox_round(conn, 5, args.batch)
        rates = {"postbox.outbox.insert_async": [], "hand-written INSERT": []}
        for r in range(args.rounds * 2):
            name, fn = (("hand-written INSERT", hand_round), ("postbox.outbox.insert_async", postbox_round))[r % 2]
            t = time.perf_counter()
            await fn(conn, args.txs, args.batch)
            rates[name].append(args.txs * args.batch / (time.perf_counter() - t))
        await conn.close()
    finally:
        await admin.execute(f"DROP SCHEMA {schema} CASCADE")
        await admin.close()
    for name, rs in rates.items():
        print(f"{name:30s} median {statistics.median(rs):9.0f} events/s  rounds: {' '.join(f'{x:.0f}' for x in rs)}")
    ratio = statistics.median(rates["postbox.outbox.insert_async"]) / statistics.median(rates["hand-written INSERT"])
    pairs = [a / b for a, b in zip(rates["postbox.outbox.insert_async"], rates["hand-written INSERT"])]
    print(f"ratio postbox/hand-written: {ratio:.2f} of the medians; round by round "
          f"{' '.join(f'{x:.2f}' for x in pairs)} (median {statistics.median(pairs):.2f})")


if __name__ == "__main__":
    asyncio.run(main())
