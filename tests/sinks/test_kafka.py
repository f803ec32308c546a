"""KafkaSink against a real Kafka-protocol broker (tansu, memory-only, 127.0.0.1)."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import decimal
import gc
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import orjson
import pyarrow as pa
import pytest

pytest.importorskip("kafka")

from kafka.partitioner.default import murmur2 as kafka_murmur2

from deltatail.sinks.kafka import pairing
from deltatail.sinks.kafka.options import KafkaOptions, default_sink_id, fill_topic
from deltatail.sinks.kafka.partitioner import choose_partition, choose_partitions, murmur2
from deltatail.sinks.kafka.producers import Outgoing, _Finder
from deltatail.sinks.kafka.sink import KafkaSink
from deltatail.state.actions import parse_json_actions
from deltatail.state.audit import AuditEvent, build_audit_event
from deltatail.state.commit import Commit
from deltatail.state.cursor import Position
from deltatail.state.errors import ConfigError, SinkError
from deltatail.state.feed import ChangeBatch, CommitEvent, TableInfo
from deltatail.state.snapshot import Snapshot
from deltatail.tailer.collector import collector_paused

TABLE = TableInfo("/data/orders", "tid-orders", "orders")
OTHER = TableInfo("/data/users", "tid-users", "users")
UTC = dt.UTC
COMMIT_TS = dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
FIXED_CLOCK = 1_700_000_000_000
ITEM = pa.struct([("sku", pa.string()), ("qty", pa.int32())])


def rows(ids: list[int], change_types: list[str], *, version: int = 3, note: str = "") -> pa.RecordBatch:
    """Realistic change rows: ints, unicode, decimals, timestamps, dates, binary, nested, nulls."""
    n = len(ids)
    return pa.record_batch(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([None if i % 5 == 4 else f"Zoë-{i}{note} ✓" for i in ids]),
            "amount": pa.array([decimal.Decimal(i) / 100 for i in ids], pa.decimal128(12, 2)),
            "ordered_at": pa.array([COMMIT_TS + dt.timedelta(seconds=i) for i in ids], pa.timestamp("us", tz="UTC")),
            "day": pa.array([dt.date(2024, 1, 1 + i % 28) for i in ids], pa.date32()),
            "blob": pa.array([bytes([i % 256]) for i in ids], pa.binary()),
            "items": pa.array([[{"sku": f"s{i}", "qty": i}] if i % 3 else None for i in ids], pa.list_(ITEM)),
            "_change_type": pa.array(change_types),
            "_commit_version": pa.array([version] * n, pa.int64()),
            "_commit_timestamp": pa.array([COMMIT_TS] * n, pa.timestamp("us", tz="UTC")),
        }
    )


def merge_audit_event() -> AuditEvent:
    """The audit event of a hand-written MERGE commit (version 3) of table ``tid-orders``."""
    schema = '{"type":"struct","fields":[{"name":"id","type":"long","nullable":true,"metadata":{}}]}'
    created = [
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {"metaData": {"id": "tid-orders", "format": {"provider": "parquet", "options": {}},
                      "schemaString": schema, "partitionColumns": [], "configuration": {}}},
        {"add": {"path": "a.parquet", "partitionValues": {}, "size": 100, "modificationTime": 1,
                 "dataChange": True, "stats": '{"numRecords":3}'}},
    ]  # fmt: skip
    snap = Snapshot.empty("/data/orders")
    for version in range(3):
        actions = created if version == 0 else [{"commitInfo": {"operation": "WRITE"}}]
        commit = Commit.from_actions(version, parse_json_actions(b"\n".join(orjson.dumps(a) for a in actions)))
        snap, _ = snap.apply(commit)
    merge = [
        {"commitInfo": {"timestamp": 1704164645000, "operation": "MERGE", "userName": "bob@corp",
                        "operationParameters": {"predicate": "t.id = s.id"},
                        "operationMetrics": {"numTargetRowsUpdated": "1", "numTargetRowsInserted": "2",
                                             "numTargetRowsDeleted": "0", "numTargetRowsCopied": "2"}}},
        {"remove": {"path": "a.parquet", "deletionTimestamp": 5, "dataChange": True, "size": 100}},
        {"add": {"path": "b.parquet", "partitionValues": {}, "size": 150, "modificationTime": 5,
                 "dataChange": True, "stats": '{"numRecords":5}'}},
    ]  # fmt: skip
    commit = Commit.from_actions(3, parse_json_actions(b"\n".join(orjson.dumps(a) for a in merge)))
    return build_audit_event(commit, snap, file_mtime_ms=1704164645123, previous_timestamp_ms=None)


def inserts(version: int, start: int, ids: list[int]) -> ChangeBatch:
    return ChangeBatch(Position.change(version, start), rows(ids, ["insert"] * len(ids), version=version))


def header(record: Any, name: str) -> bytes | None:
    return dict(record.headers).get(name)


def position_of(record: Any) -> tuple[int, int, int, bool]:
    pos = Position.from_json(orjson.loads(header(record, "dt.position") or b"null"))
    return (pos.version, pos.snapshot_rank, pos.index, record.value is None)


def expected_json_row(i: int, change_type: str, version: int = 3) -> dict[str, Any]:
    return {
        "id": i,
        "name": None if i % 5 == 4 else f"Zoë-{i} ✓",
        "amount": f"{decimal.Decimal(i) / 100:.2f}",
        "ordered_at": (COMMIT_TS + dt.timedelta(seconds=i)).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "day": f"2024-01-{1 + i % 28:02d}",
        "blob": base64.b64encode(bytes([i % 256])).decode(),
        "items": [{"sku": f"s{i}", "qty": i}] if i % 3 else None,
        "_change_type": change_type,
        "_commit_version": version,
        "_commit_timestamp": "2024-01-02T03:04:05.123456Z",
    }


def open_sink(uri: str, table: TableInfo = TABLE) -> KafkaSink:
    sink = KafkaSink(uri, clock_ms=lambda: FIXED_CLOCK)
    assert sink.open(table) is None
    return sink


# ------------------------------------------------------------------ URI and options --


def test_uri_options_and_defaults() -> None:
    opts = KafkaOptions.from_uri(
        "kafka://127.0.0.1:1,127.0.0.1:2/cdc.{table_name}?format=debezium&key=id,region&tombstones=true"
        "&exactly_once=1&commit_topic=cdc.commits&sink_id=s1&linger_ms=5&compression=gzip",
        env={},
    )
    assert opts.bootstrap == ("127.0.0.1:1", "127.0.0.1:2")
    assert (opts.topic, opts.format, opts.key_columns) == ("cdc.{table_name}", "debezium", ("id", "region"))
    assert (opts.tombstones, opts.exactly_once, opts.commit_topic, opts.sink_id) == (True, True, "cdc.commits", "s1")
    assert (opts.linger_ms, opts.compression, opts.batch_size) == (5, "gzip", 262_144)
    config = opts.producer_config()
    assert config["enable_idempotence"] is True and config["acks"] == "all"
    assert config["bootstrap_servers"] == ["127.0.0.1:1", "127.0.0.1:2"]
    assert (config["linger_ms"], config["compression_type"], config["max_request_size"]) == (5, "gzip", 1_048_576)
    plain = KafkaOptions.from_uri("kafka://127.0.0.1:9092/t", env={})
    assert (plain.format, plain.key_columns, plain.exactly_once, plain.compression) == ("json", (), False, None)
    librdkafka = plain.confluent_config()
    assert librdkafka["partitioner"] == "murmur2_random" and librdkafka["reconnect.backoff.ms"] == 50
    quick = KafkaOptions.from_uri("kafka://127.0.0.1:9092/t?reconnect_backoff_max_ms=20", env={})
    assert quick.confluent_config()["reconnect.backoff.ms"] == 20


def test_security_settings_from_env_and_uri() -> None:
    env = {
        "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "KAFKA_SASL_USERNAME": "alice",
        "KAFKA_SASL_PASSWORD": "s3cret",
        "KAFKA_SSL_CAFILE": "/etc/ca.pem",
    }
    opts = KafkaOptions.from_uri("kafka://127.0.0.1:9093/t?sasl_username=bob&ssl_check_hostname=false", env=env)
    config = opts.consumer_config()
    assert config["security_protocol"] == "SASL_SSL"
    assert config["sasl_mechanism"] == "SCRAM-SHA-512"
    assert config["sasl_plain_username"] == "bob"  # the URI wins over the environment
    assert config["sasl_plain_password"] == "s3cret"
    assert config["ssl_cafile"] == "/etc/ca.pem"
    assert config["ssl_check_hostname"] is False
    assert opts.producer_config()["sasl_plain_password"] == "s3cret"


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("http://127.0.0.1:1/t", "not a kafka:// URI"),
        ("kafka://127.0.0.1:1/", "needs exactly one topic"),
        ("kafka://127.0.0.1:1/a/b", "needs exactly one topic"),
        ("kafka://127.0.0.1/t", "is not HOST:PORT"),
        ("kafka://127.0.0.1:99999/t", "is not HOST:PORT"),
        ("kafka://127.0.0.1:1/t?colour=red", "unknown option 'colour'"),
        ("kafka://127.0.0.1:1/t?key=a&key=b", "given twice"),
        ("kafka://127.0.0.1:1/t?exactly_once=maybe", "not true or false"),
        ("kafka://127.0.0.1:1/t?linger_ms=-1", "not an integer >= 0"),
        ("kafka://127.0.0.1:1/t?batch_size=0", "not an integer >= 1"),
        ("kafka://127.0.0.1:1/t?format=avro", "format='avro'"),
        ("kafka://127.0.0.1:1/t?key=a,,b", "empty column name"),
        ("kafka://127.0.0.1:1/t?compression=brotli", "compression='brotli'"),
        ("kafka://127.0.0.1:1/t?compression=snappy", "not installed"),
        ("kafka://127.0.0.1:1/t?security_protocol=TLS", "security_protocol='TLS'"),
        ("kafka://127.0.0.1:1/t?sasl_mechanism=MD5", "sasl_mechanism='MD5'"),
        ("kafka://127.0.0.1:1/t?tombstones=true", "tombstones=true needs key"),
    ],
)
def test_bad_uris_raise_config_error(uri: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        KafkaSink(uri, env={})
    with pytest.raises(ConfigError, match=message):
        KafkaOptions.from_uri(uri, env={})


def test_topic_templates() -> None:
    assert fill_topic("cdc.{table_name}", TABLE) == "cdc.orders"
    assert fill_topic("cdc.{table_id}.v1", TABLE) == "cdc.tid-orders.v1"
    with pytest.raises(ConfigError, match="needs a table name"):
        fill_topic("cdc.{table_name}", TableInfo("/x", "id1"))
    with pytest.raises(ConfigError, match="is invalid"):
        fill_topic("cdc.{schema}", TABLE)
    with pytest.raises(ConfigError, match="not a legal Kafka topic"):
        fill_topic("cdc {table_name}", TABLE)


def test_partition_choice_matches_kafkas_keyed_partitioner() -> None:
    # Java's Utils.murmur2("21".getBytes()) is -973932308; kafka-python's murmur2 is the reference otherwise
    assert murmur2(b"21") == -973932308 & 0xFFFFFFFF
    rng = random.Random(7)
    for n in range(64):
        key = rng.randbytes(n)
        assert murmur2(key) & 0x7FFFFFFF == kafka_murmur2(key) & 0x7FFFFFFF
        assert choose_partition(key, 7) == (kafka_murmur2(key) & 0x7FFFFFFF) % 7
    assert default_sink_id("a", "t") == default_sink_id("a", "t") != default_sink_id("b", "t")


@pytest.mark.parametrize("partitions", [1, 3, 7, 100, 2**31 - 1])
def test_partitions_chosen_by_kernels_match_kafkas_keyed_partitioner(partitions: int) -> None:
    rng = random.Random(partitions)
    keys = [rng.randbytes(rng.randrange(0, 41)) for _ in range(3000)]  # every length 0-40: words and tails
    keys += [b'{"id":%d}' % i for i in range(-50, 2000, 7)] + [b""] * 3
    expected = [(kafka_murmur2(key) & 0x7FFFFFFF) % partitions for key in keys]
    assert choose_partitions(keys, partitions) == expected
    assert choose_partitions(keys[:10], partitions) == expected[:10]  # few keys: hashed one by one


def test_librdkafka_partitioner_is_choose_partition(kafka_broker: Any) -> None:
    # The confluent backend leaves partitions to librdkafka's murmur2_random without exactly_once:
    # sent without a partition, every key must land where choose_partition puts it.
    ck = pytest.importorskip("confluent_kafka")
    topic = kafka_broker.new_topic(7)
    config = KafkaOptions.from_uri(f"kafka://{kafka_broker.bootstrap}/{topic}?backend=confluent").confluent_config()
    assert config["partitioner"] == "murmur2_random"
    producer = ck.Producer({k: v for k, v in config.items() if k != "logger"})
    rng = random.Random(11)
    keys = [rng.randbytes(n) for n in range(1, 64)] + [b'{"id":%d}' % i for i in range(300)]
    keys += ['{"name":"Zoë ✓ %d"}'.encode() % i for i in range(100)]
    failed: list[Any] = []
    for key in keys:
        producer.produce(topic, b"v", key, on_delivery=lambda e, m: failed.append(e) if e else None)
    assert producer.flush(30) == 0 and not failed
    records = kafka_broker.consume(topic)
    assert sorted(r.key for r in records) == sorted(keys)
    assert all(r.partition == choose_partition(r.key, 7) for r in records)


def test_a_failed_message_is_found_by_its_key_and_value() -> None:
    # confluent-kafka reports a failed message without its headers: its stamp is found from key and value.
    out = Outgoing("t", [b"a", b"b", b"a", b"a"], [b"1", b"2", b"1", None], [[]] * 4, None, 5, 1, 10, [0, 1, 2, 2])
    find = _Finder(out)
    assert find(b"b", b"2") == (5, 1, 11, 0)
    assert find(b"a", b"1") == (5, 1, 10, 0)  # identical to message 2: named at the first of the two
    assert find(b"a", None) == (5, 1, 12, 1)  # the tombstone
    assert find(b"z", b"?") == (5, 1, 10, 0)  # never sent: the first message of the group


def test_partitions_follow_the_key_without_exactly_once(kafka: Any) -> None:
    topic = kafka.new_topic(5)
    sink = open_sink(kafka.uri(topic, key="name"))
    ids = list(range(200))
    sink.write(ChangeBatch(Position.change(3, 0), rows(ids, ["insert"] * len(ids), note="x" * 7)))
    sink.commit_event(CommitEvent(3, 0, "WRITE"))
    sink.flush()
    sink.close()
    records = kafka.consume(topic)
    assert len(records) == 200 and len({r.key for r in records}) == 161  # every 5th name is null
    assert all(r.partition == choose_partition(r.key, 5) for r in records)


# ------------------------------------------------------------------ delivery and formats --


def test_json_messages_keys_headers_and_partitions(kafka: Any) -> None:
    topic = kafka.new_topic(3)
    sink = open_sink(kafka.uri(topic))
    sink.write(ChangeBatch(Position.change(3, 10), rows([1, 2, 4], ["insert", "delete", "insert"])))
    sink.flush()
    sink.close()
    records = kafka.consume(topic)
    assert len(records) == 3
    by_index = {position_of(r)[2]: r for r in records}
    for index, (i, ct) in zip((10, 11, 12), ((1, "insert"), (2, "delete"), (4, "insert")), strict=True):
        record = by_index[index]
        assert orjson.loads(record.value) == expected_json_row(i, ct)
        assert record.key == b'{"v":3,"i":%d,"s":false}' % index
        assert record.partition == choose_partition(record.key, 3)
        assert dict(record.headers) == {
            "dt.table_id": b"tid-orders",
            "dt.sink_id": default_sink_id("tid-orders", topic).encode(),
            "dt.version": b"3",
            "dt.position": b'{"version":3,"index":%d,"snapshot":false}' % index,
            "dt.change_type": ct.encode(),
        }


def test_keyed_debezium_with_tombstones(kafka: Any) -> None:
    topic = kafka.new_topic(2)
    sink = open_sink(kafka.uri(topic, format="debezium", key="id", tombstones=True, sink_id="orders-cdc"))
    sink.write(ChangeBatch(Position.in_snapshot(2, 0), rows([1, 2], ["insert", "insert"], version=2)))
    cts = ["update_preimage", "update_postimage", "delete", "insert"]
    batch = ChangeBatch(
        Position.change(3, 0), pa.concat_batches([rows([1], cts[:1]), rows([1, 2, 3], cts[1:], note="!")])
    )
    sink.write(batch)
    sink.flush()
    sink.close()
    by_key: dict[bytes, list[Any]] = {}
    for r in kafka.consume(topic):
        by_key.setdefault(r.key, []).append(r)
    key1, key2, key3 = b'{"id":1}', b'{"id":2}', b'{"id":3}'
    ops = {k: [None if r.value is None else orjson.loads(r.value)["op"] for r in v] for k, v in by_key.items()}
    assert ops == {key1: ["r", "u"], key2: ["r", "d", None], key3: ["c"]}
    update = orjson.loads(by_key[key1][1].value)
    assert update["before"]["name"] == "Zoë-1 ✓" and update["after"]["name"] == "Zoë-1! ✓"
    assert update["before"]["amount"] == "0.01" and update["after"]["items"] == [{"sku": "s1", "qty": 1}]
    assert update["source"] == {
        "version": "0.1.0",
        "connector": "deltatail",
        "name": "deltatail",
        "ts_ms": 1704164645123,
        "snapshot": "false",
        "db": "delta",
        "ts_us": 1704164645123456,
        "ts_ns": 1704164645123456000,
        "schema": None,
        "table": "orders",
        "table_path": "/data/orders",
        "table_id": "tid-orders",
        "commit_version": 3,
        "operation": None,
        "index": 1,
    }
    assert update["ts_ms"] == FIXED_CLOCK
    assert header(by_key[key1][1], "dt.change_type") == b"update"
    assert position_of(by_key[key1][1]) == (3, 1, 1, False)  # the pair rides on the post-image's position
    snapshot_read = orjson.loads(by_key[key1][0].value)
    assert snapshot_read["source"]["snapshot"] == "true" and snapshot_read["before"] is None
    delete, tombstone = by_key[key2][1:]
    assert orjson.loads(delete.value)["before"]["id"] == 2 and tombstone.value is None
    assert position_of(tombstone) == (3, 1, 2, True)
    assert all(header(r, "dt.sink_id") == b"orders-cdc" for rs in by_key.values() for r in rs)


def test_unkeyed_debezium_splits_updates_into_delete_and_create(kafka: Any) -> None:
    topic = kafka.new_topic(1)
    sink = open_sink(kafka.uri(topic, format="debezium"))
    sink.write(ChangeBatch(Position.change(3, 0), rows([5, 5], ["update_preimage", "update_postimage"])))
    sink.flush()
    sink.close()
    records = kafka.consume(topic)
    assert [orjson.loads(r.value)["op"] for r in records] == ["d", "c"]
    assert [header(r, "dt.change_type") for r in records] == [b"update_preimage", b"update_postimage"]
    assert [r.key for r in records] == [b'{"v":3,"i":0,"s":false}', b'{"v":3,"i":1,"s":false}']


def test_commit_events_go_to_the_commit_topic_once(kafka: Any) -> None:
    topic, commits = kafka.new_topic(2), kafka.new_topic(2, prefix="commits")
    uri = kafka.uri(topic, exactly_once=True, commit_topic=commits)
    audit = merge_audit_event()
    event = CommitEvent(3, 1704164645123, "MERGE", {"numTargetRowsUpdated": "1"}, {"insert": 2}, audit)
    for _ in range(2):  # the second sink replays version 3: the commit event is not repeated
        sink = open_sink(uri)
        assert sink.wants_audit_events
        sink.write(inserts(3, 0, [1, 2]))
        sink.commit_event(event)
        sink.flush()
        sink.close()
    [record] = kafka.consume(commits)
    assert record.key == b"tid-orders"
    value = orjson.loads(record.value)
    assert value == {**audit.to_json(), "table_id": "tid-orders", "sink_id": default_sink_id("tid-orders", topic)}
    assert AuditEvent.from_json(value) == audit
    assert (value["format"], value["version"], value["operation"], value["actor"]["user_name"]) == (
        "deltatail.audit.commit/1",
        3,
        "MERGE",
        "bob@corp",
    )
    assert (value["counts"]["rows_inserted"], value["counts"]["rows_updated"], value["timestamp_ms"]) == (
        2,
        1,
        1704164645123,
    )
    assert header(record, "dt.change_type") == b"commit" and header(record, "dt.version") == b"3"
    assert len(kafka.consume(topic)) == 2


def test_commit_event_without_commit_topic_is_ignored_and_bad_events_raise(kafka: Any) -> None:
    topic, commits = kafka.new_topic(1), kafka.new_topic(1, prefix="commits")
    sink = open_sink(kafka.uri(topic))
    assert not sink.wants_audit_events
    sink.commit_event(CommitEvent(1, 0, None))
    sink.close()
    sink = open_sink(kafka.uri(topic, commit_topic=commits))
    with pytest.raises(SinkError, match="carries no audit event") as e:
        sink.commit_event(CommitEvent(1, 0, None))
    assert e.value.version == 1
    unencodable = dataclasses.replace(merge_audit_event(), operation_metrics={"when": object()})
    with pytest.raises(SinkError, match="not JSON-serialisable"):
        sink.commit_event(CommitEvent(3, 0, None, audit=unencodable))
    sink.close()
    assert kafka.consume(topic) == [] and kafka.consume(commits) == []


def test_auto_created_topic_from_template(kafka: Any) -> None:
    table = TableInfo("/data/x", "tid-x", f"auto{time.time_ns()}")
    sink = open_sink(kafka.uri("cdc.{table_name}"), table)
    sink.write(ChangeBatch(Position.change(1, 0), rows([1], ["insert"], version=1)))
    sink.flush()
    sink.close()
    assert [position_of(r) for r in kafka.consume(f"cdc.{table.name}")] == [(1, 1, 0, False)]


# ------------------------------------------------------------------ exactly once --


def every_row_once(kafka: Any, topic: str, expected: set[tuple[int, int, int, bool]]) -> None:
    records = kafka.consume(topic)
    seen = Counter(position_of(r) for r in records)
    assert {p for p, n in seen.items() if n > 1} == set()
    assert set(seen) == expected
    for partition in {r.partition for r in records}:  # each partition is in position order, dt.seq from 0
        mine = [r for r in records if r.partition == partition]
        assert [position_of(r) for r in mine] == sorted(position_of(r) for r in mine)
        assert [int(header(r, "dt.seq") or b"-1") for r in mine] == list(range(len(mine)))


def test_exactly_once_after_close_without_flush(kafka: Any) -> None:
    topic = kafka.new_topic(3)
    uri = kafka.uri(topic, exactly_once=True, key="id")
    snapshot = ChangeBatch(Position.in_snapshot(1, 0), rows(list(range(40)), ["insert"] * 40, version=1))
    batches = [snapshot, inserts(2, 0, list(range(40, 70)))]
    sink = open_sink(uri)
    for b in batches:
        sink.write(b)
    sink.close()  # no flush: the tailer saved no cursor and will replay everything
    sink = open_sink(uri)
    for b in [*batches, inserts(3, 0, list(range(70, 90)))]:
        sink.write(b)
    sink.flush()
    sink.close()
    expected = {(1, 0, i, False) for i in range(40)} | {
        (v, 1, i, False) for v, n in ((2, 30), (3, 20)) for i in range(n)
    }
    every_row_once(kafka, topic, expected)


def test_exactly_once_after_partial_delivery(kafka: Any) -> None:
    topic = kafka.new_topic(4)
    uri = kafka.uri(topic, exactly_once=True, format="debezium", key="id", tombstones=True)
    first = ChangeBatch(Position.change(5, 0), rows(list(range(30)), ["insert"] * 30, version=5))
    cts = ["delete", "insert", "update_preimage", "update_postimage"] * 10
    ids = [i // 4 * 2 + (1 if ct == "insert" else 0) for i, ct in enumerate(cts)]
    second = ChangeBatch(Position.change(6, 0), rows(ids, cts, version=6))
    sink = open_sink(uri)
    sink.write(first)
    sink.write(ChangeBatch(second.start, second.rows.slice(0, 17)))
    sink.flush()  # every partition now ends somewhere inside the second batch
    sink.close()
    sink = open_sink(uri)
    sink.write(first)  # the tailer's cursor was before both batches
    sink.write(second)
    sink.flush()
    sink.close()
    records = kafka.consume(topic)
    seen = Counter(position_of(r) for r in records)
    assert max(seen.values()) == 1
    # 30 inserts; per 4 rows of the second batch: delete + tombstone, insert, one "u" at the post-image
    expected = {(5, 1, i, False) for i in range(30)}
    for q in range(10):
        expected |= {(6, 1, 4 * q, False), (6, 1, 4 * q, True), (6, 1, 4 * q + 1, False), (6, 1, 4 * q + 3, False)}
    assert set(seen) == expected
    every_partition_in_order(records)


def every_partition_in_order(records: list[Any]) -> None:
    for partition in {r.partition for r in records}:
        mine = [position_of(r) for r in records if r.partition == partition]
        assert mine == sorted(mine)


def test_missing_tombstone_is_sent_on_resume(kafka: Any) -> None:
    source, target = kafka.new_topic(1), kafka.new_topic(1)
    options = {"exactly_once": True, "key": "id", "tombstones": True, "sink_id": "s-tomb"}
    batch = ChangeBatch(Position.change(4, 0), rows([1, 2], ["insert", "delete"], version=4))
    sink = open_sink(kafka.uri(source, **options))
    sink.write(batch)
    sink.flush()
    sink.close()
    copied = kafka.consume(source)
    assert [position_of(r) for r in copied] == [(4, 1, 0, False), (4, 1, 1, False), (4, 1, 1, True)]
    # the target got everything but the final tombstone (as if the sink died right before it)
    kafka.produce(target, [(r.key, r.value, r.headers, r.partition) for r in copied[:-1]])
    sink = open_sink(kafka.uri(target, **options))
    sink.write(batch)
    sink.flush()
    sink.close()
    assert [position_of(r) for r in kafka.consume(target)] == [(4, 1, 0, False), (4, 1, 1, False), (4, 1, 1, True)]


def copy_topic(kafka: Any, partitions: int, records: list[Any], skip: int | None = None) -> str:
    target = str(kafka.new_topic(partitions))
    kept = [r for i, r in enumerate(records) if i != skip]
    kafka.produce(target, [(r.key, r.value, r.headers, r.partition) for r in kept])
    return target


def written_topic(kafka: Any, partitions: int, n: int, **options: Any) -> str:
    topic = str(kafka.new_topic(partitions))
    sink = open_sink(kafka.uri(topic, key="id", **options))
    sink.write(inserts(1, 0, list(range(n))))
    sink.flush()
    sink.close()
    return topic


def test_refuses_a_topic_of_another_table(kafka: Any) -> None:
    topic = written_topic(kafka, 2, 10, exactly_once=True)
    sink = KafkaSink(kafka.uri(topic, exactly_once=True, key="id"))
    with pytest.raises(SinkError, match="another table") as e:
        sink.open(OTHER)
    assert e.value.table == "/data/users"
    sink.close()


def test_refuses_a_topic_of_another_sink(kafka: Any) -> None:
    topic = written_topic(kafka, 2, 10, exactly_once=True, sink_id="first")
    with pytest.raises(SinkError, match="written by sink first"):
        open_sink(kafka.uri(topic, exactly_once=True, key="id", sink_id="second"))
    open_sink(kafka.uri(topic, exactly_once=True, key="id", sink_id="first")).close()


def test_refuses_foreign_and_non_exactly_once_messages(kafka: Any) -> None:
    foreign = kafka.new_topic(1)
    kafka.produce(foreign, [(b"k", b"v", [], 0)])
    with pytest.raises(SinkError, match="not written by deltatail"):
        open_sink(kafka.uri(foreign, exactly_once=True))
    plain = written_topic(kafka, 1, 3)
    with pytest.raises(SinkError, match="without exactly_once=true"):
        open_sink(kafka.uri(plain, exactly_once=True, key="id"))
    garbled = kafka.new_topic(1)
    sink_id = default_sink_id(TABLE.table_id, garbled).encode()
    headers = [("dt.table_id", b"tid-orders"), ("dt.sink_id", sink_id), ("dt.seq", b"0"), ("dt.partitions", b"1")]
    kafka.produce(garbled, [(b"k", b"v", [*headers, ("dt.position", b"{}")], 0)])
    with pytest.raises(SinkError, match="without valid deltatail headers") as e:
        open_sink(kafka.uri(garbled, exactly_once=True))
    assert e.value.table == "/data/orders"


def test_refuses_a_changed_partition_count(kafka: Any) -> None:
    topic = written_topic(kafka, 2, 10, exactly_once=True, sink_id="s")
    moved = copy_topic(kafka, 3, kafka.consume(topic))
    with pytest.raises(SinkError, match="written with 2 partitions and now has 3"):
        open_sink(kafka.uri(moved, exactly_once=True, key="id", sink_id="s"))


def test_refuses_a_partition_that_lost_a_message(kafka: Any) -> None:
    topic = written_topic(kafka, 1, 5, exactly_once=True, sink_id="s")
    gap = copy_topic(kafka, 1, kafka.consume(topic), skip=2)
    with pytest.raises(SinkError, match=r"lost 1 message\(s\) of sink s"):
        open_sink(kafka.uri(gap, exactly_once=True, key="id", sink_id="s"))


# ------------------------------------------------------------------ failures --


def test_the_collector_is_paused_only_while_sending() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("a failure inside")
    assert gc.isenabled()
    gc.disable()  # a caller that keeps the collector off keeps it off
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_oversized_message_stops_the_sink(kafka: Any) -> None:
    topic = kafka.new_topic(1)
    sink = open_sink(kafka.uri(topic, max_message_bytes=2000))
    big = rows([1, 2, 3], ["insert"] * 3).set_column(1, "name", pa.array(["a", "b" * 5000, "c"]))
    with pytest.raises(SinkError, match=r"row at position 3:8 .*too large") as e:
        sink.write(ChangeBatch(Position.change(3, 7), big))
    assert e.value.version == 3 and e.value.table == "/data/orders"
    assert gc.isenabled()  # the collector, paused while sending, is back after the failure
    with pytest.raises(SinkError, match="stopped after an earlier failure"):
        sink.write(inserts(4, 0, [9]))
    with pytest.raises(SinkError, match="stopped after an earlier failure"):
        sink.flush()
    with pytest.raises(SinkError, match="stopped after an earlier failure"):
        sink.commit_event(CommitEvent(3, 0, "WRITE"))
    sink.close()  # drops row 7, still queued: the tailer keeps its cursor before this batch anyway
    assert all(position_of(r) < (3, 1, 8, False) for r in kafka.consume(topic))  # nothing from the failed row on


def test_bad_rows_raise_at_write(kafka: Any) -> None:
    topic = kafka.new_topic(1)
    sink = open_sink(kafka.uri(topic))
    with pytest.raises(SinkError, match="unknown change type 'merge'"):
        sink.write(ChangeBatch(Position.change(3, 0), rows([1, 2], ["insert", "merge"])))
    assert gc.isenabled()
    sink.write(inserts(4, 0, [5]))  # nothing of the bad batch was sent, so the sink goes on
    assert gc.isenabled()
    sink.flush()
    sink.close()
    assert [position_of(r) for r in kafka.consume(topic)] == [(4, 1, 0, False)]


def test_a_bad_row_past_the_first_slice_stops_the_sink_after_the_slices_before(
    kafka: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch is encoded in slices of ``ENCODE_ROWS``: a bad row in a later slice fails the sink (the
    rows of the slices before were queued), naming the row's position."""
    monkeypatch.setattr(pairing, "ENCODE_ROWS", 4)
    topic = kafka.new_topic(1)
    sink = open_sink(kafka.uri(topic))
    with pytest.raises(SinkError, match=r"unknown change type 'merge' at position 3:6 "):
        sink.write(ChangeBatch(Position.change(3, 0), rows(list(range(10)), ["insert"] * 6 + ["merge"] * 4)))
    assert gc.isenabled()
    with pytest.raises(SinkError, match="stopped after an earlier failure: unknown change type"):
        sink.write(inserts(4, 0, [5]))
    sink.close()
    assert {position_of(r) for r in kafka.consume(topic)} <= {(3, 1, i, False) for i in range(4)}


