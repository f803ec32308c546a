"""Avro written column by column (``sinks.kafka.avro_columns``), read back by fastavro and confluent-kafka.

Every datum written here is decoded by fastavro's ``schemaless_reader`` and compared with values
written by hand, and its bytes are compared with fastavro's own ``schemaless_writer`` of that datum
(the per-message path's writer). Through :class:`~sinks.kafka.avro.AvroEncoder`, the messages are
decoded by confluent-kafka's ``AvroDeserializer`` with its ``SchemaRegistryClient`` pointed at the
stand-in registry (``schema_registry.py``).
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import io
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

pytest.importorskip("fastavro")
pytest.importorskip("confluent_kafka.schema_registry")

import fastavro
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

sys.path.insert(0, str(Path(__file__).resolve().parent))
from schema_registry import SchemaRegistry

from deltatail.sinks.kafka import avro_columns
from deltatail.sinks.kafka.avro import AvroEncoder
from deltatail.sinks.kafka.avro_columns import encode_payloads
from deltatail.sinks.kafka.avro_schema import to_avro
from deltatail.sinks.kafka.connect_schema import ValueModes
from deltatail.sinks.kafka.debezium import EventOptions
from deltatail.sinks.kafka.registry import RegistryClient
from deltatail.state.cursor import Position
from deltatail.state.errors import ConfigError, SinkError
from deltatail.state.feed import ChangeBatch, TableInfo

HEADER = b"\x00\x00\x00\x00\x07"
LONGS = [0, 1, -1, 63, -64, 64, -65, 8191, 8192, 2**31 - 1, -(2**31), 2**62, 2**63 - 1, -(2**63)]


def opt(kind: str, field: str, **more: Any) -> dict[str, Any]:
    return {"type": kind, "optional": True, "field": field, **more}


def req(kind: str, field: str, **more: Any) -> dict[str, Any]:
    return {"type": kind, "optional": False, "field": field, **more}


INNER = {"type": "struct", "name": "t.Inner", "fields": [req("int32", "a"), opt("string", "b")]}
SCHEMA: dict[str, Any] = {
    "type": "struct",
    "name": "t.Value",
    "fields": [
        req("int64", "id"),
        opt("int8", "tiny"),
        opt("int16", "small"),
        opt("int32", "int"),
        opt("float32", "nothing"),
        opt("float64", "dbl"),
        opt("boolean", "flag"),
        req("string", "text"),
        opt("bytes", "blob"),
        opt(
            "bytes",
            "price",
            name="org.apache.kafka.connect.data.Decimal",
            version=1,
            parameters={"scale": "2", "connect.decimal.precision": "10"},
        ),
        opt("int32", "day", name="org.apache.kafka.connect.data.Date", version=1),
        opt("int64", "at", name="org.apache.kafka.connect.data.Timestamp", version=1),
        {**INNER, "optional": True, "field": "inner"},
        {"type": "array", "optional": True, "field": "tags", "items": {"type": "int64", "optional": False}},
        {"type": "array", "optional": False, "field": "pairs", "items": {**INNER, "optional": True}},
    ],
}


def payload(i: int) -> dict[str, Any]:
    """Row ``i`` as Connect JSON; every other row has its optional values null."""
    full = i % 2 == 0
    return {
        "id": LONGS[i % len(LONGS)],
        "tiny": -128 + i if full else None,
        "small": 32767 - i if full else None,
        "int": LONGS[(i + 3) % len(LONGS)] % 2**31 if full else None,
        "nothing": [1.5, -0.0, 3.4028234663852886e38, 1e-45][i % 4] if full else None,
        "dbl": [5e-324, -2.5, 1e20, 0.1][i % 4] if full else None,
        "flag": i % 4 == 0 if full else None,
        "text": ["", "nø", 'a"b\\c\n\u0001', "😀x"][i % 4],
        "blob": ["AP8=", "", "AAAA"][i % 3] if full else None,
        "price": ["/zg=", "AA==", "ALw="][i % 3] if full else None,
        "day": 19_723 - i if full else None,
        "at": 1_704_164_645_123 + i if full else None,
        "inner": {"a": i, "b": None if i % 3 else f"b{i}"} if full else None,
        "tags": list(range(i % 5)) if full else None,
        "pairs": [{"a": j, "b": "p"} if j % 2 else None for j in range(i % 4)],
    }


def avro_datum(row: dict[str, Any]) -> dict[str, Any]:
    """What fastavro should read back for ``payload``'s row (Avro ``bytes`` decoded, by hand)."""
    out = dict(row)
    out["blob"] = {"AP8=": b"\x00\xff", "": b"", "AAAA": b"\x00\x00\x00", None: None}[row["blob"]]
    cents = {"/zg=": "-2.00", "AA==": "0.00", "ALw=": "1.88"}  # unscaled -200 (0xff38), 0, 188 (0x00bc)
    out["price"] = None if row["price"] is None else decimal.Decimal(cents[row["price"]])
    if row["day"] is not None:
        out["day"] = dt.date(1970, 1, 1) + dt.timedelta(days=row["day"])
    if row["at"] is not None:
        out["at"] = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=row["at"])
    if row["nothing"] == 1e-45:
        out["nothing"] = 1.401298464324817e-45  # the float32 nearest to 1e-45
    return out


