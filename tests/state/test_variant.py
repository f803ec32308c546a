"""The Parquet Variant decoder (the state/variant package) against independent sources.

- **Apache Spark 4.3's own Variant code** (JVM, JDK 25), through ``tests/expectations/variant_expectations.json``
  (made by ``generate_variant_expectations.py``, which does not import deltatail): the JSON text of
  every hand-built variant (bytes written one by one from VariantEncoding.md) and of every row of
  every data file of the seven variant tables of the corpus, shredded ones included.
- **pyspark's Python variant codec** (``pyspark.sql.variant_utils``, a second implementation by the
  Spark project): its decoder for Python values, and its JSON encoder for round trips.
- **deltalake 1.6.6**, for the unshredded tables it reads: the variant bytes of every row.
- **The tables' own statistics**: Delta writes the min/max of shredded fields as Z85-encoded variants.
- **The specifications' examples**, built here byte by byte (VariantShredding.md's tables).
"""

from __future__ import annotations

import contextlib
import datetime
import decimal
import hashlib
import json
import math
import shutil
import uuid
from functools import cache
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from core_corpus import corpus_root
from hypothesis import given, settings
from hypothesis import strategies as st

from deltatail.state.errors import DataFileError, DeltaTailError
from deltatail.state.variant import (
    MAX_DEPTH,
    VARIANT_STORAGE_TYPE,
    TimestampNanos,
    check_values,
    is_variant_group,
    is_variant_type,
    java_double_text,
    json_string,
    metadata_keys,
    unshred,
    variant_json_array,
    variant_to_json,
    variant_to_python,
)
from deltatail.state.z85 import z85_decode

EXPECTATIONS = Path(__file__).resolve().parents[1] / "expectations" / "variant_expectations.json"
EMPTY = bytes([0x01, 0x00, 0x00])


@cache
def expectations() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(EXPECTATIONS.read_text(encoding="utf-8"))
    return data


def _vectors() -> list[dict[str, Any]]:
    return list(expectations()["vectors"])


# -- hand-built variants against Spark ---------------------------------------------------------------


@pytest.mark.parametrize("vector", [v for v in _vectors() if "spark_json" in v], ids=lambda v: v["name"])
def test_json_text_equals_sparks(vector: dict[str, Any]) -> None:
    metadata, value = bytes.fromhex(vector["metadata"]), bytes.fromhex(vector["value"])
    assert variant_to_json(metadata, value) == vector["spark_json"]


@pytest.mark.parametrize(
    "vector", [v for v in _vectors() if "MALFORMED" in v.get("spark_error", "") or "malformed" in v["name"]], ids=repr
)
def test_bytes_spark_calls_malformed_are_a_data_file_error(vector: dict[str, Any]) -> None:
    assert "spark_error" in vector  # Spark refused them too
    metadata, value = bytes.fromhex(vector["metadata"]), bytes.fromhex(vector["value"])
    with pytest.raises(DataFileError, match="malformed variant"):
        variant_to_json(metadata, value)
    with pytest.raises(DataFileError, match="malformed variant"):
        variant_to_python(metadata, value)


# Types Spark 4.3 does not decode (UNKNOWN_PRIMITIVE_TYPE_IN_VARIANT): the text deltatail chose, in
# Spark's style (ISO_LOCAL_TIME fractions, a space before the time, +00:00 for UTC-adjusted values).
_NOT_IN_SPARK = {
    "time 13:45:00.5": '"13:45:00.5"',
    "timestamp nanos": '"2024-02-29 13:45:00.123456789+00:00"',
    "timestamp_ntz nanos": '"2024-02-29 13:45:00.000000001"',
}


def test_types_spark_does_not_decode_have_the_documented_text() -> None:
    refused = {v["name"]: v for v in _vectors() if "UNKNOWN_PRIMITIVE_TYPE" in v.get("spark_error", "")}
    assert set(refused) == {*_NOT_IN_SPARK, "malformed: unknown primitive type 31"}
    for name, text in _NOT_IN_SPARK.items():
        v = refused[name]
        assert variant_to_json(bytes.fromhex(v["metadata"]), bytes.fromhex(v["value"])) == text


def test_every_primitive_type_is_among_the_vectors() -> None:
    # basic type 0 header bytes are type_id << 2: every id 0..20 appears as the first byte of some vector
    firsts = {bytes.fromhex(v["value"])[0] for v in _vectors() if "malformed" not in v["name"]}
    assert {t << 2 for t in range(21)} <= firsts


