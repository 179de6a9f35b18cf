"""A typed asyncio client of the HTTP API of ``postbox serve``
(docs/API.md, docs/openapi.json): the operator's calls (inboxes, items,
dead letters, subscriptions, sources, streams, replays, webhooks) and the
runtime's (lease, ack, nack, extend), which ``postbox.runner`` is built
on.

An answer of 400 and above raises ``APIError`` (its ``code`` is the API's
error code: ``not_found``, ``lease_lost``, ``invalid_field``, ...); a call
that got no answer raises ``CallError``. Answers are the server's JSON as
``TypedDict``s, whose fields tests check against docs/openapi.json.
"""

from __future__ import annotations

import json
import urllib.parse
from datetime import datetime
from typing import Any, Optional, TypedDict

from ._http import CallError, Client
from .errors import PostboxError

__all__ = [
    "API", "APIError", "CallError", "Item", "Lease", "ItemResult", "SettleResults", "Extension",
    "InboxCounts", "ItemPage", "Subscription", "Stream", "Consumer", "Source", "Webhook", "Replay",
    "Attempt", "Reply", "SubscriptionCounts", "TestDelivery", "Delivery", "Event", "EventPage", "ItemSearchPage", "Discarded",
    "DeliveryHandle",
    "go_duration", "DEFAULT_TIMEOUT",
]

#: Bounds one call (a lease adds its wait), in seconds.
DEFAULT_TIMEOUT = 30.0


class ErrorBody(TypedDict):
    code: str
    message: str


class ItemResult(TypedDict, total=False):
    """One item's outcome of an ack, nack or extend: its state, or an error
    (``not_found``, ``lease_lost``, ``invalid_state``)."""

    id: int
    state: str
    error: ErrorBody


class DeliveryHandle(TypedDict, total=False):
    """An event's delivery handle (docs/API.md, Delivery handles): where it
    came from and where a reply goes, captured at intake. ``kind`` is
    github, stripe, cloudevents, poll, webhook or device; ``url``, when a
    reply can go somewhere, is an absolute http(s) URL. Other members
    describe the target by kind (repository and issue, object and id,
    source and subject, target, device_id and session_id, a poll source's
    own). A device's event has one made from its device_id and session_id,
    which postbox cannot reply to."""

    kind: str
    url: str


class Item(TypedDict):
    id: int
    inbox: str
    subscription: str
    stream: str
    offset: int
    stream_event_id: str
    #: The same on every attempt: the key of an idempotent handler.
    event_id: str
    type: str
    occurred_at: str
    source_sequence: Optional[int]
    stored_at: str
    metadata: dict[str, Any]
    payload: Any
    #: Where the event came from and where a reply goes; None when it has none.
    delivery_handle: Optional[DeliveryHandle]
    state: str
    attempts: int
    next_attempt_at: str
    lease_expires_at: Optional[str]
    last_error: Optional[str]
    created_at: str
    updated_at: str
    failed_at: Optional[str]
    replayed_at: Optional[str]
    replays: int
    last_error_past: bool  # completed after last_error: it is history
    #: The item's key in an ordered subscription (``order_by``); None in an unordered one.
    order_key: Optional[str]


class Lease(TypedDict):
    lease: str
    expires_at: str
    items: list[Item]


class SettleResults(TypedDict):
    items: list[ItemResult]


class Extension(TypedDict):
    expires_at: str
    items: list[ItemResult]


class InboxCounts(TypedDict):
    inbox: str
    pending: int
    processing: int
    completed: int
    failed: int
    oldest_pending_at: Optional[str]


class ItemPage(TypedDict):
    items: list[Item]
    next_after: int


class SubscriptionCounts(TypedDict):
    """A subscription's items by state: its share of its inbox's."""

    inbox: str
    pending: int
    processing: int
    completed: int
    failed: int


class Subscription(TypedDict, total=False):
    name: str
    source: str
    stream: str
    inbox: str
    types: list[str]
    metadata: dict[str, str]
    start: str
    start_offset: int
    start_time: Optional[str]
    target: Optional[str]
    secrets: list[dict[str, Any]]
    headers: dict[str, str]
    created_at: str
    next_offset: int
    high_watermark: int
    lag: int
    #: In the list and a get; absent in other answers.
    counts: SubscriptionCounts
    #: An operator paused its delivery (``pause_subscription``).
    paused: bool
    paused_at: Optional[str]
    paused_reason: Optional[str]
    #: Ordered delivery per key: where the key comes from, and "block" or
    #: "skip" for a key's dead letter; None when unordered.
    order_by: Optional[str]
    on_dead_letter: Optional[str]
    #: In the list and a get of an ordered subscription: {"keys", "oldest_at"}.
    held: dict[str, Any]


