"""Schema differences: column mapping resolved by field id and physical name, nested fields by path.

Every expected diff here is written down by hand from the two schemas of the test.
"""

from __future__ import annotations

import json
from typing import Any

from deltatail.state.schema import parse_schema
from deltatail.state.schema_diff import ColumnRename, NullabilityChange, SchemaDiff, TypeChange, diff_schemas, type_name


def field(
    name: str,
    dtype: Any,
    *,
    nullable: bool = True,
    fid: int | None = None,
    phys: str | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = dict(extra or {})
    if fid is not None:
        metadata["delta.columnMapping.id"] = fid
    if phys is not None:
        metadata["delta.columnMapping.physicalName"] = phys
    return {"name": name, "type": dtype, "nullable": nullable, "metadata": metadata}


def schema(*fields: dict[str, Any]) -> Any:
    return parse_schema(json.dumps({"type": "struct", "fields": list(fields)}))


def struct(*fields: dict[str, Any]) -> dict[str, Any]:
    return {"type": "struct", "fields": list(fields)}


def test_no_old_schema_makes_every_top_level_column_added() -> None:
    new = schema(field("id", "long"), field("s", struct(field("a", "integer"))))
    assert diff_schemas(None, new) == SchemaDiff(added=("id", "s"))


def test_identical_schemas_have_no_difference() -> None:
    s = schema(field("id", "long"), field("v", "string"))
    diff = diff_schemas(s, s)
    assert not diff
    assert diff.kinds == ()
    assert diff.additive


def test_without_column_mapping_a_rename_is_a_drop_and_an_add() -> None:
    old = schema(field("id", "long"), field("v", "string"))
    new = schema(field("id", "long"), field("value", "string"))
    assert diff_schemas(old, new) == SchemaDiff(added=("value",), dropped=("v",))


def test_rename_by_field_id_even_when_the_physical_name_is_reused() -> None:
    old = schema(field("a", "long", fid=1, phys="col-1"), field("b", "long", fid=2, phys="col-2"))
    # a and b swap their logical names: the ids tell which column is which.
    new = schema(field("b", "long", fid=1, phys="col-1"), field("a", "long", fid=2, phys="col-2"))
    diff = diff_schemas(old, new)
    assert diff.renamed == (ColumnRename("a", "b"), ColumnRename("b", "a"))
    assert diff.added == () and diff.dropped == ()


def test_rename_by_physical_name_when_fields_carry_no_id() -> None:
    old = schema(field("a", "long", phys="col-a"))
    new = schema(field("alpha", "long", phys="col-a"))
    assert diff_schemas(old, new) == SchemaDiff(renamed=(ColumnRename("a", "alpha"),))


def test_same_name_with_another_field_id_is_a_drop_and_an_add() -> None:
    old = schema(field("a", "long", fid=1, phys="col-1"))
    new = schema(field("a", "long", fid=2, phys="col-2"))
    assert diff_schemas(old, new) == SchemaDiff(added=("a",), dropped=("a",))


def test_a_new_column_without_mapping_metadata_matches_by_name() -> None:
    # delta-rs adds columns to a column-mapping table without ids (seen with deltalake 1.6.6).
    old = schema(field("id", "long", fid=1, phys="col-1"), field("z", "integer"))
    new = schema(field("id", "long", fid=1, phys="col-1"), field("z", "integer", extra={"comment": "zz"}))
    assert diff_schemas(old, new) == SchemaDiff(metadata_changed=("z",))


def test_enabling_column_mapping_is_not_a_schema_change() -> None:
    old = schema(field("id", "integer"), field("description", "string"))
    new = schema(field("id", "integer", fid=1, phys="id"), field("description", "string", fid=2, phys="description"))
    assert not diff_schemas(old, new)


def test_nested_fields_by_path_with_a_renamed_parent() -> None:
    old = schema(
        field("s", struct(field("a", "integer", fid=3, phys="c3"), field("b", "string", fid=4, phys="c4")),
              fid=2, phys="c2"),
    )  # fmt: skip
    new = schema(
        field("rec", struct(field("a", "long", fid=3, phys="c3"), field("c", "string", fid=5, phys="c5")),
              fid=2, phys="c2"),
    )  # fmt: skip
    diff = diff_schemas(old, new)
    assert diff.renamed == (ColumnRename("s", "rec"),)
    assert diff.type_changed == (TypeChange("rec.a", "integer", "long"),)
    assert diff.dropped == ("s.b",)
    assert diff.added == ("rec.c",)
    assert diff.kinds == ("added", "dropped", "renamed", "type_changed")
    assert not diff.additive


def test_arrays_and_maps_by_element_key_and_value() -> None:
    old = schema(
        field("tags", {"type": "array", "elementType": "string", "containsNull": True}),
        field("m", {"type": "map", "keyType": "string", "valueType": struct(field("x", "integer")),
                    "valueContainsNull": False}),
    )  # fmt: skip
    new = schema(
        field("tags", {"type": "array", "elementType": "string", "containsNull": False}),
        field("m", {"type": "map", "keyType": "string", "valueType": struct(field("x", "long"), field("y", "date")),
                    "valueContainsNull": True}),
    )  # fmt: skip
    diff = diff_schemas(old, new)
    assert diff.nullability_changed == (
        NullabilityChange("tags.element", True, False),
        NullabilityChange("m.value", False, True),
    )
    assert diff.type_changed == (TypeChange("m.value.x", "integer", "long"),)
    assert diff.added == ("m.value.y",)
    assert not diff.additive  # array elements became NOT NULL


def test_nullability_and_kind_changes() -> None:
    old = schema(
        field("id", "long", nullable=False), field("p", "decimal(10,2)"), field("s", struct(field("a", "long")))
    )
    new = schema(field("id", "long", nullable=True), field("p", "decimal(12,2)"), field("s", "string"))
    diff = diff_schemas(old, new)
    assert diff.nullability_changed == (NullabilityChange("id", False, True),)
    assert diff.type_changed == (
        TypeChange("p", "decimal(10,2)", "decimal(12,2)"),
        TypeChange("s", "struct<a:long>", "string"),
    )


def test_names_that_need_quoting() -> None:
    old = schema(field("a.b", "long"))
    new = schema(field("a.b", "long"), field("x`y z", "long"))
    assert diff_schemas(old, new).added == ("`x``y z`",)


def test_type_names() -> None:
    s = schema(field("m", {"type": "map", "keyType": "string",
                           "valueType": {"type": "array", "elementType": "long", "containsNull": True},
                           "valueContainsNull": True}))  # fmt: skip
    assert type_name(s.fields[0].type) == "map<string,array<long>>"


def test_identity_high_water_mark_is_bookkeeping() -> None:
    old = schema(field("id", "long", extra={"delta.identity.highWaterMark": 10, "delta.identity.step": 1}))
    new = schema(field("id", "long", extra={"delta.identity.highWaterMark": 20, "delta.identity.step": 1}))
    assert not diff_schemas(old, new)


def test_json_round_trip() -> None:
    diff = SchemaDiff(
        added=("a",),
        dropped=("b",),
        renamed=(ColumnRename("c", "d"),),
        type_changed=(TypeChange("e", "integer", "long"),),
        nullability_changed=(NullabilityChange("f", True, False),),
        metadata_changed=("g",),
    )
    assert SchemaDiff.from_json(json.loads(json.dumps(diff.to_json()))) == diff
