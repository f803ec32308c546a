"""The change-row encoder: value conversion per Arrow type, the json and debezium formats, keys."""

from __future__ import annotations

import datetime as dt
import decimal
import math
from typing import Any

import orjson
import pyarrow as pa
import pytest

from deltatail.sinks.json_text import SMALL_TIMESTAMP_COLUMN, EncodedBatch, json_values, row_dicts
from deltatail.sinks.kafka.encoding import ChangeEncoder
from deltatail.state.cursor import Position
from deltatail.state.errors import ConfigError, SinkError
from deltatail.state.feed import ChangeBatch, TableInfo

TABLE = TableInfo("/data/orders", "0f1e2d3c-table-id", "orders")
UTC = dt.UTC
COMMIT_TS = dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
COMMIT_MS = 1704164645123


def change_batch(
    data: dict[str, pa.Array], change_types: list[str], *, version: int = 7, start: int = 0, snapshot: bool = False
) -> ChangeBatch:
    n = len(change_types)
    columns = {
        **data,
        "_change_type": pa.array(change_types, pa.string()),
        "_commit_version": pa.array([version] * n, pa.int64()),
        "_commit_timestamp": pa.array([COMMIT_TS] * n, pa.timestamp("us", tz="UTC")),
    }
    pos = Position.in_snapshot(version, start) if snapshot else Position.change(version, start)
    return ChangeBatch(pos, pa.record_batch(columns))


def values(encoded: EncodedBatch) -> list[Any]:
    return [None if v is None else orjson.loads(v) for v in encoded.values]


# ------------------------------------------------------------------ json_values --


def test_scalars_ints_floats_bools_unicode_strings() -> None:
    assert json_values(pa.array([1, None, -(2**63)], pa.int64())) == [1, None, -(2**63)]
    assert json_values(pa.array([1, None], pa.int8())) == [1, None]
    assert json_values(pa.array([True, None])) == [True, None]
    assert json_values(pa.array(["héllo ✓ 🚀", None, ""])) == ["héllo ✓ 🚀", None, ""]
    assert json_values(pa.array(["x"], pa.large_string())) == ["x"]
    floats = json_values(pa.array([1.5, None, math.nan], pa.float64()))
    assert floats[:2] == [1.5, None] and math.isnan(floats[2])
    assert orjson.dumps(floats) == b"[1.5,null,null]"  # NaN is written as null
    assert json_values(pa.array([1.5], pa.float16())) == [1.5]


def test_decimals_keep_their_scale_as_strings() -> None:
    col = pa.array([decimal.Decimal("-1.50"), None, decimal.Decimal("12345678901234567890.12")], pa.decimal128(22, 2))
    assert json_values(col) == ["-1.50", None, "12345678901234567890.12"]
    assert json_values(pa.array([decimal.Decimal("7")], pa.decimal128(5, 0))) == ["7"]


def test_timestamps_are_iso_utc_with_microseconds() -> None:
    instant = dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    assert json_values(pa.array([instant, None], pa.timestamp("us", tz="UTC"))) == ["2024-01-02T03:04:05.123456Z", None]
    # another zone: the same instant, written in UTC
    assert json_values(pa.array([instant], pa.timestamp("us", tz="Asia/Kolkata"))) == ["2024-01-02T03:04:05.123456Z"]
    # seconds and milliseconds are padded to microseconds; nanoseconds are truncated
    assert json_values(pa.array([instant.replace(microsecond=0)], pa.timestamp("s", tz="UTC"))) == [
        "2024-01-02T03:04:05.000000Z"
    ]
    assert json_values(pa.array([1_704_164_645_123_456_789], pa.timestamp("ns", tz="UTC"))) == [
        "2024-01-02T03:04:05.123456Z"
    ]
    assert json_values(pa.array([dt.datetime(1, 1, 1)], pa.timestamp("us", tz="UTC"))) == [
        "0001-01-01T00:00:00.000000Z"
    ]


@pytest.mark.parametrize("tz", ["UTC", "America/New_York", None])
def test_short_timestamp_columns_are_written_as_long_ones_are(tz: str | None) -> None:
    # Columns of at most SMALL_TIMESTAMP_COLUMN values are formatted in Python, longer ones by Arrow kernels.
    micros = [0, 1, -1, 1_704_164_645_123_456, -62_135_596_800_000_000, 253_402_300_799_999_999, None, 86_399_999_999]
    assert len(micros) <= SMALL_TIMESTAMP_COLUMN
    short = pa.array(micros, pa.int64()).cast(pa.timestamp("us", tz=tz))
    padded = pa.concat_arrays([short, pa.nulls(SMALL_TIMESTAMP_COLUMN, short.type)])
    assert json_values(short) == json_values(padded)[: len(micros)]
    assert json_values(short)[3] == "2024-01-02T03:04:05.123456" + ("Z" if tz else "")