def test_life_cycle_errors(kafka: Any) -> None:
    sink = KafkaSink(kafka.uri(kafka.new_topic(1)))
    with pytest.raises(SinkError, match="not open"):
        sink.write(inserts(1, 0, [1]))
    with pytest.raises(SinkError, match="not open"):
        sink.flush()
    sink.open(TABLE)
    with pytest.raises(SinkError, match="already open"):
        sink.open(TABLE)
    sink.close()
    sink.close()
    with pytest.raises(SinkError, match="not open"):
        sink.commit_event(CommitEvent(1, 0, None))
    sink.open(TABLE)  # the same object may be opened again after close
    sink.write(inserts(1, 0, [1]))
    sink.flush()
    sink.close()
    with pytest.raises(ConfigError, match="needs a table name"):
        KafkaSink(kafka.uri("cdc.{table_name}")).open(TableInfo("/x", "id"))


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_broker_fails_open(backend: str) -> None:
    sink = KafkaSink(f"kafka://127.0.0.1:{unused_port()}/t?open_timeout_ms=1500&backend={backend}")
    started = time.monotonic()
    with pytest.raises(SinkError, match="cannot connect to Kafka"):
        sink.open(TABLE)
    assert time.monotonic() - started < 15
    sink.close()


def outage_uri(kit: Any, topic: str, **extra: object) -> str:
    extra.setdefault("exactly_once", True)
    return str(kit.uri(topic, key="id", request_timeout_ms=1000, open_timeout_ms=10000, **extra))


