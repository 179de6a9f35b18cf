"""Ids and the checks every insert makes, without a database."""

from __future__ import annotations

import re

import pytest

from postbox import InvalidEventError, new_event_id
from postbox._check import compact
from postbox.outbox import Event, _prepare


def test_event_ids_are_evt_and_a_ulid_sorted_by_when_made():
    ids = [new_event_id() for _ in range(2000)]
    assert all(re.fullmatch(r"evt_[0-9A-HJKMNP-TV-Z]{26}", i) for i in ids), ids[:3]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert ids[0][4] in "01234567"  # 48 bits of milliseconds: the first character is at most 7


@pytest.mark.parametrize(
    "event, says",
    [
        (Event("t", b"{not json"), "payload is not valid JSON"),
        (Event("t", ""), "payload is empty"),
        (Event("t", b"   "), "payload is empty"),
        (Event("t", b"\xff{}"), "payload is not valid UTF-8"),
        (Event("t", "NaN"), "payload is not valid JSON"),
        (Event("t", '{"a": Infinity}'), "payload is not valid JSON"),
        (Event("t", b'{"a":1} {"b":2}'), "payload is not valid JSON"),
        (Event("t", {"a": float("nan")}), "payload cannot be encoded as JSON"),
        (Event("", b"{}"), "type is empty"),
        (Event("t" * 129, b"{}"), "type is 129 bytes, over 128"),
        (Event("t", b"{}", id="x" * 129), "id is 129 bytes, over 128"),
        (Event("t", b"{}", id=""), "id is empty"),
        (Event("t", b"{}", id="a\x00b"), "id 'a\\x00b' is not UTF-8 text without NUL"),
        (Event("t", b"{}", traceparent="00-abc"), "traceparent: '00-abc' is not a W3C traceparent"),
        (Event("t", b"{}", tracestate="a=b"), "tracestate given without a traceparent"),
        (Event("t", b"{}", traceparent="00-00000000000000000000000000000000-00f067aa0ba902b7-01"), "trace id is all zeros"),
    ],
)
def test_bad_events_are_refused_naming_the_field(event, says):
    with pytest.raises(InvalidEventError) as e:
        _prepare(event, sqlite=False)
    assert says in str(e.value)


def test_payload_kept_as_given():
    raw = b'{"b": 1,  "a": [1, 2], "b": 2, "s": "\\u00e9 \xc3\xa9"}'
    row = _prepare(Event("t", raw), sqlite=False)
    assert row[2].encode() == raw
    assert _prepare(Event("t", {"a": "é"}), sqlite=False)[2] == '{"a":"é"}'
    # The correlation id defaults to the event id.
    row = _prepare(Event("t", b"{}", id="evt_1"), sqlite=False)
    assert row[0] == row[3] == "evt_1"


def test_sqlite_rows_fit_an_envelope():
    with pytest.raises(InvalidEventError, match="must be a JSON object"):
        _prepare(Event("t", b"[1]"), sqlite=True)
    with pytest.raises(InvalidEventError, match="tenant id: begins or ends with white space"):
        _prepare(Event("t", b"{}", tenant_id=" acme"), sqlite=True)
    assert _prepare(Event("t", b'{ "a" : [ 1 , "x y" ] }'), sqlite=True)[2] == '{"a":[1,"x y"]}'


def test_compact_keeps_strings():
    assert compact('{"a\\" b": " x ",\n "c": [1, 2]}') == '{"a\\" b":" x ","c":[1,2]}'


def test_runner_backoff_is_full_jitter_up_to_its_ceiling():
    from postbox.api import API
    from postbox.runner import Runner, clean_reason

    r = Runner(API("http://127.0.0.1:1"), "x", lambda i: None, backoff_base=1.0, backoff_max=8.0)
    for attempts, ceiling in ((1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (10, 8.0), (200, 8.0)):
        ds = [r.backoff(attempts) for _ in range(200)]
        assert all(0 <= d <= ceiling for d in ds) and max(ds) > ceiling / 2, (attempts, max(ds))
    assert clean_reason("a\nb\x00c") == "a b c"
    long = clean_reason("é" * 1000)
    assert len(long.encode()) <= 1024 and long.endswith("…")
