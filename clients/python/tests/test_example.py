"""examples/python-outbox runs as its README says: orders and events in
one transaction, relayed, shipped once each by the runner with dedup."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO, Proc, free_port, pg_base_url, start_server

SCHEMA = "python_outbox_example"


def drop_schema(base):
    import psycopg

    with psycopg.connect(base, autocommit=True) as c:
        c.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")


def test_example(postbox_bin, tmp_path):
    base = pg_base_url()
    script = str(REPO / "examples" / "python-outbox" / "service.py")
    drop_schema(base)
    server = start_server(postbox_bin, tmp_path)
    relay = None
    try:
        subprocess.run([sys.executable, script, "--setup-only", "--db", base], check=True, timeout=60, capture_output=True)
        sep = "&" if "?" in base else "?"
        relay = Proc([postbox_bin, "relay", "--db", f"{base}{sep}search_path={SCHEMA}", "--to", "ws://" + server.addr,
                      "--poll", "100ms", "--listen", f"127.0.0.1:{free_port()}", "--log-level", "warn"],
                     tmp_path / "relay.log")
        r = subprocess.run([sys.executable, script, "--db", base, "--server", server.base, "--orders", "20"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr + relay.output()
        assert r.stdout.splitlines() == [
            "placed 16 orders (4 declined and rolled back: their events never leave)",
            "shipped 16 orders once each (16 handled, 1 redelivery skipped by dedup)",
        ], r.stdout
    finally:
        if relay:
            relay.stop()
        server.proc.stop()
        drop_schema(base)
