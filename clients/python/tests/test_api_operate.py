"""The client's operating calls against a real postbox serve: pause and
resume, a test event, an event's deliveries, search, cancel and discard."""

from __future__ import annotations

import asyncio
import time

import pytest
from conftest import post_webhooks

from postbox.api import API, APIError


async def test_pause_test_event_search_cancel_discard(server, target):
    async with API(server.base) as api:
        sub = await api.pause_subscription("webhooks", reason="handler deploy")
        assert sub["paused"] is True and sub["paused_at"] and sub["paused_reason"] == "handler deploy"
        post_webhooks(server.base, 3, prefix="ops")
        deadline = time.monotonic() + 30
        while (sub := await api.subscription("webhooks"))["counts"]["pending"] < 3:
            assert time.monotonic() < deadline, sub
            await asyncio.sleep(0.05)
        assert sub["paused"] is True and sub["counts"]["inbox"] == "webhooks"
        # Paused: a lease takes none of its items.
        assert (await api.lease("webhooks", max=3))["items"] == []
        sub = await api.resume_subscription("webhooks")
        assert sub["paused"] is False and sub["paused_at"] is None and sub["paused_reason"] is None

        # A test event goes to the target and is stored nowhere.
        await api.create_subscription("hook", "webhooks", target=target.url)
        sent = await api.test_subscription("hook")
        assert sent["ok"] is True and sent["status_code"] == 200 and sent["type"] == "postbox.test"
        assert sent["event_id"].startswith("test_") and sent["error"] is None
        got = await asyncio.to_thread(target.take, 1, 30.0, server.proc)
        assert got[0][0]["idempotency-key"] == sent["event_id"]
        with pytest.raises(APIError) as e:
            await api.test_subscription("webhooks")  # no target: runtimes lease it
        assert e.value.status == 400

        # An event and what each subscription made of it.
        ev = await api.event_by_id("webhooks", "ops-0")
        assert ev["event_id"] == "ops-0" and ev["stream"] == "webhooks"
        (d,) = [d for d in ev["deliveries"] if d["subscription"] == "webhooks"]
        assert d["status"] == "item" and d["item"]["state"] == "pending" and d["paused"] is False
        assert (await api.event("webhooks", ev["offset"]))["id"] == ev["id"]
        with pytest.raises(APIError) as e:
            await api.event("webhooks", 10_000)
        assert e.value.not_found

        # Search, newest first.
        page = await api.search_events("webhooks", id="ops-1")
        assert [x["event_id"] for x in page["events"]] == ["ops-1"] and "deliveries" not in page["events"][0]
        page = await api.search_events("webhooks", limit=2)
        assert [x["event_id"] for x in page["events"]] == ["ops-2", "ops-1"] and page["next_before"] > 0
        items = (await api.search_items("webhooks", state="pending"))["items"]
        assert sorted(i["event_id"] for i in items) == ["ops-0", "ops-1", "ops-2"]
        (i0,) = (await api.search_items("webhooks", id="ops-0"))["items"]
        (i1,) = (await api.search_items("webhooks", id="ops-1"))["items"]

        # Cancel: a dead letter; discard: gone.
        cancelled = await api.cancel_item("webhooks", i0["id"], reason="wrong customer")
        assert cancelled["state"] == "failed" and "cancelled" in cancelled["last_error"]
        with pytest.raises(APIError) as e:
            await api.cancel_item("webhooks", i0["id"])
        assert e.value.status == 409 and e.value.code == "invalid_state"
        assert (await api.discard_item("webhooks", i1["id"]))["id"] == i1["id"]
        with pytest.raises(APIError) as e:
            await api.item("webhooks", i1["id"])
        assert e.value.not_found
        with pytest.raises(APIError) as e:
            await api.discard_dead_letters()
        assert e.value.status == 400 and e.value.code == "missing_field"
        out = await api.discard_dead_letters(inbox="webhooks", ids=[i0["id"]])
        assert out == {"discarded": 1, "ids": [i0["id"]]}
        assert (await api.dead_letters(inbox="webhooks"))["items"] == []


async def test_reply(server, target):
    """A reply to a webhook whose handle header names the target arrives
    there, once per key: the same key and body again is the same reply,
    another body a 409."""
    import json
    import urllib.request

    def post(path: str, body: bytes, headers: dict[str, str]) -> int:
        req = urllib.request.Request(server.base + path, data=body, method="POST",
                                     headers={"Content-Type": "application/json", **headers})
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status

    source = {"name": "talk", "kind": "webhook", "settings": {"handle_header": "X-Reply-To"}}
    assert post("/v1/sources", json.dumps(source).encode(), {}) == 201
    async with API(server.base) as api:
        await api.create_subscription("talk-in", "talk")
        assert post("/webhooks/talk", b'{"n": 1}', {"Idempotency-Key": "t-1", "X-Reply-To": target.url}) == 202
        deadline = time.monotonic() + 30
        while not (items := (await api.items("talk-in"))["items"]):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        item = items[0]
        assert item["delivery_handle"] == {"kind": "webhook", "url": target.url}
        r = await api.reply("talk-in", item["id"], {"text": "hi"}, key="k")
        assert r["key"] == "k" and r["url"] == target.url and r["state"] == "pending"
        headers, body = (await asyncio.to_thread(target.take, 1, 30.0, server.proc))[0]
        assert body == b'{"text":"hi"}' and headers["content-type"] == "application/json"
        assert (await api.reply("talk-in", item["id"], {"text": "hi"}, key="k"))["key"] == "k"
        with pytest.raises(APIError) as e:
            await api.reply("talk-in", item["id"], {"text": "other"}, key="k")
        assert e.value.status == 409 and e.value.code == "conflict"
        deadline = time.monotonic() + 30
        while (rs := await api.replies("talk-in", item["id"]))[0]["state"] != "completed":
            assert time.monotonic() < deadline, rs
            await asyncio.sleep(0.05)
        assert len(rs) == 1 and rs[0]["attempt_log"][0]["status_code"] == 200
        with pytest.raises(APIError) as e:
            await api.retry_reply("talk-in", item["id"], "k")
        assert e.value.status == 409 and e.value.code == "invalid_state"