class Stream(TypedDict, total=False):
    stream: str
    source: str
    backend: str
    events: int
    first_offset: int
    last_offset: int
    first_stored_at: Optional[str]
    last_stored_at: Optional[str]
    created_at: str


class Consumer(TypedDict, total=False):
    consumer: str
    subscription: str
    stream: str
    next_offset: int
    high_watermark: int
    lag: int
    updated_at: str


class Source(TypedDict, total=False):
    name: str
    kind: str
    stream: str
    settings: dict[str, Any]
    path: str
    created_at: str


class Webhook(TypedDict, total=False):
    id: str
    idempotency_key: str
    type: str
    status: str
    created_at: str
    updated_at: str
    attempts: int
    last_error: str


class Replay(TypedDict, total=False):
    id: str
    subscription: str
    inbox: str
    state: str
    matched: int
    replayed: int
    created_at: str
    updated_at: str
    finished_at: Optional[str]


class Attempt(TypedDict, total=False):
    attempt: int
    attempted_at: str
    endpoint_url: str
    status_code: int
    latency_ms: float
    error: Optional[str]
    response_excerpt: Optional[str]


class Reply(TypedDict, total=False):
    """A reply to an item's event, sent to the url of its delivery handle:
    ``pending`` until the target answers 2xx (``completed``); ``failed`` is
    a dead letter."""

    key: str
    item: int
    url: str
    body: Any
    state: str
    attempts: int
    next_attempt_at: Optional[str]
    last_error: Optional[str]
    created_at: str
    updated_at: str
    attempt_log: list[Attempt]


class TestDelivery(TypedDict):
    """What a subscription's endpoint answered a test event: ``ok`` for a
    2xx; ``status_code`` is 0 when no answer came."""

    event_id: str
    type: str
    endpoint_url: str
    attempted_at: str
    ok: bool
    status_code: int
    latency_ms: float
    error: Optional[str]
    response_excerpt: Optional[str]


class Delivery(TypedDict, total=False):
    """What one subscription made of one event: ``status`` is ``item``
    (``item`` and ``attempts`` say how it went), ``unread`` or ``none``
    (``reason`` says why)."""

    subscription: str
    inbox: str
    deleted: bool
    paused: bool
    status: str
    reason: str
    item: Optional[Item]
    attempts: list[Attempt]


class Event(TypedDict, total=False):
    id: str
    stream: str
    source: str
    offset: int
    event_id: str
    variant: str
    type: str
    occurred_at: str
    source_sequence: Optional[int]
    stored_at: str
    metadata: Any
    payload: Any
    #: Where the event came from and where a reply goes; None when it has none.
    delivery_handle: Optional[DeliveryHandle]
    webhook_id: str
    #: In the answers about one event; a search leaves it out.
    deliveries: list[Delivery]


class EventPage(TypedDict):
    events: list[Event]
    #: Pass as ``before`` for the next page; 0: there are no more.
    next_before: int


class ItemSearchPage(TypedDict):
    items: list[Item]
    next_before: int


class Discarded(TypedDict):
    discarded: int
    ids: list[int]


#: Each answer type and its schema in docs/openapi.json (tests check that
#: every field named here is there).
SCHEMAS: dict[str, type] = {
    "Item": Item, "Lease": Lease, "SettleResults": SettleResults, "Extension": Extension,
    "Inbox": InboxCounts, "ItemPage": ItemPage, "Subscription": Subscription, "Stream": Stream,
    "Consumer": Consumer, "Source": Source, "Webhook": Webhook, "Replay": Replay, "Attempt": Attempt, "Reply": Reply,
    "SubscriptionCounts": SubscriptionCounts, "TestDelivery": TestDelivery, "Delivery": Delivery, "Event": Event,
    "EventPage": EventPage, "ItemSearchPage": ItemSearchPage,
}

