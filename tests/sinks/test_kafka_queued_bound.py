"""The kafka-python backend bounds the bytes it holds unacknowledged (kafka-python 3 itself does not)."""

from __future__ import annotations

from typing import Any

from deltatail.sinks.kafka.options import KafkaOptions
from deltatail.sinks.kafka.producers import PythonProducer, Stamp

BOUND = 1 << 20
VALUE = 64 << 10


def test_queued_bytes_stay_under_the_bound_and_every_message_arrives(kafka_broker: Any) -> None:
    topic = kafka_broker.new_topic(partitions=2, prefix="bound")
    options = KafkaOptions.from_uri(kafka_broker.uri(topic))
    failures: list[tuple[Stamp, str]] = []
    producer = PythonProducer(options, lambda stamp, why: failures.append((stamp, why)), queued_bound=BOUND)
    seen = []
    try:
        for i in range(200):
            key = b"%d" % i
            producer.send(topic, key, bytes([i % 251]) * VALUE, [], i % 2, (1, 1, i, 0))
            seen.append(producer.queued_bytes)
        assert producer.wait(30.0) is None
    finally:
        producer.close(10.0)
    assert not failures
    assert max(seen) <= BOUND + VALUE + 8, "more than the bound and one message queued unacknowledged"
    assert max(seen) > BOUND // 2, "the queue never filled: the bound was not exercised"
    assert producer.queued_bytes == 0
    records = kafka_broker.consume(topic)
    assert sorted(int(r.key) for r in records) == list(range(200))
    assert all(r.value == bytes([int(r.key) % 251]) * VALUE for r in records)


def test_acknowledged_messages_are_released_as_they_are_sent_not_at_the_next_wait(kafka_broker: Any) -> None:
    """Many small messages between two waits: what the producer holds stays within the byte bound.

    Each held message keeps a kafka-python future (~1 KB with its errback), so holding every
    message until :meth:`wait` grew the process by ~90 MiB per 100,000 messages of a giant commit.
    """
    topic = kafka_broker.new_topic(partitions=2, prefix="held")
    options = KafkaOptions.from_uri(kafka_broker.uri(topic))
    failures: list[tuple[Stamp, str]] = []
    bound, size, count = 16 << 10, 100, 20_000
    producer = PythonProducer(options, lambda stamp, why: failures.append((stamp, why)), queued_bound=bound)
    most = 0
    try:
        for i in range(count):
            key = b"%05d" % i
            producer.send(topic, key, b"v" * (size - len(key)), [], i % 2, (1, 1, i, 0))
            most = max(most, producer.held)
        assert producer.wait(30.0) is None
    finally:
        producer.close(10.0)
    assert not failures
    assert most <= bound // size + 1, f"{most} messages held at once, more than the bound's worth"
    assert producer.held == 0
    records = kafka_broker.consume(topic)
    assert sorted(int(r.key) for r in records) == list(range(count))
