"""The Kafka sink with Debezium-style events: the ordering check at open, schemas, heartbeats (local tansu broker)."""

from __future__ import annotations

import datetime as dt
import itertools
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest

from deltatail.sinks.kafka.sink import KafkaSink
from deltatail.state.cursor import Position
from deltatail.state.errors import ConfigError, SinkError
from deltatail.state.feed import ChangeBatch, FollowStatus, TableInfo

TABLE = TableInfo("/data/orders", "tid-orders", "orders")
TS = dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC)


def inserts(version: int, ids: list[int]) -> ChangeBatch:
    n = len(ids)
    rows = pa.record_batch(
        {
            "id": pa.array(ids, pa.int64()),
            "_change_type": pa.array(["insert"] * n),
            "_commit_version": pa.array([version] * n, pa.int64()),
            "_commit_timestamp": pa.array([TS] * n, pa.timestamp("us", tz="UTC")),
        }
    )
    return ChangeBatch(Position.change(version, 0), rows)


def test_unkeyed_events_on_several_partitions_are_refused_at_open(kafka_broker: Any) -> None:
    topic = kafka_broker.new_topic(3)
    for fmt in ("debezium", "flat"):
        sink = KafkaSink(kafka_broker.uri(topic, format=fmt))
        with pytest.raises(ConfigError, match=f"format={fmt} without key= on topic {topic} with 3 partitions"):
            sink.open(TABLE)
        sink.close()
    for uri in (
        kafka_broker.uri(topic, format="debezium", allow_unordered=True),
        kafka_broker.uri(topic, format="debezium", key="id"),
        kafka_broker.uri(topic, format="json"),
    ):
        sink = KafkaSink(uri)
        sink.open(TABLE)
        sink.write(inserts(1, [1, 2, 3]))
        sink.flush()
        sink.close()
    assert len(kafka_broker.consume(topic)) == 9


def test_schemas_and_the_operation_reach_the_topic(kafka_broker: Any) -> None:
    topic = kafka_broker.new_topic(1)
    sink = KafkaSink(kafka_broker.uri(topic, format="debezium", schemas=True, key="id", time_mode="micros"))
    sink.open(TABLE)
    sink.commit_started(4, "WRITE")
    sink.write(inserts(4, [1]))
    sink.write(inserts(5, [2]))  # no commit_started for version 5: its operation is unknown
    sink.flush()
    sink.close()
    records = kafka_broker.consume(topic)
    values = [orjson.loads(r.value) for r in records]
    assert [v["payload"]["source"]["operation"] for v in values] == ["WRITE", None]
    assert [orjson.loads(r.key)["payload"] for r in records] == [{"id": 1}, {"id": 2}]
    assert values[0]["schema"]["name"] == "deltatail.delta.orders.Envelope"


def test_heartbeats_go_to_their_own_topic(kafka: Any) -> None:
    topic, beats = kafka.new_topic(2), kafka.new_topic(1, prefix="hb")
    sink = KafkaSink(kafka.uri(topic, key="id", exactly_once=True, heartbeat_interval=3600, heartbeat_topic=beats))
    with pytest.raises(SinkError, match="not open"):
        sink.heartbeat(FollowStatus("tid-orders", 1, 1, 0.5))
    sink.open(TABLE)
    sink.write(inserts(1, [1, 2]))
    sink.heartbeat(FollowStatus("tid-orders", 1, 1, 0.5))
    sink.heartbeat(FollowStatus("tid-orders", 1, 1, 0.6))  # within the interval: not sent
    sink.flush()
    sink.close()
    [beat] = kafka.consume(beats)
    assert orjson.loads(beat.key) == {"serverName": "deltatail", "table_id": "tid-orders"}
    body = orjson.loads(beat.value)
    assert (body["commit_version"], body["newest_version"], body["seconds_behind"]) == (1, 1, 0.5)
    assert abs(body["ts_ms"] - time.time() * 1000) < 60_000
    assert dict(beat.headers)["dt.change_type"] == b"heartbeat"
    # The change topic holds the rows only, and a new exactly-once sink still opens on it.
    assert len(kafka.consume(topic)) == 2
    again = KafkaSink(kafka.uri(topic, key="id", exactly_once=True, heartbeat_interval=1, heartbeat_topic=beats))
    again.open(TABLE)
    again.write(inserts(1, [1, 2]))  # already there: skipped
    again.flush()
    again.close()
    assert len(kafka.consume(topic)) == 2


