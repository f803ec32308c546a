"""The Spark source (issue "Spark source") and the Kafka ``foreachBatch`` helper.

Oracles: deltalake 1.6.6 ``load_cdf`` on tables deltalake wrote in ``tmp_path`` (rows compared as
multisets over every column but ``_commit_timestamp``), and, where the issue asks for it ("equals the
standalone ``deltatail changes`` output"), ``ChangeFeed(path).read_table``.

Two layers. The reader classes are driven directly the way Spark drives them (``initialOffset``,
``latestOffset``, ``partitions``, ``read`` on pickled partitions, ``commit``): fast and exact about
offsets, admission, restarts and errors. Then one local Spark session (``local[2]``, a session-scoped
fixture) runs real queries: memory sink, restarts from a ``checkpointLocation``, availableNow,
``maxFilesPerTrigger``, batch reads, the corpus tables, schema changes and Kafka.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("pyspark")
from deltalake import DeltaTable, write_deltalake
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxBytes, ReadMaxFiles, ReadMaxRows

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tailer"))  # cdf_helpers (tests/ is not a package)
from cdf_helpers import HandTable, assert_same_rows, commit_actions, corpus_table, load_cdf

from deltatail.sinks.kafka.debezium import EventOptions
from deltatail.sinks.kafka.encoding import ChangeEncoder
from deltatail.sinks.spark import DeltaTailBatchReader, DeltaTailDataSource, DeltaTailStreamReader, register
from deltatail.sinks.spark.admission import whole_unit
from deltatail.sinks.spark.kafka_writer import kafka_batch_writer, version_batches
from deltatail.sinks.spark.offsets import Offset
from deltatail.sinks.spark.options import SourceOptions
from deltatail.sinks.spark.partitions import ChangePartition, read_partition
from deltatail.sinks.spark.schema import arrow_target
from deltatail.state.errors import (
    ConfigError,
    DeletionVectorError,
    InvalidLogError,
    MissingFileError,
    SchemaChangeError,
    StateError,
    TableNotFoundError,
    UnsupportedFeatureError,
    VersionGapError,
    VersionNotFoundError,
)
from deltatail.state.feed import TableInfo
from deltatail.tailer.parse import parse_bytes, parse_timestamp_ms
from deltatail.tailer.read.feed import ChangeFeed, ChangeOptions
from deltatail.tailer.storage import FileInfo, LocalStorage, Storage

CDF = {"delta.enableChangeDataFeed": "true"}
#: kafka-python's first import warns (legacy ``importlib.resources`` calls); the helper imports it lazily.
KAFKA_IMPORT = pytest.mark.filterwarnings(r"ignore:\w+ is deprecated. Use files\(\) instead:DeprecationWarning")
TS = "_commit_timestamp"
VALUE_FIELD = [{"name": "value", "type": "long", "nullable": True, "metadata": {}}]
DV_CONFIG = {"delta.enableChangeDataFeed": "true", "delta.enableDeletionVectors": "true"}


# ---------------------------------------------------------------- tables --


def ids(values: list[int], tag: str = "x", part: str | None = None) -> pa.Table:
    cols: dict[str, Any] = {"id": pa.array(values, pa.int64()), "v": pa.array([f"{tag}{i}" for i in values])}
    if part is not None:
        cols["p"] = pa.array([part] * len(values))
    return pa.table(cols)


def new_table(root: Path, *, cdf: bool = True) -> Path:
    """Version 0: ids 0..5 in three partition files (p=a, b, c)."""
    data = pa.concat_tables([ids([0, 1], part="a"), ids([2, 3], part="b"), ids([4, 5], part="c")])
    write_deltalake(str(root), data, partition_by=["p"], configuration=CDF if cdf else None)
    return root


def append(root: Path, values: list[int], part: str = "a") -> None:
    write_deltalake(str(root), ids(values, part=part), mode="append")


# ---------------------------------------------------------------- driving a reader like Spark --


def source(root: Path, **options: object) -> DeltaTailDataSource:
    return DeltaTailDataSource(
        {"path": str(root), **{k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in options.items()}}
    )


def stream_reader(
    root: Path, *, check_seconds: float = 0.0, storage: Storage | None = None, **options: object
) -> DeltaTailStreamReader:
    """A stream reader as Spark makes one; it checks for gaps on every idle poll unless told otherwise."""
    ds = source(root, **options)
    reader = DeltaTailStreamReader(SourceOptions.parse(ds.options), ds.schema(), storage)
    reader.planner.check_seconds = check_seconds
    return reader


def read_rows(reader: DeltaTailStreamReader | DeltaTailBatchReader, parts: Any) -> pa.Table:
    """Read partitions as an executor would: reader and partitions through pickle."""
    remote = pickle.loads(pickle.dumps(reader))
    target = arrow_target(reader.schema)
    batches = [b for p in parts for b in remote.read(pickle.loads(pickle.dumps(p)))]
    return pa.Table.from_batches(batches, schema=target)


Batch = tuple[dict[str, Any], dict[str, Any], pa.Table]


def run_batches(
    reader: DeltaTailStreamReader, start: dict[str, Any], limit: ReadLimit | None = None, most: int = 100
) -> list[Batch]:
    """Micro-batches from ``start`` until no new data: ``(start, end, rows)`` each."""
    out: list[Batch] = []
    limit = limit or reader.getDefaultReadLimit()
    for _ in range(most):
        end = reader.latestOffset(start, limit)
        if end == start:
            return out
        rows = read_rows(reader, reader.partitions(start, end))
        reader.commit(end)
        out.append((start, end, rows))
        start = end
    raise AssertionError("the stream did not settle")


def take_batches(reader: DeltaTailStreamReader, start: dict[str, Any], count: int) -> list[Batch]:
    """The first ``count`` micro-batches from ``start`` (a query stopped after them)."""
    out: list[Batch] = []
    for _ in range(count):
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        assert end != start, "fewer micro-batches than asked for"
        out.append((start, end, read_rows(reader, reader.partitions(start, end))))
        reader.commit(end)
        start = end
    return out


def all_rows(batches: list[Batch], schema: pa.Schema) -> pa.Table:
    return pa.concat_tables([b[2] for b in batches]) if batches else schema.empty_table()


def pos(offset: dict[str, Any]) -> tuple[int, bool, int]:
    return offset["version"], not offset["snapshot"], offset["index"]


# ---------------------------------------------------------------- options --


def test_storage_options_take_secrets_by_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret_file = tmp_path / "key"
    secret_file.write_text("from-a-file\n")
    monkeypatch.setenv("DT_TEST_SECRET", "from-the-environment")
    o = SourceOptions.parse(
        {
            "path": "/t",
            "storage.aws_secret_access_key": "env:DT_TEST_SECRET",
            "storage.azure_storage_account_key": f"@{secret_file}",
            "storage.aws_region": "eu-west-1",
        }
    )
    assert o.storage_options == {
        "aws_secret_access_key": "from-the-environment",
        "azure_storage_account_key": "from-a-file",
        "aws_region": "eu-west-1",
    }
    monkeypatch.delenv("DT_TEST_SECRET")
    with pytest.raises(ConfigError, match="aws_secret_access_key") as raised:
        SourceOptions.parse({"path": "/t", "storage.aws_secret_access_key": "env:DT_TEST_SECRET"})
    assert "from-the-environment" not in str(raised.value)


def test_options_parse_with_defaults_and_units() -> None:
    o = SourceOptions.parse(
        {
            "path": "/t",
            "StartingVersion": "3",
            "maxBytesPerTrigger": "64m",
            "netChanges": "TRUE",
            "keyColumns": "a, b",
            "failOnDataLoss": "false",
            "unknownOption": "x",
        }
    )
    assert (o.starting_version, o.max_bytes, o.net_changes, o.key_columns) == (3, 64 << 20, True, ("a", "b"))
    assert not o.fail_on_data_loss and o.has_start and o.initial_snapshot is None
    assert o.read_limit() == ReadMaxBytes(64 << 20)
    assert SourceOptions.parse({"path": "/t"}).read_limit() == ReadMaxFiles(1000)
    assert SourceOptions.parse({"path": "/t", "maxFilesPerTrigger": "7"}).read_limit() == ReadMaxFiles(7)
    assert SourceOptions.parse({"path": "/t", "startingVersion": "Latest"}).starting_latest
    assert (
        parse_bytes("1048576", name="x") == 1 << 20
        and parse_bytes("2gb", name="x") == 2 << 30
        and parse_bytes("3K", name="x") == 3072
    )
    assert parse_timestamp_ms("1700000000000") == 1_700_000_000_000
    assert parse_timestamp_ms("2024-01-02") == parse_timestamp_ms("2024-01-02T00:00:00Z") == 1_704_153_600_000
    assert parse_timestamp_ms("2024-01-02T01:00:00+01:00") == 1_704_153_600_000


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "no table path"),
        ({"path": "/t", "startingVersion": "-1"}, "startingVersion"),
        ({"path": "/t", "startingVersion": "1", "startingTimestamp": "2024-01-01"}, "not both"),
        ({"path": "/t", "startingTimestamp": "yesterday"}, "ISO-8601"),
        ({"path": "/t", "maxFilesPerTrigger": "0"}, "maxFilesPerTrigger"),
        ({"path": "/t", "maxBytesPerTrigger": "10 parsecs"}, "byte size"),
        ({"path": "/t", "netChanges": "maybe"}, "true or false"),
        ({"path": "/t", "keyColumns": "id"}, "netChanges"),
    ],
)
def test_invalid_options_are_config_errors(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SourceOptions.parse(options)


def test_mode_specific_options_and_key_columns_are_checked(tmp_path: Path) -> None:
    root = new_table(tmp_path / "t")
    ds = source(root, endingVersion=0)
    with pytest.raises(ConfigError, match="batch reads"):
        ds.streamReader(ds.schema())
    ds = source(root, startingVersion="latest")
    with pytest.raises(ConfigError, match="streams"):
        ds.reader(ds.schema())
    ds = source(root, netChanges=True, keyColumns="nope")
    with pytest.raises(ConfigError, match="nope"):
        ds.streamReader(ds.schema())
    with pytest.raises(ConfigError, match="nope"):
        ds.reader(ds.schema())
    with pytest.raises(ConfigError, match="read limit"):
        stream_reader(root).latestOffset({"tableId": "x", "version": 0, "index": 0, "snapshot": False}, ReadMaxRows(5))


def test_schema_errors(tmp_path: Path) -> None:
    with pytest.raises(TableNotFoundError):
        source(tmp_path).schema()
    root = new_table(tmp_path / "t")
    with pytest.raises(VersionNotFoundError):
        source(root, endingVersion=5).schema()
    with pytest.raises(ConfigError):
        source(root, maxFilesPerTrigger=-3).schema()
    schema = source(root).schema()
    assert schema.simpleString() == (
        "struct<id:bigint,v:string,p:string,_change_type:string,_commit_version:bigint,_commit_timestamp:timestamp>"
    )


def test_offsets_parse_and_refuse_garbage() -> None:
    offset = Offset("tid", 3, 2, False)
    assert Offset.from_json(json.loads(json.dumps(offset.to_json()))) == offset
    for raw in (
        {"version": 1},
        {"tableId": "t", "version": -1, "index": 0, "snapshot": False},
        "x",
        {"tableId": "t", "version": 1, "index": 0, "snapshot": "no"},
        {"tableId": "t", "version": True, "index": 0, "snapshot": False},
    ):
        with pytest.raises(StateError):
            Offset.from_json(raw)
    with pytest.raises(StateError):
        DeltaTailStreamReader(SourceOptions("/t"), id_schema()).partitions({"v": 1}, {"v": 2})


def id_schema() -> Any:
    from pyspark.sql.types import LongType, StructField, StructType

    return StructType([StructField("id", LongType())])


# ---------------------------------------------------------------- the stream reader without Spark --


def test_stream_from_version_zero_equals_load_cdf(tmp_path: Path) -> None:
    root = new_table(tmp_path / "t")
    append(root, [6, 7])
    DeltaTable(str(root)).update({"v": "'changed'"}, predicate="id = 2")
    DeltaTable(str(root)).delete("id = 4")
    reader = stream_reader(root, startingVersion=0)
    start = reader.initialOffset()
    assert start == {"tableId": DeltaTable(str(root)).metadata().id, "version": 0, "index": 0, "snapshot": False}
    batches = run_batches(reader, start)
    assert_same_rows(all_rows(batches, arrow_target(reader.schema)), load_cdf(root, 0))
    assert_same_rows(all_rows(batches, arrow_target(reader.schema)), ChangeFeed(str(root)).read_table(0), drop=())
    assert batches[-1][1]["version"] == 4 and reader.planner.rebuilds == 1


def test_default_start_is_the_initial_snapshot_then_changes(tmp_path: Path) -> None:
    root = new_table(tmp_path / "t")
    append(root, [6])
    reader = stream_reader(root)
    start = reader.initialOffset()
    assert (start["version"], start["snapshot"]) == (1, True)
    append(root, [7])
    rows = all_rows(run_batches(reader, start), arrow_target(reader.schema))
    expected = ChangeFeed(str(root)).read_table(1, initial_snapshot=True)
    assert_same_rows(rows, expected, drop=())
    assert sorted(rows.column("id").to_pylist()) == list(range(8))


def test_latest_and_timestamp_starts(tmp_path: Path) -> None:
    root = new_table(tmp_path / "t")
    append(root, [6])
    reader = stream_reader(root, startingVersion="latest")
    start = reader.initialOffset()
    assert (start["version"], start["snapshot"]) == (2, False)
    assert reader.latestOffset(start, ReadAllAvailable()) == start
    append(root, [7])
    assert all_rows(run_batches(reader, start), arrow_target(reader.schema)).column("id").to_pylist() == [7]
    assert stream_reader(root, startingTimestamp="2000-01-01").initialOffset()["version"] == 0
    assert stream_reader(root, startingTimestamp="2999-01-01").initialOffset()["version"] == 3
    with pytest.raises(VersionNotFoundError, match="after the latest"):
        stream_reader(root, startingVersion=9).initialOffset()


def test_restart_mid_version_resumes_exactly(tmp_path: Path) -> None:
    """Offsets point at file tasks: a new reader (a restarted query) from a mid-commit offset loses nothing."""
    root = new_table(tmp_path / "t", cdf=False)
    append(root, [6, 7], part="b")
    first = stream_reader(root, startingVersion=0, maxFilesPerTrigger=1)
    start = first.initialOffset()
    early = run_batches(first, start, most=100)[:2]
    boundary = early[-1][1]
    assert (boundary["version"], boundary["index"]) == (0, 2)  # version 0 has three files
    append(root, [8], part="c")
    second = stream_reader(root, startingVersion=0, maxFilesPerTrigger=1)
    late = run_batches(second, boundary)
    assert second.planner.rebuilds == 1 and len(late) == 3
    assert all(pos(b[0]) < pos(b[1]) for b in early + late)
    rows = pa.concat_tables([b[2] for b in early + late])
    assert_same_rows(rows, ChangeFeed(str(root)).read_table(0))


def test_planning_is_incremental_and_plans_are_dropped_on_commit(tmp_path: Path) -> None:
    root = new_table(tmp_path / "t")
    reader = stream_reader(root, startingVersion=0)
    start = reader.initialOffset()
    for i in range(5):
        start = run_batches(reader, start)[-1][1]
        append(root, [10 + i])
    assert reader.planner.rebuilds == 1 and reader.planner.cached == 0
    end = reader.latestOffset(start, ReadAllAvailable())
    assert reader.planner.cached == 1 and reader.latestOffset(start, ReadAllAvailable()) == end
    assert len(reader.partitions(start, end)) == 1 and reader.planner.rebuilds == 1


class CountingStorage(LocalStorage):
    """Local storage that counts directory listings."""

    def __init__(self) -> None:
        self.listings = 0

    def list_from(self, directory: str, start_after: str | None = None) -> list[FileInfo]:
        self.listings += 1
        return super().list_from(directory, start_after)


def test_idle_polls_and_new_commits_do_not_list_the_log(tmp_path: Path) -> None:
    root = new_table(tmp_path / "t")
    storage = CountingStorage()
    reader = stream_reader(root, startingVersion=0, check_seconds=3600, storage=storage)
    start = run_batches(reader, reader.initialOffset())[-1][1]  # its last, idle poll checked for gaps
    listed = storage.listings
    assert all(reader.latestOffset(start, ReadAllAvailable()) == start for _ in range(50))
    append(root, [6])
    append(root, [7])
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end["version"] == 3 and len(reader.partitions(start, end)) == 2
    assert storage.listings == listed


def test_max_files_splits_plain_commits_between_files(tmp_path: Path) -> None:
    root = new_table(tmp_path / "t", cdf=False)
    append(root, [6])
    append(root, [7])
    reader = stream_reader(root, startingVersion=0, maxFilesPerTrigger=2)
    batches = run_batches(reader, reader.initialOffset())
    assert [(b[1]["version"], b[1]["index"]) for b in batches] == [(0, 2), (2, 0), (3, 0)]
    assert [b[2].num_rows for b in batches] == [4, 3, 1]
    everything = run_batches(
        stream_reader(root, startingVersion=0, maxFilesPerTrigger=2), reader.initialOffset(), ReadAllAvailable()
    )
    assert len(everything) == 1 and everything[0][2].num_rows == 8


def test_max_bytes_admits_at_least_one_file(tmp_path: Path) -> None:
    root = new_table(tmp_path / "t", cdf=False)
    reader = stream_reader(root, startingVersion=0, maxBytesPerTrigger=1)
    batches = run_batches(reader, reader.initialOffset())
    assert [b[2].num_rows for b in batches] == [2, 2, 2]
    both = stream_reader(root, startingVersion=0, maxFilesPerTrigger=3, maxBytesPerTrigger=1)
    assert len(run_batches(both, both.initialOffset())) == 3


def test_commits_with_deletion_vectors_are_admitted_whole_with_split_never() -> None:
    root = corpus_table("kernel-rs/cdf-table-with-dv")
    reader = stream_reader(root, startingVersion=0, maxFilesPerTrigger=1, splitCommits="never")
    batches = run_batches(reader, reader.initialOffset())
    assert [b[1]["version"] for b in batches] == [1, 2, 3, 4, 5, 6, 7]  # versions 4 and 5 hold two DV tasks each
    assert all(b[1]["index"] == 0 for b in batches)
    assert_same_rows(all_rows(batches, arrow_target(reader.schema)), ChangeFeed(str(root)).read_table(0), drop=())
    pairs = stream_reader(root, startingVersion=0, maxFilesPerTrigger=2, splitCommits="never")
    assert [b[1]["version"] for b in run_batches(pairs, pairs.initialOffset())] == [2, 4, 5, 6, 7]


def test_commits_with_deletion_vectors_are_split_by_default() -> None:
    """kernel-rs/cdf-table-with-dv: versions 4 and 5 each delete by a DV and restore by another (two tasks)."""
    root = corpus_table("kernel-rs/cdf-table-with-dv")
    reader = stream_reader(root, startingVersion=0, maxFilesPerTrigger=1)
    batches = run_batches(reader, reader.initialOffset())
    ends = [(b[1]["version"], b[1]["index"]) for b in batches]
    assert ends == [(1, 0), (2, 0), (3, 0), (4, 0), (4, 1), (5, 0), (5, 1), (6, 0), (7, 0)]
    types = [sorted(set(b[2].column("_change_type").to_pylist())) for b in batches]
    # A task per micro-batch: v4 deletes no more rows by its new DV, restores 1, 4; v5 deletes 3, restores 0, 5.
    assert types[4:8] == [[], ["insert"], ["delete"], ["insert"]]
    assert_same_rows(all_rows(batches, arrow_target(reader.schema)), load_cdf(root, 0))


DV_FILES = 6


def dv_delete_table(root: Path) -> HandTable:
    """v0: ``DV_FILES`` files of ten values each; v1: one DELETE marking rows 0 and 9 of every file in a DV."""
    table = HandTable(root, VALUE_FIELD, configuration=DV_CONFIG)
    names = [f"part-{i}.parquet" for i in range(DV_FILES)]
    table.commit(
        [
            table.add(n, pa.table({"value": pa.array(range(10 * i, 10 * i + 10), pa.int64())}))
            for i, n in enumerate(names)
        ]
    )
    dvs = table.file_dvs([{0, 9}] * DV_FILES)
    table.commit(
        [a for n, dv in zip(names, dvs, strict=True) for a in (table.remove(n), table.add(n, dv=dv))],
        operation="DELETE",
    )
    return table


def test_a_deletion_vector_commit_of_many_files_is_split_and_resumes_mid_commit(tmp_path: Path) -> None:
    root = dv_delete_table(tmp_path / "t").root
    first = stream_reader(root, startingVersion=1, maxFilesPerTrigger=2)
    early = take_batches(first, first.initialOffset(), 1)  # stopped after one micro-batch
    assert (early[0][1]["version"], early[0][1]["index"]) == (1, 2)
    second = stream_reader(root, startingVersion=1, maxFilesPerTrigger=2)  # a restart from the offset log
    late = run_batches(second, early[0][1])
    assert second.planner.rebuilds == 1
    assert [(b[1]["version"], b[1]["index"]) for b in late] == [(1, 4), (2, 0)]
    assert [b[2].num_rows for b in early + late] == [4, 4, 4]
    deleted = sorted(v for b in early + late for v in b[2].column("value").to_pylist())
    assert deleted == sorted(v for i in range(DV_FILES) for v in (10 * i, 10 * i + 9))
    assert_same_rows(all_rows(early + late, arrow_target(second.schema)), load_cdf(root, 1))
    whole = stream_reader(root, startingVersion=1, maxFilesPerTrigger=2, splitCommits="never")
    assert [b[2].num_rows for b in run_batches(whole, whole.initialOffset())] == [2 * DV_FILES]


CDC_PARTS = 5


def cdc_update_table(root: Path) -> Path:
    """v0: 40 rows in ``CDC_PARTS`` partitions (CDF on); v1: UPDATE of every row (a cdc file per partition);
    v2: an UPDATE that moves ids 1..3 to partition p0, whose preimages deltalake writes in the old partitions'
    cdc files and postimages in p0's."""
    n = 40
    data = pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "v": [f"x{i}" for i in range(n)],
            "p": [f"p{i % CDC_PARTS}" for i in range(n)],
        }
    )
    write_deltalake(str(root), data, partition_by=["p"], configuration=CDF)
    DeltaTable(str(root)).update({"v": "'u'"})
    DeltaTable(str(root)).update({"p": "'p0'"}, predicate="id >= 1 and id <= 3")
    return root


