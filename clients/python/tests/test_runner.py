"""postbox.runner against a real postbox serve: every outcome is counted
at the server (GET /v1/inboxes, the items' attempts and last errors)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json

import pytest
from conftest import post_webhooks

from postbox.api import API, APIError
from postbox.runner import Permanent, RetryAfter, Runner


async def counts(api, inbox="webhooks"):
    for c in await api.inboxes():
        if c["inbox"] == inbox:
            return c
    return {"pending": 0, "processing": 0, "completed": 0, "failed": 0}


async def until(cond, timeout=30.0, what="condition"):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        got = await cond()
        if got:
            return got
        if loop.time() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s")
        await asyncio.sleep(0.02)


async def all_items(api, inbox="webhooks"):
    return (await api.items(inbox, limit=1000))["items"]


def post(server, kinds):
    for i, k in enumerate(kinds):
        post_webhooks(server.base, 1, prefix=f"{k}-{i}", body=json.dumps({"kind": k}).encode())


async def test_handles_every_item_once(server):
    post(server, ["ok"] * 60)
    seen = []

    async def handler(item):
        seen.append(item["event_id"])

    async with API(server.base) as api:
        r = Runner(api, "webhooks", handler, concurrency=8, wait=1.0)
        task = asyncio.ensure_future(r.run())
        await until(lambda: _completed(api, 60), what="60 items completed")
        r.stop()
        await asyncio.wait_for(task, 30)
        c = await counts(api)
    assert sorted(seen) == sorted(set(seen)) and len(seen) == 60
    assert (c["pending"], c["processing"], c["failed"]) == (0, 0, 0)


async def _completed(api, n):
    return (await counts(api))["completed"] == n


async def test_outcomes(server):
    """A permanent error dead-letters at once; a retry-after delays the next
    attempt by that much; another error by the backoff; a success acks."""
    post(server, ["ok", "permanent", "retry-after", "error"])
    calls = []

    async def handler(item):
        kind = item["payload"]["kind"]
        calls.append(kind)
        if kind == "permanent":
            raise Permanent("the order does not exist")
        if kind == "retry-after":
            raise RetryAfter(120, "rate limited")
        if kind == "error":
            raise ValueError("the database\nis down")

    async with API(server.base) as api:
        r = Runner(api, "webhooks", handler, concurrency=4, wait=1.0, backoff_base=600, backoff_max=600)
        task = asyncio.ensure_future(r.run())

        async def settled():
            c = await counts(api)
            return c["completed"] == 1 and c["failed"] == 1 and c["pending"] == 2

        await until(settled, what="1 completed, 1 failed, 2 pending")
        r.stop()
        await asyncio.wait_for(task, 30)
        items = {i["payload"]["kind"]: i for i in await all_items(api)}
    assert sorted(calls) == ["error", "ok", "permanent", "retry-after"]
    now = dt.datetime.now(dt.timezone.utc)

    def due(i):
        return dt.datetime.fromisoformat(i["next_attempt_at"].replace("Z", "+00:00"))

    assert items["ok"]["state"] == "completed"
    assert items["permanent"]["state"] == "failed" and items["permanent"]["attempts"] == 1
    assert items["permanent"]["last_error"] == "Permanent: the order does not exist"
    assert items["retry-after"]["state"] == "pending" and items["retry-after"]["last_error"] == "RetryAfter: rate limited"
    assert due(items["retry-after"]) > now + dt.timedelta(seconds=100)
    assert items["error"]["state"] == "pending" and items["error"]["last_error"] == "ValueError: the database is down"
    # The backoff has full jitter: anywhere up to backoff_max (600 s) from the nack.
    assert now - dt.timedelta(seconds=30) < due(items["error"]) < now + dt.timedelta(seconds=601)


async def test_a_job_outlasting_its_lease_keeps_it(server):
    """visibility 2s, a job of 5s: the heartbeat (every 2/3 s) extends the
    lease, so a second runner on the same inbox never gets the item; one
    attempt."""
    post(server, ["slow"])
    calls = []

    async def slow(item):
        calls.append(item["id"])
        await asyncio.sleep(5)

    async with API(server.base) as api:
        runners = [Runner(api, "webhooks", slow, concurrency=2, visibility_timeout=2.0, wait=0.5) for _ in range(2)]
        tasks = [asyncio.ensure_future(r.run()) for r in runners]
        await until(lambda: _completed(api, 1), timeout=30, what="the slow item completed")
        for r in runners:
            r.stop()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        (item,) = await all_items(api)
    assert len(calls) == 1
    assert item["attempts"] == 1 and item["state"] == "completed"


async def test_shutdown_hands_back_unfinished_items(server):
    post(server, ["stuck", "stuck"])
    started = []
    cancelled = []

    async def stuck(item):
        started.append(item["id"])
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(item["id"])
            raise

    async with API(server.base) as api:
        r = Runner(api, "webhooks", stuck, concurrency=2, wait=0.5, shutdown_timeout=0.3)
        task = asyncio.ensure_future(r.run())

        async def both():
            return len(started) == 2

        await until(both, what="both jobs started")
        r.stop()
        await asyncio.wait_for(task, 30)
        items = await all_items(api)
        assert sorted(cancelled) == sorted(started)
        now = dt.datetime.now(dt.timezone.utc)
        for i in items:
            assert i["state"] == "pending" and i["attempts"] == 1, i
            assert i["last_error"] == "cut off: the runner stopped"
            assert dt.datetime.fromisoformat(i["next_attempt_at"].replace("Z", "+00:00")) <= now
        # Another runner takes them at once.
        done = []

        async def ok(item):
            done.append(item["id"])

        r2 = Runner(api, "webhooks", ok, concurrency=2, wait=0.5)
        t2 = asyncio.ensure_future(r2.run())
        await until(lambda: _completed(api, 2), timeout=10, what="handed-back items completed")
        r2.stop()
        await asyncio.wait_for(t2, 30)
    assert sorted(done) == sorted(started)


async def test_cancelling_run_shuts_down_gracefully(server):
    post(server, ["stuck"])
    started = asyncio.Event()

    async def stuck(item):
        started.set()
        await asyncio.sleep(3600)

    async with API(server.base) as api:
        r = Runner(api, "webhooks", stuck, wait=0.5, shutdown_timeout=0.2)
        task = asyncio.ensure_future(r.run())
        await asyncio.wait_for(started.wait(), 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 30)
        (item,) = await all_items(api)
    assert item["state"] == "pending" and item["last_error"] == "cut off: the runner stopped"


async def test_a_lost_lease_cancels_the_handler(server):
    """An operator settles the item while its handler runs: the next
    heartbeat finds the lease lost, the handler is cancelled, and the
    runner settles nothing."""
    post(server, ["long"])
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def long(item):
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with API(server.base) as api:
        r = Runner(api, "webhooks", long, visibility_timeout=0.9, wait=0.5)
        task = asyncio.ensure_future(r.run())
        await asyncio.wait_for(started.wait(), 30)
        (item,) = await all_items(api)
        await api.ack("webhooks", "", [item["id"]])  # the operator's ack: any processing item
        await asyncio.wait_for(cancelled.wait(), 10)
        r.stop()
        await asyncio.wait_for(task, 30)
        (item,) = await all_items(api)
    assert item["state"] == "completed" and item["attempts"] == 1 and item["last_error"] is None


async def test_refused_for_good(server):
    async with API(server.base) as api:
        with pytest.raises(APIError) as e:
            await asyncio.wait_for(Runner(api, "not a name!", lambda i: None, wait=0.5).run(), 30)
    assert e.value.status == 400 and e.value.code == "invalid_field"


async def test_a_sync_handler_is_a_clear_failure(server):
    post(server, ["sync"])

    def sync_handler(item):
        return None

    async with API(server.base) as api:
        r = Runner(api, "webhooks", sync_handler, wait=0.5, backoff_base=600, backoff_max=600)
        task = asyncio.ensure_future(r.run())

        async def nacked():
            (i,) = await all_items(api)
            return i if i["state"] == "pending" and i["last_error"] else None

        item = await until(nacked, what="the item nacked")
        r.stop()
        await asyncio.wait_for(task, 30)
    assert item["last_error"] == "TypeError: the handler returned NoneType, not an awaitable: make it an async def"


async def test_items_leased_as_the_shutdown_begins_are_handed_back(server):
    """A lease whose answer arrives after stop(): its items are not
    started but nacked at once, for another runner."""
    post(server, ["late", "late", "late"])
    started = []
    holder = {}

    class StopsWhileLeasing(API):
        async def lease(self, inbox, **kw):
            got = await super().lease(inbox, **kw)
            if got["items"]:
                holder["runner"].stop()  # the shutdown begins while the answer is on its way
            return got

    async def handler(item):
        started.append(item["id"])

    async with StopsWhileLeasing(server.base) as api:
        r = Runner(api, "webhooks", handler, concurrency=4, wait=0.5)
        holder["runner"] = r
        await asyncio.wait_for(r.run(), 30)
        items = await all_items(api)
    assert started == []
    assert [(i["state"], i["attempts"], i["last_error"]) for i in items] == \
        [("pending", 1, "not started: the runner stopped")] * 3