@pytest.mark.slow
@pytest.mark.parametrize("exactly_once", [True, False], ids=["exactly-once", "at-least-once"])
def test_broker_outage_fails_flush_then_a_new_empty_broker(
    broker_factory: Callable[..., Any], exactly_once: bool
) -> None:
    kit = broker_factory()
    uri = outage_uri(kit, "outage", delivery_timeout_ms=3000, exactly_once=exactly_once)
    sink = open_sink(uri)
    sink.write(inserts(1, 0, list(range(20))))
    sink.flush()
    kit.broker.stop()
    sink.write(inserts(2, 0, list(range(20, 30))))
    started = time.monotonic()
    first = r"did not acknowledge the message for row at position 2:0\b"
    with pytest.raises(SinkError, match=first):
        sink.flush()  # the tailer keeps its cursor at the start of version 2
    assert time.monotonic() - started < 20
    with pytest.raises(SinkError, match="stopped after an earlier failure"):
        sink.write(inserts(3, 0, [99]))
    sink.close()
    # A restarted tansu is a new, empty broker: the sink must not believe it holds anything.
    kit.broker.start()
    sink = open_sink(uri)
    sink.write(inserts(2, 0, list(range(20, 30))))  # the replay from the kept cursor
    sink.flush()
    sink.close()
    assert sorted(position_of(r) for r in kit.consume("outage")) == [(2, 1, i, False) for i in range(10)]


@pytest.mark.slow
def test_transient_outage_is_retried_without_duplicates(proxied_broker: tuple[Any, Any]) -> None:
    kit, proxy = proxied_broker
    uri = outage_uri(kit, "blip", delivery_timeout_ms=60000, reconnect_backoff_max_ms=300)
    sink = open_sink(uri)
    sink.write(inserts(1, 0, list(range(50))))
    sink.flush()
    proxy.stop()
    sink.write(inserts(2, 0, list(range(50, 100))))
    timer = threading.Timer(2.0, proxy.start)
    timer.start()
    started = time.monotonic()
    sink.flush()  # the producer reconnects with backoff and delivers once the broker is back
    assert time.monotonic() - started >= 1.5
    sink.close()
    timer.join()
    expected = {(v, 1, i, False) for v in (1, 2) for i in range(50)}
    every_row_once(kit, "blip", expected)
