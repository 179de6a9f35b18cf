"""The typed API client against a real postbox serve."""

from __future__ import annotations

import pytest
from conftest import post_webhooks

from postbox.api import API, APIError, CallError


async def test_operator_calls(server):
    post_webhooks(server.base, 3, prefix="api")
    async with API(server.base) as api:
        (c,) = [c for c in await api.inboxes() if c["inbox"] == "webhooks"]
        assert c["pending"] == 3
        page = await api.items("webhooks", state="pending", limit=2)
        assert len(page["items"]) == 2 and page["next_after"] > 0
        rest = await api.items("webhooks", after=page["next_after"])
        assert len(rest["items"]) == 1
        one = await api.item("webhooks", page["items"][0]["id"])
        assert one["event_id"] == page["items"][0]["event_id"]
        lease = await api.lease("webhooks", max=3, visibility_timeout=30)
        assert len(lease["items"]) == 3 and lease["lease"]
        ids = [i["id"] for i in lease["items"]]
        ext = await api.extend("webhooks", lease["lease"], ids[:1], 60)
        assert ext["items"][0].get("state") == "processing"
        assert [r.get("state") for r in await api.ack("webhooks", lease["lease"], ids[:1])] == ["completed"]
        res = await api.nack("webhooks", lease["lease"], ids[1:2], dead=True, reason="no")
        assert res[0].get("state") == "failed"
        dead = await api.dead_letters(inbox="webhooks")
        assert [i["id"] for i in dead["items"]] == ids[1:2]
        back = await api.replay_dead_letter(ids[1])
        assert back["state"] == "pending"
        # An ack under a lease that no longer holds the item: an error per item.
        res = await api.ack("webhooks", lease["lease"], ids[1:2])
        assert res[0]["error"]["code"] in ("lease_lost", "invalid_state")
        assert any(s["name"] == "webhooks" for s in await api.subscriptions())
        assert any(s["stream"] == "webhooks" for s in await api.streams())
        with pytest.raises(APIError) as e:
            await api.subscription("no-such-subscription")
        assert e.value.not_found and e.value.code == "not_found"


async def test_no_server():
    async with API("http://127.0.0.1:1", timeout=5) as api:
        with pytest.raises(CallError, match="connect to 127.0.0.1:1"):
            await api.inboxes()
    with pytest.raises(ValueError, match="want http://HOST:PORT"):
        API("ftp://x")