def test_timestamps_beyond_year_9999_fall_back_to_the_kernels() -> None:
    beyond = pa.array([253_402_300_800_000_000], pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    assert json_values(beyond) == json_values(pa.concat_arrays([beyond] * (SMALL_TIMESTAMP_COLUMN + 1)))[:1]
    assert json_values(beyond)[0].startswith("10000-01-01")


def test_timestamp_ntz_has_no_zone_marker() -> None:
    col = pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, 6), None], pa.timestamp("us"))
    assert json_values(col) == ["2024-01-02T03:04:05.000006", None]


def test_dates_times_durations() -> None:
    assert json_values(pa.array([dt.date(2024, 2, 29), None], pa.date32())) == ["2024-02-29", None]
    assert json_values(pa.array([dt.date(1969, 12, 31)], pa.date64())) == ["1969-12-31"]
    assert json_values(pa.array([dt.time(3, 4, 5, 120000)], pa.time64("us"))) == ["03:04:05.120000"]
    assert json_values(pa.array([dt.timedelta(seconds=90)], pa.duration("s"))) == [90]


def test_binary_is_base64() -> None:
    assert json_values(pa.array([b"\x00\xffab", b"", None], pa.binary())) == ["AP9hYg==", "", None]
    assert json_values(pa.array([b"ab"], pa.large_binary())) == ["YWI="]
    assert json_values(pa.array([b"ab", None], pa.binary(2))) == ["YWI=", None]


def test_structs_lists_maps_nested_with_nulls() -> None:
    point = pa.struct([("x", pa.int32()), ("at", pa.timestamp("us", tz="UTC")), ("tags", pa.list_(pa.string()))])
    col = pa.array([{"x": 1, "at": COMMIT_TS, "tags": ["a", None]}, None, {"x": None, "at": None, "tags": None}], point)
    assert json_values(col) == [
        {"x": 1, "at": "2024-01-02T03:04:05.123456Z", "tags": ["a", None]},
        None,
        {"x": None, "at": None, "tags": None},
    ]
    lists = pa.array([[1, 2], None, [], [3]], pa.list_(pa.int64()))
    assert json_values(lists) == [[1, 2], None, [], [3]]
    assert json_values(lists.slice(1)) == [None, [], [3]]
    assert json_values(pa.array([[decimal.Decimal("1.5")]], pa.large_list(pa.decimal128(4, 1)))) == [["1.5"]]
    assert json_values(pa.array([[1, 2], None], pa.list_(pa.int8(), 2))) == [[1, 2], None]
    maps = pa.array([[("a", 1), ("b", None)], None, []], pa.map_(pa.string(), pa.int64()))
    assert json_values(maps) == [{"a": 1, "b": None}, None, {}]
    assert json_values(pa.array([[(1, "x")]], pa.map_(pa.int32(), pa.string()))) == [{"1": "x"}]
    assert json_values(pa.array([{}, None], pa.struct([]))) == [{}, None]


def test_sliced_struct_and_dictionary_and_null_columns() -> None:
    col = pa.array([{"a": 1}, {"a": 2}, {"a": 3}], pa.struct([("a", pa.int64())])).slice(1, 2)
    assert json_values(col) == [{"a": 2}, {"a": 3}]
    assert json_values(pa.array(["x", "y", "x", None]).dictionary_encode()) == ["x", "y", "x", None]
    assert json_values(pa.nulls(2)) == [None, None]


# ------------------------------------------------------------------ json format --


@pytest.mark.parametrize(
    "names",
    [
        ["id", "name"],
        ["a b", "x'y", 'q"uote', "back\\slash", "new\nline", "Zoë ✓", "class", "_0", "", "\udc80"],
        ["k", "v", "k"],  # a repeated name keeps the last value, as dict(zip(...)) does
        [f"c{i}" for i in range(300)],  # wider than the generated builders
    ],
    ids=["plain", "odd-names", "repeated", "wide"],
)
def test_row_dicts_match_dict_of_zip(names: list[str]) -> None:
    columns = [[(i, j) for j in range(4)] for i in range(len(names))]
    expected = [dict(zip(names, row, strict=True)) for row in zip(*columns, strict=True)]
    got = row_dicts(names, columns, 4)
    assert got == expected and [list(d) for d in got] == [list(d) for d in expected]
    assert row_dicts(names, [[] for _ in names], 0) == []
    assert row_dicts([], [], 3) == [{}, {}, {}]


