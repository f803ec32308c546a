"""The Spark source on Lance datasets (issue #22): ``spark.read[Stream].format("deltatail").load(lance_dataset)``.

Oracle: ``LanceFeed(path).read_table`` (``deltatail changes`` on the dataset), itself checked version by
version against pylance's scans in ``tests/tailer/test_lance_changes.py``; and, for the data-loss and
schema cases, what pylance says the dataset holds. Datasets are written by pylance in ``tmp_path``.

Two layers, as ``test_spark.py``: the reader classes driven the way Spark drives them (offsets,
admission, restarts and errors, fast), then a local Spark session running real queries (batch read,
availableNow with ``maxFilesPerTrigger``, restart from a ``checkpointLocation``).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pytest
from deltalake import write_deltalake

pytest.importorskip("pyspark")
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxFiles

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tailer"))  # helpers (tests/ is not a package)
from cdf_helpers import assert_same_rows
from lance_datasets import rows

from deltatail.sinks.spark import DeltaTailBatchReader, DeltaTailDataSource, DeltaTailStreamReader, register
from deltatail.sinks.spark.lance import LancePartition, LanceStreamPlanner
from deltatail.sinks.spark.options import SourceOptions
from deltatail.sinks.spark.schema import arrow_target
from deltatail.state.errors import (
    ConfigError,
    DataFileError,
    InvalidLogError,
    MissingFileError,
    SchemaChangeError,
    StateError,
    TableNotFoundError,
    VersionGapError,
    VersionNotFoundError,
)
from deltatail.state.lance.manifest import manifest_name
from deltatail.tailer.lance.feed import LanceFeed

# ---------------------------------------------------------------- datasets --


def build(root: Path, *, stable: bool) -> Path:
    """Versions 1..6: a create (3 fragments), an append (2), a sparse delete, an update across fragments,
    a merge-insert (updates and inserts) and the delete of a whole fragment."""
    uri = str(root)
    lance.write_dataset(rows(range(300)), uri, enable_stable_row_ids=stable, max_rows_per_file=100)
    lance.write_dataset(rows(range(300, 360)), uri, mode="append", max_rows_per_file=30)
    lance.dataset(uri).delete("id % 7 = 3")
    lance.dataset(uri).update({"score": "score + 1000"}, where="id < 20 OR id >= 350")
    source = pa.concat_tables([rows(range(100, 106), tag="m", bump=5.0), rows(range(400, 405), tag="m")])
    lance.dataset(uri).merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(source)
    lance.dataset(uri).delete("id >= 300 AND id < 330")
    assert lance.dataset(uri).version == 6
    return root


def append(root: Path, ids: list[int] | range, tag: str = "a") -> None:
    lance.write_dataset(rows(ids, tag=tag), str(root), mode="append")


def feed_rows(root: Path, start: int = 1, end: int | None = None, *, snapshot: bool = False) -> pa.Table:
    return LanceFeed(str(root)).read_table(start, end, initial_snapshot=snapshot)


# ---------------------------------------------------------------- driving a reader like Spark --


def source(path: Path | str, **options: object) -> DeltaTailDataSource:
    return DeltaTailDataSource(
        {"path": str(path), **{k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in options.items()}}
    )


def stream_reader(path: Path | str, *, check_seconds: float = 0.0, **options: object) -> DeltaTailStreamReader:
    ds = source(path, **options)
    reader = ds.streamReader(ds.schema())
    assert isinstance(reader, DeltaTailStreamReader)
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
    reader: DeltaTailStreamReader, start: dict[str, Any], limit: ReadLimit | None = None, most: int = 200
) -> list[Batch]:
    out: list[Batch] = []
    limit = limit or reader.getDefaultReadLimit()
    for _ in range(most):
        end = reader.latestOffset(start, limit)
        if end == start:
            return out
        out.append((start, end, read_rows(reader, reader.partitions(start, end))))
        reader.commit(end)
        start = end
    raise AssertionError("the stream did not settle")


def all_rows(batches: list[Batch], reader: DeltaTailStreamReader) -> pa.Table:
    target = arrow_target(reader.schema)
    return pa.concat_tables([b[2] for b in batches]) if batches else target.empty_table()


def pos(offset: dict[str, Any]) -> tuple[int, bool, int]:
    return offset["version"], not offset["snapshot"], offset["index"]


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("lance-spark")
    return {name: build(base / name, stable=name == "stable") for name in ("plain", "stable")}


# ---------------------------------------------------------------- options and detection --


def test_lance_is_detected_by_layout_prefix_or_option(datasets: dict[str, Path], tmp_path: Path) -> None:
    root = datasets["plain"]
    expected = (
        "struct<id:bigint,name:string,score:double,_change_type:string,_commit_version:bigint,"
        "_commit_timestamp:timestamp>"
    )
    for ds in (source(root), source(f"lance://{root}"), source(root, format="lance"), source(root, FORMAT="Lance")):
        assert ds.schema().simpleString() == expected
        assert ds.source_options().table_format == "lance"
    with pytest.raises(TableNotFoundError):  # told it is a Delta table: there is none
        source(root, format="delta").schema()
    with pytest.raises(TableNotFoundError):  # told it is a Lance dataset: there is none
        source(tmp_path, format="lance").schema()
    assert SourceOptions.parse({"path": str(tmp_path)}).resolved().table_format != "lance"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"format": "hudi"}, "neither delta nor iceberg nor lance"),
        ({"format": "delta", "lance": "prefix"}, "lance:// path"),
        ({"netChanges": "true"}, "netChanges applies to Delta tables"),
        ({"netChanges": "true", "keyColumns": "id"}, "netChanges, keyColumns"),
        ({"maxBytesPerTrigger": "1m"}, "maxBytesPerTrigger applies to Delta"),
    ],
)
def test_delta_only_and_invalid_options_are_config_errors(
    datasets: dict[str, Path], options: dict[str, str], message: str
) -> None:
    path = f"lance://{datasets['plain']}" if options.pop("lance", None) else datasets["plain"]
    with pytest.raises(ConfigError, match=message):
        source(path, **options).source_options()


def test_lance_mode_specific_options(datasets: dict[str, Path]) -> None:
    root = datasets["plain"]
    ds = source(root, endingVersion=3)
    with pytest.raises(ConfigError, match="batch reads"):
        ds.streamReader(ds.schema())
    ds = source(root, startingVersion="latest")
    with pytest.raises(ConfigError, match="streams"):
        ds.reader(ds.schema())
    with pytest.raises(VersionNotFoundError):
        source(root, endingVersion=99).schema()


# ---------------------------------------------------------------- the stream reader without Spark --


@pytest.mark.parametrize("name", ["plain", "stable"])
def test_stream_in_small_micro_batches_equals_the_feed(datasets: dict[str, Path], name: str) -> None:
    root = datasets[name]
    reader = stream_reader(root, startingVersion=1, maxFilesPerTrigger=2)
    start = reader.initialOffset()
    assert re.fullmatch(r"lance-[0-9a-f]{32}", start["tableId"])  # a valid topic and file name
    assert start == {"tableId": start["tableId"], "version": 1, "index": 0, "snapshot": False}
    batches = run_batches(reader, start)
    assert_same_rows(all_rows(batches, reader), feed_rows(root), drop=())
    assert all(pos(b[0]) < pos(b[1]) for b in batches) and batches[-1][1]["version"] == 7
    assert len(batches) > 6 and reader.planner.rebuilds == 1
    # A micro-batch ends inside a version only where that version has no update pairs.
    feed = LanceFeed(str(root))
    for _, end, _ in batches:
        if end["index"]:
            plan = next(feed.plans(end["version"], end["version"]))
            assert not any(t.change_type.startswith("update") for t in plan.tasks)
    kinds = set(all_rows(batches, reader).column("_change_type").to_pylist())
    updates = {"update_preimage", "update_postimage"} if name == "stable" else set()
    assert kinds == {"insert", "delete"} | updates


def test_default_start_is_the_initial_snapshot_then_changes(tmp_path: Path) -> None:
    root = build(tmp_path / "ds", stable=False)
    reader = stream_reader(root)
    start = reader.initialOffset()
    assert (start["version"], start["snapshot"]) == (6, True)
    append(root, [1000, 1001])
    got = all_rows(run_batches(reader, start, ReadMaxFiles(1)), reader)
    assert_same_rows(got, feed_rows(root, 6, snapshot=True), drop=())
    live = lance.dataset(str(root)).to_table()
    assert sorted(got.column("id").to_pylist()) == sorted(live.column("id").to_pylist())


def test_latest_timestamp_and_too_new_starts(tmp_path: Path) -> None:
    root = build(tmp_path / "ds", stable=False)
    reader = stream_reader(root, startingVersion="latest")
    start = reader.initialOffset()
    assert (start["version"], start["snapshot"]) == (7, False)
    assert reader.latestOffset(start, ReadAllAvailable()) == start
    append(root, [1000])
    assert all_rows(run_batches(reader, start), reader).column("id").to_pylist() == [1000]
    assert stream_reader(root, startingTimestamp="2000-01-01").initialOffset()["version"] == 1
    assert stream_reader(root, startingTimestamp="2999-01-01").initialOffset()["version"] == 8
    assert stream_reader(root, startingVersion=0).initialOffset()["version"] == 1  # no version 0 in Lance
    with pytest.raises(VersionNotFoundError, match="after the latest"):
        stream_reader(root, startingVersion=9).initialOffset()


def test_restart_mid_version_resumes_exactly(datasets: dict[str, Path]) -> None:
    """Offsets name row tasks: a new reader (a restarted query) from an offset inside version 1 loses nothing."""
    root = datasets["stable"]
    first = stream_reader(root, startingVersion=1, maxFilesPerTrigger=1)
    early = run_batches(first, first.initialOffset(), most=200)[:2]
    boundary = early[-1][1]
    assert (boundary["version"], boundary["index"]) == (1, 2)  # version 1 has three fragments
    second = stream_reader(root, startingVersion=1, maxFilesPerTrigger=1)
    late = run_batches(second, boundary)
    assert second.planner.rebuilds == 1
    assert all(pos(b[0]) < pos(b[1]) for b in early + late)
    assert_same_rows(pa.concat_tables([b[2] for b in early + late]), feed_rows(root), drop=())


def test_available_now_never_reads_past_the_prepared_version(tmp_path: Path) -> None:
    root = build(tmp_path / "ds", stable=False)
    reader = stream_reader(root, startingVersion=5)
    start = reader.initialOffset()
    append(root, [1000])
    reader.prepareForTriggerAvailableNow()
    append(root, [2000])
    batches = run_batches(reader, start)
    assert batches[-1][1]["version"] == 8
    assert_same_rows(all_rows(batches, reader), feed_rows(root, 5, 7), drop=())


def test_idle_polls_do_not_list_the_versions(tmp_path: Path) -> None:
    root = build(tmp_path / "ds", stable=False)
    reader = stream_reader(root, startingVersion=1, check_seconds=3600)
    start = run_batches(reader, reader.initialOffset())[-1][1]
    planner = reader.planner
    assert isinstance(planner, LanceStreamPlanner)
    listed: list[int] = []
    real = planner.dataset.list_versions

    def counting() -> Any:
        listed.append(1)
        return real()

    planner.dataset.list_versions = counting  # type: ignore[method-assign]
    assert all(reader.latestOffset(start, ReadAllAvailable()) == start for _ in range(20))
    append(root, [1000])
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end["version"] == 8 and not listed


def test_additive_schema_change_stops_after_earlier_rows_and_restart_picks_it_up(tmp_path: Path) -> None:
    root = build(tmp_path / "ds", stable=False)
    reader = stream_reader(root, startingVersion=6)
    start = run_batches(reader, reader.initialOffset())[-1][1]
    append(root, [1000])
    lance.dataset(str(root)).add_columns({"twice": "id * 2"})
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end["version"] == 8  # version 7 is delivered first
    assert read_rows(reader, reader.partitions(start, end)).column("id").to_pylist() == [1000]
    reader.commit(end)
    with pytest.raises(SchemaChangeError, match=r"'twice' is not in the query's schema.*version 8"):
        reader.latestOffset(end, ReadAllAvailable())
    append_wide = pa.table({**{c: rows([2000]).column(c) for c in ("id", "name", "score")}, "twice": [4000]})
    lance.write_dataset(append_wide, str(root), mode="append")
    restarted = stream_reader(root, startingVersion=1)
    got = all_rows(run_batches(restarted, end), restarted)
    assert got.column("id").to_pylist() == [2000] and got.column("twice").to_pylist() == [4000]


def test_non_additive_schema_change_is_an_error_naming_the_version(tmp_path: Path) -> None:
    root = build(tmp_path / "ds", stable=False)
    reader = stream_reader(root, startingVersion=6)
    start = run_batches(reader, reader.initialOffset())[-1][1]
    lance.dataset(str(root)).drop_columns(["score"])
    for _ in range(2):  # sticky
        with pytest.raises(SchemaChangeError, match="version 7"):
            reader.latestOffset(start, ReadAllAvailable())


def cleanup(root: Path) -> None:
    lance.dataset(str(root)).cleanup_old_versions(older_than=timedelta(0), delete_unverified=True)


def test_data_loss_fails_by_default_and_skips_forward_when_allowed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = build(tmp_path / "ds", stable=False)
    cleanup(root)  # only version 6 is left
    append(root, [1000])
    with pytest.raises(VersionNotFoundError, match="failOnDataLoss=false"):
        stream_reader(root, startingVersion=2).initialOffset()
    reader = stream_reader(root, startingVersion=2, failOnDataLoss=False)
    with caplog.at_level(logging.WARNING, logger="deltatail"):
        got = all_rows(run_batches(reader, reader.initialOffset()), reader)
    assert got.column("id").to_pylist() == [1000]
    assert "failOnDataLoss=false" in caplog.text


def test_data_loss_mid_stream(tmp_path: Path) -> None:
    root = build(tmp_path / "ds", stable=False)
    strict = stream_reader(root, startingVersion=6)
    lenient = stream_reader(root, startingVersion=6, failOnDataLoss=False)
    offsets = [run_batches(r, r.initialOffset())[-1][1] for r in (strict, lenient)]
    append(root, [1000])
    append(root, [2000])
    cleanup(root)  # versions 6 and 7 go: only 8 is left
    with pytest.raises(VersionGapError, match="failOnDataLoss=false"):
        strict.latestOffset(offsets[0], ReadAllAvailable())
    end = lenient.latestOffset(offsets[1], ReadAllAvailable())
    assert end["version"] == 9 and lenient.partitions(offsets[1], end) == []
    lenient.commit(end)
    append(root, [3000])
    assert all_rows(run_batches(lenient, end), lenient).column("id").to_pylist() == [3000]


def test_recreated_dataset_is_refused(tmp_path: Path) -> None:
    root = build(tmp_path / "ds", stable=False)
    reader = stream_reader(root, startingVersion=1)
    start = run_batches(reader, reader.initialOffset())[-1][1]
    shutil.rmtree(root)
    lance.write_dataset(rows(range(5)), str(root))
    with pytest.raises(StateError, match="recreated"):  # the live reader: the dataset is now shorter
        reader.latestOffset(start, ReadAllAvailable())
    with pytest.raises(StateError, match="recreated"):  # a restart
        stream_reader(root).latestOffset(start, ReadAllAvailable())
    with pytest.raises(StateError, match="belong to"):  # an offset of another dataset
        stream_reader(root).latestOffset({**start, "tableId": "lance:/elsewhere"}, ReadAllAvailable())


def test_missing_data_file_fails_the_read(tmp_path: Path) -> None:
    root = build(tmp_path / "ds", stable=False)
    reader = stream_reader(root, startingVersion=1)
    start = reader.initialOffset()
    parts = reader.partitions(start, reader.latestOffset(start, ReadMaxFiles(1)))
    assert len(parts) == 1 and isinstance(parts[0], LancePartition)
    for f in parts[0].tasks[0].fragment.files:
        (root / "data" / f.path).unlink()
    with pytest.raises(MissingFileError, match="data file of fragment"):
        read_rows(reader, parts)


def test_corrupt_data_file_fails_the_read(tmp_path: Path) -> None:
    root = build(tmp_path / "ds", stable=False)
    reader = stream_reader(root, startingVersion=1)
    start = reader.initialOffset()
    parts = reader.partitions(start, reader.latestOffset(start, ReadMaxFiles(1)))
    assert isinstance(parts[0], LancePartition)
    for f in parts[0].tasks[0].fragment.files:
        (root / "data" / f.path).write_bytes(b"not a lance file")
    with pytest.raises(DataFileError, match="pylance cannot read fragment"):
        read_rows(reader, parts)


def test_planning_errors_stop_the_stream_and_stay(tmp_path: Path) -> None:
    root = build(tmp_path / "ds", stable=False)
    reader = stream_reader(root, startingVersion=6)
    start = run_batches(reader, reader.initialOffset())[-1][1]
    before = set((root / "_deletions").iterdir())
    lance.dataset(str(root)).delete("id = 5")
    (new,) = set((root / "_deletions").iterdir()) - before
    new.unlink()
    for _ in range(2):
        with pytest.raises(MissingFileError, match="deletion file") as missing:
            reader.latestOffset(start, ReadAllAvailable())
        assert missing.value.version == 7 and missing.value.file == str(new)
    garbled = build(tmp_path / "garbled", stable=False)
    reader = stream_reader(garbled, startingVersion=6)
    start = run_batches(reader, reader.initialOffset())[-1][1]
    (garbled / "_versions" / manifest_name(7)).write_bytes(b"garbage" * 10)
    with pytest.raises(InvalidLogError, match="version 7"):
        reader.latestOffset(start, ReadAllAvailable())


def test_a_dataset_that_is_not_there(tmp_path: Path) -> None:
    schema = source(build(tmp_path / "ds", stable=False)).schema()
    with pytest.raises(TableNotFoundError):
        DeltaTailStreamReader(SourceOptions(str(tmp_path / "nope"), table_format="lance"), schema).initialOffset()
    reader = stream_reader(tmp_path / "ds")
    reader.initialOffset()
    shutil.rmtree(tmp_path / "ds")
    with pytest.raises(TableNotFoundError):
        reader.prepareForTriggerAvailableNow()
    delta = tmp_path / "delta"
    write_deltalake(str(delta), pa.table({"id": [1]}))
    delta_reader = stream_reader(delta)
    delta_reader.initialOffset()
    shutil.rmtree(delta)
    with pytest.raises(TableNotFoundError):
        delta_reader.prepareForTriggerAvailableNow()
    with pytest.raises(ConfigError, match="object stores"):
        source(tmp_path, **{"storage.aws_region": "x"}).source_options()  # detecting the format needs storage


def test_batch_reader_equals_the_feed(datasets: dict[str, Path]) -> None:
    root = datasets["stable"]
    ds = source(root, startingVersion=2, endingVersion=5)
    reader = ds.reader(ds.schema())
    assert isinstance(reader, DeltaTailBatchReader)
    assert_same_rows(read_rows(reader, reader.partitions()), feed_rows(root, 2, 5), drop=())
    ds = source(root, startingVersion=3, initialSnapshot=True)
    reader = ds.reader(ds.schema())
    assert isinstance(reader, DeltaTailBatchReader)
    assert_same_rows(read_rows(reader, reader.partitions()), feed_rows(root, 3, snapshot=True), drop=())


# ---------------------------------------------------------------- a real Spark session --


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java: no java on PATH and no JAVA_HOME")
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # loopback only, also for the JVM
    os.environ["PYSPARK_PYTHON"] = sys.executable  # executors must import deltatail from this venv
    session = (
        SparkSession.builder.master("local[2]")
        .appName("deltatail-lance-tests")
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
    yield session  # stopped by the session that made it (test_spark.py's, or at exit)


def wait_for(done: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["plain", "stable"])
def test_spark_batch_read_equals_the_feed(spark: SparkSession, datasets: dict[str, Path], name: str) -> None:
    root = datasets[name]
    df = spark.read.format("deltatail").option("startingVersion", 1).load(f"lance://{root}")
    assert_same_rows(df.toArrow(), feed_rows(root), drop=())


@pytest.mark.slow
def test_spark_available_now_with_max_files(spark: SparkSession, datasets: dict[str, Path], tmp_path: Path) -> None:
    root = datasets["stable"]
    batches: dict[int, pa.Table] = {}

    def collect(df: DataFrame, batch_id: int) -> None:
        batches[batch_id] = df.toArrow()

    stream = spark.readStream.format("deltatail").option("startingVersion", 1).option("maxFilesPerTrigger", 3)
    query = (
        stream.load(str(root))
        .writeStream.foreachBatch(collect)
        .trigger(availableNow=True)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    assert query.awaitTermination(120)
    assert len(batches) >= 4
    assert_same_rows(pa.concat_tables([batches[b] for b in sorted(batches)]), feed_rows(root), drop=())


@pytest.mark.slow
def test_spark_restart_from_checkpoint_loses_and_repeats_nothing(spark: SparkSession, tmp_path: Path) -> None:
    """Stopped after two one-fragment micro-batches (inside version 1's three fragments), written to, restarted."""
    root = build(tmp_path / "ds", stable=True)
    seen: dict[int, pa.Table] = {}

    def collect(df: DataFrame, batch_id: int) -> None:
        seen[batch_id] = df.toArrow()  # a replayed batch id replaces its first attempt

    def start() -> Any:
        reader = spark.readStream.format("deltatail").option("startingVersion", 1).option("maxFilesPerTrigger", 1)
        writer = reader.load(str(root)).writeStream.foreachBatch(collect).trigger(processingTime="100 milliseconds")
        return writer.option("checkpointLocation", str(tmp_path / "ck")).start()

    first = start()
    wait_for(lambda: len(seen) >= 2)
    append(root, [1000, 1001])
    first.stop()
    ends = {json.loads(p["sources"][0]["endOffset"])["version"] for p in first.recentProgress}
    lance.dataset(str(root)).update({"name": "'late'"}, where="id = 1000")
    second = start()
    try:
        second.processAllAvailable()
    finally:
        second.stop()
    resumed = json.loads(second.recentProgress[0]["sources"][0]["startOffset"])
    assert resumed["version"] in ends | {1}
    got = pa.concat_tables([seen[b] for b in sorted(seen)])
    assert_same_rows(got, feed_rows(root), drop=())
    assert max(seen) + 1 == len(seen)