def writer_datum(row: dict[str, Any]) -> dict[str, Any]:
    """The datum fastavro's own writer is given for ``row``: bytes decoded, the record branches of unions named."""
    out = dict(row)
    out["blob"] = None if row["blob"] is None else base64.b64decode(row["blob"])
    out["price"] = None if row["price"] is None else base64.b64decode(row["price"])
    out["inner"] = None if row["inner"] is None else ("t.Inner", row["inner"])
    out["pairs"] = [None if p is None else ("t.Inner", p) for p in row["pairs"]]
    return out


def test_every_connect_type_is_what_fastavro_reads_and_writes() -> None:
    rows = [payload(i) for i in range(40)]
    texts = [json.dumps(r, ensure_ascii=i % 2 == 0).encode() for i, r in enumerate(rows)]
    written = encode_payloads(SCHEMA, HEADER, texts)
    assert written is not None and len(written) == len(rows)
    schema = fastavro.parse_schema(to_avro(SCHEMA).schema)
    for row, message in zip(rows, written, strict=True):
        assert message[:5] == HEADER
        decoded: Any = fastavro.schemaless_reader(io.BytesIO(message[5:]), schema, None)
        assert decoded == avro_datum(row)
        assert str(decoded["nothing"]) == str(avro_datum(row)["nothing"])  # -0.0 keeps its sign
        peer = io.BytesIO()
        fastavro.schemaless_writer(peer, schema, writer_datum(row))
        assert message[5:] == peer.getvalue()


def test_what_this_path_does_not_write_is_left_to_the_message_path() -> None:
    map_schema = {"type": "struct", "fields": [opt("string", "a"), {"type": "map", "optional": True, "field": "m"}]}
    assert encode_payloads(map_schema, HEADER, [b'{"a":"x","m":{}}']) is None
    required = {"type": "struct", "fields": [req("int64", "a"), opt("int64", "b")]}
    assert encode_payloads(required, HEADER, [b'{"a":1,"b":null}', b'{"a":null,"b":2}']) is None
    assert encode_payloads(required, HEADER, [b'{"a":1.5,"b":null}']) is None  # not an int64
    nested = {"type": "struct", "fields": [{**INNER, "optional": True, "field": "inner"}]}
    assert encode_payloads(nested, HEADER, [b'{"inner":{"a":null,"b":"x"}}']) is None  # its a is required
    assert encode_payloads(nested, HEADER, [b'{"inner":null}']) == [HEADER + b"\x00"]
    assert encode_payloads(required, HEADER, []) == []


# ---------------------------------------------------------------- through AvroEncoder

TABLE = TableInfo("/data/orders", "tid-orders", "orders")
TS = dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC)


@pytest.fixture
def registry() -> Iterator[SchemaRegistry]:
    server = SchemaRegistry()
    server.start()
    yield server
    server.stop()


def change_batch(n: int) -> ChangeBatch:
    """Inserts, then a delete and an update's images, of typed columns (no map: every message column-wise)."""
    ids = list(range(n))
    kinds = ["insert"] * (n - 3) + ["delete", "update_preimage", "update_postimage"]
    rows = pa.record_batch(
        {
            "id": pa.array(ids, pa.int64()),
            "text": pa.array([None if i == 3 else f"nø-{i}" for i in ids]),
            "price": pa.array([decimal.Decimal(i * 7) / 100 for i in ids], pa.decimal128(10, 2)),
            "at": pa.array([TS + dt.timedelta(seconds=i) for i in ids], pa.timestamp("us", "UTC")),
            "tags": pa.array([list(range(i % 3)) for i in ids], pa.list_(pa.int32())),
            "ratio": pa.array([-0.0 if i == 5 else i / 4 for i in ids], pa.float64()),
            "_change_type": pa.array(kinds),
            "_commit_version": pa.array([4] * n, pa.int64()),
            "_commit_timestamp": pa.array([TS] * n, pa.timestamp("us", tz="UTC")),
        }
    )
    return ChangeBatch(Position.change(4, 0), rows)