def test_heartbeat_topic_must_be_its_own(kafka_broker: Any) -> None:
    topic = kafka_broker.new_topic(1)
    sink = KafkaSink(kafka_broker.uri(topic, heartbeat_interval=1, heartbeat_topic=topic))
    with pytest.raises(ConfigError, match=r"heartbeat_topic .* is the topic of changes or commit events"):
        sink.open(TABLE)
    without_heartbeats = KafkaSink(kafka_broker.uri(topic))
    without_heartbeats.open(TABLE)
    without_heartbeats.heartbeat(FollowStatus("tid-orders", 1, 1, 0.0))  # no heartbeat_interval: nothing
    without_heartbeats.close()
    assert kafka_broker.consume(topic) == []


# ---------------------------------------------------------------- heartbeats from the tailer


def run_for(root: Path, state: Path, uri: str, seconds: float) -> None:
    """Run a tailer (polling every 0.05 s) for ``seconds``, then stop it; its errors fail the test."""
    from deltatail.tailer.follow.tailer import Tailer, TailerConfig

    tailer = Tailer(TailerConfig(table=str(root), state_dir=str(state), poll_interval=0.05), KafkaSink(uri))
    failure: list[BaseException] = []

    def run() -> None:
        try:
            tailer.run()
        except BaseException as e:  # handed to the test thread
            failure.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(seconds)
    tailer.stop()
    thread.join(60)
    assert not thread.is_alive() and not failure, failure


@pytest.mark.slow
def test_an_idle_tailer_sends_heartbeats_and_a_restarted_one_goes_on(kafka_broker: Any, tmp_path: Path) -> None:
    deltalake = pytest.importorskip("deltalake")
    root, state = tmp_path / "table", tmp_path / "state"
    data = pa.table({"id": pa.array(range(5), pa.int64())})
    deltalake.write_deltalake(str(root), data, configuration={"delta.enableChangeDataFeed": "true"})
    topic, beats = kafka_broker.new_topic(2), kafka_broker.new_topic(1, prefix="hb")
    uri = kafka_broker.uri(
        topic, format="debezium", key="id", exactly_once=True, heartbeat_interval=0.4, heartbeat_topic=beats
    )
    run_for(root, state, uri, 2.0)
    first = [orjson.loads(r.value) for r in kafka_broker.consume(beats)]
    assert 3 <= len(first) <= 6, len(first)
    gaps = [b["ts_ms"] - a["ts_ms"] for a, b in itertools.pairwise(first)]
    assert all(gap >= 395 for gap in gaps), gaps  # never more often than the interval (clock jitter aside)
    assert {(b["commit_version"], b["newest_version"], b["table_id"]) for b in first} == {(0, 0, first[0]["table_id"])}

    deltalake.write_deltalake(str(root), pa.table({"id": pa.array([5, 6], pa.int64())}), mode="append")
    deltalake.DeltaTable(str(root)).delete("id = 0")
    run_for(root, state, uri, 1.5)
    later = [orjson.loads(r.value) for r in kafka_broker.consume(beats)][len(first) :]
    assert len(later) >= 2
    assert later[-1]["commit_version"] == later[-1]["newest_version"] == 2
    assert later[0]["ts_ms"] > first[-1]["ts_ms"]
    # Exactly once, heartbeats or not: every change row once, in the change topic only.
    events = kafka_broker.consume(topic)
    ops = Counter((orjson.loads(r.value)["op"], orjson.loads(r.key)["id"]) for r in events)
    assert ops == Counter({("c", i): 1 for i in range(7)} | {("d", 0): 1})
    assert all(dict(r.headers)["dt.change_type"] != b"heartbeat" for r in events)
