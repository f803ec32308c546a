"""Connect schemas and payload values of every Delta type, in every time and decimal mode.

Expected texts are written out by hand from Kafka Connect's and Debezium's documented formats; a
small independent checker (:func:`conforms`) then checks that every payload the encoder writes is
what its schema says, the way Connect's ``JsonConverter`` reads it (base64 for ``bytes``, string
keys for maps, exact field sets for structs...).
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
from typing import Any

import orjson
import pyarrow as pa
import pytest

from deltatail.sinks.json_text import Wrapped
from deltatail.sinks.kafka.connect_schema import ValueModes, schema_name, struct_schema, value_schema
from deltatail.sinks.kafka.debezium import EventOptions
from deltatail.sinks.kafka.encoding import ChangeEncoder
from deltatail.sinks.kafka.event_columns import convert, mode_text
from deltatail.state.cursor import Position
from deltatail.state.errors import ConfigError, SinkError
from deltatail.state.feed import ChangeBatch, TableInfo
from deltatail.state.variant import VARIANT_STORAGE_TYPE

TABLE = TableInfo("/data/orders", "tid", "orders")
UTC = dt.UTC
TS = dt.datetime(2024, 1, 2, 3, 4, 5, 123456)
TS_MICROS = 1704164645123456
MODES = [ValueModes(t, d) for t in ("iso", "sql", "micros", "connect") for d in ("string", "precise", "double")]


def texts(column: pa.Array, modes: ValueModes) -> list[Any]:
    """The JSON values the encoder writes for ``column``."""
    text = mode_text(column, modes)
    if isinstance(text, Wrapped):
        text = text.joined()
    if isinstance(text, pa.Scalar):
        return [orjson.loads(text.as_py())] * len(column)
    return [orjson.loads(t) for t in text.to_pylist()]


# ---------------------------------------------------------------- schemas of each type


DEFAULT = ValueModes()


def schema(t: pa.DataType, modes: ValueModes = DEFAULT) -> dict[str, Any]:
    return value_schema(t, modes, optional=True)


def test_primitive_types() -> None:
    expected = {
        pa.bool_(): "boolean",
        pa.int8(): "int8",
        pa.int16(): "int16",
        pa.int32(): "int32",
        pa.int64(): "int64",
        pa.float32(): "float32",
        pa.float64(): "float64",
        pa.string(): "string",
        pa.large_string(): "string",
        pa.binary(): "bytes",
        pa.large_binary(): "bytes",
        pa.binary(4): "bytes",
    }
    for t, name in expected.items():
        assert schema(t) == {"type": name, "optional": True}, t
    assert value_schema(pa.int64(), ValueModes(), optional=False, field="id") == {
        "type": "int64",
        "optional": False,
        "field": "id",
    }
    # void (a column of the null type): Connect has no null type, so an optional string that is always null
    assert schema(pa.null()) == {"type": "string", "optional": True}


def test_decimal_in_each_mode() -> None:
    t = pa.decimal128(10, 2)
    assert schema(t, ValueModes(decimal="string")) == {"type": "string", "optional": True}
    assert schema(t, ValueModes(decimal="double")) == {"type": "float64", "optional": True}
    assert schema(t, ValueModes(decimal="precise")) == {
        "type": "bytes",
        "name": "org.apache.kafka.connect.data.Decimal",
        "version": 1,
        "parameters": {"scale": "2", "connect.decimal.precision": "10"},
        "optional": True,
    }


def test_timestamps_and_dates_in_each_time_mode() -> None:
    tz, ntz, date = pa.timestamp("us", tz="UTC"), pa.timestamp("us"), pa.date32()
    plain = {"type": "string", "optional": True}
    assert schema(tz, ValueModes("iso")) == {
        "type": "string",
        "name": "io.debezium.time.ZonedTimestamp",
        "version": 1,
        "optional": True,
    }
    assert schema(ntz, ValueModes("iso")) == plain and schema(date, ValueModes("iso")) == plain
    for t in (tz, ntz, date):
        assert schema(t, ValueModes("sql")) == plain
    micro = {"type": "int64", "name": "io.debezium.time.MicroTimestamp", "version": 1, "optional": True}
    assert schema(tz, ValueModes("micros")) == micro and schema(ntz, ValueModes("micros")) == micro
    assert schema(date, ValueModes("micros")) == {
        "type": "int32",
        "name": "io.debezium.time.Date",
        "version": 1,
        "optional": True,
    }
    connect = {"type": "int64", "name": "org.apache.kafka.connect.data.Timestamp", "version": 1, "optional": True}
    assert schema(tz, ValueModes("connect")) == connect and schema(ntz, ValueModes("connect")) == connect
    assert schema(date, ValueModes("connect")) == {
        "type": "int32",
        "name": "org.apache.kafka.connect.data.Date",
        "version": 1,
        "optional": True,
    }


def test_nested_types() -> None:
    t = pa.struct([pa.field("a", pa.int32(), nullable=False), pa.field("tags", pa.list_(pa.string()))])
    assert schema(t) == {
        "type": "struct",
        "fields": [
            {"type": "int32", "optional": False, "field": "a"},
            {"type": "array", "items": {"type": "string", "optional": True}, "optional": True, "field": "tags"},
        ],
        "optional": True,
    }
    assert schema(pa.map_(pa.string(), pa.int64())) == {
        "type": "map",
        "keys": {"type": "string", "optional": False},
        "values": {"type": "int64", "optional": True},
        "optional": True,
    }
    # keys that are not strings are written as their JSON text: the schema says string keys
    assert schema(pa.map_(pa.int32(), pa.float64()))["keys"] == {"type": "string", "optional": False}
    # nested keys: an array of {key, value} structs, as the payload writes them
    nested = pa.map_(pa.struct([("k", pa.int32())]), pa.map_(pa.string(), pa.list_(pa.date32())))
    assert schema(nested, ValueModes("micros")) == {
        "type": "array",
        "items": {
            "type": "struct",
            "fields": [
                {
                    "type": "struct",
                    "fields": [{"type": "int32", "optional": True, "field": "k"}],
                    "optional": False,
                    "field": "key",
                },
                {
                    "type": "map",
                    "keys": {"type": "string", "optional": False},
                    "values": {
                        "type": "array",
                        "items": {"type": "int32", "name": "io.debezium.time.Date", "version": 1, "optional": True},
                        "optional": True,
                    },
                    "optional": True,
                    "field": "value",
                },
            ],
            "optional": False,
        },
        "optional": True,
    }


def test_variant_as_json_text_and_dictionaries() -> None:
    # A variant column arrives as Arrow's canonical JSON extension type: a string holding its JSON text.
    assert schema(pa.json_()) == {"type": "string", "name": "io.debezium.data.Json", "version": 1, "optional": True}
    assert schema(pa.dictionary(pa.int32(), pa.string())) == {"type": "string", "optional": True}


def test_types_without_a_connect_mapping_are_refused_naming_the_column() -> None:
    for t in (pa.uint64(), pa.time64("us"), pa.duration("s"), pa.month_day_nano_interval()):
        with pytest.raises(SinkError, match=r"'odd' has Arrow type .* no Kafka Connect mapping"):
            struct_schema([pa.field("odd", t)], ValueModes(), name=None, optional=False)
    with pytest.raises(SinkError, match="no Kafka Connect mapping"):
        schema(pa.map_(pa.uint64(), pa.int32()))


def test_schema_names_are_avro_safe() -> None:
    assert schema_name("my-server", "db.1", "orders 2024") == "my_server.db_1.orders_2024"
    assert schema_name("9lives", "") == "_9lives._"


def test_unknown_modes_are_refused() -> None:
    with pytest.raises(ConfigError, match="time_mode='nanos'"):
        ValueModes("nanos")
    with pytest.raises(ConfigError, match="decimal_mode='float'"):
        ValueModes(decimal="float")


# ---------------------------------------------------------------- payload values


def test_timestamp_texts_in_each_mode() -> None:
    tz = pa.array([TS.replace(tzinfo=UTC), None], pa.timestamp("us", tz="UTC"))
    ntz = pa.array([TS, None], pa.timestamp("us"))
    assert texts(tz, ValueModes("iso")) == ["2024-01-02T03:04:05.123456Z", None]
    assert texts(ntz, ValueModes("iso")) == ["2024-01-02T03:04:05.123456", None]
    assert texts(tz, ValueModes("sql")) == ["2024-01-02 03:04:05.123456Z", None]
    assert texts(ntz, ValueModes("sql")) == ["2024-01-02 03:04:05.123456", None]
    assert texts(tz, ValueModes("micros")) == [TS_MICROS, None]
    assert texts(ntz, ValueModes("micros")) == [TS_MICROS, None]
    assert texts(tz, ValueModes("connect")) == [TS_MICROS // 1000, None]
    # milliseconds are floored, not truncated toward zero: -1 µs is in the millisecond before the epoch
    before_epoch = pa.array([-1, -1000, -1001], pa.timestamp("us"))
    assert texts(before_epoch, ValueModes("connect")) == [-1, -1, -2]
    # nanosecond columns (not Delta's, but Arrow's) are truncated to microseconds
    nanos = pa.array([TS_MICROS * 1000 + 999], pa.timestamp("ns", tz="UTC"))
    assert texts(nanos, ValueModes("micros")) == [TS_MICROS]


def test_timestamps_outside_four_digit_years() -> None:
    """Years past 9999 get ISO 8601's expanded form (a ``+``), as java.time reads them; years before 1 a ``-``."""
    values = [253402300800000000, -62167219200000000, -62167219200000001, 0]
    column = pa.array(values, pa.timestamp("us", tz="UTC"))
    assert texts(column, ValueModes("iso")) == [
        "+10000-01-01T00:00:00.000000Z",
        "0000-01-01T00:00:00.000000Z",
        "-0001-12-31T23:59:59.999999Z",
        "1970-01-01T00:00:00.000000Z",
    ]
    assert texts(column, ValueModes("sql"))[0] == "+10000-01-01 00:00:00.000000Z"
    assert texts(column, ValueModes("micros")) == values  # exact in the numeric modes
    assert texts(column, ValueModes("connect")) == [v // 1000 for v in values]
    nested = pa.array([{"t": 253402300800000000}], pa.struct([("t", pa.timestamp("us"))]))
    assert texts(nested, ValueModes("iso")) == [{"t": "+10000-01-01T00:00:00.000000"}]


def test_dates_in_each_mode() -> None:
    column = pa.array([dt.date(2024, 1, 2), None, dt.date(1969, 12, 31)], pa.date32())
    assert texts(column, ValueModes("iso")) == ["2024-01-02", None, "1969-12-31"]
    assert texts(column, ValueModes("sql")) == ["2024-01-02", None, "1969-12-31"]
    assert texts(column, ValueModes("micros")) == [19724, None, -1]
    assert texts(column, ValueModes("connect")) == [19724, None, -1]


def test_decimals_in_each_mode() -> None:
    values = [decimal.Decimal("1.50"), decimal.Decimal("-1.28"), None, decimal.Decimal("0.00")]
    column = pa.array(values, pa.decimal128(10, 2))
    assert texts(column, ValueModes(decimal="string")) == ["1.50", "-1.28", None, "0.00"]
    assert texts(column, ValueModes(decimal="double")) == [1.5, -1.28, None, 0.0]
    precise = texts(column, ValueModes(decimal="precise"))
    # Connect's Decimal: base64 of the unscaled value, big-endian two's complement (Java's BigInteger bytes)
    assert precise == ["AJY=", "gA==", None, "AA=="]  # 150 needs two bytes (0x0096), -128 one (0x80)
    assert [None if p is None else int.from_bytes(base64.b64decode(p), "big", signed=True) for p in precise] == [
        150,
        -128,
        None,
        0,
    ]
    big = pa.array([decimal.Decimal("-" + "9" * 38)], pa.decimal128(38, 0))
    [text] = texts(big, ValueModes(decimal="precise"))
    assert int.from_bytes(base64.b64decode(text), "big", signed=True) == -int("9" * 38)


def test_floats_binary_and_the_null_type() -> None:
    floats = pa.array([0.1, float("nan"), float("inf"), -0.0, 1e20, None])
    assert texts(floats, ValueModes()) == [0.1, None, None, -0.0, 1e20, None]
    f32 = pa.array([0.1], pa.float32())
    f32_text = mode_text(f32, ValueModes())
    assert isinstance(f32_text, pa.Array) and f32_text.to_pylist() == ["0.1"]  # float32's shortest, not 0.10000000149
    binary = pa.array([b"\x00\xff", None, b""])
    assert texts(binary, ValueModes()) == ["AP8=", None, ""]
    assert texts(pa.array([None, None], pa.null()), ValueModes()) == [None, None]
    assert texts(pa.array(['{"a": [1]}', None], pa.json_()), ValueModes()) == ['{"a": [1]}', None]
    assert texts(pa.array(["a\x01b"]), ValueModes()) == ["a\x01b"]  # a control character: escaped by orjson


def test_nested_values_follow_the_modes() -> None:
    t = pa.struct(
        [
            ("ts", pa.timestamp("us", tz="UTC")),
            ("days", pa.list_(pa.date32())),
            ("prices", pa.map_(pa.string(), pa.decimal128(5, 1))),
            ("by_day", pa.map_(pa.date32(), pa.int32())),
        ]
    )
    value = {
        "ts": TS.replace(tzinfo=UTC),
        "days": [dt.date(1970, 1, 2), None],
        "prices": [("a", decimal.Decimal("1.5"))],
        "by_day": [(dt.date(1970, 1, 3), 7)],
    }
    column = pa.array([value, None, {"ts": None, "days": None, "prices": None, "by_day": None}], t).slice(0, 3)
    assert texts(column, ValueModes("micros", "double")) == [
        {"ts": TS_MICROS, "days": [1, None], "prices": {"a": 1.5}, "by_day": {"2": 7}},
        None,
        {"ts": None, "days": None, "prices": None, "by_day": None},
    ]
    assert texts(column, ValueModes("iso", "string"))[0] == {
        "ts": "2024-01-02T03:04:05.123456Z",
        "days": ["1970-01-02", None],
        "prices": {"a": "1.5"},
        "by_day": {'"1970-01-03"': 7},  # a key that is not a string: its JSON text
    }
    assert texts(column.slice(1), ValueModes("connect"))[0] is None  # slices are honoured
    sliced_list = pa.array([[dt.date(1970, 1, 1)], [dt.date(1970, 1, 5), None]], pa.list_(pa.date32())).slice(1)
    assert convert(sliced_list, ValueModes("micros")).to_pylist() == [[4, None]]


# ---------------------------------------------------------------- payloads conform to their schemas


def conforms(value: Any, schema: dict[str, Any], where: str = "$") -> None:
    """Check ``value`` as Connect's JsonConverter would read it against ``schema`` (written independently)."""
    if value is None:
        assert schema["optional"], f"{where}: null for a required {schema}"
        return
    kind = schema["type"]
    if kind in ("int8", "int16", "int32", "int64"):
        bits = int(kind[3:])
        assert isinstance(value, int) and not isinstance(value, bool), where
        assert -(2 ** (bits - 1)) <= value < 2 ** (bits - 1), where
    elif kind in ("float32", "float64"):
        assert isinstance(value, int | float) and not isinstance(value, bool), where
    elif kind == "boolean":
        assert isinstance(value, bool), where
    elif kind == "string":
        assert isinstance(value, str), where
    elif kind == "bytes":
        assert isinstance(value, str), where
        base64.b64decode(value, validate=True)
    elif kind == "array":
        assert isinstance(value, list), where
        for i, item in enumerate(value):
            conforms(item, schema["items"], f"{where}[{i}]")
    elif kind == "map":
        assert isinstance(value, dict) and schema["keys"]["type"] == "string", where
        for k, item in value.items():
            conforms(item, schema["values"], f"{where}.{k}")
    else:
        assert kind == "struct" and isinstance(value, dict), where
        fields = {f["field"]: f for f in schema["fields"]}
        assert set(value) == set(fields), (where, set(value) ^ set(fields))
        for name, field_schema in fields.items():
            conforms(value[name], field_schema, f"{where}.{name}")


def variant_column(values: list[bytes | None]) -> pa.Array:
    """Variants (VariantEncoding.md) without object keys: the empty metadata ``01 00 00`` and each value's bytes."""
    return pa.StructArray.from_arrays(
        [pa.array([b"\x01\x00\x00"] * len(values), pa.binary()), pa.array([v or b"" for v in values], pa.binary())],
        fields=list(VARIANT_STORAGE_TYPE),
        mask=pa.array([v is None for v in values]),
    )


def test_variants_are_strings_holding_their_json_named_io_debezium_data_json() -> None:
    # int8 3, the short string q"<newline>, variant null, and a null row
    column = variant_column([b"\x0c\x03", b"\x0d" + b'q"\n', b"\x00", None])
    for modes in MODES:
        assert texts(column, modes) == ["3", '"q\\"\\n"', "null", None]
    assert value_schema(VARIANT_STORAGE_TYPE, ValueModes(), optional=True) == {
        "type": "string",
        "name": "io.debezium.data.Json",
        "version": 1,
        "optional": True,
    }
    nested = pa.StructArray.from_arrays([column], fields=[pa.field("v", VARIANT_STORAGE_TYPE)])
    assert texts(nested, ValueModes()) == [{"v": "3"}, {"v": '"q\\"\\n"'}, {"v": "null"}, {"v": None}]
    assert convert(nested, ValueModes()).type == pa.struct([("v", pa.string())])


def every_type_batch(*, snapshot: bool = False) -> ChangeBatch:
    n = 4
    ts = TS.replace(tzinfo=UTC)
    struct_t = pa.struct([("a", pa.int16()), ("when", pa.timestamp("us")), ("tags", pa.list_(pa.string()))])
    data = {
        "id": pa.array([1, 1, 2, 3], pa.int64()),
        "b": pa.array([True, None, False, True]),
        "i8": pa.array([1, -128, None, 127], pa.int8()),
        "f32": pa.array([0.5, None, float("nan"), 1e10], pa.float32()),
        "f64": pa.array([0.1, 1e300, None, -0.0]),
        "s": pa.array(["a", 'é"\\', None, "x\ny"]),
        "bin": pa.array([b"\x00", None, b"", b"xyz"]),
        "dec": pa.array(
            [decimal.Decimal("1.5"), None, decimal.Decimal("-0.1"), decimal.Decimal("0")], pa.decimal128(5, 1)
        ),
        "day": pa.array([dt.date(2024, 1, 2), None, dt.date(1, 1, 1), dt.date(9999, 12, 31)]),
        "ts": pa.array([ts, None, ts, ts], pa.timestamp("us", tz="UTC")),
        "ntz": pa.array([TS, TS, None, TS], pa.timestamp("us")),
        "st": pa.array(
            [{"a": 1, "when": TS, "tags": ["x"]}, None, {"a": None, "when": None, "tags": None}, {}], struct_t
        ),
        "arr": pa.array([[1, None], None, [], [3]], pa.list_(pa.int32())),
        "m": pa.array([[("k", 1.5)], None, [], [("z", None)]], pa.map_(pa.string(), pa.float64())),
        "mi": pa.array([[(1, "a")], None, [], [(2, None)]], pa.map_(pa.int32(), pa.string())),
        "mn": pa.array([[({"k": 1}, 1)], None, [], []], pa.map_(pa.struct([("k", pa.int8())]), pa.int64())),
        "void": pa.array([None] * n, pa.null()),
        "variant": pa.array(['{"a":1}', None, "[]", "3"], pa.json_()),
        "var": variant_column([b"\x0c\x03", None, b"\x0d" + b'q"\n', b"\x00"]),
        "nested_var": pa.StructArray.from_arrays(
            [variant_column([b"\x04", b"\x08", None, b"\x0c\x01"])], fields=[pa.field("v", VARIANT_STORAGE_TYPE)]
        ),
        "_change_type": pa.array(["update_preimage", "update_postimage", "insert", "delete"]),
        "_commit_version": pa.array([5] * n, pa.int64()),
        "_commit_timestamp": pa.array([ts] * n, pa.timestamp("us", tz="UTC")),
    }
    start = Position.in_snapshot(5, 0) if snapshot else Position.change(5, 0)
    return ChangeBatch(start, pa.record_batch(data))


@pytest.mark.parametrize("modes", MODES, ids=lambda m: f"{m.time}-{m.decimal}")
@pytest.mark.parametrize("fmt", ["debezium", "flat"])
@pytest.mark.parametrize("keys", [(), ("id",), ("id", "day")])
def test_every_payload_conforms_to_its_schema(modes: ValueModes, fmt: str, keys: tuple[str, ...]) -> None:
    encoder = ChangeEncoder(TABLE, format=fmt, key_columns=keys, events=EventOptions(schemas=True, modes=modes))
    out = encoder.encode(every_type_batch())
    assert len(out) == (3 if keys == ("id",) else 4)
    for key, value in zip(out.keys, out.values, strict=True):
        assert value is not None
        for message in (orjson.loads(key), orjson.loads(value)):
            assert set(message) == {"schema", "payload"}
            conforms(message["payload"], message["schema"])
