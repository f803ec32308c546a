"""The debezium and flat formats field for field, their URI options, the ordering check and heartbeats."""

from __future__ import annotations

import datetime as dt
from typing import Any

import orjson
import pyarrow as pa
import pytest

from deltatail.sinks.json_text import EncodedBatch
from deltatail.sinks.kafka.connect_schema import ValueModes
from deltatail.sinks.kafka.debezium import (
    HEARTBEAT_TOPIC,
    POSITION_KEY_SCHEMA,
    SOURCE_SCHEMA,
    EventEncoder,
    EventOptions,
    check_ordering,
    deltatail_version,
    heartbeat_message,
)
from deltatail.sinks.kafka.encoding import ChangeEncoder
from deltatail.sinks.kafka.options import KafkaOptions, fill_topic
from deltatail.state.cursor import Position
from deltatail.state.errors import ConfigError, SinkError
from deltatail.state.feed import ChangeBatch, FollowStatus, TableInfo

TABLE = TableInfo("/data/orders", "tid-1", "orders")
TS = dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC)
COMMIT_US = 1704164645123456
CLOCK = 1_700_000_000_000


def batch(ids: list[int], change_types: list[str], *, start: int = 0, snapshot: bool = False) -> ChangeBatch:
    n = len(ids)
    rows = pa.record_batch(
        {
            "id": pa.array(ids, pa.int64()),
            "v": pa.array([f"v{i}" for i in ids]),
            "_change_type": pa.array(change_types),
            "_commit_version": pa.array([9] * n, pa.int64()),
            "_commit_timestamp": pa.array([TS] * n, pa.timestamp("us", tz="UTC")),
        }
    )
    return ChangeBatch(Position.in_snapshot(9, start) if snapshot else Position.change(9, start), rows)


def encode(b: ChangeBatch, *, fmt: str = "debezium", operation: str | None = None, **kwargs: Any) -> EncodedBatch:
    events = kwargs.pop("events", EventOptions())
    return ChangeEncoder(TABLE, format=fmt, clock_ms=lambda: CLOCK, events=events, **kwargs).encode(b, operation)


def bodies(out: EncodedBatch) -> list[Any]:
    return [None if v is None else orjson.loads(v) for v in out.values]


# ---------------------------------------------------------------- the envelope


def test_every_field_of_the_envelope_and_source_block() -> None:
    options = EventOptions(server_name="lake", source_db="sales", source_schema="public", source_table="orders_v2")
    out = encode(batch([7], ["insert"], start=41), operation="MERGE", events=options)
    assert bodies(out) == [
        {
            "before": None,
            "after": {"id": 7, "v": "v7"},
            "source": {
                "version": deltatail_version(),
                "connector": "deltatail",
                "name": "lake",
                "ts_ms": COMMIT_US // 1000,
                "snapshot": "false",
                "db": "sales",
                "ts_us": COMMIT_US,
                "ts_ns": COMMIT_US * 1000,
                "schema": "public",
                "table": "orders_v2",
                "table_path": "/data/orders",
                "table_id": "tid-1",
                "commit_version": 9,
                "operation": "MERGE",
                "index": 41,
            },
            "op": "c",
            "ts_ms": CLOCK,
            "ts_us": CLOCK * 1000,
            "ts_ns": CLOCK * 1_000_000,
        }
    ]
    assert deltatail_version() == "0.1.0"  # the installed package's version (pyproject.toml)
    # The order of the keys is Debezium's.
    assert list(bodies(out)[0]) == ["before", "after", "source", "op", "ts_ms", "ts_us", "ts_ns"]


def test_source_defaults_snapshot_reads_and_unknown_operation() -> None:
    [event] = bodies(encode(batch([1], ["insert"], snapshot=True)))
    source = event["source"]
    assert event["op"] == "r" and source["snapshot"] == "true" and source["operation"] is None
    assert (source["name"], source["db"], source["schema"], source["table"]) == ("deltatail", "delta", None, "orders")
    nameless = TableInfo("/x", "tid-2")
    out = ChangeEncoder(nameless, format="debezium").encode(batch([1], ["insert"]))
    assert orjson.loads(out.values[0] or b"")["source"]["table"] == "tid-2"  # no name: the table id


def test_mixed_batches_without_keys_and_positions() -> None:
    cts = ["insert", "delete", "update_preimage", "update_postimage"]
    out = encode(batch([1, 2, 3, 3], cts, start=10))
    assert [e["op"] for e in bodies(out)] == ["c", "d", "d", "c"]
    assert [e["source"]["index"] for e in bodies(out)] == [10, 11, 12, 13]
    assert [(e["before"] is None, e["after"] is None) for e in bodies(out)] == [
        (True, False),
        (False, True),
        (False, True),
        (True, False),
    ]
    assert out.keys[1] == b'{"v":9,"i":11,"s":false}'
    only_deletes = encode(batch([1, 2], ["delete", "update_preimage"]))
    assert [e["op"] for e in bodies(only_deletes)] == ["d", "d"]


