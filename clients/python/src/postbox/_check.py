"""Checks shared by the outbox and dedup: the rules of Go's
outbox.Event.Prepare and postbox.Envelope.Validate."""

from __future__ import annotations

import json
import json.scanner
import unicodedata
from typing import Any, NoReturn

MAX_EVENT_ID_BYTES = 128
MAX_EVENT_TYPE_BYTES = 128
MAX_TRACESTATE_BYTES = 512
_HEX = frozenset("0123456789abcdef")


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


# One decoder's scanner, made once (json.loads makes a decoder per call).
_scan = json.scanner.make_scanner(json.JSONDecoder(parse_constant=_no_constant))  # type: ignore[attr-defined]
_WS = " \t\r\n"


def _check_json(text: str) -> None:
    """Raise ValueError unless text is one JSON value (with white space
    around it)."""
    i = 0
    n = len(text)
    while i < n and text[i] in _WS:
        i += 1
    try:
        _, end = _scan(text, i)
    except StopIteration as e:
        raise ValueError(f"expecting a value at character {e.value}") from None
    while end < n and text[end] in _WS:
        end += 1
    if end != n:
        raise ValueError(f"extra data at character {end}")


def payload_text(payload: Any) -> str:
    """Return the payload as the text stored: bytes and str as given
    (bytes must be UTF-8), any other value encoded compactly. Raises
    ValueError naming what is wrong when it is not one JSON value."""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        try:
            text = bytes(payload).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"payload is not valid UTF-8 ({e.reason} at byte {e.start})") from None
    elif isinstance(payload, str):
        text = payload
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("payload is not valid UTF-8 (it holds a lone surrogate)") from None
    else:
        try:
            return json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise ValueError(f"payload cannot be encoded as JSON: {e}") from None
    if not text or (text[0] in " \t\r\n" and not text.strip(" \t\r\n")):
        raise ValueError("payload is empty")
    if text[0] == "\ufeff":
        raise ValueError("payload is not valid JSON: it begins with a byte order mark")
    try:
        _check_json(text)
    except ValueError as e:
        raise ValueError(f"payload is not valid JSON: {e}") from None
    return text


def check_traceparent(v: str) -> str | None:
    """Return why v is not a W3C traceparent, or None (Go's
    postbox.CheckTraceParent)."""
    bad = f"{v!r} is not a W3C traceparent (version-traceid-parentid-flags, 55 characters)"
    if len(v) < 55 or (len(v) > 55 and (v[:2] == "00" or v[55] != "-")):
        return bad
    for i, c in enumerate(v[:55]):
        if i in (2, 35, 52):
            if c != "-":
                return bad
        elif c not in _HEX:
            return f"{v!r}: {c!r} is not a lower-case hex digit"
    if v[:2] == "ff":
        return f"{v!r}: version ff is invalid"
    if v[3:35] == "0" * 32:
        return f"{v!r}: the trace id is all zeros"
    if v[36:52] == "0" * 16:
        return f"{v!r}: the parent id is all zeros"
    return None


def check_tracestate(v: str) -> str | None:
    if len(v.encode("utf-8")) > MAX_TRACESTATE_BYTES:
        return f"{len(v.encode('utf-8'))} bytes, over the limit of {MAX_TRACESTATE_BYTES}"
    for c in v:
        if not (0x20 <= ord(c) <= 0x7E):
            return f"holds the character {c!r}: it is printable ASCII"
    return None


def utf8_len(s: str) -> int:
    if s.isascii():
        return len(s)
    return len(s.encode("utf-8", "surrogatepass"))


def is_text(s: str) -> bool:
    """UTF-8 text without NUL characters (what PostgreSQL's TEXT takes)."""
    if "\x00" in s:
        return False
    if s.isascii():
        return True
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def envelope_field_problem(v: str) -> str | None:
    """Why v cannot be an envelope's id field (Go's checkString and
    checkSpace: no control characters, no white space at either end)."""
    for c in v:
        o = ord(c)
        if o < 0x20 or o == 0x7F or 0x80 <= o < 0xA0:
            return "contains a control character"
    if v[0].isspace() or v[-1].isspace() or unicodedata.category(v[0]) == "Zs" or unicodedata.category(v[-1]) == "Zs":
        if not v.strip():
            return "blank (only white space)"
        return "begins or ends with white space"
    return None


def compact(text: str) -> str:
    """Remove the white space between JSON tokens, as Go's json.Compact
    (postbox.AppendCompact) does; strings are kept as they are."""
    if not any(c in text for c in " \t\r\n"):
        return text
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n:
                d = text[j]
                if d == "\\":
                    j += 2
                    continue
                if d == '"':
                    break
                j += 1
            out.append(text[i : j + 1])
            i = j + 1
            continue
        if c not in " \t\r\n":
            out.append(c)
        i += 1
    return "".join(out)