# -- Python values against pyspark's decoder -------------------------------------------------------


def _pyspark_python(metadata: bytes, value: bytes) -> Any:
    from pyspark.sql.variant_utils import VariantUtils

    return VariantUtils.to_python(value, metadata)


def _same(ours: Any, theirs: Any) -> bool:
    if isinstance(ours, float) and isinstance(theirs, float):
        return (math.isnan(ours) and math.isnan(theirs)) or (ours == theirs and str(ours) == str(theirs))
    if isinstance(ours, dict) and isinstance(theirs, dict):
        return list(ours) == list(theirs) and all(_same(ours[k], theirs[k]) for k in ours)
    if isinstance(ours, list) and isinstance(theirs, list):
        return len(ours) == len(theirs) and all(_same(a, b) for a, b in zip(ours, theirs, strict=True))
    return type(ours) is type(theirs) and ours == theirs


# pyspark's Python codec lacks uuid; Python's date stops at year 9999 (tested below).
_PYSPARK_CANNOT = {"uuid", "date 10000-01-01"}


@pytest.mark.parametrize(
    "vector", [v for v in _vectors() if "spark_json" in v and v["name"] not in _PYSPARK_CANNOT], ids=lambda v: v["name"]
)
def test_python_values_equal_pysparks(vector: dict[str, Any]) -> None:
    metadata, value = bytes.fromhex(vector["metadata"]), bytes.fromhex(vector["value"])
    ours = variant_to_python(metadata, value)
    theirs = _pyspark_python(metadata, value)
    assert _same(ours, theirs), (ours, theirs)


def test_python_values_of_the_types_pyspark_lacks() -> None:
    by_name = {v["name"]: (bytes.fromhex(v["metadata"]), bytes.fromhex(v["value"])) for v in _vectors()}
    assert variant_to_python(*by_name["uuid"]) == uuid.UUID("10111213-1415-1617-1819-1a1b1c1d1e1f")
    assert variant_to_python(*by_name["time 13:45:00.5"]) == datetime.time(13, 45, 0, 500000)
    nanos = variant_to_python(*by_name["timestamp nanos"])
    assert nanos == TimestampNanos(1709214300123456789, adjusted_to_utc=True)
    assert nanos.isoformat() == "2024-02-29 13:45:00.123456789+00:00"
    assert variant_to_python(*by_name["decimal4 12.50"]) == decimal.Decimal("12.50")
    assert str(variant_to_python(*by_name["decimal4 12.50"])) == "12.50"  # the stored scale is kept
    with pytest.raises(DataFileError, match="outside Python's years"):
        variant_to_python(*by_name["date 10000-01-01"])


# -- the specifications' examples, byte by byte -----------------------------------------------------


def _meta(*names: str) -> bytes:
    """Metadata with 1-byte offsets: header 01, dictionary size, offsets, UTF-8 names."""
    raw = [n.encode() for n in names]
    offsets = [0]
    for r in raw:
        offsets.append(offsets[-1] + len(r))
    return bytes([0x01, len(raw), *offsets]) + b"".join(raw)


def test_the_encoding_specs_empty_metadata_with_and_without_its_offset() -> None:
    # VariantShredding.md writes the empty metadata as "01 00"; writers write "01 00 00".
    assert metadata_keys(bytes([0x01, 0x00])) == ()
    assert metadata_keys(EMPTY) == ()
    assert metadata_keys(_meta("a", "bc")) == ("a", "bc")


def _measurements() -> pa.StructArray:
    # VariantShredding.md, "Value Shredding": 34, null, "n/a", 100 shredded as int64. The specification's
    # table writes "n/a" as 13 6E 2F 61, but 0x13 has basic type 3 (array): a 3-byte short string's
    # header is 3 << 2 | 1 = 0x0D.
    return pa.StructArray.from_arrays(
        [
            pa.array([bytes([1, 0])] * 4, pa.binary()),
            pa.array([None, bytes([0x00]), bytes([0x0D, 0x6E, 0x2F, 0x61]), None], pa.binary()),
            pa.array([34, None, None, 100], pa.int64()),
        ],
        names=["metadata", "value", "typed_value"],
    )


def test_spec_example_shredded_measurements() -> None:
    out = unshred(_measurements())
    assert out.type == VARIANT_STORAGE_TYPE
    values = out.field("value").to_pylist()
    # int64 is primitive type 6: header 6 << 2 = 0x18, then 8 bytes little-endian
    assert values == [
        bytes([0x18, 34, 0, 0, 0, 0, 0, 0, 0]),
        b"\x00",
        b"\x0dn/a",
        bytes([0x18, 100, 0, 0, 0, 0, 0, 0, 0]),
    ]
    assert variant_json_array(_measurements()).to_pylist() == ["34", "null", '"n/a"', "100"]


