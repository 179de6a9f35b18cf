"""Verify the Standard Webhooks signatures postbox puts on what it pushes
to a target (a subscription with a ``secret``): ``webhook-id``,
``webhook-timestamp`` and ``webhook-signature``, which is ``v1,`` and the
base64 HMAC-SHA256 of ``id.timestamp.body`` keyed with the secret's
decoded bytes (several, space-separated, while postbox rotates secrets).

The ``standardwebhooks`` package verifies the same signatures; this module
does it with the standard library alone::

    from postbox import webhooks

    webhooks.verify("whsec_...", request.headers, body)  # raises on a bad one
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Iterable, Mapping
from typing import Any, Optional

from .errors import PostboxError

__all__ = ["verify", "sign", "parse_secret", "delivery_handle", "WebhookVerificationError", "TOLERANCE",
           "DELIVERY_HANDLE_HEADER"]

#: The header a push carries its item's delivery handle in (compact JSON).
DELIVERY_HANDLE_HEADER = "X-Postbox-Delivery-Handle"

#: How far a webhook's timestamp may be from now, either way, in seconds.
TOLERANCE = 300


class WebhookVerificationError(PostboxError):
    """A webhook whose headers are missing, whose timestamp is outside the
    tolerance, or whose signature no secret makes. Answer it 401."""


def parse_secret(secret: str | bytes) -> bytes:
    """The key of a secret: ``whsec_`` and base64 (the prefix optional), or
    the key's bytes themselves."""
    if isinstance(secret, (bytes, bytearray)):
        return bytes(secret)
    s = secret.strip()
    if s.startswith("whsec_"):
        s = s[len("whsec_"):]
    try:
        key = base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("webhook secret: want whsec_ and base64") from None
    if not key:
        raise ValueError("webhook secret: want whsec_ and base64")
    return key


def _mac(key: bytes, msg_id: str, timestamp: str, body: bytes) -> bytes:
    return hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()


def sign(secret: str | bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """The webhook-signature value for body sent as msg_id at timestamp
    (Unix seconds): ``v1,`` and base64."""
    return "v1," + base64.b64encode(_mac(parse_secret(secret), msg_id, str(timestamp), body)).decode()


def _header(headers: Mapping[str, str], name: str) -> str:
    v = headers.get(name)
    if v is None:
        for k, val in headers.items():
            if k.lower() == name:
                return val
        return ""
    return v


def verify(
    secrets: str | bytes | Iterable[str | bytes],
    headers: Mapping[str, str],
    body: bytes,
    *,
    tolerance: float = TOLERANCE,
    now: float | None = None,
) -> str:
    """Check that one of the webhook-signature's signatures is the HMAC of
    webhook-id, webhook-timestamp and the raw body under one of secrets,
    and that the timestamp is within tolerance seconds of now. Returns the
    webhook-id (the same at every attempt of one item: a key to skip
    redeliveries on); raises WebhookVerificationError otherwise.

    headers is any mapping of the request's headers (names matched without
    regard to case); body is the raw bytes as received, before any JSON
    parsing.
    """
    if isinstance(secrets, (str, bytes, bytearray)):
        secrets = [secrets]
    keys = [parse_secret(s) for s in secrets]
    if not keys:
        raise ValueError("verify: no secret")
    msg_id = _header(headers, "webhook-id")
    ts = _header(headers, "webhook-timestamp")
    sigs = _header(headers, "webhook-signature")
    if not msg_id or not ts or not sigs:
        raise WebhookVerificationError("missing webhook-id, webhook-timestamp or webhook-signature")
    if not ts.isdigit() or len(ts) > 18:
        raise WebhookVerificationError(f"webhook-timestamp {ts[:32]!r} is not Unix seconds")
    now = time.time() if now is None else now
    if abs(int(ts) - now) > tolerance:
        raise WebhookVerificationError(f"webhook-timestamp {ts} is more than {tolerance:g}s from now: refused as a replay")
    if isinstance(body, str):
        body = body.encode("utf-8")
    macs = [_mac(k, msg_id, ts, bytes(body)) for k in keys]
    for sig in sigs.split():
        version, _, value = sig.partition(",")
        if version != "v1":
            continue
        try:
            got = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            continue
        if any(hmac.compare_digest(got, m) for m in macs):
            return msg_id
    raise WebhookVerificationError("no signature matches: wrong secret, or the body was changed")


def delivery_handle(headers: Mapping[str, str]) -> Optional[dict[str, Any]]:
    """The delivery handle of a pushed item, decoded from its
    ``X-Postbox-Delivery-Handle`` header: where its event came from and
    where a reply goes (``kind``, and ``url`` when a reply can go
    somewhere; see the item's ``delivery_handle``). None when the push
    carries none, or the header is not a JSON object.
    """
    raw = _header(headers, DELIVERY_HANDLE_HEADER.lower())
    if not raw:
        return None
    try:
        v = json.loads(raw)
    except ValueError:
        return None
    return v if isinstance(v, dict) else None
