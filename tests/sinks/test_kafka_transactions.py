"""``transactions=true``: Debezium's transaction metadata, one transaction per Delta commit, exactly once across kills.

A table written by deltalake is sent by ``deltatail run`` (the real command line) into tansu, killed at
the run loop's crash points and at random instants, and restarted on the same state directory. The
transaction topic must then hold one ``BEGIN`` and one ``END`` per commit, in commit order, each
``END`` counting exactly the commit's change rows as deltalake's ``load_cdf`` gives them, and every
change event must be there once with a ``transaction`` block that numbers the commit's events 1..N.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest

pytest.importorskip("kafka")
pytest.importorskip("deltalake")

from deltalake import DeltaTable, write_deltalake

from deltatail.sinks.kafka.options import KafkaOptions
from deltatail.sinks.kafka.sink import KafkaSink
from deltatail.state.cursor import Position
from deltatail.state.errors import ConfigError
from deltatail.state.feed import ChangeBatch, CommitEvent, TableInfo

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: launcher.py (tests/ is not a package)
from launcher import popen

ROOT = Path(__file__).resolve().parents[2]
CDF = {"delta.enableChangeDataFeed": "true"}


def rows(ids: range, parts: int = 6) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(list(ids), pa.int64()),
            "p": pa.array([i % parts for i in ids], pa.int64()),
            "score": pa.array([i * 0.5 for i in ids], pa.float64()),
        }
    )


def history(root: Path) -> list[Callable[[], object]]:
    """Partitioned commits of several files (several batches each), updates, deletes, an empty-ish commit:
    one writer step per commit, so that a campaign can commit one before each run."""
    t = str(root)
    return [
        lambda: write_deltalake(t, rows(range(300)), partition_by=["p"], configuration=CDF),
        lambda: write_deltalake(t, rows(range(300, 480)), mode="append"),
        lambda: DeltaTable(t).update(updates={"score": "score + 1"}, predicate="id % 7 = 0"),
        lambda: DeltaTable(t).delete("id % 11 = 0"),
        lambda: write_deltalake(t, rows(range(480, 540)), mode="append"),
        lambda: DeltaTable(t).update(updates={"score": "score * 2"}, predicate="p = 2"),
        lambda: write_deltalake(t, rows(range(540, 600)), mode="append"),
    ]


def rows_per_version(root: Path) -> dict[int, int]:
    table = pa.table(DeltaTable(str(root)).load_cdf(starting_version=0).read_all())
    return dict(Counter(table.column("_commit_version").to_pylist()))


def run(table: Path, state: Path, uri: str, crash: str | None, rng: random.Random, *, forked: bool = True) -> int:
    """One ``deltatail run --until-caught-up``, ended by ``crash`` (a crash point, or ``kill:<s>``: SIGKILL at a
    random instant); ``forked`` by the test launcher (tests/launcher.py: the same ``main`` without the
    interpreter's start), else started by ``subprocess`` (the campaign's last, clean run)."""
    script = Path(sys.executable).parent / "deltatail"
    args = [str(script), "run", str(table), "--state-dir", str(state), "--sink", uri, "--until-caught-up"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELTATAIL_")}
    if crash and not crash.startswith("kill"):
        env["DELTATAIL_CRASH_AT"] = crash
    start = popen if forked else subprocess.Popen
    proc = start([*args, "--checkpoint-commits", "1"], cwd=ROOT, env=env, stderr=subprocess.PIPE)
    if crash and crash.startswith("kill"):
        time.sleep(rng.uniform(0.05, float(crash.partition(":")[2])))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode in (0, -signal.SIGKILL) and err is not None, (err or b"").decode()[-2000:]
    return proc.returncode


@pytest.mark.slow
def test_begin_and_end_of_every_commit_exactly_once_across_kills(kafka_broker: Any, tmp_path: Path) -> None:
    topic, tx_topic = kafka_broker.new_topic(3), kafka_broker.new_topic(1, prefix="tx")
    uri = kafka_broker.uri(
        topic, format="debezium", key="id", exactly_once=True, transactions=True, transaction_topic=tx_topic
    )
    rng = random.Random(30)
    # Before each run the writer commits once more, so every run has work left: a crash point always strikes
    # (the first commit's six partition files are several writes); a kill at a random instant may come
    # after the run is done, which the machine's speed decides.
    crashes = [
        *("after_write:2", "after_flush:1", "kill:0.6", "after_write:1"),
        *("after_save:1", "kill:0.4", "after_write:1"),
    ]
    killed: list[int] = []
    for step, crash in zip(history(tmp_path / "t"), crashes, strict=True):
        step()
        killed.append(run(tmp_path / "t", tmp_path / "state", uri, crash, rng))
    at_points = [code for code, crash in zip(killed, crashes, strict=True) if not crash.startswith("kill")]
    assert at_points == [-signal.SIGKILL] * len(at_points)
    assert run(tmp_path / "t", tmp_path / "state", uri, None, rng, forked=False) == 0
    expected = rows_per_version(tmp_path / "t")

    boundaries = [(orjson.loads(r.key), orjson.loads(r.value)) for r in kafka_broker.consume(tx_topic)]
    table_id = boundaries[0][1]["id"].rpartition(":")[0]
    wanted: list[tuple[dict[str, str], str, int | None, list[dict[str, Any]] | None]] = []
    for version in sorted(expected):
        tx = f"{table_id}:{version}"
        wanted.append(({"id": tx}, "BEGIN", None, None))
        collections = [{"data_collection": "delta.t", "event_count": expected[version]}]
        wanted.append(({"id": tx}, "END", expected[version], collections))
    assert [(k, v["status"], v["event_count"], v["data_collections"]) for k, v in boundaries] == wanted
    assert all(isinstance(v["ts_ms"], int) for _, v in boundaries)

    events = [orjson.loads(r.value) for r in kafka_broker.consume(topic)]
    blocks = Counter((e["transaction"]["id"], e["transaction"]["total_order"]) for e in events)
    assert blocks == Counter({(f"{table_id}:{v}", k): 1 for v, n in expected.items() for k in range(1, n + 1)})
    for e in events:
        block = e["transaction"]
        assert block["id"] == f"{table_id}:{e['source']['commit_version']}"
        assert block["total_order"] == block["data_collection_order"] == e["source"]["index"] + 1
        assert e["op"] in ("c", "d")  # one event per change row: an update is a d and a c


TABLE = TableInfo("/data/orders", "tid-orders", "orders")


def test_the_transaction_block_in_the_connect_schema_and_a_commit_without_rows(kafka_broker: Any) -> None:
    topic, tx_topic = kafka_broker.new_topic(1), kafka_broker.new_topic(1, prefix="tx")
    sink = KafkaSink(
        kafka_broker.uri(
            topic, format="debezium", key="id", schemas=True, transactions=True, transaction_topic=tx_topic
        )
    )
    sink.open(TABLE)
    n = 3
    batch_rows = pa.record_batch(
        {
            "id": pa.array([1, 1, 2], pa.int64()),
            "_change_type": pa.array(["update_preimage", "update_postimage", "insert"]),
            "_commit_version": pa.array([4] * n, pa.int64()),
            "_commit_timestamp": pa.array([1_700_000_000_000_000] * n, pa.timestamp("us", tz="UTC")),
        }
    )
    sink.write(ChangeBatch(Position.change(4, 0), batch_rows))
    sink.commit_event(CommitEvent(4, 1_700_000_000_000, "MERGE"))
    sink.commit_event(CommitEvent(5, 1_700_000_001_000, "OPTIMIZE"))  # no change rows
    sink.flush()
    sink.close()
    events = [orjson.loads(r.value) for r in kafka_broker.consume(topic)]
    assert [(e["payload"]["op"], e["payload"]["transaction"]) for e in events] == [
        ("d", {"id": "tid-orders:4", "total_order": 1, "data_collection_order": 1}),
        ("c", {"id": "tid-orders:4", "total_order": 2, "data_collection_order": 2}),
        ("c", {"id": "tid-orders:4", "total_order": 3, "data_collection_order": 3}),
    ]
    block = next(f for f in events[0]["schema"]["fields"] if f["field"] == "transaction")
    assert block["name"] == "event.block" and block["optional"] is True
    boundaries = [orjson.loads(r.value) for r in kafka_broker.consume(tx_topic)]
    assert [(b["status"], b["id"], b["event_count"], b["ts_ms"]) for b in boundaries] == [
        ("BEGIN", "tid-orders:4", None, 1_700_000_000_000),
        ("END", "tid-orders:4", 3, 1_700_000_000_000),
        ("BEGIN", "tid-orders:5", None, 1_700_000_001_000),
        ("END", "tid-orders:5", 0, 1_700_000_001_000),
    ]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("format=flat&transactions=true", "transactions=true needs format=debezium"),
        ("format=debezium&transaction_topic=x", "transaction_topic applies to transactions=true only"),
        ("format=debezium&transactions=maybe", "transactions"),
    ],
)
def test_transaction_options_are_checked(query: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        KafkaOptions.from_uri(f"kafka://127.0.0.1:9092/t?{query}")