def _event_column() -> tuple[pa.StructArray, list[str | None]]:
    """VariantShredding.md, "Objects": the event table, each row with the JSON text it stands for."""
    meta = _meta("event_type", "event_ts", "email", "error_msg", "click")
    email = bytes([0x02, 1, 2, 0, 17]) + bytes([16 << 2 | 1]) + b"user@example.com"  # {"email": ...}
    error = bytes([0x02, 1, 3, 0, 15]) + bytes([14 << 2 | 1]) + b"malformed: ..."
    not_object = bytes([24 << 2 | 1]) + b"malformed: not an object"
    click = bytes([0x02, 1, 4, 0, 8]) + bytes([7 << 2 | 1]) + b"_button"
    date_string = bytes([10 << 2 | 1]) + b"2024-10-24"
    rows: list[tuple[Any, ...]] = [
        # value, typed_value present?, event_type (value, typed), event_ts (value, typed), JSON
        (None, True, (None, "noop"), (None, 1729794114937), '{"event_ts":1729794114937,"event_type":"noop"}'),
        (
            email,
            True,
            (None, "login"),
            (None, 1729794146402),
            '{"email":"user@example.com","event_ts":1729794146402,"event_type":"login"}',
        ),
        (error, True, (None, None), (None, None), '{"error_msg":"malformed: ..."}'),
        (not_object, False, None, None, '"malformed: not an object"'),
        (click, True, (None, None), (None, 1729794240241), '{"click":"_button","event_ts":1729794240241}'),
        (None, True, (b"\x00", None), (None, 1729794954163), '{"event_ts":1729794954163,"event_type":null}'),
        (None, True, (None, "noop"), (date_string, None), '{"event_ts":"2024-10-24","event_type":"noop"}'),
        (None, True, (None, None), (None, None), "{}"),
        (b"\x00", False, None, None, "null"),
        (None, False, None, None, "null"),  # missing: a required variant reads as variant null
    ]

    def field(index: int, typed_type: pa.DataType) -> pa.StructArray:
        cells = [r[index] if r[1] else (None, None) for r in rows]
        return pa.StructArray.from_arrays(
            [pa.array([c[0] for c in cells], pa.binary()), pa.array([c[1] for c in cells], typed_type)],
            names=["value", "typed_value"],
        )

    typed = pa.StructArray.from_arrays(
        [field(2, pa.string()), field(3, pa.int64())],  # event_ts as int64, so the JSON shows the numbers
        names=["event_type", "event_ts"],
        mask=pa.array([not r[1] for r in rows]),
    )
    column = pa.StructArray.from_arrays(
        [pa.array([meta] * len(rows), pa.binary()), pa.array([r[0] for r in rows], pa.binary()), typed],
        names=["metadata", "value", "typed_value"],
    )
    return column, [r[4] for r in rows]


def test_spec_example_shredded_event_objects() -> None:
    column, texts = _event_column()
    assert variant_json_array(column).to_pylist() == texts
    # and the reconstructed objects are proper variants: field ids in name order, found in the metadata
    out = unshred(column)
    first = variant_to_python(out[0]["metadata"].as_py(), out[0]["value"].as_py())
    assert first == {"event_ts": 1729794114937, "event_type": "noop"}


def test_spec_example_shredded_tags_arrays() -> None:
    # VariantShredding.md, "Arrays": ["comedy","drama"], ["horror", null], ["comedy","drama","romance"], null
    element = pa.struct([pa.field("value", pa.binary()), pa.field("typed_value", pa.string())])
    lists = pa.array(
        [
            [{"value": None, "typed_value": "comedy"}, {"value": None, "typed_value": "drama"}],
            [{"value": None, "typed_value": "horror"}, {"value": b"\x00", "typed_value": None}],
            [{"value": None, "typed_value": t} for t in ("comedy", "drama", "romance")],
            None,
        ],
        pa.list_(pa.field("element", element, nullable=False)),
    )
    column = pa.StructArray.from_arrays(
        [pa.array([EMPTY] * 4, pa.binary()), pa.array([None, None, None, b"\x00"], pa.binary()), lists],
        names=["metadata", "value", "typed_value"],
    )
    assert variant_json_array(column).to_pylist() == [
        '["comedy","drama"]',
        '["horror",null]',
        '["comedy","drama","romance"]',
        "null",
    ]