def cdc_tasks(root: Path, version: int) -> int:
    return len([a for a in commit_actions(root, version) if "cdc" in a])


def test_cdc_commits_are_whole_by_default_and_split_with_always(tmp_path: Path) -> None:
    root = cdc_update_table(tmp_path / "t")
    assert (cdc_tasks(root, 1), cdc_tasks(root, 2)) == (CDC_PARTS, 4)  # the fixture is what it claims
    auto = stream_reader(root, startingVersion=1, maxFilesPerTrigger=1)
    assert [(b[1]["version"], b[1]["index"]) for b in run_batches(auto, auto.initialOffset())] == [(2, 0), (3, 0)]
    split = stream_reader(root, startingVersion=1, maxFilesPerTrigger=1, splitCommits="always")
    batches = run_batches(split, split.initialOffset())
    assert [(b[1]["version"], b[1]["index"]) for b in batches] == [
        *((1, i) for i in range(1, CDC_PARTS)),
        (2, 0),
        *((2, i) for i in range(1, 4)),
        (3, 0),
    ]
    assert_same_rows(all_rows(batches, arrow_target(split.schema)), load_cdf(root, 1))
    # What "always" gives up: version 2's images of one row land in different micro-batches.
    moved = [Counter(b[2].column("_change_type").to_pylist()) for b in batches[CDC_PARTS:]]
    assert sum(c["update_preimage"] for c in moved) == sum(c["update_postimage"] for c in moved) == 3
    assert any(c["update_preimage"] != c["update_postimage"] for c in moved)


