"""Reading variant columns of data files: every layout unshredded, every value checked, errors placed.

Oracle: the shredded Parquet files that Apache Spark 4.3 wrote with forced shredding schemas and its
own ``to_json`` of every row (``tests/expectations/variant_expectations.json``, ``shredded``; see
``generate_variant_expectations.py``). The nested cases wrap those same Spark-written columns in
lists, maps and structs with pyarrow, so the expected JSON is Spark's, wrapped the same way.
"""

from __future__ import annotations

import json
import shutil
from functools import cache
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from deltatail.state.errors import DataFileError, InvalidLogError
from deltatail.state.schema import StructType, parse_schema
from deltatail.state.variant import VARIANT_STORAGE_TYPE, is_variant_type, variant_json_array
from deltatail.tailer.read.conform import nulls
from deltatail.tailer.read.rows import read_file_rows
from deltatail.tailer.storage import LocalStorage

EXPECTATIONS = Path(__file__).resolve().parents[1] / "expectations"
STORAGE = LocalStorage()


@cache
def shredded_cases() -> dict[str, dict[str, Any]]:
    with (EXPECTATIONS / "variant_expectations.json").open(encoding="utf-8") as f:
        return {case["name"]: case for case in json.load(f)["shredded"]}


def schema(**columns: Any) -> StructType:
    fields = [{"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in columns.items()]
    return parse_schema(orjson.dumps({"type": "struct", "fields": fields}).decode())


def read(directory: Path, path: str, table_schema: StructType, **kwargs: Any) -> pa.Table:
    batches = list(
        read_file_rows(
            STORAGE,
            str(directory),
            path,
            schema=table_schema,
            partition_columns=(),
            partition_values={},
            column_mapping_mode="none",
            table="the-table",
            version=7,
            **kwargs,
        )
    )
    return pa.Table.from_batches(batches, schema=batches[0].schema) if batches else pa.table({})


def texts(column: pa.ChunkedArray | pa.Array) -> list[str | None]:
    out = variant_json_array(column)
    return list(out.to_pylist())


ARRAY_OF_VARIANT = {"type": "array", "elementType": "variant", "containsNull": True}
MAP_OF_VARIANT = {"type": "map", "keyType": "string", "valueType": "variant", "valueContainsNull": True}
STRUCT_OF_VARIANT = {"type": "struct", "fields": [{"name": "v", "type": "variant", "nullable": True, "metadata": {}}]}


def _children(struct: pa.StructArray) -> list[pa.Array]:
    """The children as stored (``flatten`` would put the parent's nulls into required children)."""
    return [struct.field(i) for i in range(struct.type.num_fields)]


def test_spark_shredded_files_with_different_shredding_schemas_read_as_spark_reads_them(tmp_path: Path) -> None:
    """Five files of one table, each shredded differently (objects, arrays, primitives, nesting)."""
    table_schema = schema(id="long", v="variant")
    for name, case in shredded_cases().items():
        shutil.copyfile(EXPECTATIONS / case["file"], tmp_path / f"{name}.parquet")
    for name, case in shredded_cases().items():
        rows = read(tmp_path, f"{name}.parquet", table_schema).sort_by("id")
        assert is_variant_type(rows.schema.field("v").type)
        assert rows.column("id").to_pylist() == [i for i, _ in case["rows"]]
        assert texts(rows.column("v")) == [text for _, text in case["rows"]], name


def test_shredded_variants_in_lists_maps_and_structs_are_unshredded(tmp_path: Path) -> None:
    case = shredded_cases()["object"]
    spark_rows = sorted(case["rows"])
    v = pq.read_table(EXPECTATIONS / case["file"]).sort_by("id").column("v").combine_chunks()
    n = len(v)
    # each row i: a list of [v_i, null, v_i], a map {"k": v_i, "z": null}, a struct {v: v_i}; row 2 all null
    starts = pa.array([3 * i for i in range(n + 1)], pa.int32())
    elements = v.take(pa.array([j for i in range(n) for j in (i, i, i)]))
    absent = v.is_null().to_pylist()  # Spark's SQL null row stays null wherever it is copied
    element_mask = pa.array([j % 3 == 1 or absent[j // 3] for j in range(3 * n)])
    elements = pa.StructArray.from_arrays(_children(elements), fields=list(v.type), mask=element_mask)
    row_mask = pa.array([i == 2 for i in range(n)])
    lists = pa.ListArray.from_arrays(starts, elements, mask=row_mask)
    map_starts = pa.array([2 * i for i in range(n + 1)], pa.int32())
    keys = pa.array(["k", "z"] * n)
    items = v.take(pa.array([i for i in range(n) for _ in (0, 1)]))
    items = pa.StructArray.from_arrays(
        _children(items), fields=list(v.type), mask=pa.array([j % 2 == 1 or absent[j // 2] for j in range(2 * n)])
    )
    maps = pa.MapArray.from_arrays(map_starts, keys, items, mask=row_mask)
    structs = pa.StructArray.from_arrays([v], names=["v"], mask=row_mask)
    pq.write_table(pa.table({"l": lists, "m": maps, "s": structs}), tmp_path / "nested.parquet")

    rows = read(tmp_path, "nested.parquet", schema(l=ARRAY_OF_VARIANT, m=MAP_OF_VARIANT, s=STRUCT_OF_VARIANT))
    want = [text for _, text in spark_rows]
    got_lists = rows.column("l").combine_chunks()
    assert is_variant_type(got_lists.type.value_type)
    got_maps = rows.column("m").combine_chunks()
    assert is_variant_type(got_maps.type.item_type)
    elements, items = texts(got_lists.values), texts(got_maps.items)
    keys = got_maps.keys.to_pylist()
    list_at, map_at = got_lists.offsets.to_pylist(), got_maps.offsets.to_pylist()
    for i, text in enumerate(want):
        if i == 2:
            assert not got_lists[i].is_valid and not got_maps[i].is_valid
            continue
        assert elements[list_at[i] : list_at[i + 1]] == [text, None, text]
        assert dict(zip(keys[map_at[i] : map_at[i + 1]], items[map_at[i] : map_at[i + 1]], strict=True)) == {
            "k": text,
            "z": None,
        }
    got_structs = rows.column("s").combine_chunks()
    inner = texts(got_structs.field("v"))
    assert [inner[i] for i in range(n) if i != 2] == [w for i, w in enumerate(want) if i != 2]
    assert got_structs.null_count == 1
    pq.write_table(rows, tmp_path / "out.parquet")  # the output is writable as it is (no null under a required child)


def _variant_file(directory: Path, values: list[bytes | None], metadata: list[bytes | None] | None = None) -> str:
    meta = metadata if metadata is not None else [b"\x01\x00\x00"] * len(values)
    column = pa.StructArray.from_arrays(
        [pa.array(values, pa.binary()), pa.array(meta, pa.binary())], names=["value", "metadata"]
    )
    pq.write_table(
        pa.table({"id": pa.array(range(len(values)), pa.int64()), "v": column}), directory / "part-0.parquet"
    )
    return "part-0.parquet"


def test_malformed_variant_bytes_name_table_version_file_column_and_row(tmp_path: Path) -> None:
    path = _variant_file(tmp_path, [b"\x0c\x05", b"\x0c\x05", b"\x7c"])  # primitive type 31 does not exist
    with pytest.raises(DataFileError, match=r"variant column 'v'.*row 2.*unknown primitive type 31") as caught:
        read(tmp_path, path, schema(id="long", v="variant"))
    assert (caught.value.table, caught.value.version, caught.value.file) == ("the-table", 7, f"{tmp_path}/{path}")


def test_a_null_variant_metadata_is_a_data_file_error_naming_the_file(tmp_path: Path) -> None:
    path = _variant_file(tmp_path, [b"\x0c\x05"], metadata=[None])
    with pytest.raises(DataFileError, match="metadata is null") as caught:
        read(tmp_path, path, schema(id="long", v="variant"))
    assert caught.value.file == f"{tmp_path}/{path}"


def test_a_file_column_that_is_not_a_variant_is_an_invalid_log(tmp_path: Path) -> None:
    pq.write_table(pa.table({"v": pa.array([1, 2], pa.int64())}), tmp_path / "p.parquet")
    with pytest.raises(
        InvalidLogError, match="column 'v' is int64 in the data file, the schema says variant"
    ) as caught:
        read(tmp_path, "p.parquet", schema(v="variant"))
    assert caught.value.file == f"{tmp_path}/p.parquet" and caught.value.version == 7


def test_a_variant_column_the_file_lacks_reads_as_nulls_that_parquet_can_hold(tmp_path: Path) -> None:
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int64())}), tmp_path / "old.parquet")
    rows = read(tmp_path, "old.parquet", schema(id="long", v="variant", s=STRUCT_OF_VARIANT))
    assert rows.column("v").null_count == 2 and rows.column("s").null_count == 2
    assert is_variant_type(rows.schema.field("v").type)
    pq.write_table(rows, tmp_path / "out.parquet")
    assert pq.read_table(tmp_path / "out.parquet").column("v").to_pylist() == [None, None]


def test_nulls_fill_required_binaries_under_null_structs() -> None:
    array = nulls(3, pa.struct([pa.field("v", VARIANT_STORAGE_TYPE), pa.field("n", pa.int8(), False)]))
    assert array.null_count == 3 and array.type.field("v").type == VARIANT_STORAGE_TYPE
    assert array.field("v").field("metadata").to_pylist() == [b"", b"", b""]
    assert nulls(2, pa.int64()).to_pylist() == [None, None]


def test_a_required_variant_under_a_null_struct_is_not_read_as_a_value(tmp_path: Path) -> None:
    """``struct<v: variant not null>``: a null struct's required group reads back present, with empty bytes."""
    v = pa.StructArray.from_arrays(
        [pa.array([b"\x01\x00\x00", b"\x01\x00\x00"]), pa.array([b"\x0c\x01", b"\x0c\x02"])],
        fields=[pa.field("metadata", pa.binary(), False), pa.field("value", pa.binary(), False)],
    )
    s = pa.StructArray.from_arrays([v], fields=[pa.field("v", v.type, False)], mask=pa.array([False, True]))
    pq.write_table(pa.table({"s": s}), tmp_path / "p.parquet")
    assert pq.read_table(tmp_path / "p.parquet").column("s").chunk(0).field("v").field("metadata")[1].as_py() == b""
    required = {"type": "struct", "fields": [{"name": "v", "type": "variant", "nullable": False, "metadata": {}}]}
    rows = read(tmp_path, "p.parquet", schema(s=required))
    assert rows.column("s").to_pylist() == [{"v": {"metadata": b"\x01\x00\x00", "value": b"\x0c\x01"}}, None]
    pq.write_table(rows, tmp_path / "out.parquet")  # and the output is writable