def _one_row(value: bytes | None, typed: pa.Array, metadata: bytes = EMPTY) -> pa.StructArray:
    return pa.StructArray.from_arrays(
        [pa.array([metadata], pa.binary()), pa.array([value], pa.binary()), typed],
        names=["metadata", "value", "typed_value"],
    )


@pytest.mark.parametrize(
    ("case", "column", "message"),
    [
        ("primitive with both", _one_row(b"\x00", pa.array([1], pa.int64())), "both value and typed_value"),
        (
            "field both shredded and in value",
            _one_row(
                bytes([0x02, 1, 0, 0, 2]) + bytes([1 << 2 | 1]) + b"x",
                pa.StructArray.from_arrays(
                    [
                        pa.StructArray.from_arrays(
                            [pa.array([None], pa.binary()), pa.array(["y"])], names=["value", "typed_value"]
                        )
                    ],
                    names=["a"],
                ),
                _meta("a"),
            ),
            "both shredded and in the object's value",
        ),
        (
            "typed object beside a value that is not an object",
            _one_row(
                bytes([1 << 2 | 1]) + b"a", pa.StructArray.from_arrays([pa.array([None], pa.binary())], names=["x"])
            ),
            "is not an object|not a group",
        ),
        (
            "shredded field name absent from the metadata",
            _one_row(
                None,
                pa.StructArray.from_arrays(
                    [
                        pa.StructArray.from_arrays(
                            [pa.array([None], pa.binary()), pa.array([1])], names=["value", "typed_value"]
                        )
                    ],
                    names=["nope"],
                ),
            ),
            "not in the variant's metadata",
        ),
        (
            "unsupported typed_value type",
            _one_row(None, pa.array([1], pa.uint32())),
            "not a type variant shredding allows",
        ),
        (
            "millisecond timestamp",
            _one_row(None, pa.array([1], pa.timestamp("ms"))),
            "not a type variant shredding allows",
        ),
    ],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_invalid_shredding_is_a_data_file_error_naming_the_column(
    case: str, column: pa.StructArray, message: str
) -> None:
    with pytest.raises(DataFileError, match=message) as info:
        unshred(column, column="column 'v'")
    assert "column 'v'" in str(info.value)


def test_a_partly_shredded_object_whose_value_holds_a_name_twice_is_a_data_file_error() -> None:
    # value {"a": true, "a": false} (ids 0 and 1 both name "a") beside a shredded field "b"
    meta = _meta("a", "a", "b")
    rest = bytes([0x02, 2, 0, 1, 0, 1, 2]) + b"\x04\x08"
    typed = pa.StructArray.from_arrays(
        [pa.StructArray.from_arrays([pa.array([None], pa.binary()), pa.array([1])], names=["value", "typed_value"])],
        names=["b"],
    )
    with pytest.raises(DataFileError, match="twice"):
        unshred(_one_row(rest, typed, meta))


def test_a_missing_array_element_is_a_data_file_error() -> None:
    element = pa.struct([pa.field("value", pa.binary()), pa.field("typed_value", pa.string())])
    lists = pa.array([[{"value": None, "typed_value": None}]], pa.list_(pa.field("element", element, nullable=False)))
    with pytest.raises(DataFileError, match="missing element"):
        unshred(_one_row(None, lists))


def test_a_null_metadata_in_a_present_row_is_a_data_file_error() -> None:
    column = pa.StructArray.from_arrays(
        [pa.array([EMPTY, None], pa.binary()), pa.array([b"\x04", b"\x04"], pa.binary())], names=["metadata", "value"]
    )
    with pytest.raises(DataFileError, match="row 1: the metadata is null"):
        unshred(column)


def test_a_struct_that_is_not_a_variant_group_is_refused() -> None:
    other = pa.StructArray.from_arrays([pa.array([1]), pa.array(["x"])], names=["a", "b"])
    assert not is_variant_group(other.type)
    with pytest.raises(DataFileError, match="not a variant group"):
        unshred(other)
    with pytest.raises(DataFileError, match="not a variant group"):
        variant_json_array(pa.array([1, 2]))


def test_unshredded_columns_pass_through_with_nulls_and_field_order_normalized() -> None:
    # Spark 4.0 writes (value, metadata); a value that is null in a present row reads as variant null
    column = pa.StructArray.from_arrays(
        [pa.array([b"\x0c\x05", None, b"\x04"], pa.binary()), pa.array([EMPTY, EMPTY, EMPTY], pa.binary())],
        names=["value", "metadata"],
        mask=pa.array([False, False, True]),
    )
    out = unshred(column)
    assert out.type == VARIANT_STORAGE_TYPE
    assert out.to_pylist() == [{"metadata": EMPTY, "value": b"\x0c\x05"}, {"metadata": EMPTY, "value": b"\x00"}, None]
    assert variant_json_array(column).to_pylist() == ["5", "null", None]
    chunked = pa.chunked_array([column, column.slice(1)])
    assert variant_json_array(chunked).to_pylist() == ["5", "null", None, "null", None]
    assert unshred(chunked).type == VARIANT_STORAGE_TYPE


def test_the_marker_on_metadata_tells_a_variant_from_a_struct_of_two_binaries() -> None:
    assert is_variant_type(VARIANT_STORAGE_TYPE)
    spark_40 = pa.StructArray.from_arrays([pa.array([b"\x04"]), pa.array([EMPTY])], names=["value", "metadata"])
    assert not is_variant_type(spark_40.type)  # as read from a file: not marked
    assert is_variant_type(unshred(spark_40).type)
    marked = pa.field("metadata", pa.binary(), False, {b"variant": b"true"})
    assert is_variant_type(pa.struct([pa.field("value", pa.binary(), False), marked]))  # PySpark's field order
    plain = pa.struct([pa.field("metadata", pa.binary()), pa.field("value", pa.binary())])
    assert not is_variant_type(plain)
    assert not is_variant_type(pa.struct([marked]))
    assert not is_variant_type(pa.struct([marked, pa.field("value", pa.binary()), pa.field("x", pa.int8())]))
    assert not is_variant_type(pa.binary())


def test_check_values_accepts_what_decodes_and_names_the_row_of_what_does_not() -> None:
    good = pa.StructArray.from_arrays(
        [pa.array([EMPTY, EMPTY, EMPTY], pa.binary()), pa.array([b"\x04", b"", b"\x0c\x05"], pa.binary())],
        fields=list(VARIANT_STORAGE_TYPE),
        mask=pa.array([False, True, False]),
    )
    check_values(good)  # the null row's empty value is not looked at
    check_values(pa.nulls(0, VARIANT_STORAGE_TYPE))
    bad = pa.StructArray.from_arrays(
        [pa.array([EMPTY, EMPTY], pa.binary()), pa.array([b"\x04", b"\x7c"], pa.binary())],
        fields=list(VARIANT_STORAGE_TYPE),
    )
    with pytest.raises(DataFileError, match=r"in column v, row 1: malformed variant: unknown primitive type 31"):
        check_values(bad, column="column v")
    with pytest.raises(DataFileError, match="row 0"):
        check_values(bad.slice(1))


# -- the corpus tables against Spark ----------------------------------------------------------------


def _contains_variant(dtype: Any) -> bool:
    if dtype == "variant":
        return True
    if isinstance(dtype, dict):
        kind = dtype["type"]
        if kind == "struct":
            return any(_contains_variant(f["type"]) for f in dtype["fields"])
        if kind == "array":
            return _contains_variant(dtype["elementType"])
        if kind == "map":
            return _contains_variant(dtype["valueType"])
    return False


def _rows(array: pa.Array, dtype: Any, where: str) -> list[Any]:
    """Python values of an Arrow column with every variant in it replaced by its JSON text (maps as dicts)."""
    if dtype == "variant":
        texts: list[Any] = variant_json_array(array, column=where).to_pylist()
        return texts
    if not _contains_variant(dtype):
        plain: list[Any] = array.to_pylist(maps_as_pydicts="strict")
        return plain
    valid = array.is_valid().to_pylist()
    kind = dtype["type"]
    if kind == "struct":
        children = {
            f["name"]: _rows(array.field(f["name"]), f["type"], f"{where}.{f['name']}") for f in dtype["fields"]
        }
        return [{name: values[i] for name, values in children.items()} if valid[i] else None for i in range(len(array))]
    offsets = array.offsets.to_pylist()
    start, stop = offsets[0], offsets[-1]
    if kind == "array":
        pairs: list[Any] = _rows(array.values.slice(start, stop - start), dtype["elementType"], f"{where}[]")
    else:
        keys = _rows(array.keys.slice(start, stop - start), dtype["keyType"], where)
        values = _rows(array.items.slice(start, stop - start), dtype["valueType"], f"{where}{{}}")
        pairs = list(zip(keys, values, strict=True))
    out: list[Any] = []
    for i in range(len(array)):
        chunk = pairs[offsets[i] - start : offsets[i + 1] - start]
        out.append(None if not valid[i] else (chunk if kind == "array" else dict(chunk)))
    return out


def _file_rows(path: Path, schema: dict[str, Any]) -> list[dict[str, Any]]:
    table = pq.read_table(path)
    columns = {
        f["name"]: _rows(table.column(f["name"]).combine_chunks(), f["type"], f"column {f['name']!r}")
        for f in schema["fields"]
    }
    return [{name: columns[name][i] for name in columns} for i in range(table.num_rows)]


def _line(row: dict[str, Any]) -> str:
    return json.dumps(row, ensure_ascii=False, separators=(",", ":"), sort_keys=True, default=str)


def _tables() -> list[str]:
    return list(expectations()["tables"])


@pytest.mark.slow
@pytest.mark.parametrize("table", _tables())
def test_every_row_of_every_data_file_equals_sparks_reading(table: str) -> None:
    root = corpus_root() / table
    expected = expectations()["tables"][table]
    on_disk = sorted(p.name for p in root.glob("*.parquet"))
    assert on_disk == sorted(expected["files"])
    for name, facts in expected["files"].items():
        rows = _file_rows(root / name, expected["schema"])
        assert len(rows) == facts["rows"]
        assert rows[: len(facts["head"])] == facts["head"]
        digest = hashlib.sha256("\n".join(_line(r) for r in rows).encode("utf-8")).hexdigest()
        assert digest == facts["sha256"], name


@pytest.mark.parametrize("case", expectations()["shredded"], ids=lambda c: c["name"])
def test_files_spark_shredded_read_as_spark_reads_them(case: dict[str, Any]) -> None:
    # Spark wrote these files with a forced shredding schema (objects partly shredded, fields of the
    # wrong type, arrays, every primitive type, nesting) and read them back with to_json.
    table = pq.read_table(EXPECTATIONS.parent / case["file"])
    assert "typed_value" in table.schema.field("v").type.names  # really shredded
    texts = variant_json_array(table.column("v"), column="column 'v'").to_pylist()
    assert sorted(zip(table.column("id").to_pylist(), texts, strict=True)) == [tuple(r) for r in case["rows"]]


@pytest.mark.parametrize("case", expectations()["shredded"], ids=lambda c: c["name"])
def test_slices_of_a_shredded_column_give_slices_of_the_result(case: dict[str, Any]) -> None:
    column = pq.read_table(EXPECTATIONS.parent / case["file"]).column("v").combine_chunks()
    full = variant_json_array(column).to_pylist()
    for k in range(1, len(column)):
        assert variant_json_array(column.slice(k)).to_pylist() == full[k:]
        assert variant_json_array(column.slice(0, k)).to_pylist() == full[:k]
        assert unshred(column.slice(k)).to_pylist() == unshred(column).to_pylist()[k:]


# What each table should yield, established from the log (json), Spark (values) and deltalake.
TABLE_FACTS = {
    # table: (versions, rows in the latest snapshot, files the log names that are missing on disk)
    "kernel-rs/unshredded-variant": (3, 102, 0),
    "delta-spark/variant-stats-no-checkpoint": (2, 10, 0),
    "delta-spark/variant-stats-nested-no-checkpoint": (2, 10, 0),
    "delta-spark/variant-stats-with-struct-no-checkpoint": (2, 10, 0),
    "delta-spark/variant-stats-state-reconstruction": (1, 1, 0),
    "delta-kernel-java/spark-shredded-variant-preview-delta": (3, 102, 0),
    "delta-kernel-java/spark-variant-stable-feature-checkpoint": (2, 20000, 4),
}


@pytest.mark.parametrize("table", list(TABLE_FACTS))
def test_what_each_table_holds(table: str) -> None:
    versions, rows, missing = TABLE_FACTS[table]
    facts = expectations()["tables"][table]
    adds = [a for per_version in facts["adds"].values() for a in per_version]
    assert len(facts["adds"]) == versions
    assert sum(a["numRecords"] for a in adds) == rows  # append-only tables: every add is live
    assert sum(not a["on_disk"] for a in adds) == missing
    if not missing:
        assert sum(f["rows"] for f in facts["files"].values()) == rows


def test_the_checkpoint_table_names_prefixed_files_that_are_not_on_disk() -> None:
    # MANIFEST.md: the log says test%25file%25prefix-part-..., the files on disk lack the prefix. A reader
    # must not guess: the files the log names do not exist (deltalake: FileNotFoundError).
    facts = expectations()["tables"]["delta-kernel-java/spark-variant-stable-feature-checkpoint"]
    logged = {a["path"] for per_version in facts["adds"].values() for a in per_version}
    assert all(p.startswith("test%file%prefix-part-") for p in logged)
    assert {p.removeprefix("test%file%prefix-") for p in logged} == set(facts["files"])


# -- deltalake, for the tables it reads -------------------------------------------------------------


def _deltalake_rows(root: Path) -> list[tuple[int, bytes, bytes]]:
    from deltalake import DeltaTable

    table = DeltaTable(str(root)).to_pyarrow_table(columns=["id", "v"])
    return sorted((r["id"], r["v"]["metadata"], r["v"]["value"]) for r in table.to_pylist())


def _our_rows(root: Path) -> list[tuple[int, bytes, bytes]]:
    rows = []
    for path in sorted(root.glob("*.parquet")):
        table = pq.read_table(path, columns=["id", "v"])
        storage = unshred(table.column("v"))
        for i, v in zip(table.column("id").to_pylist(), storage.to_pylist(), strict=True):
            rows.append((i, v["metadata"], v["value"]))
    return sorted(rows)


def test_unshredded_table_bytes_equal_deltalakes(tmp_path: Path) -> None:
    root = corpus_root() / "kernel-rs/unshredded-variant"
    assert _our_rows(root) == _deltalake_rows(root)


def test_shredded_preview_table_bytes_equal_deltalakes_without_the_feature(tmp_path: Path) -> None:
    # deltalake refuses the variantShredding-preview feature; this table's files are not shredded, so a
    # copy whose protocol drops the feature lets deltalake read the same files.
    src = corpus_root() / "delta-kernel-java/spark-shredded-variant-preview-delta"
    root = tmp_path / "t"
    shutil.copytree(src, root)
    for f in (root / "_delta_log").iterdir():
        if f.suffix == ".crc" or ".checkpoint." in f.name or f.name == "_last_checkpoint":
            f.unlink()
    commit = root / "_delta_log" / f"{0:020d}.json"
    lines = []
    for line in commit.read_text(encoding="utf-8").splitlines():
        action = json.loads(line)
        if "protocol" in action:
            for key in ("readerFeatures", "writerFeatures"):
                action["protocol"][key] = [x for x in action["protocol"][key] if x != "variantShredding-preview"]
        lines.append(json.dumps(action))
    commit.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert _our_rows(src) == _deltalake_rows(root)


# -- the tables' variant statistics ------------------------------------------------------------------


def _split(encoded: bytes) -> tuple[bytes, bytes]:
    """A stats variant is its metadata then its value (then Z85 padding): find where the metadata ends."""
    size = (encoded[0] >> 6) + 1
    count = int.from_bytes(encoded[1 : 1 + size], "little")
    strings_at = 1 + size + (count + 1) * size
    last = int.from_bytes(encoded[strings_at - size : strings_at], "little")
    return encoded[: strings_at + last], encoded[strings_at + last :]


@pytest.mark.parametrize(
    ("table", "column", "path"),
    [
        ("delta-spark/variant-stats-no-checkpoint", "v", ("v",)),
        ("delta-spark/variant-stats-no-checkpoint", "nv", ("nv", "v")),
        ("delta-spark/variant-stats-nested-no-checkpoint", "s", ("s", "v")),
        ("delta-spark/variant-stats-with-struct-no-checkpoint", "v", ("v",)),
        ("delta-spark/variant-stats-state-reconstruction", "v", ("v",)),
    ],
)
def test_stats_min_and_max_equal_those_of_the_shredded_columns(table: str, column: str, path: tuple[str, ...]) -> None:
    root = corpus_root() / table
    for commit in sorted((root / "_delta_log").glob("*.json")):
        for line in commit.read_text(encoding="utf-8").splitlines():
            add = json.loads(line).get("add")
            if not add:
                continue
            stats = json.loads(add["stats"])
            group = pq.read_table(root / add["path"].replace("%25", "%")).column(column).combine_chunks()
            for step in path[1:]:
                group = group.field(step)
            typed = group.field("typed_value")
            for bound, compute in (("minValues", pc.min), ("maxValues", pc.max)):
                encoded = stats[bound]
                for step in path:
                    encoded = encoded[step]
                decoded = variant_to_python(*_split(z85_decode(encoded)))
                if pa.types.is_struct(typed.type):  # {"$['field']": bound of that shredded field}
                    want = {
                        f"$['{f.name}']": compute(typed.field(f.name).field("typed_value")).as_py() for f in typed.type
                    }
                    assert decoded == want
                else:  # a top-level shredded primitive: the key is "$"
                    assert decoded == {"$": compute(typed).as_py()}


# -- malformed input, properties -------------------------------------------------------------------


def test_nesting_beyond_the_limit_is_a_data_file_error_not_a_recursion_error() -> None:
    value = b"\x00"
    for _ in range(MAX_DEPTH + 5):  # arrays of one element with 4-byte offsets: header (3 << 2) | 3
        value = bytes([0x0F, 1]) + (0).to_bytes(4, "little") + len(value).to_bytes(4, "little") + value
    with pytest.raises(DataFileError, match="deeper than"):
        variant_to_json(EMPTY, value)
    with pytest.raises(DataFileError, match="deeper than"):
        variant_to_python(EMPTY, value)


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        (b"", "empty"),
        (bytes([0x11, 0x02]), "too short"),
        (bytes([0x01, 0x01, 0x00, 0x05]) + b"ab", "spans bytes"),
        (bytes([0x01, 0x01, 0x00, 0x02]) + b"\xff\xfe", "not UTF-8"),
        (bytes([0x01, 0x02, 0x00, 0x02, 0x01]) + b"ab", "spans bytes"),
    ],
)
def test_malformed_metadata(metadata: bytes, message: str) -> None:
    with pytest.raises(DataFileError, match=message):
        metadata_keys(metadata)


