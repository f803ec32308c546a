"""Column-wise encoding (Arrow kernels) writes the very bytes of row-wise encoding (orjson per row).

Long batches are encoded from per-column JSON texts (``json_texts``) joined by
Arrow kernels; short ones, and columns the kernels cannot write, row by row. The
row path is the reference: these tests compare the two, byte for byte.
"""

from __future__ import annotations

import datetime as dt
import decimal
import struct
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import deltatail.sinks.embedded as embedded
import deltatail.sinks.kafka.encoding as encoding
from deltatail.sinks.json_text import (
    EncodedBatch,
    column_texts,
    concatenated,
    constant_text,
    counting_texts,
    json_texts,
    json_values,
)
from deltatail.sinks.kafka.encoding import ChangeEncoder
from deltatail.state.cursor import Position
from deltatail.state.errors import SinkError
from deltatail.state.feed import ChangeBatch, TableInfo
from deltatail.state.variant import VARIANT_STORAGE_TYPE

TABLE = TableInfo("/data/orders", "0f1e2d3c-table-id", "orders")
UTC = dt.UTC
INSTANT = dt.datetime(2024, 1, 2, 3, 4, 5, 123456)
ROWS = 48  # above VECTOR_ROWS, so long batches take the column path


def reference(column: pa.Array) -> list[str]:
    return [orjson.dumps(v).decode() for v in json_values(column)]


STRINGS = ["plain", 'quo"te', "back\\slash", 'both "\\" kinds', "", None, "ü🚀 ✓", "\u2028 line sep", "del \x7f"]

WRITTEN = {
    "int8": pa.array([-128, 127, None, 0], pa.int8()),
    "int16": pa.array([-(2**15), 2**15 - 1, None], pa.int16()),
    "int32": pa.array([-(2**31), 2**31 - 1, None], pa.int32()),
    "int64": pa.array([-(2**63), 2**63 - 1, None, 7], pa.int64()),
    "uint8": pa.array([0, 255, None], pa.uint8()),
    "uint64": pa.array([0, 2**64 - 1, None], pa.uint64()),
    "bool": pa.array([True, False, None]),
    "string": pa.array(STRINGS, pa.string()),
    "large_string": pa.array(STRINGS, pa.large_string()),
    "string_view": pa.array(STRINGS, pa.string_view()),
    "dictionary": pa.array(STRINGS, pa.string()).dictionary_encode(),
    "sliced string": pa.array(STRINGS, pa.string()).slice(2, 5),
    "decimal": pa.array([decimal.Decimal("-1.50"), decimal.Decimal("0.00"), None], pa.decimal128(12, 2)),
    "decimal256": pa.array([decimal.Decimal("12345678901234567890.12"), None], pa.decimal256(40, 2)),
    "date32": pa.array([dt.date(2024, 2, 29), dt.date(1, 1, 1), None], pa.date32()),
    "date64": pa.array([dt.date(2024, 2, 29), None], pa.date64()),
    "time32": pa.array([dt.time(3, 4, 5), None], pa.time32("s")),
    "time64": pa.array([dt.time(3, 4, 5, 6), None], pa.time64("us")),
    "duration": pa.array([dt.timedelta(seconds=3, microseconds=7), None], pa.duration("us")),
    **{
        f"timestamp[{unit}, {tz}]": pc.cast(
            pa.array([INSTANT, INSTANT.replace(microsecond=0), dt.datetime(1, 1, 1), None], pa.timestamp("us", tz=tz)),
            pa.timestamp(unit, tz=tz),
            safe=False,
        )
        for unit in ("s", "ms", "us")
        for tz in (None, "UTC", "Asia/Kolkata")
    },
    "timestamp[ns, UTC]": pa.array([1_704_164_645_123_456_789, None], pa.timestamp("ns", tz="UTC")),
    "variant": pa.StructArray.from_arrays(
        [
            pa.array([b"\x01\x01\x00\x01a"] * 5, pa.binary()),  # metadata: the one key "a"
            # int8 3; the short string q"\n; {"a": true}; variant null; a null row
            pa.array([b"\x0c\x03", b'\x0dq"\n', b"\x02\x01\x00\x00\x01\x04", b"\x00", b""], pa.binary()),
        ],
        fields=list(VARIANT_STORAGE_TYPE),
        mask=pa.array([False, False, False, False, True]),
    ),
}


def test_variants_are_embedded_as_their_json_text() -> None:
    """Spark's ``to_json(struct(v))`` writes ``{"v":3}``, not ``{"v":"3"}``: JSON lines and ``format=json`` alike."""
    texts = json_texts(WRITTEN["variant"])
    assert texts is not None
    assert texts.to_pylist() == ["3", '"q\\"\\n"', '{"a":true}', "null", "null"]
    assert reference(WRITTEN["variant"]) == ["3", '"q\\"\\n"', '{"a":true}', "null", "null"]
    assert reference(WRITTEN["variant"].slice(2, 2)) == ['{"a":true}', "null"]