def test_a_cdc_commit_split_mid_commit_resumes_at_the_next_file_after_a_restart(tmp_path: Path) -> None:
    root = cdc_update_table(tmp_path / "t")
    first = stream_reader(root, startingVersion=1, maxBytesPerTrigger=1, splitCommits="always")
    early = take_batches(first, first.initialOffset(), 2)
    assert [(b[1]["version"], b[1]["index"]) for b in early] == [(1, 1), (1, 2)]
    second = stream_reader(root, startingVersion=1, maxBytesPerTrigger=1, splitCommits="always")
    late = run_batches(second, early[-1][1])
    assert second.planner.rebuilds == 1 and all(pos(b[0]) < pos(b[1]) for b in early + late)
    assert len(early + late) == CDC_PARTS + 4
    assert_same_rows(all_rows(early + late, arrow_target(second.schema)), load_cdf(root, 1))


def test_split_commits_option() -> None:
    assert SourceOptions.parse({"path": "/t"}).split_commits == "auto"
    assert SourceOptions.parse({"path": "/t", "splitCommits": " Always"}).split_commits == "always"
    with pytest.raises(ConfigError, match="splitCommits must be one of auto, never, always, got 'sometimes'"):
        SourceOptions.parse({"path": "/t", "splitCommits": "sometimes"})
    for fmt in ("lance", "iceberg"):
        assert SourceOptions.parse({"path": "/t", "format": fmt, "splitCommits": "never"}).split_commits == "never"
        with pytest.raises(ConfigError, match="option splitCommits=always applies to Delta tables"):
            SourceOptions.parse({"path": "/t", "format": fmt, "splitCommits": "always"})


