"""Kafka sinks sharing one producer (``sinks.kafka.shared``) against the real broker, with both backends."""

from __future__ import annotations

import datetime as dt
import socket
from typing import Any

import orjson
import pyarrow as pa
import pytest

pytest.importorskip("kafka")

from deltatail.sinks.kafka.options import KafkaOptions
from deltatail.sinks.kafka.shared import ProducerPool
from deltatail.sinks.kafka.sink import KafkaSink
from deltatail.state.cursor import Position
from deltatail.state.errors import SinkError, SinkUnavailableError
from deltatail.state.feed import ChangeBatch, TableInfo

COMMIT_TS = dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def table(i: int) -> TableInfo:
    return TableInfo(f"/data/t{i}", f"tid-{i}", f"t{i}")


def inserts(version: int, ids: list[int], name: str = "x") -> ChangeBatch:
    n = len(ids)
    batch = pa.record_batch(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([name] * n),
            "_change_type": pa.array(["insert"] * n),
            "_commit_version": pa.array([version] * n, pa.int64()),
            "_commit_timestamp": pa.array([COMMIT_TS] * n, pa.timestamp("us", tz="UTC")),
        }
    )
    return ChangeBatch(Position.change(version, 0), batch)


def ids_in(kafka: Any, topic: str) -> list[int]:
    return sorted(orjson.loads(r.value)["id"] for r in kafka.consume(topic))


def opened(kafka: Any, pool: ProducerPool, topic: str, i: int, **options: object) -> KafkaSink:
    sink = KafkaSink(kafka.uri(topic, **options), producers=pool)
    sink.open(table(i))
    return sink


def test_sinks_of_the_same_settings_share_one_producer(kafka: Any) -> None:
    pool = ProducerPool()
    topics = [kafka.new_topic(2) for _ in range(4)]
    sinks = [opened(kafka, pool, topic, i, exactly_once=True) for i, topic in enumerate(topics)]
    assert (pool.created, pool.live) == (1, 1)
    other = opened(kafka, pool, kafka.new_topic(1), 9, linger_ms=50)  # other settings: a producer of its own
    assert (pool.created, pool.live) == (2, 2)
    for version in range(3):
        for i, sink in enumerate(sinks):
            sink.write(inserts(version, [100 * i + 10 * version + k for k in range(5)]))
        for sink in sinks:
            sink.flush()
    for i, topic in enumerate(topics):
        assert ids_in(kafka, topic) == sorted(100 * i + 10 * v + k for v in range(3) for k in range(5))
    for sink in [*sinks, other]:
        sink.close()
    assert pool.live == 0
    again = opened(kafka, pool, topics[0], 0, exactly_once=True)  # a new producer, resuming exactly once
    again.write(inserts(2, [20, 21, 22, 23, 24]))
    again.write(inserts(3, [30]))
    again.flush()
    again.close()
    assert pool.created == 3
    assert ids_in(kafka, topics[0]) == sorted([*(10 * v + k for v in range(3) for k in range(5)), 30])


def test_a_message_too_large_fails_its_table_only(kafka: Any) -> None:
    pool = ProducerPool()
    big_topic, small_topic = kafka.new_topic(1), kafka.new_topic(1)
    big = opened(kafka, pool, big_topic, 1, max_message_bytes=4000)
    small = opened(kafka, pool, small_topic, 2, max_message_bytes=4000)
    assert pool.created == 1
    small.write(inserts(0, [1, 2]))
    with pytest.raises(SinkError, match=r"too large"):
        big.write(inserts(0, [7], name="b" * 5000))
    with pytest.raises(SinkError, match="stopped after an earlier failure"):
        big.flush()
    big.close()
    small.write(inserts(1, [3]))
    small.flush()  # the shared producer goes on for the other table
    assert ids_in(kafka, small_topic) == [1, 2, 3]
    assert ids_in(kafka, big_topic) == []
    small.close()
    assert pool.live == 0


def test_a_topic_that_cannot_be_opened_fails_its_table_only(kafka: Any) -> None:
    pool = ProducerPool()
    foreign, good = kafka.new_topic(1), kafka.new_topic(1)
    kafka.produce(foreign, [(b"k", b"not deltatail's", [], 0)])
    sink = opened(kafka, pool, good, 1, exactly_once=True)
    with pytest.raises(SinkError, match="not written by deltatail"):
        opened(kafka, pool, foreign, 2, exactly_once=True)
    assert (pool.created, pool.live) == (1, 1)
    sink.write(inserts(0, [1, 2, 3]))
    sink.flush()
    sink.close()
    assert ids_in(kafka, good) == [1, 2, 3]
    assert pool.live == 0


@pytest.mark.slow
def test_a_message_not_acknowledged_breaks_the_shared_producer(proxied_broker: Any) -> None:
    """Every sink on it fails as unavailable (cursor held); the next lease gets a new producer."""
    kafka, proxy = proxied_broker
    pool = ProducerPool()
    topics = [kafka.new_topic(1), kafka.new_topic(1)]
    options = {"delivery_timeout_ms": 1500, "request_timeout_ms": 1000, "exactly_once": True}
    sinks = [opened(kafka, pool, topic, i, **options) for i, topic in enumerate(topics)]
    sinks[0].write(inserts(0, [1]))
    sinks[1].write(inserts(0, [2]))
    for sink in sinks:
        sink.flush()
    proxy.stop()
    sinks[0].write(inserts(1, [3]))
    with pytest.raises(SinkUnavailableError, match="did not acknowledge"):
        sinks[0].flush()
    sinks[1].write(inserts(1, [4]))
    with pytest.raises(SinkUnavailableError):
        sinks[1].flush()
    for sink in sinks:
        sink.close()
    assert pool.live == 0
    proxy.start()
    again = [opened(kafka, pool, topic, i, **options) for i, topic in enumerate(topics)]
    assert pool.created == 2
    again[0].write(inserts(1, [3]))
    again[1].write(inserts(1, [4]))
    for sink in again:
        sink.flush()
        sink.close()
    assert ids_in(kafka, topics[0]) == [1, 3]
    assert ids_in(kafka, topics[1]) == [2, 4]


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_an_unreachable_cluster_leaves_nothing_in_the_pool(backend: str) -> None:
    pool = ProducerPool()
    uri = f"kafka://127.0.0.1:{unused_port()}/t?open_timeout_ms=1500&backend={backend}"
    if backend == "kafka-python":  # its producer connects as it is made: the lease itself fails
        with pytest.raises(SinkUnavailableError, match="cannot connect to Kafka"):
            pool.lease(KafkaOptions.from_uri(uri), lambda stamp, detail: None)
    with pytest.raises(SinkError, match=r"cannot (connect to Kafka|get the partitions)"):
        KafkaSink(uri, producers=pool).open(table(1))
    assert pool.live == 0