def test_json_format_writes_every_column_and_position_keys() -> None:
    batch = change_batch(
        {
            "id": pa.array([1, 2], pa.int64()),
            "name": pa.array(["Zoë", None]),
            "price": pa.array([decimal.Decimal("9.90"), decimal.Decimal("-0.01")], pa.decimal128(10, 2)),
            "day": pa.array([dt.date(2024, 1, 2), None], pa.date32()),
            "blob": pa.array([b"\x01", None], pa.binary()),
        },
        ["insert", "delete"],
        start=40,
    )
    out = ChangeEncoder(TABLE, format="json").encode(batch)
    assert out.rows == [0, 1]
    assert out.change_types == ["insert", "delete"]
    assert out.keys == [b'{"v":7,"i":40,"s":false}', b'{"v":7,"i":41,"s":false}']
    assert (
        out.values[0]
        == (
            '{"id":1,"name":"Zoë","price":"9.90","day":"2024-01-02","blob":"AQ==","_change_type":"insert",'
            '"_commit_version":7,"_commit_timestamp":"2024-01-02T03:04:05.123456Z"}'
        ).encode()
    )
    assert values(out)[1] == {
        "id": 2,
        "name": None,
        "price": "-0.01",
        "day": None,
        "blob": None,
        "_change_type": "delete",
        "_commit_version": 7,
        "_commit_timestamp": "2024-01-02T03:04:05.123456Z",
    }


def test_keys_from_columns_and_snapshot_position_keys() -> None:
    batch = change_batch({"a": pa.array([1, 2]), "b": pa.array(["x", 'q"uote'])}, ["insert", "insert"])
    assert ChangeEncoder(TABLE, key_columns=["b", "a"]).encode(batch).keys == [
        b'{"b":"x","a":1}',
        b'{"b":"q\\"uote","a":2}',
    ]
    assert ChangeEncoder(TABLE, key_columns=["b"]).encode(batch).keys == [b'{"b":"x"}', b'{"b":"q\\"uote"}']
    snap = change_batch({"a": pa.array([1])}, ["insert"], snapshot=True, start=3)
    assert ChangeEncoder(TABLE).encode(snap).keys == [b'{"v":7,"i":3,"s":true}']


def test_json_tombstones_follow_deletes() -> None:
    batch = change_batch({"id": pa.array([1, 2, 3])}, ["delete", "insert", "delete"])
    out = ChangeEncoder(TABLE, key_columns=["id"], tombstones=True).encode(batch)
    assert out.rows == [0, 0, 1, 2, 2]
    assert [v is None for v in out.values] == [False, True, False, False, True]
    assert out.keys == [b'{"id":1}', b'{"id":1}', b'{"id":2}', b'{"id":3}', b'{"id":3}']


def test_empty_batch_encodes_to_nothing() -> None:
    batch = change_batch({"id": pa.array([1])}, ["insert"])
    empty = ChangeBatch(batch.start, batch.rows.slice(0, 0))
    assert len(ChangeEncoder(TABLE, format="debezium").encode(empty)) == 0


# ------------------------------------------------------------------ debezium --


def debezium(before: Any, after: Any, op: str, index: int, *, snapshot: bool = False) -> dict[str, Any]:
    """The envelope as Debezium's documentation lays it out (every source field: tests/sinks/test_debezium.py)."""
    source = {
        "version": "0.1.0",
        "connector": "deltatail",
        "name": "deltatail",
        "ts_ms": COMMIT_MS,
        "snapshot": "true" if snapshot else "false",
        "db": "delta",
        "ts_us": COMMIT_MS * 1000 + 456,
        "ts_ns": (COMMIT_MS * 1000 + 456) * 1000,
        "schema": None,
        "table": "orders",
        "table_path": "/data/orders",
        "table_id": "0f1e2d3c-table-id",
        "commit_version": 7,
        "operation": None,
        "index": index,
    }
    clock = 1_700_000_000_000
    return {
        "before": before,
        "after": after,
        "source": source,
        "op": op,
        "ts_ms": clock,
        "ts_us": clock * 1000,
        "ts_ns": clock * 1_000_000,
    }


def encoder(**kwargs: Any) -> ChangeEncoder:
    return ChangeEncoder(TABLE, format="debezium", clock_ms=lambda: 1_700_000_000_000, **kwargs)


def test_debezium_inserts_deletes_and_snapshot_reads() -> None:
    data = {"id": pa.array([1, 2]), "v": pa.array(["a", "b"])}
    out = encoder().encode(change_batch(data, ["insert", "delete"]))
    assert values(out) == [
        debezium(None, {"id": 1, "v": "a"}, "c", 0),
        debezium({"id": 2, "v": "b"}, None, "d", 1),
    ]
    snap = encoder().encode(change_batch(data, ["insert", "insert"], snapshot=True))
    assert values(snap) == [
        debezium(None, {"id": 1, "v": "a"}, "r", 0, snapshot=True),
        debezium(None, {"id": 2, "v": "b"}, "r", 1, snapshot=True),
    ]


