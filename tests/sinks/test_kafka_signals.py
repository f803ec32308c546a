"""``serve``'s Kafka signal topic: a Debezium ``execute-snapshot`` message on the real broker triggers one snapshot.

The service follows two tables written by deltalake; messages are produced to the signal topic on
the tansu broker. Only the message with the service's key asks for a snapshot, of the table it
names only, with its condition; read again after a restart, it asks for nothing more.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: launcher.py (tests/ is not a package)
import launcher

ROOT = Path(__file__).resolve().parents[2]
CDF = {"delta.enableChangeDataFeed": "true"}


def rows(ids: range) -> pa.Table:
    return pa.table({"id": pa.array(list(ids), pa.int64()), "v": pa.array([f"a{i}" for i in ids])})


def lines(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def snapshot_rows(out: Path) -> list[tuple[Any, ...]]:
    return [(r["id"], r["v"], r["_commit_version"]) for r in lines(out) if r["_position"][2]]


def change_rows(out: Path) -> Counter[tuple[Any, ...]]:
    return Counter(
        (r["id"], r["v"], r["_change_type"], r["_commit_version"]) for r in lines(out) if not r["_position"][2]
    )


def cdf(path: Path) -> Counter[tuple[Any, ...]]:
    got = pa.table(DeltaTable(str(path)).load_cdf(starting_version=0).read_all()).to_pylist()
    return Counter((r["id"], r["v"], r["_change_type"], r["_commit_version"]) for r in got)


Started = subprocess.Popen[bytes] | launcher.Launched


def wait_for(proc: Started, done: Any, deadline: float) -> None:
    while not done():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)


def serve(config: Path, *, forked: bool = False) -> Started:
    """``deltatail serve``, started by ``subprocess`` or ``forked`` by the test launcher (tests/launcher.py:
    the same ``main`` without the interpreter's start)."""
    args = [sys.executable, "-m", "deltatail", "serve", "--config", str(config)]
    if forked:
        return launcher.popen(args, cwd=ROOT, env=os.environ, stderr=subprocess.PIPE)
    return subprocess.Popen(args, cwd=ROOT, stderr=subprocess.PIPE)


def write_config(tmp_path: Path, bootstrap: str, topic: str, tables: list[Path], defaults: str = "") -> Path:
    """A serve configuration: state in ``tmp_path/state``, JSON lines in ``tmp_path/out``, signals on ``topic``."""
    config = tmp_path / "serve.toml"
    paths = "".join(f'[[tables]]\npath = "{t}"\n\n' for t in tables)
    config.write_text(
        f'[service]\nstate_root = "{tmp_path / "state"}"\nlisten = "off"\n'
        f'signal_kafka_topic = "kafka://{bootstrap}/{topic}"\n\n'
        f'[defaults]\nsink = "jsonl:{tmp_path / "out"}/{{table_name}}.jsonl"\n{defaults}'
        f"poll_interval = 0.1\nreader_processes = 0\n\n{paths}"
    )
    return config


def stop(proc: Started) -> str:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert err is not None and proc.returncode == 0, (err or b"").decode()[-3000:]
    return err.decode()


@pytest.mark.slow
def test_a_signal_message_snapshots_the_table_it_names_once(tmp_path: Path, kafka_broker: Any) -> None:
    lake, out, state = tmp_path / "lake", tmp_path / "out", tmp_path / "state"
    for name in ("a", "b"):
        write_deltalake(str(lake / name), rows(range(10)), configuration=CDF)
    topic = kafka_broker.new_topic(partitions=1, prefix="signals")
    config = write_config(
        tmp_path, kafka_broker.bootstrap, topic, [lake / "a", lake / "b"], "checkpoint_seconds = 0.2\n"
    )
    out.mkdir()
    snapshot = {
        "type": "execute-snapshot",
        "data": {
            "data-collections": ["a"],
            "type": "incremental",
            "additional-conditions": [{"data-collection": "a", "filter": "id < 4"}],
        },
    }
    kafka_broker.produce(
        topic,
        [
            (b"another-service", json.dumps({**snapshot, "data": {"data-collections": ["b"]}}).encode(), [], 0),
            (b"deltatail", b"{not json", [], 0),
            (b"deltatail", json.dumps(snapshot).encode(), [], 0),
        ],
    )
    proc = serve(config, forked=True)
    deadline = time.monotonic() + 180
    try:
        wait_for(proc, lambda: len(lines(out / "a.jsonl")) >= 14 and len(lines(out / "b.jsonl")) >= 10, deadline)
        for name in ("a", "b"):
            write_deltalake(str(lake / name), rows(range(10, 12)), mode="append")
        wait_for(proc, lambda: len(lines(out / "a.jsonl")) >= 16 and len(lines(out / "b.jsonl")) >= 12, deadline)
    finally:
        err = stop(proc)
    assert "message kafka-0-1 passed over" in err
    assert snapshot_rows(out / "a.jsonl") == [(i, f"a{i}", 0) for i in range(4)]
    assert snapshot_rows(out / "b.jsonl") == []  # the other service's message named b
    proc = serve(config, forked=True)  # the signal topic is read again from the saved offset: nothing asked twice
    try:
        for name in ("a", "b"):
            write_deltalake(str(lake / name), rows(range(12, 13)), mode="append")
        wait_for(proc, lambda: len(lines(out / "a.jsonl")) >= 17 and len(lines(out / "b.jsonl")) >= 13, deadline)
    finally:
        stop(proc)
    assert json.loads((state / "kafka-signals.json").read_bytes()) == {"0": 3}
    assert snapshot_rows(out / "a.jsonl") == [(i, f"a{i}", 0) for i in range(4)]
    for name in ("a", "b"):
        assert change_rows(out / f"{name}.jsonl") == cdf(lake / name)


def run_into(table: Path, state: Path, uri: str, crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
    """``deltatail run --until-caught-up`` into ``uri``, forked by the test launcher."""
    env = {k: v for k, v in os.environ.items() if k != "DELTATAIL_CRASH_AT"}
    if crash_at is not None:
        env["DELTATAIL_CRASH_AT"] = crash_at
    return launcher.run(
        [sys.executable, "-m", "deltatail", "run", str(table), "--state-dir", str(state), "--sink", uri,
         "--until-caught-up", "--reader-processes", "0"],
        cwd=ROOT, text=True, env=env, timeout=300,
    )  # fmt: skip


@pytest.mark.slow
def test_a_keyed_snapshot_into_debezium_interleaves_once_across_a_kill(tmp_path: Path, kafka_broker: Any) -> None:
    table, state = tmp_path / "t", tmp_path / "state"
    write_deltalake(str(table), rows(range(30)), configuration=CDF)
    topic = kafka_broker.new_topic(partitions=1)
    uri = kafka_broker.uri(topic, format="debezium", key="id", exactly_once=True)
    assert run_into(table, state, uri).returncode == 0
    asked = launcher.run(
        [sys.executable, "-m", "deltatail", "signal", str(state), "snapshot", "--chunk-rows", "4"],
        cwd=ROOT, text=True, env=os.environ, timeout=300,
    )  # fmt: skip
    assert asked.returncode == 0, asked.stderr
    DeltaTable(str(table)).delete("id >= 10 AND id < 13")  # version 1: after the first chunk, before the others
    killed = run_into(table, state, uri, crash_at="after_write:3")  # killed inside the snapshot, after version 1
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    finished = run_into(table, state, uri)
    assert finished.returncode == 0, finished.stderr
    events = [json.loads(r.value) for r in kafka_broker.consume(topic) if r.value is not None]
    ops = [(e["op"], (e["after"] or e["before"])["id"]) for e in events]
    later = [i for i in range(4, 30) if not 10 <= i < 13]  # the deleted keys' rows are dropped from later chunks
    assert ops == (
        [("c", i) for i in range(30)]
        + [("r", i) for i in range(4)]  # the first chunk, after version 0
        + [("d", i) for i in range(10, 13)]  # version 1
        + [("r", i) for i in later]  # the other chunks, after version 1: each row once
    )
    # source.(commit_version, snapshot, index) is the row's position: V+1:s<i> after version V, i going on
    snap = [e["source"] for e in events if e["op"] == "r"]
    assert [(s["commit_version"], s["snapshot"], s["index"]) for s in snap] == [(1, "true", i) for i in range(4)] + [
        (2, "true", i) for i in range(4, 4 + len(later))
    ]


@pytest.mark.slow
def test_a_signal_naming_a_lance_dataset_fails_its_request(tmp_path: Path, kafka_broker: Any) -> None:
    lance = pytest.importorskip("lance")
    lake, out, state = tmp_path / "lake", tmp_path / "out", tmp_path / "state"
    write_deltalake(str(lake / "a"), rows(range(5)), configuration=CDF)
    lance.write_dataset(rows(range(3)), str(lake / "ds"))
    topic = kafka_broker.new_topic(partitions=1, prefix="signals")
    config = write_config(tmp_path, kafka_broker.bootstrap, topic, [lake / "a", lake / "ds"])
    out.mkdir()
    signal_value = {"type": "execute-snapshot", "data": {"data-collections": ["ds", "a"], "type": "incremental"}}
    kafka_broker.produce(topic, [(b"deltatail", json.dumps(signal_value).encode(), [], 0)])
    proc = serve(config)
    try:
        wait_for(proc, lambda: len(snapshot_rows(out / "a.jsonl")) == 5, time.monotonic() + 180)
    finally:
        err = stop(proc)
    reason = "on-demand snapshots are for Delta tables, not a Lance dataset"
    assert f"snapshot kafka-0-0 of ds failed: {reason}" in err
    status = subprocess.run(
        [sys.executable, "-m", "deltatail", "signal", str(state), "status", "--table", "ds", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
    last = json.loads(status.stdout)["last"]
    assert (last["outcome"], last["error"], last["request"]["id"]) == ("failed", reason, "kafka-0-0")
    assert json.loads(status.stdout)["waiting"] is None