def test_whole_unit_rule(tmp_path: Path) -> None:
    """The admission rule alone, on plans of real commits: cdc, deletion vectors, plain, and under netChanges."""
    cdc_root = cdc_update_table(tmp_path / "cdc")
    plain_root = new_table(tmp_path / "plain", cdf=False)
    append(plain_root, [6])
    cdc = next(iter(ChangeFeed(str(cdc_root)).plans(1, 1)))
    dv = next(iter(ChangeFeed(str(corpus_table("kernel-rs/cdf-table-with-dv"))).plans(4, 4)))
    plain = next(iter(ChangeFeed(str(plain_root)).plans(1, 1)))
    expected = {"auto": (True, False, False), "always": (False, False, False), "never": (True, True, False)}
    for mode, whole in expected.items():
        options = SourceOptions.parse({"path": "/t", "format": "delta", "splitCommits": mode})
        assert (whole_unit(cdc, options), whole_unit(dv, options), whole_unit(plain, options)) == whole, mode
        net = replace(options, net_changes=True)
        assert (whole_unit(cdc, net), whole_unit(dv, net), whole_unit(plain, net)) == (True, True, True), mode


def test_available_now_never_reads_past_the_prepared_version(tmp_path: Path) -> None:
    root = new_table(tmp_path / "t")
    reader = stream_reader(root, startingVersion=0, maxFilesPerTrigger=1)
    start = reader.initialOffset()
    append(root, [6])
    reader.prepareForTriggerAvailableNow()
    append(root, [7])
    batches = run_batches(reader, start)
    assert batches[-1][1]["version"] == 2
    assert sorted(all_rows(batches, arrow_target(reader.schema)).column("id").to_pylist()) == list(range(7))