def test_an_object_holding_a_name_twice_is_malformed() -> None:
    meta = _meta("a", "a")
    value = bytes([0x02, 2, 0, 1, 0, 1, 2]) + b"\x04\x08"
    with pytest.raises(DataFileError, match="twice"):
        variant_to_json(meta, value)


def test_json_array_names_column_and_row() -> None:
    column = pa.StructArray.from_arrays(
        [pa.array([EMPTY, EMPTY], pa.binary()), pa.array([b"\x04", b"\x7c"], pa.binary())], names=["metadata", "value"]
    )
    with pytest.raises(DataFileError, match=r"in column 'v', row 1: malformed variant: unknown primitive type 31"):
        variant_json_array(column, column="column 'v'")


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=40), st.binary(max_size=60))
def test_random_bytes_give_a_value_or_a_data_file_error(metadata: bytes, value: bytes) -> None:
    for decode in (variant_to_json, variant_to_python):
        with contextlib.suppress(DataFileError):
            decode(metadata, value)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.data())
def test_damaged_vectors_give_a_value_or_a_data_file_error(data: st.DataObject) -> None:
    vector = data.draw(st.sampled_from(_vectors()))
    value = bytearray.fromhex(vector["value"])
    if value and data.draw(st.booleans()):
        value[data.draw(st.integers(0, len(value) - 1))] = data.draw(st.integers(0, 255))
    else:
        value = value[: data.draw(st.integers(0, len(value)))]
    for decode in (variant_to_json, variant_to_python):
        try:
            decode(bytes.fromhex(vector["metadata"]), bytes(value))
        except DeltaTailError as e:
            assert isinstance(e, DataFileError)