@pytest.mark.parametrize("name", list(WRITTEN))
def test_column_texts_are_what_orjson_writes_for_the_values(name: str) -> None:
    column = WRITTEN[name]
    texts = json_texts(column)
    assert texts is not None
    assert texts.null_count == 0
    assert texts.to_pylist() == reference(column)


def test_long_timestamp_columns_are_iso_8601_whatever_their_years() -> None:
    # Long enough for the kernels (not datetime) to write them in every path; the years 0000-9999
    # take a byte-slice replacement, the others a substring search: both must write the same form.
    instants = [dt.datetime(1, 1, 1) + dt.timedelta(days=76 * 365 * i, microseconds=i) for i in range(ROWS)]
    expected = [f'"{t.isoformat(timespec="microseconds")}Z"' for t in instants]
    column = pa.array(instants, pa.timestamp("us", tz="UTC"))
    assert json_texts(column).to_pylist() == expected  # type: ignore[union-attr]
    assert json_values(column) == [e.strip('"') for e in expected]
    outside = pa.array([*range(ROWS - 2), 253_402_300_800_000_000, -62_167_219_200_000_001], pa.int64())
    texts = json_texts(outside.cast(pa.timestamp("us")))
    assert texts is not None
    assert texts.to_pylist()[-2:] == ['"10000-01-01T00:00:00.000000"', '"-0001-12-31T23:59:59.999999"']
    assert texts.to_pylist()[1] == '"1970-01-01T00:00:00.000001"'


def _invalid_utf8() -> pa.Array:
    return pa.Array.from_buffers(pa.string(), 1, [None, pa.py_buffer(struct.pack("<ii", 0, 1)), pa.py_buffer(b"\xff")])


LEFT_TO_ORJSON = {
    "float64": pa.array([1.0, 1e-6, None]),
    "float32": pa.array([1.5], pa.float32()),
    "binary": pa.array([b"\x00\x01"]),
    "struct": pa.array([{"a": 1}]),
    "list": pa.array([[1, 2]]),
    "null": pa.nulls(2),
    "newline in a string": pa.array(["a\nb"]),
    "NUL in a string": pa.array(["a\x00b"]),
    "invalid UTF-8": _invalid_utf8(),
}


@pytest.mark.parametrize("name", list(LEFT_TO_ORJSON))
def test_column_texts_decline_what_the_kernels_cannot_write_exactly(name: str) -> None:
    assert json_texts(LEFT_TO_ORJSON[name]) is None


def test_constant_text_only_for_a_column_of_one_value() -> None:
    same = pa.array([5] * ROWS, pa.int64())
    text = constant_text(same)
    assert text is not None and text.as_py() == "5"
    stamp = pa.array([INSTANT] * 3, pa.timestamp("us", tz="UTC"))
    stamp_text = constant_text(stamp)
    assert stamp_text is not None and stamp_text.as_py() == '"2024-01-02T03:04:05.123456Z"'
    assert constant_text(pa.array([5, 6], pa.int64())) is None
    assert constant_text(pa.array([5, None], pa.int64())) is None
    assert constant_text(pa.array(["a", "a"])) is None  # strings are not looked at
    assert constant_text(pa.array([], pa.int64())) is None


def test_concatenated_honours_a_slice() -> None:
    text = pa.array(["ab", "c", "", "def"])
    assert concatenated(text) == b"abcdef"
    assert concatenated(text.slice(1, 2)) == b"c"


# ------------------------------------------------------------------ whole batches --


def long_batch(*, version: int = 7, start: int = 0, snapshot: bool = False, floats: bool = False) -> ChangeBatch:
    ids = list(range(ROWS))
    kinds = ["insert", "delete", "update_preimage", "update_postimage"]
    data: dict[str, pa.Array] = {
        "id": pa.array(ids, pa.int64()),
        "name": pa.array([STRINGS[i % len(STRINGS)] for i in ids]),
        "amount": pa.array([None if i % 7 == 0 else decimal.Decimal(i) / 4 for i in ids], pa.decimal128(10, 2)),
        "at": pa.array([INSTANT + dt.timedelta(hours=i) for i in ids], pa.timestamp("us", tz="UTC")),
        "day": pa.array([dt.date(2024, 1, 1 + i % 28) for i in ids], pa.date32()),
        "flag": pa.array([i % 3 == 0 for i in ids]),
    }
    if floats:
        data["ratio"] = pa.array([i / 3 for i in ids])
    n = len(ids)
    data["_change_type"] = pa.array([kinds[i % 4] for i in ids])
    data["_commit_version"] = pa.array([version] * n, pa.int64())
    data["_commit_timestamp"] = pa.array([INSTANT] * n, pa.timestamp("us", tz="UTC"))
    pos = Position.in_snapshot(version, start) if snapshot else Position.change(version, start)
    return ChangeBatch(pos, pa.record_batch(data))