def test_net_changes_partition_per_commit(tmp_path: Path) -> None:
    root = new_table(tmp_path / "t", cdf=False)
    DeltaTable(str(root)).update({"v": "'new'"}, predicate="id = 3")
    reader = stream_reader(root, startingVersion=1, netChanges=True, keyColumns="id")
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    parts = reader.partitions(start, end)
    assert len(parts) == 1 and isinstance(parts[0], ChangePartition) and parts[0].net
    rows = read_rows(reader, parts)
    assert sorted(zip(rows.column("_change_type").to_pylist(), rows.column("v").to_pylist(), strict=True)) == [
        ("update_postimage", "new"),
        ("update_preimage", "x3"),
    ]
    feed = ChangeFeed(str(root), options=ChangeOptions(net_changes=True, key_columns=("id",)))
    assert_same_rows(rows, feed.read_table(1), drop=())


def test_additive_schema_change_stops_after_earlier_rows_and_restart_picks_it_up(tmp_path: Path) -> None:
    root = new_table(tmp_path / "t")
    reader = stream_reader(root, startingVersion=0)
    start = run_batches(reader, reader.initialOffset())[-1][1]
    append(root, [6])
    wider = ids([7]).append_column("extra", pa.array(["e"]))
    write_deltalake(str(root), wider.append_column("p", pa.array(["a"])), mode="append", schema_mode="merge")
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end["version"] == 2  # version 1 is delivered first
    assert read_rows(reader, reader.partitions(start, end)).column("id").to_pylist() == [6]
    reader.commit(end)
    with pytest.raises(SchemaChangeError, match=r"'extra' is not in the query's schema.*version 2"):
        reader.latestOffset(end, ReadAllAvailable())
    restarted = stream_reader(root, startingVersion=0)
    rows = all_rows(run_batches(restarted, end), arrow_target(restarted.schema))
    assert rows.column("extra").to_pylist() == ["e"] and "extra" in restarted.schema.fieldNames()
    older = stream_reader(root, startingVersion=0)  # today's schema, history before the change: nulls
    history = all_rows(run_batches(older, older.initialOffset()), arrow_target(older.schema))
    assert history.column("extra").null_count == 7 and history.num_rows == 8


def test_non_additive_schema_change_is_an_error_naming_the_version(tmp_path: Path) -> None:
    root = new_table(tmp_path / "t")
    reader = stream_reader(root, startingVersion=0)
    start = run_batches(reader, reader.initialOffset())[-1][1]
    narrower = pa.table({"id": pa.array([1], pa.int64()), "p": ["a"]})  # column v dropped
    write_deltalake(str(root), narrower, partition_by=["p"], mode="overwrite", schema_mode="overwrite")
    with pytest.raises(SchemaChangeError, match="version 1"):
        reader.latestOffset(start, ReadAllAvailable())
    with pytest.raises(SchemaChangeError, match="version 1"):  # sticky
        reader.latestOffset(start, ReadAllAvailable())


def test_recreated_table_is_refused(tmp_path: Path) -> None:
    root = new_table(tmp_path / "t")
    append(root, [6])
    append(root, [7])
    reader = stream_reader(root, startingVersion=0)
    start = run_batches(reader, reader.initialOffset())[-1][1]
    shutil.rmtree(root)
    new_table(root)
    with pytest.raises(StateError, match="recreated"):  # the live reader: the log is now shorter
        reader.latestOffset(start, ReadAllAvailable())
    for v in range(3, 6):
        append(root, [v * 10])
    with pytest.raises(StateError, match="table id"):  # a restart: the id differs
        stream_reader(root).latestOffset(start, ReadAllAvailable())
    live = stream_reader(root, startingVersion=0)
    live.initialOffset()
    with pytest.raises(StateError, match="table id"):  # an offset of another table, on a running reader
        live.partitions(start, {**start, "version": 5})


def test_invalid_and_unsupported_commits_stop_the_stream(tmp_path: Path) -> None:
    root = new_table(tmp_path / "t")
    reader = stream_reader(root, startingVersion=0)
    start = run_batches(reader, reader.initialOffset())[-1][1]
    (root / "_delta_log" / f"{1:020d}.json").write_text('{"add": 5}\n')
    with pytest.raises(InvalidLogError, match="version 1"):
        reader.latestOffset(start, ReadAllAvailable())
    protocol = {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["fancy"], "writerFeatures": ["fancy"]}
    (root / "_delta_log" / f"{1:020d}.json").write_text(json.dumps({"protocol": protocol}) + "\n")
    with pytest.raises(UnsupportedFeatureError, match="fancy"):
        stream_reader(root, startingVersion=0).latestOffset(start, ReadAllAvailable())


def test_missing_table_and_gaps(tmp_path: Path) -> None:
    with pytest.raises(TableNotFoundError):
        DeltaTailStreamReader(SourceOptions(str(tmp_path)), id_schema()).initialOffset()
    root = new_table(tmp_path / "t")
    append(root, [6])
    append(root, [7])
    schema = source(root).schema()
    with pytest.raises(StateError):
        stream_reader(root).latestOffset({"version": 1}, ReadAllAvailable())
    (root / "_delta_log" / f"{1:020d}.json").unlink()
    with pytest.raises(VersionGapError):
        DeltaTailBatchReader(SourceOptions(str(root)), schema, None).partitions()


def cleaned_table(root: Path) -> Path:
    """Versions 0..5 with a checkpoint at 3 and commits 0..2 deleted (log cleanup)."""
    new_table(root)
    for v in (6, 7, 8):
        append(root, [v])
    DeltaTable(str(root)).create_checkpoint()
    append(root, [9])
    append(root, [10])
    for v in range(3):
        (root / "_delta_log" / f"{v:020d}.json").unlink()
    return root


def test_data_loss_fails_by_default_and_skips_forward_when_allowed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = cleaned_table(tmp_path / "t")
    with pytest.raises(VersionNotFoundError, match="failOnDataLoss=false"):
        stream_reader(root, startingVersion=1).initialOffset()
    reader = stream_reader(root, startingVersion=1, failOnDataLoss=False)
    with caplog.at_level(logging.WARNING, logger="deltatail"):
        rows = all_rows(run_batches(reader, reader.initialOffset()), arrow_target(reader.schema))
    assert sorted(rows.column("id").to_pylist()) == [9, 10]
    assert "failOnDataLoss=false" in caplog.text


def test_data_loss_mid_stream(tmp_path: Path) -> None:
    """The log is cleaned up past the stream's position while it runs: commits 0 and 1 go, checkpoint 2 stays."""
    root = new_table(tmp_path / "t")
    strict = stream_reader(root, startingVersion=0)
    lenient = stream_reader(root, startingVersion=0, failOnDataLoss=False)
    offsets = [run_batches(r, r.initialOffset())[-1][1] for r in (strict, lenient)]
    for v in (1, 2):
        append(root, [v * 10])
    DeltaTable(str(root)).create_checkpoint()
    for v in (0, 1):
        (root / "_delta_log" / f"{v:020d}.json").unlink()
    with pytest.raises(VersionGapError, match="failOnDataLoss=false"):
        strict.latestOffset(offsets[0], ReadAllAvailable())
    end = lenient.latestOffset(offsets[1], ReadAllAvailable())
    assert end["version"] == 3 and lenient.partitions(offsets[1], end) == []
    lenient.commit(end)
    append(root, [30])
    assert all_rows(run_batches(lenient, end), arrow_target(lenient.schema)).column("id").to_pylist() == [30]