# ---------------------------------------------------------------- flat


def test_flat_rows_as_extract_new_record_state_writes_them() -> None:
    cts = ["insert", "update_preimage", "update_postimage", "delete"]
    out = encode(batch([1, 2, 2, 3], cts), fmt="flat", key_columns=["id"], tombstones=True, operation="UPDATE")
    meta = {"__table": "orders", "__commit_version": 9, "__source_ts_ms": COMMIT_US // 1000}
    assert bodies(out) == [
        {"id": 1, "v": "v1", "__op": "c", **meta, "__deleted": "false"},
        {"id": 2, "v": "v2", "__op": "u", **meta, "__deleted": "false"},
        {"id": 3, "v": "v3", "__op": "d", **meta, "__deleted": "true"},
        None,  # rewrite-with-tombstone
    ]
    assert out.change_types == ["insert", "update", "delete", "delete"]
    assert out.keys == [b'{"id":1}', b'{"id":2}', b'{"id":3}', b'{"id":3}']
    unkeyed = encode(batch([2, 2], ["update_preimage", "update_postimage"]), fmt="flat")
    assert [(e["__op"], e["__deleted"]) for e in bodies(unkeyed)] == [("d", "true"), ("c", "false")]
    reads = encode(batch([5], ["insert"], snapshot=True), fmt="flat")
    assert bodies(reads)[0]["__op"] == "r"


def test_flat_with_schemas_and_a_table_without_columns() -> None:
    out = encode(batch([1], ["insert"]), fmt="flat", events=EventOptions(schemas=True))
    value = orjson.loads(out.values[0] or b"")
    assert [f["field"] for f in value["schema"]["fields"]] == [
        "id",
        "v",
        "__op",
        "__table",
        "__commit_version",
        "__source_ts_ms",
        "__deleted",
    ]
    assert value["schema"]["name"] == "deltatail.delta.orders.Value"
    assert orjson.loads(out.keys[0]) == {"schema": POSITION_KEY_SCHEMA, "payload": {"v": 9, "i": 0, "s": False}}
    bare = batch([1], ["delete"])
    bare = ChangeBatch(bare.start, bare.rows.drop_columns(["id", "v"]))
    assert bodies(encode(bare, fmt="flat"))[0] == {
        "__op": "d",
        "__table": "orders",
        "__commit_version": 9,
        "__source_ts_ms": COMMIT_US // 1000,
        "__deleted": "true",
    }
    assert bodies(encode(bare))[0]["before"] == {}


def test_flat_refuses_a_column_named_like_its_fields() -> None:
    b = batch([1], ["insert"])
    clash = ChangeBatch(b.start, b.rows.append_column("__op", pa.array(["x"])))
    with pytest.raises(SinkError, match="column named __op; use format=debezium") as e:
        encode(clash, fmt="flat")
    assert e.value.version == 9 and e.value.table == "/data/orders"


# ---------------------------------------------------------------- schemas


def test_envelope_schema_fields_and_names() -> None:
    options = EventOptions(schemas=True, server_name="my-lake", modes=ValueModes("micros"))
    out = encode(batch([1, 1], ["update_preimage", "update_postimage"]), key_columns=["id"], events=options)
    value, key = orjson.loads(out.values[0] or b""), orjson.loads(out.keys[0])
    schema = value["schema"]
    assert (schema["name"], schema["version"], schema["optional"]) == ("my_lake.delta.orders.Envelope", 1, False)
    assert [f["field"] for f in schema["fields"]] == ["before", "after", "source", "op", "ts_ms", "ts_us", "ts_ns"]
    before = schema["fields"][0]
    assert before["name"] == "my_lake.delta.orders.Value" and before["optional"] is True
    assert before["fields"] == [
        {"type": "int64", "optional": True, "field": "id"},
        {"type": "string", "optional": True, "field": "v"},
    ]
    assert schema["fields"][2] == SOURCE_SCHEMA
    assert [f["field"] for f in SOURCE_SCHEMA["fields"]] == list(value["payload"]["source"])
    assert value["payload"]["op"] == "u"
    assert key == {
        "schema": {
            "type": "struct",
            "fields": [{"type": "int64", "optional": True, "field": "id"}],
            "optional": False,
            "name": "my_lake.delta.orders.Key",
        },
        "payload": {"id": 1},
    }
    with_schema = EventOptions(schemas=True, source_schema="public")
    [named] = bodies(encode(batch([1], ["insert"]), events=with_schema))
    assert named["schema"]["name"] == "deltatail.public.orders.Envelope"


def test_schemas_refuse_a_column_without_connect_mapping() -> None:
    b = batch([1], ["insert"])
    odd = ChangeBatch(b.start, b.rows.append_column("t", pa.array([1], pa.time64("us"))))
    with pytest.raises(SinkError, match="'t' has Arrow type time64") as e:
        encode(odd, events=EventOptions(schemas=True))
    assert e.value.version == 9
    assert bodies(encode(odd))[0]["after"]["t"] == "00:00:00.000001"  # without schemas: written as before


def test_schemas_need_an_event_format() -> None:
    with pytest.raises(ConfigError, match="schemas=true needs format=debezium or format=flat"):
        ChangeEncoder(TABLE, events=EventOptions(schemas=True))
    with pytest.raises(ConfigError, match="not a Debezium-style format"):
        EventEncoder(TABLE, "json", (), EventOptions(), lambda: 0)


# ---------------------------------------------------------------- options


def options(query: str) -> KafkaOptions:
    return KafkaOptions.from_uri(f"kafka://127.0.0.1:9092/cdc?{query}", {})


def test_uri_options() -> None:
    opts = options(
        "format=flat&schemas=true&time_mode=connect&decimal_mode=precise&server_name=lake&source_db=d"
        "&source_schema=s&source_table=t&allow_unordered=true&heartbeat_interval=2.5&heartbeat_topic=hb.{table_id}"
    )
    assert opts.format == "flat" and opts.allow_unordered and opts.heartbeat_interval == 2.5
    assert opts.events == EventOptions(True, ValueModes("connect", "precise"), "lake", "d", "s", "t")
    assert opts.heartbeat_topic == "hb.{table_id}"
    defaults = options("format=debezium")
    assert defaults.events == EventOptions() and defaults.heartbeat_interval is None
    assert defaults.heartbeat_topic == HEARTBEAT_TOPIC and not defaults.allow_unordered
    assert fill_topic(HEARTBEAT_TOPIC, TABLE, "lake") == "__debezium-heartbeat.lake"


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("format=avro", "format='avro'; expected json, debezium or flat"),
        ("schemas=true", "schemas apply to format=debezium or format=flat only"),
        ("time_mode=micros", "time_mode apply to format=debezium"),
        ("format=debezium&time_mode=nanos", "time_mode='nanos'"),
        ("format=debezium&decimal_mode=float", "decimal_mode='float'"),
        ("format=debezium&schemas=maybe", "schemas='maybe' is not true or false"),
        ("format=debezium&server_name=", "server_name is empty"),
        ("format=debezium&heartbeat_interval=0", "heartbeat_interval='0' is not seconds > 0"),
        ("format=debezium&heartbeat_interval=soon", "heartbeat_interval='soon'"),
        ("format=debezium&heartbeat_interval=inf", "heartbeat_interval='inf'"),
        ("format=debezium&allow_unordered=sure", "allow_unordered='sure'"),
    ],
)
def test_bad_uri_options(query: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        options(query)


# ---------------------------------------------------------------- ordering


def test_unkeyed_events_on_several_partitions_are_refused_unless_allowed() -> None:
    with pytest.raises(ConfigError, match=r"without key= on topic cdc with 3 partitions.*allow_unordered=true") as e:
        check_ordering("debezium", (), 3, allow_unordered=False, topic="cdc", table="/t")
    assert e.value.table == "/t"
    with pytest.raises(ConfigError, match="format=flat without key="):
        check_ordering("flat", (), 2, allow_unordered=False, topic="cdc", table="/t")
    check_ordering("debezium", (), 3, allow_unordered=True, topic="cdc", table="/t")
    check_ordering("debezium", ("id",), 3, allow_unordered=False, topic="cdc", table="/t")
    check_ordering("debezium", (), 1, allow_unordered=False, topic="cdc", table="/t")
    check_ordering("json", (), 3, allow_unordered=False, topic="cdc", table="/t")


# ---------------------------------------------------------------- heartbeats


def test_heartbeat_messages() -> None:
    status = FollowStatus("tid-1", 12, 12, 3.25)
    key, value = heartbeat_message(TABLE, EventOptions(server_name="lake"), status, 1_700_000_000_123)
    assert orjson.loads(key) == {"serverName": "lake", "table_id": "tid-1"}
    assert orjson.loads(value) == {
        "ts_ms": 1_700_000_000_123,
        "table_path": "/data/orders",
        "table_id": "tid-1",
        "table": "orders",
        "commit_version": 12,
        "newest_version": 12,
        "seconds_behind": 3.25,
    }
    key, value = heartbeat_message(TABLE, EventOptions(schemas=True), status, 5)
    assert orjson.loads(key)["schema"]["name"] == "io.debezium.connector.common.ServerNameKey"
    wrapped = orjson.loads(value)
    assert wrapped["schema"]["name"] == "io.debezium.connector.common.Heartbeat"
    assert [f["field"] for f in wrapped["schema"]["fields"]] == list(wrapped["payload"])