@pytest.mark.parametrize("format", ["debezium", "flat", "json"])
def test_messages_decode_with_confluent_kafkas_deserializer(registry: SchemaRegistry, format: str) -> None:
    encoder = AvroEncoder(
        TABLE,
        topic="orders",
        registry=RegistryClient(registry.url),
        format=format,
        key_columns=["id"],
        tombstones=True,
        events=EventOptions(modes=ValueModes(time="connect", decimal="precise")),
        clock_ms=lambda: 1_700_000_000_000,
    )
    out = encoder.encode(change_batch(12))
    deserializer = AvroDeserializer(SchemaRegistryClient({"url": registry.url}))
    values = [
        None if v is None else deserializer(v, SerializationContext("orders", MessageField.VALUE)) for v in out.values
    ]
    keys = [deserializer(k, SerializationContext("orders", MessageField.KEY)) for k in out.keys]
    assert [k["id"] for k in keys] == out.rows  # the key of row i is id i
    assert values.count(None) == 1  # the delete's tombstone
    events = [v for v in values if v is not None]
    by_id = {r["id"]: r for r in (e["after"] or e["before"] for e in events)} if format == "debezium" else {}
    by_id = by_id or {r["id"]: r for r in events}
    assert sorted(by_id) == list(range(12))
    assert by_id[5]["text"] == "nø-5" and by_id[3]["text"] is None
    assert by_id[5]["price"] == decimal.Decimal("0.35")
    assert by_id[5]["at"] == TS.replace(microsecond=123000) + dt.timedelta(seconds=5)
    assert by_id[5]["tags"] == [0, 1] and by_id[6]["tags"] == []
    assert by_id[6]["ratio"] == 1.5 and math.copysign(1.0, by_id[5]["ratio"]) == -1.0  # -0.0 keeps its sign


def test_a_value_that_does_not_fit_is_still_named(registry: SchemaRegistry) -> None:
    encoder = AvroEncoder(
        TABLE,
        topic="orders",
        registry=RegistryClient(registry.url),
        format="json",
        key_columns=["id"],
        tombstones=False,
        events=EventOptions(),
        clock_ms=lambda: 0,
    )
    rows = change_batch(4).rows
    strict = rows.schema.append(pa.field("dbl", pa.float64(), nullable=False))  # NaN is null in Connect JSON
    rows = pa.RecordBatch.from_arrays([*rows.columns, pa.array([1.0, float("nan"), 2.0, 3.0])], schema=strict)
    with pytest.raises(SinkError, match=r"a row of the batch at 4:0 does not fit its Avro schema"):
        encoder.encode(ChangeBatch(Position.change(4, 0), rows))


def test_avro_without_numpy_is_a_clear_error(registry: SchemaRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "numpy", None)  # as if not installed: importing it raises ImportError
    monkeypatch.delitem(sys.modules, "deltatail.sinks.kafka.avro_columns")
    with pytest.raises(ConfigError, match=r"encoding=avro needs the package numpy: pip install 'deltatail\[avro\]'"):
        AvroEncoder(
            TABLE,
            topic="orders",
            registry=RegistryClient(registry.url),
            format="json",
            key_columns=[],
            tombstones=False,
            events=EventOptions(),
            clock_ms=lambda: 0,
        )


def test_a_batch_is_read_in_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    schema = {"type": "struct", "fields": [req("int64", "a"), opt("string", "b")]}
    payloads = [b'{"a":%d,"b":"%s"}' % (i, b"x" * (i % 7)) for i in range(50)]
    whole = encode_payloads(schema, HEADER, payloads)
    monkeypatch.setattr(avro_columns, "_MOST_BLOCK_BYTES", 64)  # many blocks of a few payloads each
    assert encode_payloads(schema, HEADER, payloads) == whole
    assert whole is not None and whole[9] == HEADER + b"\x12\x02\x04xx"  # a=9 (zig-zag 18), b="xx"
    long = encode_payloads(schema, HEADER, [payloads[0], b'{"a":1,"b":"%s"}' % (b"y" * 80), payloads[1]])
    assert long == [whole[0], HEADER + b"\x02\x02\xa0\x01" + b"y" * 80, whole[1]]  # longer than a block; 80: a0 01
