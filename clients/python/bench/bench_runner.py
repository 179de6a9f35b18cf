"""The Python runner against a do-nothing handler: --items webhooks wait in
the inbox of a real postbox serve (SQLite, its defaults, on loopback), and
a runner leases, handles and acks them all; items/s counts until the
server has every item completed. The counterpart of Go's
BenchmarkRunner (go test -run '^$' -bench BenchmarkRunner -benchtime 20000x ./client/).

    POSTBOX_BIN=/path/to/postbox /usr/bin/python3 clients/python/bench/bench_runner.py --items 20000
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from postbox.api import API  # noqa: E402
from postbox.runner import Runner  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def preload(port: int, n: int, workers: int = 16) -> None:
    def work(w):
        c = http.client.HTTPConnection("127.0.0.1", port)
        for i in range(w, n, workers):
            c.request("POST", "/webhooks", body=b'{"n": 1}',
                      headers={"Content-Type": "application/json", "Idempotency-Key": f"b-{i}"})
            r = c.getresponse()
            r.read()
            assert r.status == 202, r.status
        c.close()

    ts = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


async def run_once(base: str, n: int, concurrency: int) -> float:
    handled = 0

    async def noop(item):
        nonlocal handled
        handled += 1

    async with API(base) as api, API(base) as watch:
        r = Runner(api, "webhooks", noop, concurrency=concurrency, wait=1.0)
        start = time.perf_counter()
        task = asyncio.ensure_future(r.run())
        while True:
            c = [x for x in await watch.inboxes() if x["inbox"] == "webhooks"]
            if c and c[0]["completed"] >= n:
                break
            await asyncio.sleep(0.005)
        elapsed = time.perf_counter() - start
        r.stop()
        await task
    return n / elapsed


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--items", type=int, default=20000)
    p.add_argument("--concurrency", default="64,256")
    p.add_argument("--bin", default=os.environ.get("POSTBOX_BIN", "postbox"))
    args = p.parse_args()
    for conc in [int(c) for c in args.concurrency.split(",")]:
        with tempfile.TemporaryDirectory() as d:
            port = free_port()
            srv = subprocess.Popen([args.bin, "serve", "--addr", f"127.0.0.1:{port}", "--db", os.path.join(d, "p.db"),
                                    "--log-level", "error"])
            try:
                for _ in range(600):
                    try:
                        urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=1)
                        break
                    except OSError:
                        time.sleep(0.05)
                preload(port, args.items)
                rate = asyncio.run(run_once(f"http://127.0.0.1:{port}", args.items, conc))
                print(f"concurrency={conc}: {args.items} items, {rate:.0f} items/s")
            finally:
                srv.terminate()
                srv.wait()


if __name__ == "__main__":
    main()
