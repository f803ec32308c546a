"""Avro-encoded Debezium events through KafkaSink versus a bare producer sending the same bytes, and versus JSON.

The same change rows (``benchmarks.kafka_sink``'s orders: id, customer, decimal amount, timestamp)
go to a local tansu broker as ``format=debezium&key=id`` events four ways, each the best of three
interleaved runs:

- KafkaSink with ``encoding=avro`` (its schemas registered with the tests' stand-in Schema
  Registry, ``tests/sinks/schema_registry.py``, on 127.0.0.1: one request per schema, none per message);
- a bare kafka-python producer sending the very bytes the Avro sink sends (keys, values, the five
  headers), pre-encoded: the target is the sink at >= 80% of it;
- KafkaSink with the JSON encoding of the same events, and a bare producer of those JSON bytes.

Run::

    .venv/bin/python -m benchmarks.kafka_avro [--rows N] [--runs N]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from kafka import KafkaAdminClient

from benchmarks.kafka_sink import (
    TABLE,
    bare_producer,
    make_batches,
    new_topic,
    tansu_broker,
    through_sink,
)
from deltatail.sinks.kafka.avro import AvroEncoder
from deltatail.sinks.kafka.debezium import EventOptions
from deltatail.sinks.kafka.encoding import ChangeEncoder
from deltatail.sinks.kafka.registry import RegistryClient
from deltatail.state.feed import ChangeBatch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "sinks"))
from schema_registry import SchemaRegistry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    batches = make_batches(args.rows)
    registry = SchemaRegistry()
    registry.start()
    try:
        with tansu_broker() as bootstrap:
            admin = KafkaAdminClient(bootstrap_servers=bootstrap)
            avro = AvroEncoder(
                TABLE,
                topic="bench-avro",
                registry=RegistryClient(registry.url),
                format="debezium",
                key_columns=["id"],
                tombstones=False,
                events=EventOptions(),
                clock_ms=lambda: 1_700_000_000_000,
            )
            json_encoder = ChangeEncoder(TABLE, format="debezium", key_columns=["id"])
            avro_size = len(avro.encode(batches[0]).values[0] or b"")
            json_size = len(json_encoder.encode(batches[0]).values[0] or b"")
            print(f"{args.rows} rows, debezium events: Avro value ~{avro_size} B, JSON value ~{json_size} B")
            for label, encode in encodings(avro, json_encoder).items():
                wall, cpu_s = time.perf_counter(), time.process_time()
                for batch in batches:
                    encode(batch)
                wall, cpu_s = time.perf_counter() - wall, time.process_time() - cpu_s
                per_event = f"{wall / args.rows * 1e6:6.1f} us/event, CPU {cpu_s / args.rows * 1e6:.1f}"
                print(f"encoding alone, {label:<36}{per_event}")
            uri = f"kafka://{bootstrap}/{{topic}}?format=debezium&key=id"
            avro_uri = uri + f"&encoding=avro&registry={registry.url}"
            runs: dict[str, list[float]] = {}
            cpu: dict[str, list[float]] = {label: [] for label in LABELS}
            sink_avro, bare_avro, sink_json, bare_json = LABELS
            for _ in range(args.runs):
                figures = {
                    sink_avro: through_sink(avro_uri.format(topic=new_topic(admin)), batches, cpu=cpu[sink_avro]),
                    bare_avro: bare_producer(
                        bootstrap,
                        new_topic(admin),
                        batches,
                        headers=True,
                        encoder=avro,  # type: ignore[arg-type]
                        cpu=cpu[bare_avro],
                    ),
                    sink_json: through_sink(uri.format(topic=new_topic(admin)), batches, cpu=cpu[sink_json]),
                    bare_json: bare_producer(
                        bootstrap, new_topic(admin), batches, headers=True, encoder=json_encoder, cpu=cpu[bare_json]
                    ),
                }
                for label, rate in figures.items():
                    runs.setdefault(label, []).append(rate)
            admin.close()
    finally:
        registry.stop()
    report(runs, cpu)


#: The four ways the events are sent: the Avro sink, a bare producer of its bytes, the same for JSON.
LABELS = (
    "KafkaSink, Avro (encodes too)",
    "bare kafka-python, the same Avro bytes + 5 headers",
    "KafkaSink, JSON (encodes too)",
    "bare kafka-python, the same JSON bytes + 5 headers",
)


def report(runs: dict[str, list[float]], cpu: dict[str, list[float]]) -> None:
    """The best rate of each way, and the ratios by wall clock and by process CPU time (least of the runs)."""
    best = {label: max(rates) for label, rates in runs.items()}
    least = {label: min(seconds) for label, seconds in cpu.items()}
    for label, rate in best.items():
        print(f"{label:<56}{rate:>10,.0f} msg/s (runs: {', '.join(f'{r:,.0f}' for r in runs[label])})")
        print(f"{'':<56}CPU {least[label]:.2f} s (runs: {', '.join(f'{s:.2f}' for s in cpu[label])})")
    sink_avro, bare_avro, sink_json, _ = LABELS
    print(f"Avro sink / bare producer of its bytes: {best[sink_avro] / best[bare_avro]:.0%} wall clock, ", end="")
    print(f"{least[bare_avro] / least[sink_avro]:.0%} CPU time (target >= 80%)")
    print(f"Avro sink / JSON sink, same events: {best[sink_avro] / best[sink_json]:.0%} wall clock, ", end="")
    print(f"{least[sink_json] / least[sink_avro]:.0%} CPU time")


def encodings(avro: AvroEncoder, json_encoder: ChangeEncoder) -> dict[str, Callable[[ChangeBatch], object]]:
    """The encodings timed alone: the sink's Avro (column-wise), Avro message by message as before, JSON."""

    def per_message(batch: ChangeBatch) -> object:
        encoded = avro._json.encode(batch)
        value, key = avro._writers_of(batch)
        return [key.write(k) for k in encoded.keys], [None if v is None else value.write(v) for v in encoded.values]

    return {
        "Avro (column-wise)": avro.encode,
        "Avro (one fastavro call a message)": per_message,
        "JSON": json_encoder.encode,
    }


if __name__ == "__main__":
    main()