def test_debezium_pairs_update_images_by_key_in_either_order() -> None:
    data = {"id": pa.array([1, 2, 1, 3, 2]), "v": pa.array(["old1", "new2", "new1", "x", "old2"])}
    cts = ["update_preimage", "update_postimage", "update_postimage", "insert", "update_preimage"]
    out = encoder(key_columns=["id"]).encode(change_batch(data, cts))
    # a pair travels at the position of its later row
    assert out.rows == [2, 3, 4]
    assert out.change_types == ["update", "insert", "update"]
    assert out.keys == [b'{"id":1}', b'{"id":3}', b'{"id":2}']
    assert values(out) == [
        debezium({"id": 1, "v": "old1"}, {"id": 1, "v": "new1"}, "u", 2),
        debezium(None, {"id": 3, "v": "x"}, "c", 3),
        debezium({"id": 2, "v": "old2"}, {"id": 2, "v": "new2"}, "u", 4),
    ]


def test_debezium_unpaired_images_become_delete_and_create() -> None:
    # the key itself changed: two keys, no pair
    data = {"id": pa.array([1, 9]), "v": pa.array(["a", "a"])}
    out = encoder(key_columns=["id"], tombstones=True).encode(
        change_batch(data, ["update_preimage", "update_postimage"])
    )
    assert out.change_types == ["update_preimage", "update_postimage"]
    assert values(out) == [debezium({"id": 1, "v": "a"}, None, "d", 0), debezium(None, {"id": 9, "v": "a"}, "c", 1)]
    # no key columns: never paired
    data = {"id": pa.array([1, 1]), "v": pa.array(["a", "b"])}
    out = encoder().encode(change_batch(data, ["update_preimage", "update_postimage"]))
    assert values(out) == [debezium({"id": 1, "v": "a"}, None, "d", 0), debezium(None, {"id": 1, "v": "b"}, "c", 1)]


def test_debezium_pair_split_across_batches_is_delete_then_create() -> None:
    batch = change_batch(
        {"id": pa.array([4, 4]), "v": pa.array(["old", "new"])}, ["update_preimage", "update_postimage"]
    )
    enc = encoder(key_columns=["id"])
    first, second = ChangeBatch(batch.start, batch.rows.slice(0, 1)), batch.slice_from(batch.position(1))
    assert values(enc.encode(first)) == [debezium({"id": 4, "v": "old"}, None, "d", 0)]
    assert values(enc.encode(second)) == [debezium(None, {"id": 4, "v": "new"}, "c", 1)]
    assert enc.encode(second).rows == [0]  # row 0 of the second batch: position index 1


def test_debezium_tombstones_only_after_real_deletes() -> None:
    data = {"id": pa.array([1, 2, 2])}
    cts = ["delete", "update_preimage", "update_postimage"]
    out = encoder(key_columns=["id"], tombstones=True).encode(change_batch(data, cts))
    assert out.rows == [0, 0, 2]
    assert out.values[1] is None and out.keys[1] == b'{"id":1}'
    assert values(out)[2] == debezium({"id": 2}, {"id": 2}, "u", 2)


def test_debezium_uses_the_wall_clock_by_default() -> None:
    out = ChangeEncoder(TABLE, format="debezium").encode(change_batch({"id": pa.array([1])}, ["insert"]))
    ts = values(out)[0]["ts_ms"]
    assert abs(ts - dt.datetime.now(UTC).timestamp() * 1000) < 60_000


# ------------------------------------------------------------------ errors --


def test_constructor_raises_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown message format"):
        ChangeEncoder(TABLE, format="avro")
    with pytest.raises(ConfigError, match="repeat"):
        ChangeEncoder(TABLE, key_columns=["id", "id"])
    with pytest.raises(ConfigError, match="tombstones need key columns"):
        ChangeEncoder(TABLE, tombstones=True)


def test_encode_raises_sink_error_naming_the_position() -> None:
    batch = change_batch({"id": pa.array([1, 2])}, ["insert", "upsert"], start=10)
    for fmt in ("json", "debezium", "flat"):
        with pytest.raises(SinkError, match=r"unknown change type 'upsert' at position 7:11 \[") as e:
            ChangeEncoder(TABLE, format=fmt).encode(batch)
        assert e.value.version == 7 and e.value.table == "/data/orders"
    with pytest.raises(SinkError, match="no column 'customer'"):
        ChangeEncoder(TABLE, key_columns=["customer"]).encode(batch)
    bare = ChangeBatch(batch.start, batch.rows.drop_columns(["_commit_timestamp"]))
    with pytest.raises(SinkError, match="no column '_commit_timestamp'"):
        ChangeEncoder(TABLE).encode(bare)