def test_on_data_loss_resnapshot_reads_the_current_rows_as_a_snapshot(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = cleaned_table(tmp_path / "t")
    reader = stream_reader(root, startingVersion=1, onDataLoss="resnapshot")
    with caplog.at_level(logging.WARNING, logger="deltatail"):
        batches = run_batches(reader, reader.initialOffset())
    rows = all_rows(batches, arrow_target(reader.schema))
    current = DeltaTable(str(root)).to_pyarrow_table()  # the peer's reading of version 5
    assert sorted(rows.column("id").to_pylist()) == sorted(current.column("id").to_pylist())
    assert set(rows.column("_change_type").to_pylist()) == {"insert"}
    assert [(b[0]["version"], b[1]["version"], b[2].num_rows) for b in batches] == [(1, 6, len(current))]
    assert reader.planner.data_losses == 1 and "onDataLoss=resnapshot" in caplog.text
    append(root, [11])
    assert all_rows(run_batches(reader, batches[-1][1]), arrow_target(reader.schema)).column("id").to_pylist() == [11]


def test_on_data_loss_resnapshot_mid_stream(tmp_path: Path) -> None:
    root = new_table(tmp_path / "t")
    reader = stream_reader(root, startingVersion=0, onDataLoss="resnapshot")
    offset = run_batches(reader, reader.initialOffset())[-1][1]
    for v in (1, 2):
        append(root, [v * 10])
    DeltaTable(str(root)).create_checkpoint()
    for v in (0, 1):
        (root / "_delta_log" / f"{v:020d}.json").unlink()
    batches = run_batches(reader, offset)
    rows = all_rows(batches, arrow_target(reader.schema))
    assert sorted(rows.column("id").to_pylist()) == [0, 1, 2, 3, 4, 5, 10, 20]  # the rows at version 2
    assert reader.planner.data_losses == 1


@pytest.mark.parametrize(
    ("options", "mode"),
    [({}, "fail"), ({"failOnDataLoss": "false"}, "skip"), ({"onDataLoss": "SKIP"}, "skip"),
     ({"onDataLoss": "resnapshot"}, "resnapshot")],
)  # fmt: skip
def test_on_data_loss_option(tmp_path: Path, options: dict[str, str], mode: str) -> None:
    parsed = SourceOptions.parse({"path": str(tmp_path), "format": "delta", **options})
    assert parsed.on_data_loss == mode and parsed.fail_on_data_loss == (mode == "fail")


def test_on_data_loss_option_refuses_nonsense(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="onDataLoss must be one of fail, resnapshot, skip"):
        SourceOptions.parse({"path": str(tmp_path), "format": "delta", "onDataLoss": "ignore"})
    with pytest.raises(ConfigError, match="contradict"):
        SourceOptions.parse({"path": str(tmp_path), "format": "delta", "onDataLoss": "skip", "failOnDataLoss": "true"})
    with pytest.raises(ConfigError, match="onDataLoss=resnapshot applies to Delta tables"):
        SourceOptions.parse({"path": str(tmp_path), "format": "lance", "onDataLoss": "resnapshot"})


def test_missing_data_file_fails_the_read(tmp_path: Path) -> None:
    root = new_table(tmp_path / "t")
    reader = stream_reader(root, startingVersion=0)
    start = reader.initialOffset()
    parts = reader.partitions(start, reader.latestOffset(start, ReadAllAvailable()))
    assert isinstance(parts[0], ChangePartition)
    (root / parts[0].tasks[0].path).unlink()
    with pytest.raises(MissingFileError):
        list(read_partition(parts[0], arrow_target(reader.schema), (), LocalStorage()))


def test_corrupt_deletion_vector_fails_the_read(tmp_path: Path) -> None:
    root = tmp_path / "dv"
    shutil.copytree(corpus_table("kernel-rs/cdf-table-with-dv"), root)
    for dv in root.glob("deletion_vector_*.bin"):
        dv.write_bytes(b"\x01" + b"\0" * (dv.stat().st_size - 1))
    reader = stream_reader(root, startingVersion=1)
    start = reader.initialOffset()
    parts = reader.partitions(start, reader.latestOffset(start, ReadAllAvailable()))
    with pytest.raises(DeletionVectorError):
        read_rows(reader, parts)


def test_batch_reader_errors(tmp_path: Path) -> None:
    root = new_table(tmp_path / "t")
    DeltaTable(str(root)).update({"v": "'u'"}, predicate="id = 1")
    wider = ids([7], part="a").append_column("extra", pa.array(["e"]))
    write_deltalake(str(root), wider, mode="append", schema_mode="merge")
    ds = source(root, startingVersion=0, endingVersion=1)
    narrow = ds.reader(ds.schema())
    assert isinstance(narrow, DeltaTailBatchReader)
    wide = source(root, startingVersion=0).schema()
    tasks = sum(len(p.tasks) for p in ChangeFeed(str(root)).plans(0))
    assert len(DeltaTailBatchReader(SourceOptions.parse({"path": str(root)}), wide, 2).partitions()) == tasks
    with pytest.raises(SchemaChangeError, match="version 2"):
        DeltaTailBatchReader(SourceOptions.parse({"path": str(root)}), narrow.schema, 2).partitions()
    with pytest.raises(VersionNotFoundError):
        DeltaTailBatchReader(SourceOptions.parse({"path": str(root), "startingVersion": "7"}), wide, None).partitions()


def test_version_batches_group_rows_by_commit() -> None:
    rows = pa.record_batch({"id": [1, 2, 3], "_commit_version": pa.array([5, 4, 5], pa.int64())})
    groups = [(b.start.version, b.rows.column("id").to_pylist()) for b in version_batches(rows)]
    assert groups == [(5, [1, 3]), (4, [2])]


@KAFKA_IMPORT
def test_kafka_writer_refuses_what_spark_cannot_do(tmp_path: Path) -> None:
    root = new_table(tmp_path / "t")
    with pytest.raises(ConfigError, match="exactly_once"):
        kafka_batch_writer("kafka://127.0.0.1:9/t?exactly_once=true", str(root))
    with pytest.raises(ConfigError, match="confluent"):
        kafka_batch_writer("kafka://127.0.0.1:9/t?backend=confluent", str(root))
    with pytest.raises(ConfigError):
        kafka_batch_writer("kafka://127.0.0.1:9/{nope}", str(root))
    with pytest.raises(TableNotFoundError):
        kafka_batch_writer("kafka://127.0.0.1:9/t", str(tmp_path / "none"))


# ---------------------------------------------------------------- Spark --


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java: no java on PATH and no JAVA_HOME")
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # loopback only, also for the JVM
    os.environ["PYSPARK_PYTHON"] = sys.executable  # executors must import deltatail from this venv
    session = (
        SparkSession.builder.master("local[2]")
        .appName("deltatail-tests")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


def arrow(df: DataFrame) -> pa.Table:
    return df.toArrow()


@pytest.mark.slow
def test_spark_stream_into_memory_sink_follows_writes(spark: SparkSession, tmp_path: Path) -> None:
    root = new_table(tmp_path / "t")
    stream = spark.readStream.format("deltatail").option("startingVersion", 0).load(str(root))
    query = (
        stream.writeStream.format("memory")
        .queryName("follow")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        query.processAllAvailable()
        append(root, [6, 7])
        DeltaTable(str(root)).update({"v": "'changed'"}, predicate="id = 2")
        query.processAllAvailable()
        DeltaTable(str(root)).delete("id = 4")
        DeltaTable(str(root)).merge(
            ids([1, 9], "m"), "s.id = t.id", source_alias="s", target_alias="t"
        ).when_matched_update_all().when_not_matched_insert_all().execute()
        query.processAllAvailable()
    finally:
        query.stop()
    got = arrow(spark.table("follow"))
    assert_same_rows(got, load_cdf(root, 0))
    assert got.column(TS).null_count == 0 and len(query.recentProgress) >= 3


@pytest.mark.slow
def test_spark_restart_from_checkpoint_loses_and_repeats_nothing(spark: SparkSession, tmp_path: Path) -> None:
    """Stopped after two one-file micro-batches (inside version 0's three files), written to, restarted."""
    root = new_table(tmp_path / "t", cdf=False)
    seen: dict[int, pa.Table] = {}

    def collect(df: DataFrame, batch_id: int) -> None:
        seen[batch_id] = arrow(df)  # a replayed batch id replaces its first attempt

    def start() -> Any:
        reader = spark.readStream.format("deltatail").option("startingVersion", 0).option("maxFilesPerTrigger", 1)
        writer = reader.load(str(root)).writeStream.foreachBatch(collect).trigger(processingTime="100 milliseconds")
        return writer.option("checkpointLocation", str(tmp_path / "ck")).start()

    first = start()
    wait_for(lambda: len(seen) >= 2)
    append(root, [6, 7], part="b")
    first.stop()
    ends = {json.loads(p["sources"][0]["endOffset"])["version"] for p in first.recentProgress}
    append(root, [8], part="c")
    DeltaTable(str(root)).delete("id = 0")
    second = start()
    try:
        second.processAllAvailable()
    finally:
        second.stop()
    resumed = json.loads(second.recentProgress[0]["sources"][0]["startOffset"])
    assert resumed["version"] in ends | {0}
    rows = pa.concat_tables([seen[b] for b in sorted(seen)])
    assert_same_rows(rows, ChangeFeed(str(root)).read_table(0))
    assert max(seen) + 1 == len(seen)


def wait_for(done: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.slow
def test_spark_available_now_with_max_files(spark: SparkSession, tmp_path: Path) -> None:
    root = new_table(tmp_path / "t", cdf=False)
    append(root, [6])
    append(root, [7, 8], part="b")
    tasks = [(p.context.version, t.partition_values["p"]) for p in ChangeFeed(str(root)).plans(0) for t in p.tasks]
    batches: dict[int, set[tuple[int, str]]] = {}

    def collect(df: DataFrame, batch_id: int) -> None:
        batches[batch_id] = {(r["_commit_version"], r["p"]) for r in df.select("_commit_version", "p").collect()}

    stream = (
        spark.readStream.format("deltatail")
        .option("startingVersion", 0)
        .option("maxFilesPerTrigger", 2)
        .load(str(root))
    )
    query = (
        stream.writeStream.foreachBatch(collect)
        .trigger(availableNow=True)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    assert query.awaitTermination(120)
    assert [batches[b] for b in sorted(batches)] == [set(tasks[0:2]), set(tasks[2:4]), set(tasks[4:5])]
    assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [4, 3, 2]


@pytest.mark.slow
def test_spark_batch_read_equals_standalone_changes(spark: SparkSession, tmp_path: Path) -> None:
    root = new_table(tmp_path / "t")
    append(root, [6])
    DeltaTable(str(root)).update({"v": "'u'"}, predicate="id < 3")
    DeltaTable(str(root)).delete("id = 5")
    df = spark.read.format("deltatail").option("startingVersion", 1).option("endingVersion", 3).load(str(root))
    assert_same_rows(arrow(df), ChangeFeed(str(root)).read_table(1, 3), drop=())
    append(root, [7])  # a batch read without endingVersion stops at the version it was defined at
    assert_same_rows(arrow(df), ChangeFeed(str(root)).read_table(1, 3), drop=())


@pytest.mark.parametrize(
    "table",
    [
        "kernel-rs/cdf-table-with-dv",
        "kernel-rs/cdf-table-with-cdc-and-dvs",
        "kernel-rs/cdf-column-mapping-name-mode",
        "kernel-rs/cdf-column-mapping-id-mode",
    ],
)
@pytest.mark.slow
def test_spark_corpus_tables_equal_changefeed(spark: SparkSession, table: str) -> None:
    root = corpus_table(table)
    df = spark.read.format("deltatail").option("startingVersion", 0).load(str(root))
    assert_same_rows(arrow(df), ChangeFeed(str(root)).read_table(0), drop=())


@pytest.mark.slow
@pytest.mark.parametrize("table", ["delta-spark/variant-stats-no-checkpoint", "kernel-rs/unshredded-variant"])
def test_spark_reads_variant_columns_as_variants(spark: SparkSession, table: str) -> None:
    """Variant columns arrive as Spark variants (PySpark's marker): Spark's to_json of them is what Spark wrote down."""
    root = corpus_table(table)
    df = spark.read.format("deltatail").option("startingVersion", 0).load(str(root))
    assert df.schema["v"].dataType.simpleString() == "variant"
    got = sorted(r["j"] for r in df.selectExpr("to_json(v) as j").collect())
    expectations = Path(__file__).resolve().parents[1] / "expectations" / "variant_expectations.json"
    files = json.loads(expectations.read_text(encoding="utf-8"))["tables"][table]["files"]
    heads = [row["v"] for f in files.values() for row in f["head"]]
    assert set(heads) <= set(got) and len(got) == sum(f["rows"] for f in files.values())


@pytest.mark.slow
def test_spark_stream_of_a_corpus_table_with_deletion_vectors(spark: SparkSession, tmp_path: Path) -> None:
    root = corpus_table("kernel-rs/cdf-table-with-cdc-and-dvs")
    stream = spark.readStream.format("deltatail").option("startingVersion", 0).load(str(root))
    query = (
        stream.writeStream.format("memory")
        .queryName("corpus")
        .trigger(availableNow=True)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    assert query.awaitTermination(120)
    assert_same_rows(arrow(spark.table("corpus")), ChangeFeed(str(root)).read_table(0), drop=())


@pytest.mark.slow
def test_spark_schema_change_stops_the_query_and_a_restart_continues(spark: SparkSession, tmp_path: Path) -> None:
    root = new_table(tmp_path / "t")
    seen: dict[int, pa.Table] = {}

    def collect(df: DataFrame, batch_id: int) -> None:
        seen[batch_id] = arrow(df)

    def start() -> Any:
        stream = spark.readStream.format("deltatail").option("startingVersion", 0).load(str(root))
        return stream.writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "ck")).start()

    query = start()
    query.processAllAvailable()
    wider = ids([7], part="a").append_column("extra", pa.array(["e"]))
    write_deltalake(str(root), wider, mode="append", schema_mode="merge")
    with pytest.raises(Exception, match=r"SchemaChangeError[\s\S]*'extra'[\s\S]*version 1"):
        query.processAllAvailable()
    query = start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert [seen[b].num_rows for b in sorted(seen)] == [6, 1]
    assert seen[max(seen)].to_pylist()[0]["extra"] == "e"


@pytest.mark.slow
@KAFKA_IMPORT
def test_spark_kafka_foreach_batch(spark: SparkSession, tmp_path: Path, kafka_broker: Any) -> None:
    kafka = kafka_broker
    root = new_table(tmp_path / "t")
    DeltaTable(str(root)).update({"v": "'u'"}, predicate="id = 1")
    DeltaTable(str(root)).delete("id = 4")
    for fmt in ("json", "debezium"):
        topic = kafka.new_topic(3)
        writer = kafka_batch_writer(kafka.uri(topic, key="id", format=fmt), str(root), table_name="t")
        stream = spark.readStream.format("deltatail").option("startingVersion", 0).load(str(root))
        query = (
            stream.writeStream.foreachBatch(writer)
            .trigger(availableNow=True)
            .option("checkpointLocation", str(tmp_path / f"ck-{fmt}"))
            .start()
        )
        assert query.awaitTermination(120)
        records = kafka.consume(topic)
        check_kafka_records(root, records, fmt)


def check_kafka_records(root: Path, records: list[Any], fmt: str) -> None:
    """Same messages as the sink's encoder makes of the standalone rows; each key's in commit order."""
    from deltatail.sinks.kafka.partitioner import choose_partition

    rows = ChangeFeed(str(root)).read_table(0)
    encoder = ChangeEncoder(
        TableInfo(str(root), str(DeltaTable(str(root)).metadata().id), "t"),
        format=fmt,
        key_columns=("id",),
        events=EventOptions(positions=False),  # Spark rows come without their positions
    )
    expected: Counter[tuple[bytes, str]] = Counter()
    for batch in rows.to_batches():
        for changes in version_batches(batch):
            encoded = encoder.encode(changes)
            expected.update((k, strip(v)) for k, v in zip(encoded.keys, encoded.values, strict=True))
    assert Counter((r.key, strip(r.value)) for r in records) == expected
    by_key: dict[bytes, list[tuple[int, int]]] = {}
    for r in records:
        headers = dict(r.headers)
        assert headers["dt.change_type"] and "dt.spark_batch" in headers
        by_key.setdefault(r.key, []).append((r.partition, int(headers["dt.version"])))
    for key, seen in by_key.items():
        assert {p for p, _ in seen} == {choose_partition(key, 3)}  # Kafka's keyed partitioner, 3 partitions
        assert [v for _, v in seen] == sorted(v for _, v in seen)
    if fmt == "debezium":
        assert any(json.loads(r.value)["op"] == "u" for r in records)


def strip(value: bytes | None) -> str:
    """A message value without the encoding time (Debezium ``ts_ms``, ``ts_us``, ``ts_ns``)."""
    event = json.loads(value or b"null")
    if isinstance(event, dict):
        for unit in ("ts_ms", "ts_us", "ts_ns"):
            event.pop(unit, None)
    return json.dumps(event, sort_keys=True)


@pytest.mark.slow
@KAFKA_IMPORT
def test_kafka_send_failure_is_a_sink_error(spark: SparkSession, tmp_path: Path, kafka_broker: Any) -> None:
    kafka = kafka_broker
    root = new_table(tmp_path / "t")
    topic = kafka.new_topic(1)
    writer = kafka_batch_writer(kafka.uri(topic, key="id", max_message_bytes=64), str(root))
    df = spark.read.format("deltatail").option("startingVersion", 0).load(str(root))
    with pytest.raises(Exception, match="SinkError"):
        writer(df, 0)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("shape", "mode", "sizes"),
    [
        ("dv", "auto", [2] * DV_FILES),
        ("dv", "never", [2 * DV_FILES]),
        ("cdc", "always", None),  # a micro-batch per cdc file, in the order of the commit's actions
        ("cdc", "auto", [80, 6]),
    ],
)
def test_spark_split_commits_micro_batches(
    spark: SparkSession, tmp_path: Path, shape: str, mode: str, sizes: list[int] | None
) -> None:
    """A DELETE by deletion vectors of six files, and CDF UPDATEs of five and four cdc files, one file per trigger."""
    root = dv_delete_table(tmp_path / "t").root if shape == "dv" else cdc_update_table(tmp_path / "t")
    seen: dict[int, pa.Table] = {}

    def collect(df: DataFrame, batch_id: int) -> None:
        seen[batch_id] = arrow(df)

    stream = (
        spark.readStream.format("deltatail")
        .option("startingVersion", 1)
        .option("maxFilesPerTrigger", 1)
        .option("splitCommits", mode)
        .load(str(root))
    )
    query = (
        stream.writeStream.foreachBatch(collect)
        .trigger(availableNow=True)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    assert query.awaitTermination(120)
    if sizes is None:
        files = [a["cdc"]["path"] for v in (1, 2) for a in commit_actions(root, v) if "cdc" in a]
        sizes = [pq.read_metadata(root / unquote(f)).num_rows for f in files]
    assert [seen[b].num_rows for b in sorted(seen)] == sizes
    assert_same_rows(pa.concat_tables([seen[b] for b in sorted(seen)]), load_cdf(root, 1))


@pytest.mark.slow
def test_spark_query_restarted_inside_a_split_cdc_commit_delivers_each_row_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The third micro-batch (version 1's cdc file 2) fails once; the restarted query replays it from the offset log."""
    root = cdc_update_table(tmp_path / "t")
    seen: dict[int, pa.Table] = {}
    failed: list[int] = []

    def collect(df: DataFrame, batch_id: int) -> None:
        if batch_id == 2 and not failed:
            failed.append(batch_id)
            raise RuntimeError("the sink fails once")
        seen[batch_id] = arrow(df)

    def start() -> Any:
        reader = spark.readStream.format("deltatail").option("startingVersion", 1).option("maxFilesPerTrigger", 1)
        writer = reader.option("splitCommits", "always").load(str(root)).writeStream.foreachBatch(collect)
        return writer.trigger(availableNow=True).option("checkpointLocation", str(tmp_path / "ck")).start()

    first = start()
    with pytest.raises(StreamingQueryException, match="the sink fails once"):
        first.awaitTermination(120)
    second = start()
    assert second.awaitTermination(120)
    resumed = json.loads(second.recentProgress[0]["sources"][0]["startOffset"])
    assert (resumed["version"], resumed["index"]) == (1, 2)
    assert sorted(seen) == list(range(CDC_PARTS + 4))
    assert_same_rows(pa.concat_tables([seen[b] for b in sorted(seen)]), load_cdf(root, 1))