#: Every call this client makes: method, path as openapi.json names it,
#: and the request body's fields it may send (tests check them too).
ROUTES: list[tuple[str, str, tuple[str, ...]]] = [
    ("GET", "/v1/inboxes", ()),
    ("GET", "/v1/inboxes/{inbox}/items", ()),
    ("GET", "/v1/inboxes/{inbox}/items/{id}", ()),
    ("GET", "/v1/inboxes/{inbox}/items/{id}/attempts", ()),
    ("POST", "/v1/inboxes/{inbox}/items/{id}/cancel", ("reason",)),
    ("POST", "/v1/inboxes/{inbox}/items/{id}/discard", ()),
    ("POST", "/v1/inboxes/{inbox}/items/{id}/reply", ("key", "body")),
    ("GET", "/v1/inboxes/{inbox}/items/{id}/replies", ()),
    ("POST", "/v1/inboxes/{inbox}/items/{id}/replies/{key}/retry", ()),
    ("GET", "/v1/inboxes/{inbox}/search", ()),
    ("POST", "/v1/inboxes/{inbox}/lease", ("max", "visibility_timeout", "wait")),
    ("POST", "/v1/inboxes/{inbox}/ack", ("ids", "lease")),
    ("POST", "/v1/inboxes/{inbox}/nack", ("ids", "lease", "delay", "reason", "dead")),
    ("POST", "/v1/inboxes/{inbox}/extend", ("ids", "lease", "visibility_timeout")),
    ("GET", "/v1/dead-letters", ()),
    ("GET", "/v1/dead-letters/{id}", ()),
    ("POST", "/v1/dead-letters/{id}/replay", ()),
    ("POST", "/v1/dead-letters/discard", ("ids", "inbox", "subscription", "from", "to", "all")),
    ("GET", "/v1/subscriptions", ()),
    ("GET", "/v1/subscriptions/{name}", ()),
    ("POST", "/v1/subscriptions", ("name", "source", "types", "metadata", "inbox", "start", "start_offset",
                                   "start_time", "target", "secret", "headers", "timeout", "max_attempts",
                                   "order_by", "on_dead_letter")),
    ("DELETE", "/v1/subscriptions/{name}", ()),
    ("POST", "/v1/subscriptions/{name}/pause", ("reason",)),
    ("POST", "/v1/subscriptions/{name}/resume", ()),
    ("POST", "/v1/subscriptions/{name}/test", ()),
    ("GET", "/v1/sources", ()),
    ("GET", "/v1/sources/{name}", ()),
    ("GET", "/v1/streams", ()),
    ("GET", "/v1/streams/{stream}", ()),
    ("GET", "/v1/streams/{stream}/events/{offset}", ()),
    ("GET", "/v1/streams/{stream}/events", ()),
    ("GET", "/v1/streams/{stream}/search", ()),
    ("GET", "/v1/consumers", ()),
    ("GET", "/v1/replays", ()),
    ("GET", "/v1/replays/{id}", ()),
    ("GET", "/webhooks/{source}", ()),
]


class APIError(PostboxError):
    """An error answer of the server: ``status``, and ``code`` and
    ``message`` from its JSON error (``code`` is "" when the answer was
    not the API's JSON)."""

    def __init__(self, status: int, code: str, message: str, method: str = "", path: str = ""):
        self.status, self.code, self.message, self.method, self.path = status, code, message, method, path
        super().__init__(f"server: {status} {code or 'error'}: {message}")

    @property
    def not_found(self) -> bool:
        return self.status == 404 or self.code == "not_found"

    @property
    def lease_lost(self) -> bool:
        return self.code == "lease_lost"

    @property
    def unauthorized(self) -> bool:
        return self.status == 401

    @property
    def invalid(self) -> bool:
        return self.status == 400


def result_error(r: ItemResult) -> Optional[APIError]:
    """The error of one item's result of an ack, nack or extend, or None
    when the item was settled."""
    e = r.get("error")
    if not e:
        return None
    return APIError(404 if e.get("code") == "not_found" else 409, e.get("code", ""), e.get("message", ""))


def go_duration(seconds: float) -> str:
    """seconds as the API reads durations ("1500ms"), at least 1ms."""
    return f"{max(1, round(seconds * 1000))}ms"


def _name(s: str) -> str:
    return urllib.parse.quote(s, safe="")


def _time(t: str | datetime | None) -> str:
    """An RFC 3339 time: a datetime (naive: UTC) or a string as it is."""
    if t is None or isinstance(t, str):
        return t or ""
    return t.isoformat() if t.tzinfo else t.isoformat() + "Z"


def _query(q: dict[str, Any]) -> str:
    """?k=v&... of q's non-empty values, "" when all are empty."""
    q = {k: v for k, v in q.items() if v}
    return "?" + urllib.parse.urlencode(q) if q else ""


