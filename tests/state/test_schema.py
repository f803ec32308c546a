"""Schema parsing and conversion to Arrow (protocol, "Schema Serialization Format", "Column Mapping").

The logical Arrow schema is checked against the expected-output Parquet files that Spark wrote for
the delta-golden tables, and the physical schema (column mapping ``name`` and ``id`` modes) against
the data files of the same tables: their column names and ``PARQUET:field_id``s.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from core_corpus import corpus_root

from deltatail.state.actions import Metadata, parse_json_actions
from deltatail.state.errors import InvalidLogError
from deltatail.state.schema import (
    ArrayType,
    DecimalType,
    MapType,
    PrimitiveType,
    StructField,
    StructType,
    contains_variant,
    is_variant,
    parse_schema,
)


@pytest.fixture
def corpus() -> Path:
    return corpus_root()


# The protocol's "JSON Encoded Table Schema" example.
_SPEC_EXAMPLE = {
    "type": "struct",
    "fields": [
        {"name": "a", "type": "integer", "nullable": False, "metadata": {}},
        {
            "name": "b",
            "type": {"type": "struct", "fields": [{"name": "d", "type": "integer", "nullable": False, "metadata": {}}]},
            "nullable": True,
            "metadata": {},
        },
        {
            "name": "c",
            "type": {"type": "array", "elementType": "integer", "containsNull": False},
            "nullable": True,
            "metadata": {},
        },
        {
            "name": "e",
            "type": {
                "type": "array",
                "elementType": {
                    "type": "struct",
                    "fields": [{"name": "d", "type": "integer", "nullable": False, "metadata": {}}],
                },
                "containsNull": True,
            },
            "nullable": True,
            "metadata": {},
        },
        {
            "name": "f",
            "type": {"type": "map", "keyType": "string", "valueType": "string", "valueContainsNull": True},
            "nullable": True,
            "metadata": {},
        },
    ],
}

# The protocol's column-mapping example field.
_MAPPED_FIELD = {
    "name": "e",
    "type": {
        "type": "array",
        "elementType": {
            "type": "struct",
            "fields": [
                {
                    "name": "d",
                    "type": "integer",
                    "nullable": False,
                    "metadata": {
                        "delta.columnMapping.id": 5,
                        "delta.columnMapping.physicalName": "col-a7f4159c-53be-4cb0-b81a-f7e5240cfc49",
                    },
                }
            ],
        },
        "containsNull": True,
    },
    "nullable": True,
    "metadata": {
        "delta.columnMapping.id": 4,
        "delta.columnMapping.physicalName": "col-5f422f40-de70-45b2-88ab-1d5c90e94db1",
    },
}


def _field(name: str, dtype: Any, nullable: bool = True) -> dict[str, Any]:
    return {"name": name, "type": dtype, "nullable": nullable, "metadata": {}}


def _schema(*fields: dict[str, Any]) -> str:
    return json.dumps({"type": "struct", "fields": list(fields)})


def _field_id(f: pa.Field) -> str | None:
    metadata = f.metadata or {}
    value = metadata.get(b"PARQUET:field_id")
    return None if value is None else bytes(value).decode()


def _named_fields(dtype: pa.DataType, prefix: str) -> list[tuple[str, str | None]]:
    """Every struct field below ``dtype`` as (path, field id); list and map wrappers are walked through."""
    out: list[tuple[str, str | None]] = []
    if pa.types.is_struct(dtype):
        for i in range(dtype.num_fields):
            f = dtype.field(i)
            out.append((f"{prefix}/{f.name}", _field_id(f)))
            out += _named_fields(f.type, f"{prefix}/{f.name}")
    elif pa.types.is_map(dtype):
        out += _named_fields(dtype.key_type, prefix + "{key}")
        out += _named_fields(dtype.item_type, prefix + "{value}")
    elif pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        out += _named_fields(dtype.value_type, prefix + "[]")
    return out


def _schema_fields(schema: pa.Schema) -> list[tuple[str, str | None]]:
    return _named_fields(pa.struct(list(schema)), "")


def _latest_metadata(table: Path) -> Metadata:
    found = None
    for path in sorted((table / "_delta_log").iterdir()):
        if re.fullmatch(r"\d{20}\.json", path.name):
            for action in parse_json_actions(path.read_bytes()):
                if isinstance(action, Metadata):
                    found = action
    assert found is not None
    return found


# -- parsing --------------------------------------------------------------------------------------


def test_protocol_example_schema() -> None:
    schema = parse_schema(json.dumps(_SPEC_EXAMPLE))
    assert schema.names == ["a", "b", "c", "e", "f"]
    assert schema.field("a") == StructField("a", PrimitiveType("integer"), nullable=False)
    assert schema.field("b").type == StructType((StructField("d", PrimitiveType("integer"), nullable=False),))
    assert schema.field("c").type == ArrayType(PrimitiveType("integer"), contains_null=False)
    assert schema.field("e").type == ArrayType(
        StructType((StructField("d", PrimitiveType("integer"), nullable=False),)), contains_null=True
    )
    assert schema.field("f").type == MapType(PrimitiveType("string"), PrimitiveType("string"), value_contains_null=True)
    with pytest.raises(KeyError):
        schema.field("d")


def test_protocol_example_to_arrow() -> None:
    expected = pa.schema(
        [
            pa.field("a", pa.int32(), nullable=False),
            pa.field("b", pa.struct([pa.field("d", pa.int32(), nullable=False)])),
            pa.field("c", pa.list_(pa.field("element", pa.int32(), nullable=False))),
            pa.field("e", pa.list_(pa.field("element", pa.struct([pa.field("d", pa.int32(), nullable=False)])))),
            pa.field("f", pa.map_(pa.string(), pa.string())),
        ]
    )
    actual = parse_schema(json.dumps(_SPEC_EXAMPLE)).to_arrow()
    assert actual.equals(expected), f"{actual}\n!=\n{expected}"


@pytest.mark.parametrize(
    ("delta", "arrow"),
    [
        ("string", pa.string()),
        ("long", pa.int64()),
        ("integer", pa.int32()),
        ("short", pa.int16()),
        ("byte", pa.int8()),
        ("float", pa.float32()),
        ("double", pa.float64()),
        ("boolean", pa.bool_()),
        ("binary", pa.binary()),
        ("date", pa.date32()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestamp_ntz", pa.timestamp("us")),
        ("decimal(10,2)", pa.decimal128(10, 2)),
        ("decimal(38,0)", pa.decimal128(38, 0)),
        ("decimal(38, 18)", pa.decimal128(38, 18)),
    ],
)
def test_primitive_types_to_arrow(delta: str, arrow: pa.DataType) -> None:
    schema = parse_schema(_schema(_field("x", delta)))
    assert schema.to_arrow().field("x").type == arrow


def test_variant_columns_are_the_marked_struct_of_two_binaries_at_any_depth() -> None:
    """``variant`` (protocol, "Variant Data Type") maps to ``struct<metadata, value>``, marked as PySpark marks it."""
    fields = [
        _field("v", "variant"),
        _field("a", {"type": "array", "elementType": "variant", "containsNull": True}),
        _field("m", {"type": "map", "keyType": "string", "valueType": "variant", "valueContainsNull": True}),
        _field("s", {"type": "struct", "fields": [_field("v", "variant")]}),
        _field("n", "long"),
    ]
    schema = parse_schema(_schema(*fields))
    arrow = schema.to_arrow()
    want = pa.struct([pa.field("metadata", pa.binary(), False), pa.field("value", pa.binary(), False)])
    found = [
        arrow.field("v").type,
        arrow.field("a").type.value_type,
        arrow.field("m").type.item_type,
        arrow.field("s").type.field("v").type,
    ]
    for t in found:
        assert t == want
        assert t.field("metadata").metadata == {b"variant": b"true"}
    assert is_variant(schema.field("v").type) and not is_variant(schema.field("a").type)
    assert [contains_variant(f.type) for f in schema.fields] == [True, True, True, True, False]


def test_decimal_type_is_parsed() -> None:
    assert parse_schema(_schema(_field("x", "decimal(12,3)"))).field("x").type == DecimalType(12, 3)


def test_map_with_nested_values() -> None:
    dtype = {
        "type": "map",
        "keyType": "long",
        "valueType": {"type": "array", "elementType": "timestamp_ntz", "containsNull": False},
        "valueContainsNull": False,
    }
    arrow = parse_schema(_schema(_field("m", dtype))).to_arrow().field("m").type
    assert pa.types.is_map(arrow)
    assert arrow.key_type == pa.int64()
    assert arrow.item_field.nullable is False
    assert arrow.item_type.value_type == pa.timestamp("us")
    assert arrow.item_type.value_field.nullable is False


@pytest.mark.parametrize(
    "dtype",
    [
        "interval",
        "char(3)",
        "decimal(x,1)",
        "Long",
        42,
        {"type": "union"},
        {"type": "array"},
        {"type": "map", "keyType": "string"},
        {"type": "struct", "fields": [{"name": "x", "type": "nope", "nullable": True, "metadata": {}}]},
    ],
)
def test_unknown_or_malformed_type_is_an_invalid_log(dtype: Any) -> None:
    with pytest.raises(InvalidLogError):
        parse_schema(_schema(_field("x", dtype)))


@pytest.mark.parametrize("text", ["", "{", "[1]", '"string"', '{"type":"array","elementType":"long"}'])
def test_schema_string_that_is_not_a_struct_is_an_invalid_log(text: str) -> None:
    with pytest.raises(InvalidLogError):
        parse_schema(text)


@pytest.mark.parametrize(
    "field",
    [
        {"name": 5, "type": "long"},
        {"type": "long"},
        {"name": "x", "type": "long", "nullable": "yes"},
        {"name": "x", "type": "long", "nullable": 1},
        {"name": "x", "type": "long", "metadata": "ab"},
        {"name": "x", "type": "long", "metadata": [["a", "b"]]},
        {"name": "x", "type": {"type": "array", "elementType": "long", "containsNull": 0}},
        {"name": "x", "type": {"type": "map", "keyType": "string", "valueType": "long", "valueContainsNull": "t"}},
        "x",
        ["x", "long"],
    ],
)
def test_field_of_the_wrong_shape_is_an_invalid_log(field: Any) -> None:
    # name is a String, nullable/containsNull/valueContainsNull Booleans, metadata an object; nothing coerced
    with pytest.raises(InvalidLogError):
        parse_schema(json.dumps({"type": "struct", "fields": [field]}))


def test_fields_that_are_not_an_array_is_an_invalid_log() -> None:
    with pytest.raises(InvalidLogError, match="'fields' must be an array"):
        parse_schema('{"type": "struct", "fields": {"name": "x"}}')


def test_a_schema_nested_too_deeply_to_parse_is_an_invalid_log() -> None:
    dtype = '"long"'
    for _ in range(900):  # within orjson's nesting limit, beyond what a recursive parse can descend
        dtype = f'{{"type":"array","elementType":{dtype},"containsNull":true}}'
    with pytest.raises(InvalidLogError, match="RecursionError"):
        parse_schema(f'{{"type":"struct","fields":[{{"name":"x","type":{dtype}}}]}}')


def test_field_metadata_is_kept() -> None:
    schema = parse_schema(_schema({**_field("x", "long"), "metadata": {"delta.generationExpression": "1 + 1"}}))
    assert schema.field("x").metadata == {"delta.generationExpression": "1 + 1"}


# -- column mapping: the protocol's example --------------------------------------------------------


def test_column_mapping_example_physical_names_and_ids() -> None:
    schema = parse_schema(_schema(_MAPPED_FIELD))
    e = schema.field("e")
    assert e.field_id == 4
    assert e.physical_name("name") == "col-5f422f40-de70-45b2-88ab-1d5c90e94db1"
    assert e.physical_name("none") == "e"

    by_name = schema.to_physical_arrow("name")
    assert _schema_fields(by_name) == [
        ("/col-5f422f40-de70-45b2-88ab-1d5c90e94db1", None),
        ("/col-5f422f40-de70-45b2-88ab-1d5c90e94db1[]/col-a7f4159c-53be-4cb0-b81a-f7e5240cfc49", None),
    ]
    by_id = schema.to_physical_arrow("id")
    assert _schema_fields(by_id) == [
        ("/col-5f422f40-de70-45b2-88ab-1d5c90e94db1", "4"),
        ("/col-5f422f40-de70-45b2-88ab-1d5c90e94db1[]/col-a7f4159c-53be-4cb0-b81a-f7e5240cfc49", "5"),
    ]
    assert _schema_fields(schema.to_arrow()) == [("/e", None), ("/e[]/d", None)]
    assert _schema_fields(schema.to_physical_arrow("none")) == [("/e", None), ("/e[]/d", None)]


# -- column mapping: the corpus --------------------------------------------------------------------


def test_schema_of_a_column_mapping_id_mode_table(corpus: Path) -> None:
    table = corpus / "kernel-rs/cdf-column-mapping-id-mode"
    metadata = _latest_metadata(table)
    assert metadata.column_mapping_mode == "id"
    schema = metadata.schema()
    assert schema.to_arrow().names == ["id", "name", "value"]
    physical = schema.to_physical_arrow("id")
    data_files = sorted(table.glob("part-*.parquet"))
    assert data_files
    for path in data_files:
        written = pq.read_schema(path)
        for f in physical:
            assert written.field(f.name).type == f.type
            assert _field_id(written.field(f.name)) == _field_id(f)
    assert [_field_id(f) for f in physical] == ["1", "2", "3"]


@pytest.mark.parametrize(
    ("table", "mode"), [("table-with-columnmapping-mode-id", "id"), ("table-with-columnmapping-mode-name", "name")]
)
def test_nested_physical_schema_matches_the_data_files(corpus: Path, table: str, mode: str) -> None:
    root = corpus / "delta-golden" / table / "delta"
    metadata = _latest_metadata(root)
    assert metadata.column_mapping_mode == mode
    physical = _schema_fields(metadata.schema().to_physical_arrow(mode))
    assert len(physical) > 20
    names = [name for name, _ in physical]
    for path in sorted(root.glob("*.parquet")):
        written = _schema_fields(pq.read_schema(path))
        assert names == [name for name, _ in written]
        if mode == "id":
            assert physical == written
        else:
            assert all(field_id is None for _, field_id in physical)


@pytest.mark.parametrize(
    "table",
    [
        "table-with-columnmapping-mode-id",
        "table-with-columnmapping-mode-name",
        "data-reader-timestamp_ntz-id-mode",
        "data-reader-timestamp_ntz-name-mode",
    ],
)
def test_logical_schema_matches_the_expected_output(corpus: Path, table: str) -> None:
    root = corpus / "delta-golden" / table
    logical = _latest_metadata(root / "delta").schema().to_arrow()
    [expected_file, *_] = sorted((root / "expected").glob("*.parquet"))
    expected = pq.read_schema(expected_file)
    assert sorted(logical.names) == sorted(expected.names)
    for f in logical:
        assert f.type.equals(expected.field(f.name).type), f.name
