"""Reading the rows of one logical file, checked against independent readers and written facts.

Oracles: deltalake 1.6.6 (``DeltaTable.scan()``, an independent reader), the Spark-written
``expected/`` results of the golden tables, the verified CDF reference outputs of the corpus,
column statistics recorded in the logs, and the row positions of the Parquet files themselves.
"""

from __future__ import annotations

import datetime as dt
import math
import sys
from collections import Counter
from collections.abc import Iterable
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from pyroaring import BitMap64

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: corpus.py (tests/ is not a package)
from corpus import corpus_root, corpus_table

from deltatail.state.actions import Add, AddCDCFile, Metadata, Remove, parse_json_actions
from deltatail.state.errors import (
    ConfigError,
    DeletionVectorError,
    DeltaTailError,
    InvalidLogError,
    MissingFileError,
    UnsafePathError,
)
from deltatail.state.feed import CHANGE_TYPE_COLUMN
from deltatail.state.schema import StructField, StructType, parse_schema
from deltatail.tailer.read.column_plan import ColumnPlan, PlansByParquetSchema
from deltatail.tailer.read.conform import conform
from deltatail.tailer.read.deletion_vectors import read_deletion_vector
from deltatail.tailer.read.parquet_file import ParquetOpening, open_parquet
from deltatail.tailer.read.partition_values import parse_partition_value
from deltatail.tailer.read.rows import (
    SHARED_LARGE_ROWS,
    RowFilter,
    output_schema,
    read_file_batches,
    read_file_rows,
    repeated_string,
    resolve_data_path,
)
from deltatail.tailer.storage import LocalStorage

STORAGE = LocalStorage()


def reference_dir() -> Path:
    """Derived deltalake outputs of the corpus (some verified against peer assertions, see MANIFEST.md)."""
    return corpus_root() / "_reference-outputs" / "deltalake-1.6.6"


# ------------------------------------------------------------------ helpers: a tiny log replay


def commits(root: Path) -> Iterable[tuple[int, list[Any]]]:
    for commit in sorted((root / "_delta_log").glob("*.json")):
        if commit.name[:20].isdigit() and commit.name.count(".") == 1:
            yield int(commit.name[:20]), parse_json_actions(commit.read_bytes())


def replay(root: Path, version: int | None = None) -> tuple[Metadata, list[tuple[int, Add]]]:
    """The metadata and live adds at ``version``, reconciled by ``(path, deletionVector.uniqueId)``."""
    metadata: Metadata | None = None
    live: dict[tuple[str, str | None], tuple[int, Add]] = {}
    for v, actions in commits(root):
        if version is not None and v > version:
            break
        for action in actions:
            if isinstance(action, Metadata):
                metadata = action
            elif isinstance(action, Add):
                live[(action.path, action.dv_id)] = (v, action)
            elif isinstance(action, Remove):
                live.pop((action.path, action.dv_id), None)
    assert metadata is not None
    return metadata, list(live.values())


def read_add(root: Path, metadata: Metadata, version: int, add: Add, **kwargs: Any) -> list[pa.RecordBatch]:
    row_filter = None
    if add.deletion_vector is not None:
        deleted = read_deletion_vector(STORAGE, str(root), add.deletion_vector, data_file=add.path, version=version)
        row_filter = RowFilter(deleted, keep=False)
    return list(
        read_file_rows(
            STORAGE,
            str(root),
            add.path,
            schema=metadata.schema(),
            partition_columns=metadata.partition_columns,
            partition_values=add.partition_values,
            column_mapping_mode=metadata.column_mapping_mode,
            row_filter=row_filter,
            version=version,
            **kwargs,
        )
    )


def our_snapshot(root: Path, version: int | None = None) -> pa.Table:
    metadata, adds = replay(root, version)
    batches = [b for v, add in adds for b in read_add(root, metadata, v, add)]
    return pa.Table.from_batches(batches, schema=output_schema(metadata.schema()))


def deltalake_snapshot(root: Path, version: int | None = None) -> pa.Table:
    return pa.RecordBatchReader.from_stream(DeltaTable(str(root), version=version).scan()).read_all()


