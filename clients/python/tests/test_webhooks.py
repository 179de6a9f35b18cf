"""postbox.webhooks.verify against the Standard Webhooks test vector, and
against the signatures a real postbox serve puts on what it pushes."""

from __future__ import annotations

import asyncio
import json

import pytest
from conftest import SECRET, post_webhooks

from postbox import webhooks
from postbox.api import API
from postbox.webhooks import WebhookVerificationError

# The Standard Webhooks specification's vector (also Go's stdwebhook tests').
V_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
V_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
V_TS = 1614265330
V_BODY = b'{"test": 2432232314}'
V_SIG = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def headers(sig=V_SIG, ts=V_TS, id=V_ID):
    return {"Webhook-Id": id, "webhook-timestamp": str(ts), "WEBHOOK-SIGNATURE": sig}


def test_vector():
    assert webhooks.sign(V_SECRET, V_ID, V_TS, V_BODY) == V_SIG
    assert webhooks.verify(V_SECRET, headers(), V_BODY, now=V_TS) == V_ID
    # Several signatures (a rotation): one matching is enough; so is one of several secrets.
    assert webhooks.verify(V_SECRET, headers("v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc= " + V_SIG), V_BODY, now=V_TS)
    assert webhooks.verify(["whsec_" + "QUFBQUFBQUFBQUFBQUFBQQ==", V_SECRET], headers(), V_BODY, now=V_TS)


@pytest.mark.parametrize(
    "hdrs, body, now, says",
    [
        (headers(), V_BODY + b" ", V_TS, "no signature matches"),
        (headers(), V_BODY, V_TS + 301, "more than 300s from now"),
        (headers(), V_BODY, V_TS - 301, "more than 300s from now"),
        (headers(sig="v2," + V_SIG[3:]), V_BODY, V_TS, "no signature matches"),
        (headers(id="msg_other"), V_BODY, V_TS, "no signature matches"),
        ({"webhook-id": V_ID, "webhook-timestamp": str(V_TS)}, V_BODY, V_TS, "missing"),
        (headers(ts="9223372036854775808"), V_BODY, V_TS, "not Unix seconds"),
        (headers(ts="-1"), V_BODY, V_TS, "not Unix seconds"),
    ],
)
def test_refused(hdrs, body, now, says):
    with pytest.raises(WebhookVerificationError, match=says):
        webhooks.verify(V_SECRET, hdrs, body, now=now)


def test_bad_secret():
    with pytest.raises(ValueError, match="whsec_ and base64"):
        webhooks.verify("whsec_not base64!", headers(), V_BODY, now=V_TS)


async def test_signatures_of_a_real_server(server, target):
    """A subscription with a secret: what postbox serve pushes verifies
    with the secret, and not with another, and the body is the webhook's
    bytes."""
    async with API(server.base) as api:
        await api.create_subscription("signed", "webhooks", target=target.url, secret=SECRET)
        bodies = [b'{"n": 1,  "s": "\xc3\xa9"}', b'{"n":2}']
        for i, b in enumerate(bodies):
            post_webhooks(server.base, 1, prefix=f"sig{i}", body=b)
        got = await asyncio.to_thread(target.take, 2, 60.0, server.proc)
    by_body = {body: hdrs for hdrs, body in got}
    assert set(by_body) == set(bodies)
    for body, hdrs in by_body.items():
        msg_id = webhooks.verify(SECRET, hdrs, body)
        assert msg_id == hdrs["webhook-id"] and msg_id.startswith("item_")
        with pytest.raises(WebhookVerificationError):
            webhooks.verify(V_SECRET, hdrs, body)
        with pytest.raises(WebhookVerificationError):
            webhooks.verify(SECRET, hdrs, body.replace(b"1", b"3").replace(b"2", b"3"))
        assert json.loads(body)


def test_delivery_handle():
    h = '{"kind":"github","repository":"o/r","issue":12,"url":"https://api.github.com/repos/o/r/issues/12/comments"}'
    assert webhooks.delivery_handle({"X-Postbox-Delivery-Handle": h})["url"] == "https://api.github.com/repos/o/r/issues/12/comments"
    assert webhooks.delivery_handle({"x-postbox-delivery-handle": '{"kind":"device","device_id":"pi","session_id":"s"}'}) == {
        "kind": "device", "device_id": "pi", "session_id": "s"}
    assert webhooks.delivery_handle({}) is None
    assert webhooks.delivery_handle({"X-Postbox-Delivery-Handle": "not json"}) is None
    assert webhooks.delivery_handle({"X-Postbox-Delivery-Handle": "[1]"}) is None