json_documents = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=70),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=6), children, max_size=5),
    max_leaves=25,
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(json_documents)
def test_values_pysparks_encoder_builds_decode_as_pysparks_decoder_reads_them(document: Any) -> None:
    from pyspark.sql.variant_utils import VariantUtils

    value, metadata = VariantUtils.parse_json(json.dumps(document))
    ours = variant_to_python(metadata, value)
    assert _same(ours, VariantUtils.to_python(value, metadata))
    assert json.loads(variant_to_json(metadata, value), parse_float=decimal.Decimal) == json.loads(
        json.dumps(document), parse_float=decimal.Decimal
    ) or _numerically_equal(json.loads(variant_to_json(metadata, value)), document)


def _numerically_equal(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_numerically_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_numerically_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool):
        return float(a) == float(b)
    return bool(a == b)


# -- the formatting helpers ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("x", "text"),
    [(1.0, "1.0"), (1e21, "1.0E21"), (1234567.0, "1234567.0"), (0.00125, "0.00125"), (-2.5e-7, "-2.5E-7")],
)
def test_java_double_text(x: float, text: str) -> None:
    # Java's Double.toString, as its documentation lays it out
    assert java_double_text(x) == text


def test_json_string_escapes_control_characters_in_upper_case_hex() -> None:
    assert json_string("\x1f\\u001f") == '"\\u001F\\\\u001f"'
