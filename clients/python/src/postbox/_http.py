"""A small HTTP/1.1 client on asyncio streams, with keep-alive: enough
for postbox's JSON API, without a dependency."""

from __future__ import annotations

import asyncio
import ssl as _ssl
import time
import urllib.parse
from dataclasses import dataclass

_IDLE_SECONDS = 30.0  # an idle connection older than this is closed, not reused
_MAX_IDLE = 64
_MAX_BODY = 64 << 20


class CallError(Exception):
    """A call that got no answer, or none that could be read."""

    def __init__(self, method: str, path: str, reason: str):
        self.method, self.path, self.reason = method, path, reason
        super().__init__(f"{method} {path}: {reason}")


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


class _Conn:
    __slots__ = ("reader", "writer", "idle_since")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.idle_since = 0.0

    def close(self) -> None:
        try:
            self.writer.close()
        except Exception:
            pass


class Client:
    """Sends requests to one server, keeping idle connections for reuse."""

    def __init__(self, base_url: str):
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"server URL {base_url!r}: want http://HOST:PORT or https://HOST:PORT")
        if u.query or u.fragment:
            raise ValueError(f"server URL {base_url!r}: want no query or fragment")
        if u.username or u.password:
            raise ValueError("server URL: credentials in the URL are not sent: use the API token instead")
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.ssl: _ssl.SSLContext | None = _ssl.create_default_context() if u.scheme == "https" else None
        self.prefix = u.path.rstrip("/")
        self.host_header = u.netloc
        self._idle: list[_Conn] = []

    async def _open(self) -> _Conn:
        reader, writer = await asyncio.open_connection(self.host, self.port, ssl=self.ssl, limit=1 << 20)
        return _Conn(reader, writer)

    def _take(self) -> _Conn | None:
        now = time.monotonic()
        while self._idle:
            c = self._idle.pop()
            if now - c.idle_since < _IDLE_SECONDS and not c.reader.at_eof():
                return c
            c.close()
        return None

    def _put(self, c: _Conn) -> None:
        if len(self._idle) >= _MAX_IDLE:
            c.close()
            return
        c.idle_since = time.monotonic()
        self._idle.append(c)

    async def close(self) -> None:
        while self._idle:
            self._idle.pop().close()

    async def request(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str], timeout: float
    ) -> Response:
        """Send one request and read its answer within timeout seconds. A
        reused connection the server closed before answering is replaced
        once."""
        try:
            return await asyncio.wait_for(self._request(method, path, body, headers), timeout)
        except asyncio.TimeoutError:
            raise CallError(method, path, f"no answer within {timeout:g}s") from None

    async def _request(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> Response:
        head = [f"{method} {self.prefix}{path} HTTP/1.1", f"Host: {self.host_header}"]
        for k, v in headers.items():
            head.append(f"{k}: {v}")
        if body is not None or method in ("POST", "PUT", "PATCH"):
            head.append(f"Content-Length: {len(body or b'')}")
        data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (body or b"")
        for attempt in (0, 1):
            c = self._take() if attempt == 0 else None
            reused = c is not None
            if c is None:
                try:
                    c = await self._open()
                except OSError as e:
                    raise CallError(method, path, f"connect to {self.host}:{self.port}: {e}") from None
            ok = False
            try:
                c.writer.write(data)
                await c.writer.drain()
                try:
                    status_line = await c.reader.readline()
                except (ConnectionError, asyncio.IncompleteReadError):
                    status_line = b""
                if not status_line:
                    if reused:
                        continue  # the server closed an idle connection: once more on a new one
                    raise CallError(method, path, "the server closed the connection without answering")
                resp, keep = await self._read(c, status_line, method)
                ok = keep
                return resp
            except (ConnectionError, asyncio.IncompleteReadError, ValueError) as e:
                if reused and isinstance(e, ConnectionError) and attempt == 0:
                    continue
                raise CallError(method, path, f"read the answer: {e!r}") from None
            finally:
                if ok:
                    self._put(c)
                else:
                    c.close()
        raise CallError(method, path, "the server closed the connection without answering")

    async def _read(self, c: _Conn, status_line: bytes, method: str) -> tuple[Response, bool]:
        parts = status_line.decode("latin-1").rstrip("\r\n").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise ValueError(f"not an HTTP/1.1 status line: {status_line[:80]!r}")
        status = int(parts[1])
        hdrs: dict[str, str] = {}
        while True:
            line = await c.reader.readline()
            if not line:
                raise asyncio.IncompleteReadError(b"", None)
            if line in (b"\r\n", b"\n"):
                break
            k, _, v = line.decode("latin-1").partition(":")
            hdrs[k.strip().lower()] = v.strip()
        keep = hdrs.get("connection", "").lower() != "close" and parts[0] == "HTTP/1.1"
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            return Response(status, hdrs, b""), keep
        if hdrs.get("transfer-encoding", "").lower() == "chunked":
            chunks = []
            total = 0
            while True:
                size_line = await c.reader.readline()
                size = int(size_line.split(b";", 1)[0].strip(), 16)
                if size == 0:
                    while (await c.reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                total += size
                if total > _MAX_BODY:
                    raise ValueError("answer over 64 MiB")
                chunks.append(await c.reader.readexactly(size))
                await c.reader.readexactly(2)
            return Response(status, hdrs, b"".join(chunks)), keep
        if "content-length" in hdrs:
            n = int(hdrs["content-length"])
            if n > _MAX_BODY:
                raise ValueError("answer over 64 MiB")
            return Response(status, hdrs, await c.reader.readexactly(n)), keep
        return Response(status, hdrs, await c.reader.read(_MAX_BODY)), False
