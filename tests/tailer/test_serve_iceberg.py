"""``deltatail serve`` on Iceberg tables it discovers under a warehouse written by pyiceberg: every row
once, across a restart. Oracle: pyiceberg's scan of each table at the end (the delivered rows net to it).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from iceberg_tables import SCHEMA, catalog, rows, table_dir
from pyiceberg.table import Table

from deltatail.tailer.serve.discovery import find_tables

ROOT = Path(__file__).resolve().parents[2]


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def net(records: list[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
    out: Counter[tuple[Any, ...]] = Counter()
    for r in records:
        key = (r["id"], r["name"])
        if r["_change_type"] in ("insert", "update_postimage"):
            out[key] += 1
        else:
            out[key] -= 1
    return +out


def live(t: Table) -> Counter[tuple[Any, ...]]:
    return Counter((r["id"], r["name"]) for r in t.refresh().scan().to_arrow().to_pylist())


def start(config: Path, log: Path) -> subprocess.Popen[bytes]:
    before = log.stat().st_size if log.exists() else 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "deltatail", "serve", "--config", str(config)], cwd=ROOT, stderr=log.open("ab")
    )
    deadline = time.monotonic() + 90
    while len(re.findall(rb"following table \S+", log.read_bytes()[before:])) < 2:
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "the service did not start: " + log.read_text()[-3000:]
        time.sleep(0.1)
    return proc


def wait_until_equal(out: Path, tables: dict[str, Table], log: Path) -> None:
    deadline = time.monotonic() + 120
    while True:
        got = {name: lines(out / f"{name}.jsonl") for name in tables}
        if all(net(got[name]) == live(t) for name, t in tables.items()):
            for name, records in got.items():
                positions = [tuple(r["_position"]) for r in records]
                assert len(positions) == len(set(positions)), f"{name}: rows repeated"
            return
        assert time.monotonic() < deadline, f"outputs never matched the tables: {log.read_text()[-3000:]}"
        time.sleep(0.3)


@pytest.mark.slow
def test_serve_discovers_and_follows_iceberg_tables(tmp_path: Path) -> None:
    cat = catalog(tmp_path / "cat")
    orders = cat.create_table("db.orders", SCHEMA, properties={"format-version": "2"})
    events = cat.create_table("db.events", SCHEMA, properties={"format-version": "1"})
    orders.append(rows([1, 2, 3]))
    events.append(rows([10]))
    warehouse = tmp_path / "cat" / "warehouse"
    assert find_tables(str(warehouse)) == sorted([table_dir(orders), table_dir(events)])
    out, state, config, log = tmp_path / "out", tmp_path / "state", tmp_path / "serve.toml", tmp_path / "serve.log"
    out.mkdir()
    config.write_text(
        textwrap.dedent(
            f"""
            [service]
            state_root = "{state}"
            listen = "off"
            discover_seconds = 0.5

            [defaults]
            sink = "jsonl:{out}/{{table_name}}.jsonl"
            checkpoint_seconds = 0.3
            poll_interval = 0.2

            [[discover]]
            root = "{warehouse}"
            """
        )
    )
    tables = {"db.orders": orders, "db.events": events}
    proc = start(config, log)
    try:
        orders.delete("id == 2")
        events.append(rows([11, 12]))
        orders.upsert(rows([3, 4], tag="u"))
        wait_until_equal(out, tables, log)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
    events.delete("id == 11")  # while stopped: a restart delivers it, and nothing again
    proc = start(config, log)
    try:
        wait_until_equal(out, tables, log)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
    status = json.loads((state / f"iceberg-{orders.metadata.table_uuid}" / "status.json").read_text())
    assert status["state"] == "stopped"