def canon(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, canon(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(canon(v) for v in value)
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return value


def rows(table: pa.Table, like: pa.Schema) -> Counter[Any]:
    """The rows of ``table`` as a multiset, after casting it to ``like`` (column order and types)."""
    table = table.select(like.names).cast(like)
    return Counter(canon(r) for r in table.to_pylist())


def batches_rows(batches: list[pa.RecordBatch]) -> list[dict[str, Any]]:
    return [r for b in batches for r in b.to_pylist()]


# ------------------------------------------------------------------ whole snapshots of corpus tables


SNAPSHOT_TABLES = [
    # deletion vectors (relative, packed, inline history), with checkpoints and column mapping
    "kernel-rs/table-with-dv-small",
    "kernel-rs/with-short-dv",
    "kernel-rs/cdf-table-with-cdc-and-dvs",
    "delta-rs/table_with_deletion_logs",
    "delta-golden/dv-partitioned-with-checkpoint/delta",
    "delta-golden/dv-with-columnmapping/delta",
    "delta-golden/log-replay-dv-key-cases/delta",
    "delta-kernel-java/basic-dv-no-checkpoint",
    "delta-kernel-java/basic-dv-with-checkpoint",
    # column mapping: name and id modes, nested types, partitions keyed by physical name
    "kernel-rs/cdf-column-mapping-name-mode",
    "kernel-rs/cdf-column-mapping-id-mode",
    "delta-rs/table_with_column_mapping",
    "delta-rs/table_with_partitioning_mapping",
    "delta-golden/table-with-columnmapping-mode-name/delta",
    "delta-golden/table-with-columnmapping-mode-id/delta",
    "delta-golden/table-with-icebegCompatV2Enabled",
    "delta-golden/data-skipping-basic-stats-all-types-columnmapping-id/delta",
    "delta-kernel-java/column-mapping-id",
    "delta-kernel-java/data-reader-partition-values-column-mapping-name",
    "delta-kernel-java/data-reader-primitives-column-mapping-name",
    # timestamp_ntz (data and partition columns, with and without column mapping)
    "kernel-rs/data-reader-timestamp_ntz",
    "delta-golden/data-reader-timestamp_ntz/delta",
    "delta-golden/data-reader-timestamp_ntz-id-mode/delta",
    "delta-golden/data-reader-timestamp_ntz-name-mode/delta",
    "delta-golden/parquet-all-types/delta",
    "delta-golden/parquet-all-types-legacy-format/delta",
    "kernel-rs/stats-writing-all-types",
    # partition value serialization of many types, nulls, special characters
    "delta-golden/data-reader-partition-values/delta",
    "delta-golden/kernel-timestamp-int96/delta",
    "delta-golden/kernel-timestamp-pst/delta",
    "delta-golden/kernel-timestamp-timestamp_millis/delta",
    "delta-golden/kernel-timestamp-partition-col-ISO8601",
    "delta-golden/hive-deltatbl-special-chars-in-partition-column",
    "delta-golden/data-reader-escaped-chars/delta",
    "kernel-rs/timestamp-partitioned-table",
    "kernel-rs/partitioned_with_materialize_feature",
    "kernel-rs/basic-decimal-table",
    "delta-rs/partition-type-primitives",
    "delta-rs/delta-0.8.0-null-partition",
    "delta-rs/delta-0.8.0-special-partition",
    "dat/multi_partitioned/delta",
    # nested types, decimals, dates, added columns (missing in old files), dotted names
    "delta-golden/data-reader-array-complex-objects/delta",
    "delta-golden/data-reader-map/delta",
    "delta-golden/data-reader-nested-struct/delta",
    "delta-golden/decimal-various-scale-precision/delta",
    "delta-golden/data-reader-date-types-Asia/delta",
    "delta-golden/time-travel-schema-changes-b/delta",
    "dat/with_schema_change/delta",
    "kernel-rs/cdf-table-backtick-column-names",
]


@pytest.mark.parametrize("table", SNAPSHOT_TABLES)
def test_corpus_snapshot_matches_deltalake(table: str) -> None:
    root = corpus_table(table)
    ours = our_snapshot(root)
    assert rows(deltalake_snapshot(root), ours.schema) == rows(ours, ours.schema)


@pytest.mark.parametrize("version", range(7))
def test_inline_dv_history_matches_deltalake_at_every_version(version: int) -> None:
    root = corpus_table("kernel-rs/cdf-table-with-dv")
    ours = our_snapshot(root, version)
    assert rows(deltalake_snapshot(root, version), ours.schema) == rows(ours, ours.schema)


GOLDEN_WITH_EXPECTED = [
    "dv-with-columnmapping",
    "dv-partitioned-with-checkpoint",
    "log-replay-dv-key-cases",
    "table-with-columnmapping-mode-id",
    "table-with-columnmapping-mode-name",
    "data-reader-timestamp_ntz-id-mode",
    "parquet-all-types",
    "kernel-timestamp-int96",
    "data-reader-map",
    "time-travel-schema-changes-b",
]


@pytest.mark.parametrize("name", GOLDEN_WITH_EXPECTED)
def test_golden_snapshot_matches_spark_expected(name: str) -> None:
    root = corpus_table(f"delta-golden/{name}/delta")
    ours = our_snapshot(root)
    expected = pads.dataset(root.parent / "expected", format="parquet").to_table()
    assert rows(expected, ours.schema) == rows(ours, ours.schema)


def test_int96_timestamps_near_year_9999_match_log_statistics() -> None:
    """deltalake overflows these through nanoseconds; the log's stats record the true values."""
    root = corpus_table("delta-rs/table_with_edge_timestamps")
    metadata, adds = replay(root)
    for version, add in adds:
        stats = orjson.loads(add.stats or "{}")
        assert stats["numRecords"] == 1 and stats["minValues"] == stats["maxValues"]
        [row] = batches_rows(read_add(root, metadata, version, add))
        for column, text in stats["minValues"].items():
            expected = dt.datetime.fromisoformat(text) if isinstance(text, str) else text
            assert row[column] == expected, column


# ------------------------------------------------------------------ cdc files


def reference_cdf(relative: str) -> pa.Table:
    [path] = list((reference_dir() / relative).glob("cdf_from_*.parquet"))
    return pq.read_table(path)


@pytest.mark.parametrize(
    "table",
    [
        "kernel-rs/cdf-table",
        "kernel-rs/cdf-table-partitioned",
        "kernel-rs/cdf-table-non-partitioned",
        "kernel-rs/cdf-table-simple",
        "kernel-rs/cdf-table-update-ops",
        "kernel-rs/cdf-table-delete-conditional-two-rows",
        "kernel-rs/cdf-table-with-cdc-and-dvs",
        "delta-rs/cdc_ict_table",
    ],
)
@pytest.mark.parametrize("dictionary_min_bytes", [0, None], ids=["as-dictionary", "as-strings"])
def test_cdc_files_with_change_type_match_verified_reference(table: str, dictionary_min_bytes: int | None) -> None:
    """A commit with cdc actions has exactly those files' rows as its changes (protocol, Change Data Files).

    Both ways of reading ``_change_type`` are checked: as a dictionary (large files; here forced for all)
    and as strings (the corpus files are all below the default ``dictionary_min_bytes``).
    """
    opening = ParquetOpening() if dictionary_min_bytes is None else ParquetOpening(dictionary_min_bytes=0)
    root = corpus_table(table)
    reference = reference_cdf(table)
    metadata: Metadata | None = None
    checked = 0
    for version, actions in commits(root):
        metadata = next((a for a in actions if isinstance(a, Metadata)), metadata)
        cdcs = [a for a in actions if isinstance(a, AddCDCFile)]
        if not cdcs or metadata is None:
            continue
        schema = output_schema(metadata.schema(), keep_change_type=True)
        ours = [
            b
            for cdc in cdcs
            for b in read_file_rows(
                STORAGE,
                str(root),
                cdc.path,
                schema=metadata.schema(),
                partition_columns=metadata.partition_columns,
                partition_values=cdc.partition_values,
                column_mapping_mode=metadata.column_mapping_mode,
                keep_change_type=True,
                version=version,
                opening=opening,
            )
        ]
        expected = reference.filter(pc.equal(reference["_commit_version"], version))
        assert rows(pa.Table.from_batches(ours, schema=schema), schema) == rows(expected, schema), version
        checked += 1
    assert checked


@pytest.mark.parametrize("mode", ["name", "id"])
def test_cdc_files_under_column_mapping_match_log_statistics(mode: str) -> None:
    """Each cdc row is the single row of a data file whose stats (min == max) the log records."""
    root = corpus_table(f"kernel-rs/cdf-column-mapping-{mode}-mode")
    metadata, _ = replay(root, 0)
    schema = metadata.schema()
    assert metadata.column_mapping_mode == mode
    physical = {f.physical_name(mode): f.name for f in schema.fields}
    images = set()
    for _, actions in commits(root):
        for add in (a for a in actions if isinstance(a, Add)):
            stats = orjson.loads(add.stats or "{}")
            assert stats["numRecords"] == 1
            images.add(tuple(sorted((physical[k], v) for k, v in stats["minValues"].items())))
    seen: dict[str, int] = Counter()
    for version, actions in commits(root):
        for cdc in (a for a in actions if isinstance(a, AddCDCFile)):
            batches = list(
                read_file_rows(
                    STORAGE,
                    str(root),
                    cdc.path,
                    schema=schema,
                    partition_columns=(),
                    partition_values={},
                    column_mapping_mode=mode,
                    keep_change_type=True,
                    version=version,
                )
            )
            assert batches[0].schema.names == [*schema.names, CHANGE_TYPE_COLUMN]
            for row in batches_rows(batches):
                seen[row.pop(CHANGE_TYPE_COLUMN)] += 1
                assert tuple(sorted(row.items())) in images
    assert seen == {"update_preimage": 1, "update_postimage": 1, "delete": 1}


def first_cdc(root: Path) -> tuple[Metadata, int, AddCDCFile]:
    metadata: Metadata | None = None
    for version, actions in commits(root):
        metadata = next((a for a in actions if isinstance(a, Metadata)), metadata)
        for action in actions:
            if isinstance(action, AddCDCFile) and metadata is not None:
                return metadata, version, action
    raise AssertionError(f"{root} has no cdc file")


def test_change_type_of_cdc_file_is_dropped_unless_requested() -> None:
    root = corpus_table("kernel-rs/cdf-table")
    metadata, version, cdc = first_cdc(root)
    batches = read_add(root, metadata, version, Add(cdc.path, cdc.partition_values, cdc.size, 0, False))
    assert batches and all(b.schema == output_schema(metadata.schema()) for b in batches)


@pytest.mark.parametrize("dictionary_min_bytes", [0, None], ids=["as-dictionary", "as-strings"])
def test_change_type_requested_from_a_data_file_is_an_invalid_log(dictionary_min_bytes: int | None) -> None:
    # As a dictionary, pyarrow refuses a missing dictionary column at open: mapped too.
    opening = ParquetOpening() if dictionary_min_bytes is None else ParquetOpening(dictionary_min_bytes=0)
    root = corpus_table("kernel-rs/table-without-dv-small")
    metadata, [(version, add)] = replay(root)
    with pytest.raises(InvalidLogError, match=CHANGE_TYPE_COLUMN) as info:
        read_add(root, metadata, version, add, keep_change_type=True, opening=opening)
    assert info.value.file == f"{root}/{add.path}" and info.value.version == version


@pytest.mark.parametrize("batch_size", [3, 4, 64])
def test_change_types_read_as_a_dictionary_come_out_as_written_in_runs_and_mixed(
    tmp_path: Path, batch_size: int
) -> None:
    """Batches holding one change type and batches holding several both give each row's own string.

    Batches of one change type share one column (same data buffer) instead of each copying the string.
    """
    kinds = ["update_preimage"] * 8 + ["update_postimage"] * 8 + ["delete", "insert", "delete", "insert"]
    table = pa.table({"x": pa.array(range(len(kinds)), pa.int64()), CHANGE_TYPE_COLUMN: pa.array(kinds)})
    pq.write_table(table, tmp_path / "cdc.parquet")
    out = read_plain(
        tmp_path,
        "cdc.parquet",
        NUMBERED,
        keep_change_type=True,
        batch_size=batch_size,
        opening=ParquetOpening(dictionary_min_bytes=0),
    )
    assert all(b.schema.field(CHANGE_TYPE_COLUMN).type == pa.string() for b in out)
    assert [(r["x"], r[CHANGE_TYPE_COLUMN]) for r in batches_rows(out)] == list(enumerate(kinds))
    if batch_size == 4:  # rows 0-3 and 4-7: update_preimage throughout, one shared column
        first, second = (b.column(CHANGE_TYPE_COLUMN).buffers()[2] for b in out[:2])
        assert first.address == second.address


def test_change_types_of_row_groups_of_one_kind_share_one_column(tmp_path: Path) -> None:
    """A row group holding one change type has a one-entry dictionary: its batches share one column."""
    kinds = ["update_preimage"] * 6 + ["update_postimage"] * 6
    table = pa.table({"x": pa.array(range(len(kinds)), pa.int64()), CHANGE_TYPE_COLUMN: pa.array(kinds)})
    pq.write_table(table, tmp_path / "cdc.parquet", row_group_size=6)
    out = read_plain(
        tmp_path,
        "cdc.parquet",
        NUMBERED,
        keep_change_type=True,
        batch_size=3,
        opening=ParquetOpening(dictionary_min_bytes=0),
    )
    assert [(r["x"], r[CHANGE_TYPE_COLUMN]) for r in batches_rows(out)] == list(enumerate(kinds))
    columns = [b.column(CHANGE_TYPE_COLUMN) for b in out]
    assert [c.type for c in columns] == [pa.string()] * 4
    assert columns[0].buffers()[2].address == columns[1].buffers()[2].address
    assert columns[2].buffers()[2].address == columns[3].buffers()[2].address


def test_repeated_strings_are_shared_up_to_the_bound_and_built_afresh_beyond_it() -> None:
    for n in (1, 5_000, SHARED_LARGE_ROWS):
        first, second = repeated_string("insert", n), repeated_string("insert", n)
        assert first.to_pylist() == ["insert"] * n and first.buffers()[2].address == second.buffers()[2].address
    long = SHARED_LARGE_ROWS + 1
    first, second = repeated_string("delete", long), repeated_string("delete", long)
    assert first.to_pylist() == ["delete"] * long and first.buffers()[2].address != second.buffers()[2].address


# ------------------------------------------------------------------ tables written here with deltalake


def partition_types_table() -> pa.Table:
    utc = dt.UTC
    return pa.table(
        {
            "id": pa.array([1, 2, 3, 4, 5], pa.int64()),
            "s": pa.array(["a b", "x/y=z%25", None, "ü&+#?{}", ""], pa.string()),
            "i": pa.array([1, None, -3, 4, 1], pa.int32()),
            "b": pa.array([True, False, None, True, True]),
            "d": pa.array([dt.date(2020, 1, 1), None, dt.date(1969, 12, 31), dt.date(2020, 1, 1), None]),
            "ts": pa.array(
                [
                    dt.datetime(2020, 1, 1, 8, 9, 10, 123456, tzinfo=utc),
                    None,
                    dt.datetime(1969, 1, 1, tzinfo=utc),
                    dt.datetime(2020, 1, 1, 8, 9, 10, 123456, tzinfo=utc),
                    dt.datetime(2024, 2, 29, 23, 59, 59, tzinfo=utc),
                ],
                pa.timestamp("us", tz="UTC"),
            ),
            "ntz": pa.array(
                [dt.datetime(2021, 2, 3, 4, 5, 6), None, dt.datetime(2021, 2, 3, 4, 5, 6, 7), None, None],
                pa.timestamp("us"),
            ),
            "dec": pa.array([Decimal("1.25"), None, Decimal("3.50"), Decimal("0.00"), None], pa.decimal128(10, 2)),
            "f": pa.array([1.5, None, float("nan"), -0.0, 2.0], pa.float64()),
            "v": pa.array(["p", "q", "r", "s", "t"]),
        }
    )


def empty_strings_to_null(table: pa.Table, column: str) -> pa.Table:
    values = table.column(column).cast(pa.string())
    cleaned = pc.if_else(pc.equal(values, ""), pa.scalar(None, values.type), values)
    return table.set_column(table.schema.get_field_index(column), pa.field(column, pa.string()), cleaned)


def test_partition_values_of_many_types_match_deltalake(tmp_path: Path) -> None:
    root = tmp_path / "partitioned"
    data = partition_types_table()
    write_deltalake(str(root), data, partition_by=["s", "i", "b", "d", "ts", "ntz", "dec", "f"])
    _, adds = replay(root)
    assert len(adds) == data.num_rows and any(None in a.partition_values.values() for _, a in adds)
    assert {"s": ""}.items() <= next(a.partition_values for _, a in adds if a.partition_values["s"] == "").items()
    ours = our_snapshot(root)
    assert ours.schema.names == data.schema.names
    # Protocol: "An empty string for any type translates to a null partition value". deltalake
    # writes "" for the empty string and reads it back as "", so both oracles get that rule applied.
    assert rows(empty_strings_to_null(deltalake_snapshot(root), "s"), ours.schema) == rows(ours, ours.schema)
    assert rows(empty_strings_to_null(data, "s"), ours.schema) == rows(ours, ours.schema)


def test_columns_added_later_read_as_nulls_in_older_files(tmp_path: Path) -> None:
    root = tmp_path / "evolving"
    write_deltalake(str(root), pa.table({"a": [1, 2], "p": ["x", "y"]}), partition_by=["p"])
    later = pa.table({"a": [3], "p": ["x"], "n": pa.array([{"k": 1}], pa.struct([("k", pa.int32())]))})
    write_deltalake(str(root), later, mode="append", schema_mode="merge")
    metadata, adds = replay(root)
    assert metadata.schema().names == ["a", "p", "n"] and len(adds) == 3
    ours = our_snapshot(root)
    assert sorted(ours.column("n").to_pylist(), key=str) == [None, None, {"k": 1}]
    assert rows(deltalake_snapshot(root), ours.schema) == rows(ours, ours.schema)


def test_absolute_file_uri_reads_the_same_rows(tmp_path: Path) -> None:
    root = tmp_path / "plain"
    write_deltalake(str(root), pa.table({"a": [1, 2, 3]}))
    metadata, [(version, add)] = replay(root)
    relative = batches_rows(read_add(root, metadata, version, add))
    absolute = Add(f"file://{root}/{add.path}", {}, add.size, 0, True)  # under the table root: allowed
    assert batches_rows(read_add(root, metadata, version, absolute)) == relative
    assert [r["a"] for r in relative] == [1, 2, 3]


# ------------------------------------------------------------------ row filters


def write_numbered_file(directory: Path, n: int) -> tuple[str, list[int]]:
    values = [v * 7 for v in range(n)]
    pq.write_table(pa.table({"x": pa.array(values, pa.int64())}), directory / "numbered.parquet", row_group_size=4)
    return "numbered.parquet", values


def schema_of(*fields: tuple[str, Any], mapping: dict[str, tuple[str, int]] | None = None) -> StructType:
    """A schema from ``(name, type)`` pairs; ``mapping`` gives (physical name, id) per logical name."""
    out = []
    for name, dtype in fields:
        metadata: dict[str, Any] = {}
        if mapping and name in mapping:
            physical, field_id = mapping[name]
            metadata = {"delta.columnMapping.physicalName": physical, "delta.columnMapping.id": field_id}
        out.append({"name": name, "type": dtype, "nullable": True, "metadata": metadata})
    return parse_schema(orjson.dumps({"type": "struct", "fields": out}).decode())


NUMBERED = schema_of(("x", "long"))


def read_plain(
    directory: Path, path: str, schema: StructType, mode: str = "none", **kwargs: Any
) -> list[pa.RecordBatch]:
    defaults: dict[str, Any] = {"partition_columns": (), "partition_values": {}}
    defaults.update(kwargs)
    return list(
        read_file_rows(STORAGE, str(directory), path, schema=schema, column_mapping_mode=mode, version=3, **defaults)
    )


@pytest.mark.parametrize("batch_size", [1, 3, 4, 100])
def test_drop_filter_removes_exactly_those_row_positions(tmp_path: Path, batch_size: int) -> None:
    path, values = write_numbered_file(tmp_path, 10)
    dropped = {0, 3, 4, 9}
    out = read_plain(
        tmp_path, path, NUMBERED, row_filter=RowFilter(BitMap64(dropped), keep=False), batch_size=batch_size
    )
    assert [r["x"] for r in batches_rows(out)] == [v for i, v in enumerate(values) if i not in dropped]


@pytest.mark.parametrize("batch_size", [1, 3, 4, 100])
def test_keep_filter_emits_only_those_row_positions(tmp_path: Path, batch_size: int) -> None:
    path, values = write_numbered_file(tmp_path, 10)
    kept = {0, 3, 4, 9}
    row_filter = RowFilter(BitMap64(kept), keep=True)
    out = read_plain(tmp_path, path, NUMBERED, row_filter=row_filter, batch_size=batch_size)
    assert [r["x"] for r in batches_rows(out)] == [v for i, v in enumerate(values) if i in kept]


def test_sliced_nested_columns_conform_like_whole_ones() -> None:
    # The read path hands whole decoded batches to _conform today; a slice (offset > 0) of a list
    # or map with nulls must give the same rows, not pyarrow's "offsets slice not supported".
    schema = schema_of(
        ("l", {"type": "array", "elementType": "long", "containsNull": True}),
        ("m", {"type": "map", "keyType": "string", "valueType": "long", "valueContainsNull": True}),
        (
            "s",
            {
                "type": "struct",
                "fields": [
                    {
                        "name": "a",
                        "type": {"type": "array", "elementType": "long", "containsNull": True},
                        "nullable": True,
                        "metadata": {},
                    }
                ],
            },
        ),
    )
    lists = pa.array([[1, 2], None, [3], [4, None, 6], None, [7]], pa.list_(pa.int64()))
    maps = pa.array([[("a", 1)], None, [("b", 2), ("c", None)], [], None, [("d", 4)]], pa.map_(pa.string(), pa.int64()))
    structs = pa.array(
        [{"a": [1]}, None, {"a": None}, {"a": [2, 3]}, {"a": []}, None], pa.struct([("a", pa.list_(pa.int64()))])
    )
    for field, column in zip(schema.fields, (lists, maps, structs), strict=True):
        whole = conform(column, field.type, "none", field.name)
        assert whole.to_pylist() == column.to_pylist()  # same names and types: the values pass unchanged
        for start, length in ((1, 4), (2, 3), (5, 1), (3, 0)):
            part = conform(column.slice(start, length), field.type, "none", field.name)
            assert part.to_pylist() == whole.slice(start, length).to_pylist()


def test_empty_filters_keep_everything_or_nothing(tmp_path: Path) -> None:
    path, values = write_numbered_file(tmp_path, 10)
    everything = read_plain(tmp_path, path, NUMBERED, row_filter=RowFilter(BitMap64(), keep=False), batch_size=3)
    nothing = read_plain(tmp_path, path, NUMBERED, row_filter=RowFilter(BitMap64(), keep=True), batch_size=3)
    assert [r["x"] for r in batches_rows(everything)] == values
    assert nothing == []


def test_filter_beyond_the_last_row_is_a_deletion_vector_error(tmp_path: Path) -> None:
    path, values = write_numbered_file(tmp_path, 10)
    with pytest.raises(DeletionVectorError, match="beyond") as info:
        read_plain(tmp_path, path, NUMBERED, row_filter=RowFilter(BitMap64([2, len(values)]), keep=False))
    assert (info.value.table, info.value.version, info.value.file) == (str(tmp_path), 3, f"{tmp_path}/{path}")


def test_dv_of_a_real_table_drops_the_rows_the_spec_readme_names() -> None:
    root = corpus_table("kernel-rs/table-with-dv-small")
    metadata, [(version, add)] = replay(root)
    raw = pq.read_table(root / add.path).column("value").to_pylist()
    ours = [r["value"] for r in batches_rows(read_add(root, metadata, version, add))]
    assert ours == [v for i, v in enumerate(raw) if i not in (0, 9)]


# ------------------------------------------------------------------ column mapping and type conversion


def test_id_mode_matches_parquet_field_ids_before_names(tmp_path: Path) -> None:
    def field(name: str, dtype: pa.DataType, field_id: int) -> pa.Field:
        return pa.field(name, dtype, metadata={b"PARQUET:field_id": str(field_id).encode()})

    file_schema = pa.schema([field("renamed-a", pa.int64(), 1), field("col-b", pa.string(), 2)])
    pq.write_table(pa.table({"renamed-a": [1, 2], "col-b": ["x", "y"]}, schema=file_schema), tmp_path / "f.parquet")
    mapping = {"a": ("col-a", 1), "b": ("col-b", 7), "c": ("col-c", 3)}
    schema = schema_of(("a", "long"), ("b", "string"), ("c", "double"), mapping=mapping)
    by_id = batches_rows(read_plain(tmp_path, "f.parquet", schema, "id"))
    by_name = batches_rows(read_plain(tmp_path, "f.parquet", schema, "name"))
    assert by_id == [{"a": 1, "b": "x", "c": None}, {"a": 2, "b": "y", "c": None}]
    assert by_name == [{"a": None, "b": "x", "c": None}, {"a": None, "b": "y", "c": None}]


@pytest.mark.parametrize("stored_schema", [True, False], ids=["stored-arrow-schema", "parquet-schema-only"])
def test_files_alike_but_for_their_field_ids_are_read_by_their_own_ids(
    tmp_path: Path, opening: ParquetOpening, stored_schema: bool
) -> None:
    # Plans are shared by files with equal Parquet schemas; field ids are part of that equality.
    def write(name: str, ids: tuple[int, int]) -> None:
        fields = [
            pa.field(column, pa.int64(), metadata={b"PARQUET:field_id": str(i).encode()})
            for column, i in zip("pq", ids, strict=True)
        ]
        table = pa.table({"p": [1, 2], "q": [10, 20]}, schema=pa.schema(fields))
        pq.write_table(table, tmp_path / name, store_schema=stored_schema)

    write("one.parquet", (1, 2))
    write("two.parquet", (2, 1))
    schema = schema_of(("a", "long"), ("b", "long"), mapping={"a": ("x", 1), "b": ("y", 2)})
    one, two = (
        batches_rows(read_plain(tmp_path, f, schema, "id", opening=opening)) for f in ("one.parquet", "two.parquet")
    )
    assert one == [{"a": 1, "b": 10}, {"a": 2, "b": 20}]
    assert two == [{"a": 10, "b": 1}, {"a": 20, "b": 2}]


def test_plans_shared_by_parquet_schema_are_bounded_by_schemas_keys_and_footer_bytes(tmp_path: Path) -> None:
    pq.write_table(pa.table({"x": [1]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"x": [1], "y": ["z"]}), tmp_path / "b.parquet")

    def physical(name: str) -> pq.ParquetSchema:
        return pq.ParquetFile(tmp_path / name).metadata.schema

    first = cast(ColumnPlan, object())  # plans, compared by identity
    second = cast(ColumnPlan, object())
    plans = PlansByParquetSchema()
    plans.add(("k",), physical("a.parquet"), first, 100)
    assert plans.find(("k",), physical("a.parquet")) is first  # another file's equal schema
    assert plans.find(("k",), physical("b.parquet")) is None and plans.find(("other",), physical("a.parquet")) is None
    plans.schemas = 1
    plans.add(("k",), physical("b.parquet"), second, 100)  # the oldest schema of the key goes
    assert plans.find(("k",), physical("a.parquet")) is None and plans.find(("k",), physical("b.parquet")) is second
    plans.footer_bytes = 150
    plans.add(("k2",), physical("a.parquet"), first, 100)  # 100 + 100 > 150: everything before goes
    assert plans.find(("k",), physical("b.parquet")) is None and plans.find(("k2",), physical("a.parquet")) is first
    plans.keys = 1
    plans.add(("k3",), physical("a.parquet"), second, 1)  # a second key: everything before goes
    assert plans.find(("k2",), physical("a.parquet")) is None and plans.find(("k3",), physical("a.parquet")) is second


def test_nested_physical_names_become_logical_names(tmp_path: Path) -> None:
    inner = pa.struct([("col-y", pa.int32())])
    file_type = pa.struct([("col-x", pa.list_(inner)), ("col-m", pa.map_(pa.string(), inner))])
    values = [
        {"col-x": [{"col-y": 1}, None], "col-m": [("k", {"col-y": 2})]},
        None,
        {"col-x": None, "col-m": None},
    ]
    pq.write_table(pa.table({"col-s": pa.array(values, file_type)}), tmp_path / "n.parquet")

    def mapped(name: str, dtype: Any) -> dict[str, Any]:
        physical = {"delta.columnMapping.physicalName": f"col-{name}"}
        return {"name": name, "type": dtype, "nullable": True, "metadata": physical}

    y_struct = {"type": "struct", "fields": [mapped("y", "long")]}
    s_type = {
        "type": "struct",
        "fields": [
            mapped("x", {"type": "array", "elementType": y_struct, "containsNull": True}),
            mapped("m", {"type": "map", "keyType": "string", "valueType": y_struct, "valueContainsNull": True}),
        ],
    }
    schema = parse_schema(orjson.dumps({"type": "struct", "fields": [mapped("s", s_type)]}).decode())
    out = read_plain(tmp_path, "n.parquet", schema, "name", batch_size=2)
    assert pa.Table.from_batches(out).schema == output_schema(schema)
    assert batches_rows(out) == [
        {"s": {"x": [{"y": 1}, None], "m": [("k", {"y": 2})]}},
        {"s": None},
        {"s": {"x": None, "m": None}},
    ]


OPENINGS = {
    "whole": ParquetOpening(),
    "footer": ParquetOpening(whole_file_bytes=0),
    "footer-in-two-reads": ParquetOpening(whole_file_bytes=0, footer_read_bytes=16),
    "footer-whole-column-chunks": ParquetOpening(whole_file_bytes=0, stream_bytes=0),
    "footer-pre-buffered": ParquetOpening(whole_file_bytes=0, pre_buffer=True),
}


def test_column_chunks_streamed_through_a_small_buffer_read_as_whole_ones(tmp_path: Path) -> None:
    """Pages larger than the buffer, several pages and row groups a column: the same rows either way."""
    count = 50_000
    rows = pa.table(
        {
            "x": pa.array(range(count), pa.int64()),
            "s": pa.array([f"value-{i * 7919 % count}" for i in range(count)], pa.string()),
        }
    )
    pq.write_table(rows, tmp_path / "big.parquet", row_group_size=20_000, data_page_size=64 << 10)
    layout = pq.ParquetFile(tmp_path / "big.parquet").metadata
    assert layout.num_row_groups == 3
    assert layout.row_group(0).column(1).total_compressed_size > 4 * 1024  # many times the buffer
    schema = schema_of(("x", "long"), ("s", "string"))
    read = {
        name: pa.Table.from_batches(read_plain(tmp_path, "big.parquet", schema, opening=opening))
        for name, opening in {
            "streamed": ParquetOpening(whole_file_bytes=0, stream_bytes=1024),
            "whole": ParquetOpening(whole_file_bytes=0, stream_bytes=0),
        }.items()
    }
    assert read["streamed"].equals(rows)
    assert read["whole"].equals(rows)


@pytest.fixture(params=sorted(OPENINGS))
def opening(request: pytest.FixtureRequest) -> ParquetOpening:
    """Each way a file is opened: read whole (small files), or by its footer (large ones), found in one read or two."""
    return OPENINGS[str(request.param)]


def test_file_types_are_widened_and_timestamps_cast_to_microseconds(tmp_path: Path, opening: ParquetOpening) -> None:
    moment = dt.datetime(2021, 5, 6, 7, 8, 9, 123456)
    table = pa.table(
        {
            "i": pa.array([1, None], pa.int8()),
            "l": pa.array([2**31 - 1, -5], pa.int32()),
            "f": pa.array([1.5, None], pa.float32()),
            "dec": pa.array([Decimal("123.45"), None], pa.decimal128(5, 2)),
            "ts_ns": pa.array([moment, None], pa.timestamp("ns", tz="UTC")),
            "ts_ms": pa.array([moment.replace(microsecond=123000), None], pa.timestamp("ms")),
            "s": pa.array(["a", None], pa.large_string()),
        }
    )
    pq.write_table(table, tmp_path / "w.parquet", version="2.6", coerce_timestamps=None)
    assert pq.read_schema(tmp_path / "w.parquet").field("ts_ns").type.unit == "ns"
    schema = schema_of(
        ("i", "integer"), ("l", "long"), ("f", "double"), ("dec", "decimal(10,2)"),
        ("ts_ns", "timestamp"), ("ts_ms", "timestamp_ntz"), ("s", "string"),
    )  # fmt: skip
    [batch] = read_plain(tmp_path, "w.parquet", schema, opening=opening)
    assert batch.schema == schema.to_arrow()
    assert batch.to_pylist() == [
        {
            "i": 1,
            "l": 2**31 - 1,
            "f": 1.5,
            "dec": Decimal("123.45"),
            "ts_ns": moment.replace(tzinfo=dt.UTC),
            "ts_ms": moment.replace(microsecond=123000),
            "s": "a",
        },
        {"i": None, "l": -5, "f": None, "dec": None, "ts_ns": None, "ts_ms": None, "s": None},
    ]


def test_delta_rs_string_views_decode_as_strings_without_the_stored_arrow_schema(
    tmp_path: Path, opening: ParquetOpening
) -> None:
    root = tmp_path / "views"
    rows = pa.table({"s": ["a", None, "ccc"], "n": pa.array([1, 2, 3], pa.int64())})
    write_deltalake(str(root), rows, configuration={"delta.enableChangeDataFeed": "true"})
    DeltaTable(str(root)).delete("n = 2")
    metadata, version, cdc = first_cdc(root)
    assert pq.read_schema(root / cdc.path).field("s").type == pa.string_view()  # what delta-rs stores
    decoded = list(
        read_file_batches(
            STORAGE, str(root), cdc.path, schema=metadata.schema(), partition_columns=(), partition_values={},
            column_mapping_mode="none", keep_change_type=True, version=version, opening=opening,
        )
    )  # fmt: skip
    assert [b.batch.schema.field("s").type for b in decoded] == [pa.string()]
    assert [b.columns() for b in decoded] == [
        [pa.array([None], pa.string()), pa.array([2], pa.int64()), pa.array(["delete"])]
    ]


@pytest.mark.parametrize("store_schema", [False, True], ids=["no-stored-schema", "stored-schema"])
def test_a_column_named_like_the_arrow_schema_key_is_read_as_written(
    tmp_path: Path, opening: ParquetOpening, store_schema: bool
) -> None:
    # The name is in the footer twice (the schema, the column chunk) besides any stored schema: never renamed.
    pq.write_table(
        pa.table({"ARROW:schema": ["x", "y"], "n": [1, 2]}), tmp_path / "odd.parquet", store_schema=store_schema
    )
    out = read_plain(tmp_path, "odd.parquet", schema_of(("ARROW:schema", "string"), ("n", "long")), opening=opening)
    assert batches_rows(out) == [{"ARROW:schema": "x", "n": 1}, {"ARROW:schema": "y", "n": 2}]


def test_a_footer_whose_only_arrow_schema_is_another_keys_value_is_read_as_written(
    tmp_path: Path, opening: ParquetOpening
) -> None:
    table = pa.table({"x": pa.array([1, 2], pa.int64())})
    with pq.ParquetWriter(tmp_path / "kv.parquet", table.schema, store_schema=False) as writer:
        writer.write_table(table)
        writer.add_key_value_metadata({"note": "ARROW:schema"})
    opened = open_parquet(STORAGE, str(tmp_path / "kv.parquet"), opening=opening)
    try:
        assert opened.parquet.metadata.metadata == {b"note": b"ARROW:schema"}
        assert opened.parquet.read().column("x").to_pylist() == [1, 2]
    finally:
        opened.parquet.close()
        opened.source.close()


def test_incompatible_file_type_is_an_invalid_log(tmp_path: Path) -> None:
    pq.write_table(pa.table({"x": ["not a number"]}), tmp_path / "s.parquet")
    with pytest.raises(InvalidLogError, match="'x'") as info:
        read_plain(tmp_path, "s.parquet", NUMBERED)
    assert info.value.file == f"{tmp_path}/s.parquet" and info.value.version == 3


@pytest.mark.parametrize("delta_type", ["array", "map", "struct"])
def test_nested_schema_type_over_a_primitive_file_column_is_an_invalid_log(tmp_path: Path, delta_type: str) -> None:
    pq.write_table(pa.table({"x": [1]}), tmp_path / "p.parquet")
    dtypes: dict[str, dict[str, Any]] = {
        "array": {"type": "array", "elementType": "long", "containsNull": True},
        "map": {"type": "map", "keyType": "string", "valueType": "long", "valueContainsNull": True},
        "struct": {"type": "struct", "fields": []},
    }
    with pytest.raises(InvalidLogError, match=f"says {delta_type}"):
        read_plain(tmp_path, "p.parquet", schema_of(("x", dtypes[delta_type])))


# ------------------------------------------------------------------ columns, partitions and output shape


def test_columns_subset_is_emitted_in_schema_order(tmp_path: Path) -> None:
    pq.write_table(pa.table({"c": [3], "a": [1], "b": [2]}), tmp_path / "o.parquet")
    schema = schema_of(("a", "long"), ("b", "long"), ("c", "long"), ("p", "string"))
    out = read_plain(
        tmp_path, "o.parquet", schema, columns=["p", "c", "a"], partition_columns=("p",), partition_values={"p": "v"}
    )
    assert batches_rows(out) == [{"a": 1, "c": 3, "p": "v"}]
    assert out[0].schema == output_schema(schema, columns=["c", "a", "p"])


def test_unknown_requested_column_is_a_config_error(tmp_path: Path) -> None:
    path, _ = write_numbered_file(tmp_path, 2)
    with pytest.raises(ConfigError, match="nope") as info:
        read_plain(tmp_path, path, NUMBERED, columns=["x", "nope"])
    assert info.value.file == f"{tmp_path}/{path}"
    with pytest.raises(ConfigError, match="nope"):
        output_schema(NUMBERED, columns=["nope"])


def test_partition_values_win_over_materialized_file_columns(tmp_path: Path) -> None:
    pq.write_table(pa.table({"x": [1, 2], "p": ["in-file", "in-file"]}), tmp_path / "m.parquet")
    schema = schema_of(("x", "long"), ("p", "string"))
    from_log = read_plain(tmp_path, "m.parquet", schema, partition_columns=("p",), partition_values={"p": "in-log"})
    from_file = read_plain(tmp_path, "m.parquet", schema, partition_columns=("p",), partition_values={})
    assert [r["p"] for r in batches_rows(from_log)] == ["in-log", "in-log"]
    assert [r["p"] for r in batches_rows(from_file)] == ["in-file", "in-file"]


def test_partition_values_are_looked_up_by_physical_name(tmp_path: Path) -> None:
    path, values = write_numbered_file(tmp_path, 2)
    schema = schema_of(("x", "long"), ("p", "integer"), mapping={"p": ("col-p", 2)})
    out = read_plain(tmp_path, path, schema, "name", partition_columns=("p",), partition_values={"col-p": "42"})
    assert batches_rows(out) == [{"x": v, "p": 42} for v in values]


def test_partition_value_missing_from_the_map_and_the_file_is_null(tmp_path: Path) -> None:
    """Delta Spark reads a key absent from ``partitionValues`` as null (``partitionValues.get(col).orNull``)."""
    path, values = write_numbered_file(tmp_path, 2)
    schema = schema_of(("x", "long"), ("p", "integer"), ("d", "date"))
    out = read_plain(tmp_path, path, schema, partition_columns=("p", "d"), partition_values={"q": "1"})
    assert batches_rows(out) == [{"x": v, "p": None, "d": None} for v in values]


def test_unparsable_partition_value_is_an_invalid_log(tmp_path: Path) -> None:
    path, _ = write_numbered_file(tmp_path, 2)
    schema = schema_of(("x", "long"), ("p", "integer"))
    with pytest.raises(InvalidLogError, match="'abc'") as info:
        read_plain(tmp_path, path, schema, partition_columns=("p",), partition_values={"p": "abc"})
    assert info.value.table == str(tmp_path) and info.value.file == f"{tmp_path}/{path}"


def test_only_partition_columns_still_counts_rows(tmp_path: Path) -> None:
    path, values = write_numbered_file(tmp_path, 10)
    schema = schema_of(("x", "long"), ("p", "date"))
    out = read_plain(
        tmp_path,
        path,
        schema,
        columns=["p"],
        partition_columns=("p",),
        partition_values={"p": "2024-02-29"},
        row_filter=RowFilter(BitMap64([1, 5]), keep=False),
    )
    assert batches_rows(out) == [{"p": dt.date(2024, 2, 29)}] * (len(values) - 2)


def field_of(dtype: Any) -> StructField:
    return schema_of(("c", dtype)).fields[0]


@pytest.mark.parametrize(
    ("dtype", "raw", "expected"),
    [
        ("string", "a b/%", "a b/%"),
        ("long", "-9223372036854775808", -(2**63)),
        ("integer", "2147483647", 2**31 - 1),
        ("short", "-32768", -(2**15)),
        ("byte", "127", 127),
        ("double", "1.25", 1.25),
        ("float", "-0.5", -0.5),
        ("boolean", "true", True),
        ("boolean", "false", False),
        ("date", "1970-01-01", dt.date(1970, 1, 1)),
        ("timestamp", "1970-01-01 00:00:00", dt.datetime(1970, 1, 1, tzinfo=dt.UTC)),
        ("timestamp", "2020-01-01 08:09:10.001", dt.datetime(2020, 1, 1, 8, 9, 10, 1000, tzinfo=dt.UTC)),
        ("timestamp", "2024-01-01T10:00:00.000000Z", dt.datetime(2024, 1, 1, 10, tzinfo=dt.UTC)),
        ("timestamp", "2024-01-01T12:00:00+02:00", dt.datetime(2024, 1, 1, 10, tzinfo=dt.UTC)),
        ("timestamp_ntz", "2013-07-05 17:01:00.123456", dt.datetime(2013, 7, 5, 17, 1, 0, 123456)),
        ("decimal(5,2)", "1.5", Decimal("1.50")),
        ("binary", orjson.loads(r'"\u0001\u0002\u0003"'), b"\x01\x02\x03"),  # the spec's JSON example
        ("integer", "", None),
        ("string", "", None),
        ("timestamp", None, None),
    ],
)
def test_partition_value_serialization(dtype: str, raw: str | None, expected: Any) -> None:
    value = parse_partition_value(raw, field_of(dtype))
    assert value.type == schema_of(("c", dtype)).to_arrow().field("c").type
    assert value.as_py() == expected


@pytest.mark.parametrize(
    ("dtype", "raw"),
    [("integer", "1.5"), ("boolean", "yes"), ("date", "2020-13-01"), ("decimal(3,1)", "1.25"), ("byte", "300")],
)
def test_unparsable_partition_values_are_invalid_logs(dtype: str, raw: str) -> None:
    with pytest.raises(InvalidLogError, match="partition value"):
        parse_partition_value(raw, field_of(dtype))


def test_nested_partition_column_type_is_an_invalid_log() -> None:
    with pytest.raises(InvalidLogError, match="cannot be a partition column"):
        parse_partition_value("x", field_of({"type": "struct", "fields": []}))


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("part-0.parquet", "/t/part-0.parquet"),
        ("ts=2020-01-01 08:09:10/part-0.parquet", "/t/ts=2020-01-01 08:09:10/part-0.parquet"),
        ("/t/part-0.parquet", "/t/part-0.parquet"),
        ("file:///t/part-0.parquet", "/t/part-0.parquet"),
        ("/abs/part-0.parquet", None),
        ("s3://bucket/t/part-0.parquet", None),
    ],
)
def test_relative_paths_resolve_under_the_root_and_absolute_ones_stay(path: str, expected: str | None) -> None:
    if expected is None:  # outside the table root: state/paths.py's rule (tests/state/test_paths.py)
        with pytest.raises(UnsafePathError):
            resolve_data_path("/t/", path)
    else:
        assert resolve_data_path("/t/", path) == expected
    assert resolve_data_path("/t/", "/abs/part-0.parquet", ("/abs",)) == "/abs/part-0.parquet"


