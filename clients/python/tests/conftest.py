"""Fixtures: real PostgreSQL (POSTBOX_TEST_POSTGRES), a SQLite file, the
real postbox binary (POSTBOX_BIN, or built once per session with go
build) and a real ``postbox serve``.

A test that needs a service it is not given skips, naming what it needs;
under POSTBOX_REQUIRE_SERVICES=1 it fails instead, so CI never passes by
skipping.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]  # clients/python/tests -> the repository


def need(what: str) -> None:
    """Skip the test for want of what, or fail under
    POSTBOX_REQUIRE_SERVICES=1."""
    if os.environ.get("POSTBOX_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{what}; POSTBOX_REQUIRE_SERVICES=1 forbids skipping", pytrace=False)
    pytest.skip(what)


def pg_base_url() -> str:
    url = os.environ.get("POSTBOX_TEST_POSTGRES", "")
    if not url:
        need("POSTBOX_TEST_POSTGRES is not set; this test needs a real PostgreSQL (see README, Development)")
    return url


class PG:
    """A fresh schema of the test database: url (for postbox, with
    search_path), libpq (for psycopg: search_path in options) and schema."""

    def __init__(self, base: str, schema: str):
        self.base, self.schema = base, schema
        sep = "&" if "?" in base else "?"
        self.url = f"{base}{sep}search_path={schema}"
        self.libpq_options = f"-csearch_path={schema}"

    def psycopg(self, **kw):
        import psycopg

        return psycopg.connect(self.base, options=self.libpq_options, **kw)

    async def psycopg_async(self, **kw):
        import psycopg

        return await psycopg.AsyncConnection.connect(self.base, options=self.libpq_options, **kw)

    async def asyncpg(self):
        import asyncpg

        return await asyncpg.connect(self.base, server_settings={"search_path": self.schema})


def migrations(dialect: str) -> list[str]:
    d = REPO / "outbox" / ("outboxpg" if dialect == "postgres" else "outboxsqlite") / "migrations"
    return [p.read_text() for p in sorted(d.glob("*.sql"))]


@pytest.fixture
def pg():
    """A new schema holding the outbox (postbox's migrations) and inbox
    (dedup's schema) tables, dropped at the end."""
    pytest.importorskip("psycopg")
    import psycopg

    from postbox import dedup

    base = pg_base_url()
    schema = f"py_{os.getpid()}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(base, autocommit=True) as c:
        c.execute(f"CREATE SCHEMA {schema}")
    p = PG(base, schema)
    with p.psycopg() as c:
        for m in migrations("postgres"):
            c.execute(m)
        c.commit()
        dedup.migrate(c)
    try:
        yield p
    finally:
        with psycopg.connect(base, autocommit=True) as c:
            c.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture
def sqlite_path(tmp_path):
    """A SQLite file with the outbox (postbox's migrations) and inbox
    tables."""
    import sqlite3

    from postbox import dedup

    path = tmp_path / "service.db"
    c = sqlite3.connect(path)
    c.execute("PRAGMA journal_mode=WAL")
    for m in migrations("sqlite"):
        c.executescript(m)
    dedup.migrate(c)
    c.close()
    return path


@pytest.fixture(scope="session")
def postbox_bin(tmp_path_factory) -> str:
    """The postbox binary: POSTBOX_BIN, or go build ./cmd/postbox once."""
    if os.environ.get("POSTBOX_BIN"):
        return os.environ["POSTBOX_BIN"]
    go = shutil.which("go")
    if go is None:
        need("go is not on PATH to build the postbox binary (or set POSTBOX_BIN)")
    out = tmp_path_factory.mktemp("bin") / "postbox"
    r = subprocess.run([go, "build", "-o", str(out), "./cmd/postbox"], cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"go build ./cmd/postbox: {r.stderr}")
    return str(out)


@pytest.fixture(scope="session")
def godedup_bin(tmp_path_factory) -> str:
    """The Go program of testdata/godedup, built once."""
    go = shutil.which("go")
    if go is None:
        need("go is not on PATH to build the Go dedup helper")
    out = tmp_path_factory.mktemp("bin") / "godedup"
    r = subprocess.run([go, "build", "-o", str(out), "./clients/python/tests/testdata/godedup"], cwd=REPO,
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"go build godedup: {r.stderr}")
    return str(out)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A postbox subprocess whose output goes to a file."""

    def __init__(self, args: list[str], log: Path):
        self.log = log
        self.f = open(log, "wb")
        self.p = subprocess.Popen(args, stdout=self.f, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(15)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.f.close()


def wait_http(url: str, proc: Proc, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.p.poll() is not None:
            raise AssertionError(f"{proc.p.args} exited {proc.p.returncode}:\n{proc.output()}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        time.sleep(0.05)
    raise AssertionError(f"{url} not ready in {timeout}s:\n{proc.output()}")


class Server:
    def __init__(self, proc: Proc, base: str, addr: str):
        self.proc, self.base, self.addr = proc, base, addr


@pytest.fixture
def server(postbox_bin, tmp_path):
    """A postbox serve on a temporary database; extra flags by
    indirect parametrization are not needed: tests that need others start
    their own with start_server."""
    s = start_server(postbox_bin, tmp_path)
    try:
        yield s
    finally:
        s.proc.stop()


def start_server(postbox_bin: str, tmp_path: Path, *flags: str) -> Server:
    addr = f"127.0.0.1:{free_port()}"
    proc = Proc([postbox_bin, "serve", "--addr", addr, "--db", str(tmp_path / "postbox.db"),
                 "--log-level", "warn", *flags], tmp_path / f"serve-{addr.split(':')[1]}.log")
    try:
        wait_http(f"http://{addr}/ready", proc)
    except BaseException:
        proc.stop()
        raise
    return Server(proc, f"http://{addr}", addr)


def post_webhooks(base: str, n: int, prefix: str = "k", body: bytes = b'{"n": 1}') -> None:
    """Send n webhooks to POST /webhooks (the inbox webhooks)."""
    for i in range(n):
        req = urllib.request.Request(f"{base}/webhooks", data=body, method="POST",
                                     headers={"Content-Type": "application/json", "Idempotency-Key": f"{prefix}-{i}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 202, r.status


sys.path.insert(0, str(HERE))


class Target:
    """An HTTP target on loopback that records what postbox POSTs to it
    (headers, raw body) and answers 200."""

    def __init__(self):
        import http.server
        import queue
        import threading

        self.received: "queue.Queue[tuple[dict[str, str], bytes]]" = queue.Queue()
        target = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                n = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(n)
                target.received.put(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def take(self, n: int, timeout: float = 60.0, proc: "Proc | None" = None):
        import queue

        out = []
        deadline = time.monotonic() + timeout
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"the target got {len(out)} requests in {timeout}s, want {n}"
                                     + (f":\n{proc.output()}" if proc else ""))
            try:
                out.append(self.received.get(timeout=min(left, 1.0)))
            except queue.Empty:
                pass
        return out

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def target():
    t = Target()
    try:
        yield t
    finally:
        t.close()


SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwMfKQ9r8GKYo="