class API:
    """A client of the server at base_url (``http://HOST:PORT`` or
    ``https://HOST:PORT``, with the path the server is mounted at if any).
    ``token`` is the server's API token (``serve --api-token``). Safe to
    share between tasks of one event loop; ``close`` (or ``async with``)
    closes its connections."""

    def __init__(self, base_url: str, *, token: str | None = None, timeout: float = DEFAULT_TIMEOUT):
        if timeout <= 0:
            raise ValueError("API timeout must be positive")
        self._http = Client(base_url)
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._headers = {"Accept": "application/json"}
        if token:
            self._headers["Authorization"] = "Bearer " + token

    async def __aenter__(self) -> "API":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.close()

    async def request(self, method: str, path: str, body: Any = None, *, extra: float = 0.0) -> Any:
        """Send method path (with its query) with body as JSON (None: no
        body) and return the decoded answer (None for 204). The typed
        methods are built on it; it serves calls they do not cover."""
        headers = dict(self._headers)
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            headers["Content-Type"] = "application/json"
        resp = await self._http.request(method, path, data, headers, self.timeout + extra)
        if resp.status >= 300:
            try:
                e = json.loads(resp.body)["error"]
                raise APIError(resp.status, e["code"], e.get("message", ""), method, path)
            except (ValueError, KeyError, TypeError):
                text = resp.body[:200].decode("utf-8", "replace").strip()
                raise APIError(resp.status, "", f"{method} {path}: {text}", method, path) from None
        if resp.status == 204 or not resp.body:
            return None
        try:
            return json.loads(resp.body)
        except ValueError as e:
            raise CallError(method, path, f"the answer is not JSON ({e}): {resp.body[:200]!r}") from None

    # The runtime's calls.

    async def lease(self, inbox: str, *, max: int | None = None, visibility_timeout: float | None = None,
                    wait: float | None = None) -> Lease:
        """Lease up to max ready items of inbox, each processing with an
        attempt counted; with wait (seconds, up to 60), wait for one when
        none is ready. An answer with no items is no error."""
        body: dict[str, Any] = {}
        if max is not None:
            body["max"] = max
        if visibility_timeout is not None:
            body["visibility_timeout"] = go_duration(visibility_timeout)
        if wait:
            body["wait"] = go_duration(wait)
        return await self.request("POST", f"/v1/inboxes/{_name(inbox)}/lease", body, extra=wait or 0.0)

    async def ack(self, inbox: str, lease: str, ids: list[int]) -> list[ItemResult]:
        """Complete items that lease holds ("" for an operator). One result
        per id; ``result_error`` says why one was not acked."""
        body: dict[str, Any] = {"ids": ids}
        if lease:
            body["lease"] = lease
        out: SettleResults = await self.request("POST", f"/v1/inboxes/{_name(inbox)}/ack", body)
        return out["items"]

    async def nack(self, inbox: str, lease: str, ids: list[int], *, delay: float = 0.0, reason: str = "",
                   dead: bool = False) -> list[ItemResult]:
        """Record a failed attempt: each item is pending again after delay
        seconds (up to 24h), or a dead letter after its last attempt, or at
        once with dead."""
        body: dict[str, Any] = {"ids": ids}
        if lease:
            body["lease"] = lease
        if delay > 0:
            body["delay"] = go_duration(delay)
        if reason:
            body["reason"] = reason
        if dead:
            body["dead"] = True
        out: SettleResults = await self.request("POST", f"/v1/inboxes/{_name(inbox)}/nack", body)
        return out["items"]

    async def extend(self, inbox: str, lease: str, ids: list[int], visibility_timeout: float | None = None) -> Extension:
        """Move the end of lease, for the items it still holds, to
        visibility_timeout seconds from now (None: the server's 30s)."""
        body: dict[str, Any] = {"ids": ids, "lease": lease}
        if visibility_timeout is not None:
            body["visibility_timeout"] = go_duration(visibility_timeout)
        return await self.request("POST", f"/v1/inboxes/{_name(inbox)}/extend", body)

    # The operator's calls.

    async def inboxes(self) -> list[InboxCounts]:
        """The inboxes with their items by state."""
        return (await self.request("GET", "/v1/inboxes"))["inboxes"]

    async def items(self, inbox: str, *, state: str = "", after: int = 0, limit: int = 0) -> ItemPage:
        """A page of an inbox's items, oldest first."""
        q = {k: v for k, v in (("state", state), ("after", after), ("limit", limit)) if v}
        path = f"/v1/inboxes/{_name(inbox)}/items"
        return await self.request("GET", path + ("?" + urllib.parse.urlencode(q) if q else ""))

    async def item(self, inbox: str, id: int) -> Item:
        return await self.request("GET", f"/v1/inboxes/{_name(inbox)}/items/{int(id)}")

    async def attempts(self, inbox: str, id: int) -> list[Attempt]:
        return (await self.request("GET", f"/v1/inboxes/{_name(inbox)}/items/{int(id)}/attempts"))["attempts"]

    async def cancel_item(self, inbox: str, id: int, reason: str = "") -> Item:
        """Move a pending item to failed at once: a dead letter whose
        last_error says it was cancelled (and reason). A processing item is
        ``APIError`` 409 ``invalid_state``."""
        return await self.request("POST", f"/v1/inboxes/{_name(inbox)}/items/{int(id)}/cancel",
                                  {"reason": reason} if reason else None)

    async def discard_item(self, inbox: str, id: int) -> Item:
        """Delete an item that is not processing, with its attempt log, for
        good; returns it as it was."""
        return await self.request("POST", f"/v1/inboxes/{_name(inbox)}/items/{int(id)}/discard")

    async def reply(self, inbox: str, id: int, body: Any, key: str = "") -> Reply:
        """Reply to the event of an item: the server POSTs ``body`` (JSON) to
        the url of the event's delivery handle with the source's reply
        settings, retrying it as it retries deliveries. Stored once per
        ``key`` (default: a digest of the body): the same key and body again
        return the reply as it is; another body is ``APIError`` 409
        ``conflict``. An item whose handle names no url (a device's event, a
        CloudEvent) is ``APIError`` 400 ``invalid_field``."""
        req: dict[str, Any] = {"body": body}
        if key:
            req["key"] = key
        return await self.request("POST", f"/v1/inboxes/{_name(inbox)}/items/{int(id)}/reply", req)

    async def replies(self, inbox: str, id: int) -> list[Reply]:
        """The replies to an item's event, oldest first, with their attempt logs."""
        return (await self.request("GET", f"/v1/inboxes/{_name(inbox)}/items/{int(id)}/replies"))["replies"]

    async def retry_reply(self, inbox: str, id: int, key: str) -> Reply:
        """Send a failed reply (a dead letter) again, with a fresh count of attempts."""
        return await self.request("POST", f"/v1/inboxes/{_name(inbox)}/items/{int(id)}/replies/{_name(key)}/retry")

    async def search_items(self, inbox: str, *, id: str = "", type: str = "", state: str = "",
                           since: str | datetime | None = None, until: str | datetime | None = None,
                           before: int = 0, limit: int = 0) -> ItemSearchPage:
        """A page of an inbox's items, newest first, by the event's id (or
        idempotency key), its type, the item's state and when it was
        materialised (since inclusive, until exclusive); pass the page's
        next_before as before for the next."""
        q = {"id": id, "type": type, "state": state, "since": _time(since), "until": _time(until),
             "before": before, "limit": limit}
        return await self.request("GET", f"/v1/inboxes/{_name(inbox)}/search" + _query(q))

    async def dead_letters(self, *, inbox: str = "", subscription: str = "", after: int = 0, limit: int = 0) -> ItemPage:
        q = {k: v for k, v in (("inbox", inbox), ("subscription", subscription), ("after", after), ("limit", limit)) if v}
        return await self.request("GET", "/v1/dead-letters" + ("?" + urllib.parse.urlencode(q) if q else ""))

    async def dead_letter(self, id: int) -> Item:
        return await self.request("GET", f"/v1/dead-letters/{int(id)}")

    async def replay_dead_letter(self, id: int) -> Item:
        """Make a dead letter pending again."""
        return await self.request("POST", f"/v1/dead-letters/{int(id)}/replay")

    async def discard_dead_letters(self, *, ids: list[int] | None = None, inbox: str = "", subscription: str = "",
                                   from_: str | datetime | None = None, to: str | datetime | None = None,
                                   all: bool = False) -> Discarded:
        """Delete, for good, the dead letters the selection names (every
        argument given narrows it); one that names nothing must say
        all=True (else ``APIError`` 400 ``missing_field``)."""
        body: dict[str, Any] = {}
        if ids:
            body["ids"] = [int(i) for i in ids]
        for k, v in (("inbox", inbox), ("subscription", subscription), ("from", _time(from_)), ("to", _time(to))):
            if v:
                body[k] = v
        if all:
            body["all"] = True
        return await self.request("POST", "/v1/dead-letters/discard", body)

    async def subscriptions(self) -> list[Subscription]:
        return (await self.request("GET", "/v1/subscriptions"))["subscriptions"]

    async def subscription(self, name: str) -> Subscription:
        return await self.request("GET", f"/v1/subscriptions/{_name(name)}")

    async def create_subscription(self, name: str, source: str, **fields: Any) -> Subscription:
        """Create a subscription (fields: types, metadata, inbox, start,
        start_offset, start_time, target, secret, headers, timeout,
        max_attempts, order_by, on_dead_letter); one that exists with this definition is returned as
        it is, one with another is ``APIError`` 409."""
        return await self.request("POST", "/v1/subscriptions", {"name": name, "source": source, **fields})

    async def delete_subscription(self, name: str) -> None:
        await self.request("DELETE", f"/v1/subscriptions/{_name(name)}")

    async def pause_subscription(self, name: str, reason: str = "") -> Subscription:
        """Pause the delivery of a subscription: none of its items is
        leased, by the server's workers or a runtime, until
        ``resume_subscription``; its inbox keeps filling."""
        return await self.request("POST", f"/v1/subscriptions/{_name(name)}/pause",
                                  {"reason": reason} if reason else None)

    async def resume_subscription(self, name: str) -> Subscription:
        """Resume the delivery of a paused subscription (of one that
        delivers: nothing changes)."""
        return await self.request("POST", f"/v1/subscriptions/{_name(name)}/resume")

    async def test_subscription(self, name: str) -> TestDelivery:
        """Send a ``postbox.test`` event to the subscription's target and
        return what it answered, whatever it answered (``ok``: a 2xx). A
        subscription without a target is ``APIError`` 400."""
        return await self.request("POST", f"/v1/subscriptions/{_name(name)}/test")

    async def sources(self) -> list[Source]:
        return (await self.request("GET", "/v1/sources"))["sources"]

    async def source(self, name: str) -> Source:
        return await self.request("GET", f"/v1/sources/{_name(name)}")

    async def streams(self) -> list[Stream]:
        return (await self.request("GET", "/v1/streams"))["streams"]

    async def stream(self, stream: str) -> Stream:
        return await self.request("GET", f"/v1/streams/{_name(stream)}")

    async def event(self, stream: str, offset: int) -> Event:
        """The event at offset of a stream, with its deliveries: what every
        subscription made of it (deleted ones' items too), with the
        attempt logs."""
        return await self.request("GET", f"/v1/streams/{_name(stream)}/events/{int(offset)}")

    async def event_by_id(self, stream: str, id: str, variant: str = "") -> Event:
        """``event`` by the source's id of the event (an envelope's
        event_id, a webhook's idempotency key); variant names the device in
        the device stream, where one id may come from several (without it,
        several are ``APIError`` 409)."""
        return await self.request("GET", f"/v1/streams/{_name(stream)}/events" + _query({"id": id, "variant": variant}))

    async def search_events(self, stream: str, *, id: str = "", type: str = "",
                            since: str | datetime | None = None, until: str | datetime | None = None,
                            before: int = 0, limit: int = 0) -> EventPage:
        """A page of a stream's events, newest first, without deliveries:
        by id (or key), type and stored time; pass the page's next_before
        as before for the next."""
        q = {"id": id, "type": type, "since": _time(since), "until": _time(until), "before": before, "limit": limit}
        return await self.request("GET", f"/v1/streams/{_name(stream)}/search" + _query(q))

    async def consumers(self) -> list[Consumer]:
        return (await self.request("GET", "/v1/consumers"))["consumers"]

    async def replays(self, subscription: str = "") -> list[Replay]:
        q = "?subscription=" + urllib.parse.quote(subscription) if subscription else ""
        return (await self.request("GET", "/v1/replays" + q))["replays"]

    async def replay(self, id: str) -> Replay:
        return await self.request("GET", f"/v1/replays/{_name(id)}")

    async def webhook(self, id: str) -> Webhook:
        """A webhook taken by POST /webhooks and where its delivery stands,
        by its id ("wh_42")."""
        return await self.request("GET", f"/webhooks/{_name(id)}")