# ------------------------------------------------------------------ unreadable files


def test_missing_data_file_names_table_version_and_file(tmp_path: Path) -> None:
    with pytest.raises(MissingFileError) as info:
        read_plain(tmp_path, "part-gone.parquet", NUMBERED)
    error = info.value
    assert (error.table, error.version, error.file) == (str(tmp_path), 3, f"{tmp_path}/part-gone.parquet")
    assert str(tmp_path) in str(error) and "version 3" in str(error)


def test_corrupt_parquet_is_a_deltatail_error(tmp_path: Path, opening: ParquetOpening) -> None:
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 definitely not parquet PAR1")
    with pytest.raises(DeltaTailError, match="Parquet") as info:
        read_plain(tmp_path, "bad.parquet", NUMBERED, opening=opening)
    assert info.value.file == f"{tmp_path}/bad.parquet" and info.value.version == 3


def test_a_damaged_footer_is_a_deltatail_error_naming_the_file(tmp_path: Path, opening: ParquetOpening) -> None:
    pq.write_table(pa.table({"x": pa.array([1, 2, 3], pa.int64())}), tmp_path / "cut.parquet")
    data = (tmp_path / "cut.parquet").read_bytes()
    (tmp_path / "cut.parquet").write_bytes(data[:-40] + data[-8:])  # the footer loses its last 32 bytes
    with pytest.raises(DeltaTailError, match="Parquet") as info:
        read_plain(tmp_path, "cut.parquet", NUMBERED, opening=opening)
    assert info.value.file == f"{tmp_path}/cut.parquet" and info.value.version == 3