def row_by_row(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(encoding, "VECTOR_ROWS", 10**9)
    monkeypatch.setattr(embedded, "VECTOR_ROWS", 10**9)


def as_tuple(out: EncodedBatch) -> tuple[Any, ...]:
    return out.rows, out.keys, out.values, out.change_types


ENCODERS = {
    "position keys": {},
    "one key": {"key_columns": ["id"]},
    "two keys, tombstones": {"key_columns": ["name", "id"], "tombstones": True},
}


@pytest.mark.parametrize("options", list(ENCODERS))
@pytest.mark.parametrize("shape", ["changes", "snapshot", "one kind", "slice", "floats"])
def test_json_format_is_the_same_bytes_column_wise_and_row_wise(
    monkeypatch: pytest.MonkeyPatch, options: str, shape: str
) -> None:
    batch = long_batch(snapshot=shape == "snapshot", start=100, floats=shape == "floats")
    if shape == "one kind":
        ct = batch.rows.schema.get_field_index("_change_type")
        batch = ChangeBatch(batch.start, batch.rows.set_column(ct, "_change_type", pa.array(["delete"] * ROWS)))
    if shape == "slice":
        batch = ChangeBatch(batch.start, batch.rows.slice(5, ROWS - 10))
    encoder = ChangeEncoder(TABLE, format="json", **ENCODERS[options])  # type: ignore[arg-type]
    column_wise = encoder.encode(batch)
    with monkeypatch.context() as m:
        row_by_row(m)
        expected = encoder.encode(batch)
    assert as_tuple(column_wise) == as_tuple(expected)
    last = column_wise.values[-2] if column_wise.values[-1] is None else column_wise.values[-1]
    assert last is not None
    decoded = orjson.loads(last)  # and the bytes are the last row's
    assert decoded["id"] == batch.rows.column("id")[len(batch) - 1].as_py()
    assert decoded["_commit_timestamp"] == "2024-01-02T03:04:05.123456Z"


def test_an_unknown_change_type_in_a_long_batch_names_its_position() -> None:
    batch = long_batch(start=10)
    ct = batch.rows.schema.get_field_index("_change_type")
    kinds = ["insert"] * ROWS
    kinds[30] = "upsert"
    bad = ChangeBatch(batch.start, batch.rows.set_column(ct, "_change_type", pa.array(kinds)))
    with pytest.raises(SinkError, match=r"'upsert' at position \d+:40\b"):
        ChangeEncoder(TABLE, format="json").encode(bad)


@pytest.mark.parametrize("shape", ["changes", "snapshot", "floats", "position column"])
def test_json_lines_are_the_same_bytes_column_wise_and_row_wise(monkeypatch: pytest.MonkeyPatch, shape: str) -> None:
    batch = long_batch(version=3, start=20, snapshot=shape == "snapshot", floats=shape == "floats")
    if shape == "position column":  # a table column named like the line's position: the row path's rule
        batch = ChangeBatch(batch.start, batch.rows.append_column("_position", pa.array(range(ROWS))))
    column_wise = embedded.encode_jsonl(batch)
    with monkeypatch.context() as m:
        row_by_row(m)
        expected = embedded.encode_jsonl(batch)
    assert column_wise == expected
    lines = column_wise.splitlines()
    assert len(lines) == ROWS
    assert orjson.loads(lines[-1])["_position"] == [3, 20 + ROWS - 1, shape == "snapshot"]


#: What orjson writes for each value of the floating-point columns, which have no kernel path.
VALUE_TEXTS = {
    "float64": ["1.0", "1e-6", "null"],
    "float32": ["1.5"],
    "float64 specials": ["null", "null", "-0.0", "1.7976931348623157e+308", "5e-324", "0.1"],
    "empty": [],
}
FLOATS = {
    **{k: LEFT_TO_ORJSON[k] for k in ("float64", "float32")},
    "float64 specials": pa.array([float("nan"), float("inf"), -0.0, 1.7976931348623157e308, 5e-324, 0.1]),
    "empty": pa.array([], pa.float64()),
}


@pytest.mark.parametrize("name", list(VALUE_TEXTS))
def test_a_float_column_is_written_column_wise_as_orjson_writes_each_value(name: str) -> None:
    """A float column no longer sends its whole batch down the row path; other columns without a kernel still do."""
    column = FLOATS[name]
    rows = pa.record_batch({"id": pa.array(range(len(column)), pa.int64()), "x": column})
    texts = column_texts(rows)
    assert texts is not None
    assert texts["x"].to_pylist() == VALUE_TEXTS[name]  # type: ignore[union-attr]
    assert VALUE_TEXTS[name] == [orjson.dumps(v).decode() for v in column.to_pylist()]  # orjson's own, value by value


@pytest.mark.parametrize("name", ["binary", "struct", "list", "null", "newline in a string"])
def test_a_batch_with_another_column_without_a_kernel_is_left_to_the_row_path(name: str) -> None:
    column = LEFT_TO_ORJSON[name]
    assert column_texts(pa.record_batch({"id": pa.array(range(len(column)), pa.int64()), "x": column})) is None


def test_counting_texts_are_the_decimal_texts_of_the_range() -> None:
    assert counting_texts(7, 11).to_pylist() == ["7", "8", "9", "10"]
    assert counting_texts(0, 1).to_pylist() == ["0"]
    assert counting_texts(2**40, 2**40 + 2).to_pylist() == ["1099511627776", "1099511627777"]
    assert counting_texts(5, 5).to_pylist() == []
    assert counting_texts(5, 5).type == pa.string()
