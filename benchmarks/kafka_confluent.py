"""KafkaSink with confluent-kafka against a bare confluent-kafka producer: wall clock and main-thread CPU.

Both send the same change rows (``benchmarks.kafka_sink``'s orders, ~190-byte JSON values, the
sink's five headers) to a local tansu broker with the sink's librdkafka settings
(``KafkaOptions.confluent_config()``), the bare producer pre-encoded. Both producers hold their
idempotent producer id before their clocks start (one message delivered to a scratch topic). The
runs alternate, sink then bare, ``--runs`` times.

Besides the wall clock, each side's main-thread CPU time (``time.thread_time``) is printed: the
thread that encodes (the sink) and calls ``produce`` (both), which on the quiet machine is busy all
the time and so sets the rate. On a machine shared with other work the wall clock mostly measures
the scheduler; the CPU time does not. ``--profile`` runs each side once more under cProfile.

Run::

    .venv/bin/python -m benchmarks.kafka_confluent [--rows N] [--runs N] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import pstats
import statistics
import time
from typing import Any

from kafka import KafkaAdminClient

from benchmarks.kafka_sink import TABLE, encoded_messages, make_batches, new_topic, tansu_broker
from benchmarks.kafka_tailer import warm_up
from deltatail.sinks.kafka.options import KafkaOptions
from deltatail.sinks.kafka.sink import KafkaSink
from deltatail.state.feed import ChangeBatch
from deltatail.tailer.collector import collector_paused

#: Seconds of wall clock and of main-thread CPU.
Timing = tuple[float, float]


def bare(bootstrap: str, topic: str, messages: list[Any], warm_topic: str) -> Timing:
    """The pre-encoded messages through a bare producer, sent as the sink sends them (a poll every 1,024)."""
    ck = importlib.import_module("confluent_kafka")
    options = KafkaOptions.from_uri(f"kafka://{bootstrap}/{topic}?backend=confluent")
    producer = ck.Producer({k: v for k, v in options.confluent_config().items() if k != "logger"})
    producer.list_topics(topic, timeout=10)
    warm_up(producer, warm_topic)
    failed: list[Any] = []

    def report(error: Any, message: Any) -> None:
        if error is not None:
            failed.append(error)

    produce, poll = producer.produce, producer.poll
    wall, cpu = time.perf_counter(), time.thread_time()
    with collector_paused():
        for i, (k, v, h) in enumerate(messages):
            while True:
                try:
                    produce(topic, v, k, -1, on_delivery=report, headers=h)
                    break
                except BufferError:
                    poll(0.01)
            if not i % 1024:
                poll(0)
    remaining = producer.flush(60)
    timing = time.perf_counter() - wall, time.thread_time() - cpu
    assert not failed and not remaining, (failed[:3], remaining)
    return timing


def sink(bootstrap: str, topic: str, batches: list[ChangeBatch], warm_topic: str) -> Timing:
    """KafkaSink (confluent backend) writing the batches and flushing, its producer holding its id first."""
    opened = KafkaSink(f"kafka://{bootstrap}/{topic}?key=id&backend=confluent")
    opened.open(TABLE)
    warm_up(opened._producer._producer, warm_topic)  # type: ignore[union-attr]
    wall, cpu = time.perf_counter(), time.thread_time()
    for batch in batches:
        opened.write(batch)
    opened.flush()
    timing = time.perf_counter() - wall, time.thread_time() - cpu
    opened.close()
    return timing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="cProfile one more run of each side")
    args = parser.parse_args()
    batches = make_batches(args.rows)
    messages = encoded_messages(batches, headers=True)
    timings: dict[str, list[Timing]] = {"sink": [], "bare": []}
    with tansu_broker() as bootstrap:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        warm_topic = new_topic(admin)
        for _ in range(args.runs):
            timings["sink"].append(sink(bootstrap, new_topic(admin), batches, warm_topic))
            timings["bare"].append(bare(bootstrap, new_topic(admin), messages, warm_topic))
        if args.profile:
            for side, run in (
                ("sink", lambda: sink(bootstrap, new_topic(admin), batches, warm_topic)),
                ("bare", lambda: bare(bootstrap, new_topic(admin), messages, warm_topic)),
            ):
                profile = cProfile.Profile()
                profile.runcall(run)
                print(f"--- cProfile, {side}")
                pstats.Stats(profile).sort_stats("tottime").print_stats(12)
        admin.close()
    report(args.rows, timings)


def report(rows: int, timings: dict[str, list[Timing]]) -> None:
    """Each run's figures, and the ratios (bare over sink: the sink's share of the bare producer's speed)."""
    for side, runs in timings.items():
        walls = ", ".join(f"{rows / w:,.0f}" for w, _ in runs)
        cpus = ", ".join(f"{c:.3f}" for _, c in runs)
        print(f"{side:<5} msgs/s: {walls}; main-thread CPU s: {cpus}")
    pairs = list(zip(timings["sink"], timings["bare"], strict=True))
    wall_ratios = [b[0] / s[0] for s, b in pairs]
    cpu_ratios = [b[1] / s[1] for s, b in pairs]
    print("sink / bare by wall clock, run by run: " + ", ".join(f"{r:.0%}" for r in wall_ratios))
    print("sink / bare by main-thread CPU, run by run: " + ", ".join(f"{r:.0%}" for r in cpu_ratios))
    print(
        f"medians: wall {statistics.median(wall_ratios):.0%}, CPU {statistics.median(cpu_ratios):.0%} (target >= 80%)"
    )


if __name__ == "__main__":
    main()
