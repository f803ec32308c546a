"""``deltatail serve`` with 50 tables into one broker: one shared producer, and a broken table fails alone.

The producers are counted as the serve process's established TCP connections to the broker
(``/proc/PID/fd`` sockets matched with ``/proc/PID/net/tcp``): one producer per table would be
at least one connection per table.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

pytest.importorskip("kafka")

ROOT = Path(__file__).resolve().parents[2]
CDF = {"delta.enableChangeDataFeed": "true"}
TABLES = 50
FOREIGN = "t07"  # its topic holds a message deltatail did not write
TOO_LARGE = "t08"  # its second commit holds a row over max_message_bytes

Row = tuple[int, str, int]


def broker_connections(pid: int, port: int) -> int:
    """Established TCP connections of process ``pid`` to ``port`` (IPv4)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    count = 0
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote_port, state, inode = int(fields[2].split(":")[1], 16), fields[3], fields[9]
        count += remote_port == port and state == "01" and inode in inodes
    return count


def make_table(path: Path, t: int) -> None:
    write_deltalake(str(path), pa.table({"id": pa.array([10 * t + i for i in range(3)]), "s": ["a"] * 3}),
                    configuration=CDF)  # fmt: skip
    big = "b" * 3000 if path.name == TOO_LARGE else "c"
    write_deltalake(str(path), pa.table({"id": pa.array([10 * t + 5]), "s": [big]}), mode="append")
    DeltaTable(str(path)).delete(f"id = {10 * t}")


def expected(path: Path) -> Counter[Row]:
    table = pa.table(DeltaTable(str(path)).load_cdf(starting_version=0).read_all())
    return Counter((r["id"], r["_change_type"], r["_commit_version"]) for r in table.to_pylist())


def delivered(kafka: Any, topic: str) -> Counter[Row]:
    values = [orjson.loads(r.value) for r in kafka.consume(topic)]
    return Counter((v["id"], v["_change_type"], v["_commit_version"]) for v in values)


def start(config: Path, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    with log.open("ab") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "deltatail", "serve", "--config", str(config)], cwd=ROOT, stderr=err
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = re.findall(rb"metrics and health on http://127\.0\.0\.1:(\d+)/", log.read_bytes())
        if found and proc.poll() is None:
            return proc, int(found[-1])
        assert proc.poll() is None, log.read_text()
        time.sleep(0.1)
    raise AssertionError("the service did not start: " + log.read_text())


def failed_tables(port: int) -> set[str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except urllib.error.URLError:
        return set()
    failed = set()
    for line in text.splitlines():
        if line.startswith("deltatail_table_state{") and float(line.rsplit(" ", 1)[1]) == 1.0:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
            if labels.get("state") == "failed":
                failed.add(labels["table"])
    return failed


@pytest.mark.slow
def test_fifty_tables_share_one_producer_and_a_broken_topic_fails_one_table(kafka: Any, tmp_path: Path) -> None:
    lake, state = tmp_path / "lake", tmp_path / "state"
    names = [f"t{t:02d}" for t in range(TABLES)]
    for t, name in enumerate(names):
        make_table(lake / name, t)
    prefix = f"cdc-{uuid.uuid4().hex[:8]}"
    for name in names:
        kafka.admin().create_topics([_new_topic(f"{prefix}.{name}")])
    kafka.produce(f"{prefix}.{FOREIGN}", [(b"k", b"not deltatail's", [], 0)])
    uri = kafka.uri(f"{prefix}.{{table_name}}", exactly_once=True, max_message_bytes=2000)
    config = tmp_path / "serve.toml"
    config.write_text(
        textwrap.dedent(
            f"""
            [service]
            state_root = "{state}"
            listen = "127.0.0.1:0"
            status_seconds = 1

            [defaults]
            sink = "{uri}"
            checkpoint_seconds = 0.5
            poll_interval = 0.2

            [[discover]]
            root = "{lake}"
            """
        )
    )
    log = tmp_path / "serve.log"
    proc, port = start(config, log)
    try:
        deadline = time.monotonic() + 180
        while failed_tables(port) != {FOREIGN, TOO_LARGE} and time.monotonic() < deadline:
            time.sleep(1.0)
        assert failed_tables(port) == {FOREIGN, TOO_LARGE}, log.read_text()[-3000:]
        for name in names:
            if name not in (FOREIGN, TOO_LARGE):
                want = expected(lake / name)
                while delivered(kafka, f"{prefix}.{name}") != want and time.monotonic() < deadline:
                    time.sleep(0.5)
                assert delivered(kafka, f"{prefix}.{name}") == want, name
        # 48 tables following, their producer open: one producer's connections, not one per table
        connections = broker_connections(proc.pid, kafka.broker.port)
        assert 1 <= connections <= 3, connections
        text = log.read_text()
        assert re.search(rf"table {FOREIGN} stopped: .*not written by deltatail", text), text[-3000:]
        assert re.search(rf"table {TOO_LARGE} stopped: .*too large", text), text[-3000:]
        large = delivered(kafka, f"{prefix}.{TOO_LARGE}")
        assert large == Counter(r for r in expected(lake / TOO_LARGE).elements() if r[2] == 0)  # up to the big row
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]


def _new_topic(name: str) -> Any:
    from kafka.admin import NewTopic

    return NewTopic(name, num_partitions=1, replication_factor=1)
