"""The Spark source on Iceberg tables (issue #32): ``spark.read[Stream].format("deltatail").load(iceberg_table)``.

Oracles: pyiceberg's scans of each snapshot (``table.scan(snapshot_id=...)``), whose multiset
difference is every snapshot's net change, and ``IcebergFeed.read_table`` (``deltatail changes``),
itself checked against those scans in ``tests/tailer/test_iceberg_*.py``. Tables are written by
pyiceberg (SQL catalog on SQLite) in ``tmp_path``, with one merge-on-read position delete built from
the spec (``iceberg_tables.commit_deletes``).

Two layers, as ``test_spark_lance.py``: the reader classes driven the way Spark drives them (fast),
then a local[2] Spark session: an ``availableNow`` query in small micro-batches and a restart from
its ``checkpointLocation``.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

pytest.importorskip("pyspark")
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxFiles

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tailer"))  # helpers (tests/ is not a package)
from cdf_helpers import assert_same_rows
from iceberg_tables import commit_deletes, new_table, rows, table_dir
from pyiceberg.table import Table
from pyiceberg.types import StringType

from deltatail.sinks.spark import DeltaTailBatchReader, DeltaTailDataSource, DeltaTailStreamReader, register
from deltatail.sinks.spark.iceberg import IcebergPartition, IcebergStreamPlanner
from deltatail.sinks.spark.schema import arrow_target
from deltatail.state.errors import ConfigError, StateError, VersionGapError, VersionNotFoundError
from deltatail.tailer.iceberg.feed import IcebergFeed

COLUMNS = ["id", "name", "grp"]
#: The version of :func:`build`'s newest snapshot (pyiceberg's ninth sequence number).
LATEST = 9
CHANGE_COLUMNS = ["_change_type", "_commit_version", "_commit_timestamp", "_snapshot_id"]

# ---------------------------------------------------------------- tables --


def build(root: Path) -> Table:
    """Nine snapshots: two appends, a delete, an upsert (an overwrite updating 4, an append of 10), an overwrite
    (pyiceberg commits three snapshots for it here), a position delete."""
    t = new_table(root)
    t.append(rows([1, 2, 3, 4, 5, 6]))
    t.append(rows([7, 8, 9]))
    t.delete("id == 2")
    t.upsert(rows([4, 10], tag="u"))
    t.overwrite(rows([11]), overwrite_filter="id == 7")
    path = next(f for f in t.inspect.files().column("file_path").to_pylist() if "8" in _ids_of(t, f))
    ids = _ids_of(t, path)
    return commit_deletes(t, positions=[(path, ids.index("8"))])


def _ids_of(t: Table, path: str) -> list[str]:
    import pyarrow.parquet as pq

    return [str(i) for i in pq.read_table(path.split("://", 1)[-1]).column("id").to_pylist()]


def scan(t: Table, snapshot_id: int | None) -> Counter[tuple[Any, ...]]:
    if snapshot_id is None:
        return Counter()
    table = t.scan(snapshot_id=snapshot_id).to_arrow()
    return Counter(zip(*(table.column(c).to_pylist() for c in COLUMNS), strict=True))


def net_by_snapshot(got: pa.Table) -> dict[int, tuple[Counter[tuple[Any, ...]], Counter[tuple[Any, ...]]]]:
    """Per snapshot id: (rows deleted, rows inserted), an update's preimage deleted and its postimage inserted."""
    out: dict[int, tuple[Counter[tuple[Any, ...]], Counter[tuple[Any, ...]]]] = {}
    for r in got.to_pylist():
        gone, added = out.setdefault(r["_snapshot_id"], (Counter(), Counter()))
        key = tuple(r[c] for c in COLUMNS)
        (gone if r["_change_type"] in ("delete", "update_preimage") else added)[key] += 1
    return out


def assert_equals_the_scans(t: Table, got: pa.Table) -> None:
    """Every snapshot's rows are exactly the difference of pyiceberg's scans of it and its parent."""
    t = t.refresh()
    found = net_by_snapshot(got)
    snapshots = list(reversed(list(t.inspect.snapshots().to_pylist())))
    chain = sorted(snapshots, key=lambda s: s["committed_at"])
    assert {s["snapshot_id"] for s in chain} == set(found) | {
        s["snapshot_id"] for s in chain if scan(t, s["snapshot_id"]) == scan(t, s["parent_id"])
    }
    for s in chain:
        before, after = scan(t, s["parent_id"]), scan(t, s["snapshot_id"])
        gone, added = found.get(s["snapshot_id"], (Counter(), Counter()))
        assert gone == before - after, s
        assert added == after - before, s


def newest_version(t: Table) -> int:
    """The newest snapshot's sequence number, as pyiceberg reads it (the version the source numbers it with)."""
    return max(s.sequence_number or 0 for s in t.refresh().metadata.snapshots)


def feed_rows(t: Table, start: int | None = None, end: int | None = None, *, snapshot: bool = False) -> pa.Table:
    return IcebergFeed(table_dir(t)).read_table(start, end, initial_snapshot=snapshot)


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Table:
    return build(tmp_path_factory.mktemp("iceberg-spark"))


# ---------------------------------------------------------------- driving a reader like Spark --


def source(path: str, **options: object) -> DeltaTailDataSource:
    return DeltaTailDataSource(
        {"path": path, **{k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in options.items()}}
    )


def stream_reader(path: str, **options: object) -> DeltaTailStreamReader:
    ds = source(path, **options)
    reader = ds.streamReader(ds.schema())
    assert isinstance(reader, DeltaTailStreamReader)
    return reader


def read_rows(reader: DeltaTailStreamReader | DeltaTailBatchReader, parts: Any) -> pa.Table:
    """Read partitions as an executor would: reader and partitions through pickle."""
    remote = pickle.loads(pickle.dumps(reader))
    target = arrow_target(reader.schema)
    batches = [b for p in parts for b in remote.read(pickle.loads(pickle.dumps(p)))]
    return pa.Table.from_batches(batches, schema=target)


Batch = tuple[dict[str, Any], dict[str, Any], pa.Table]


def run_batches(
    reader: DeltaTailStreamReader, start: dict[str, Any], limit: ReadLimit, most: int = 50, *, settle: bool = True
) -> list[Batch]:
    out: list[Batch] = []
    for _ in range(most):
        end = reader.latestOffset(start, limit)
        if end == start:
            return out
        out.append((start, end, read_rows(reader, reader.partitions(start, end))))
        reader.commit(end)
        start = end
    assert not settle, "the stream did not settle"
    return out


def concat(batches: list[Batch], reader: DeltaTailStreamReader) -> pa.Table:
    return pa.concat_tables([b[2] for b in batches]) if batches else arrow_target(reader.schema).empty_table()


def test_schema_has_the_change_columns_and_the_snapshot_id(table: Table) -> None:
    ds = source(table_dir(table))
    names = ds.schema().fieldNames()
    assert names == [*COLUMNS, *CHANGE_COLUMNS]
    assert ds.schema_version == newest_version(table) == LATEST


def test_stream_in_one_snapshot_micro_batches_equals_the_scans(table: Table) -> None:
    reader = stream_reader(table_dir(table), startingVersion=1)
    start = reader.initialOffset()
    assert start["version"] == 1 and not start["snapshot"]
    batches = run_batches(reader, start, ReadMaxFiles(1))
    # each snapshot admitted whole: one snapshot per micro-batch
    assert [(b[0]["version"], b[1]["version"]) for b in batches] == [(v, v + 1) for v in range(1, LATEST + 1)]
    assert all(b[1]["index"] == 0 for b in batches)
    got = concat(batches, reader)
    assert_same_rows(got, feed_rows(table, 1), drop=())
    assert_equals_the_scans(table, got)
    # the merge-on-read position delete (the last snapshot) deletes exactly row 8
    assert [(r["id"], r["_change_type"], r["_commit_version"]) for r in batches[-1][2].to_pylist()] == [
        (8, "delete", LATEST)
    ]


def test_default_start_is_an_initial_snapshot_then_new_snapshots(tmp_path: Path) -> None:
    t = new_table(tmp_path)
    t.append(rows([1, 2]))
    t.append(rows([3]))
    reader = stream_reader(table_dir(t))
    start = reader.initialOffset()
    head = t.refresh().metadata.current_snapshot_id  # the snapshot the offset reads: named in it
    assert start == {"tableId": start["tableId"], "version": 2, "index": 0, "snapshot": True, "baseSnapshotId": head}
    first = run_batches(reader, start, reader.getDefaultReadLimit())
    assert Counter((r["id"], r["_change_type"]) for r in concat(first, reader).to_pylist()) == Counter(
        [(1, "insert"), (2, "insert"), (3, "insert")]
    )
    t.delete("id == 1")
    more = run_batches(reader, first[-1][1], reader.getDefaultReadLimit())
    assert [(r["id"], r["_change_type"], r["_commit_version"]) for r in concat(more, reader).to_pylist()] == [
        (1, "delete", 3)
    ]


def test_restart_from_an_offset_rebuilds_and_repeats_nothing(table: Table) -> None:
    reader = stream_reader(table_dir(table), startingVersion=1)
    first = run_batches(reader, reader.initialOffset(), ReadMaxFiles(1), most=3, settle=False)
    fresh = stream_reader(table_dir(table), startingVersion=1)  # a restarted query: a new driver, the saved offset
    rest = run_batches(fresh, first[-1][1], ReadMaxFiles(1000))
    assert isinstance(fresh.planner, IcebergStreamPlanner) and fresh.planner.rebuilds == 1
    assert_same_rows(pa.concat_tables([b[2] for b in first + rest]), feed_rows(table, 1), drop=())
    assert run_batches(fresh, rest[-1][1], ReadMaxFiles(1000)) == []


def test_partitions_are_one_per_snapshot_and_the_batch_reader_equals_the_feed(table: Table) -> None:
    ds = source(table_dir(table), startingVersion=2, endingVersion=5)
    reader = ds.reader(ds.schema())
    assert isinstance(reader, DeltaTailBatchReader)
    parts = reader.partitions()
    assert [p.plan.version for p in parts if isinstance(p, IcebergPartition)] == [2, 3, 4, 5]
    assert_same_rows(read_rows(reader, parts), feed_rows(table, 2, 5), drop=())


def test_errors(tmp_path: Path) -> None:
    t = new_table(tmp_path / "a")
    t.append(rows([1]))
    with pytest.raises(ConfigError, match="failOnDataLoss=false") as e:
        source(table_dir(t), failOnDataLoss=False).schema()
    assert e.value.table == table_dir(t)
    with pytest.raises(ConfigError, match="maxBytesPerTrigger"):
        source(table_dir(t), maxBytesPerTrigger="1m").schema()
    with pytest.raises(VersionNotFoundError, match="startingVersion 5 is after the latest version 1"):
        stream_reader(table_dir(t), startingVersion=5).initialOffset()
    with pytest.raises(VersionNotFoundError, match="no snapshot of the main branch has version 7"):
        source(table_dir(t), endingVersion=7).schema()


def test_a_rollback_of_main_past_the_stream_is_a_state_error(tmp_path: Path) -> None:
    t = new_table(tmp_path)
    t.append(rows([1]))
    first_id = t.refresh().metadata.current_snapshot_id
    t.append(rows([2]))
    reader = stream_reader(table_dir(t), startingVersion=1)
    done = run_batches(reader, reader.initialOffset(), ReadMaxFiles(1000))
    assert first_id is not None
    t.manage_snapshots().set_current_snapshot(first_id).commit()
    t.refresh().append(rows([3]))
    with pytest.raises(StateError, match="no longer on the main branch"):
        reader.latestOffset(done[-1][1], ReadMaxFiles(1000))


def test_an_expired_parent_is_a_version_gap(tmp_path: Path) -> None:
    t = new_table(tmp_path)
    for i in range(3):
        t.append(rows([i]))
    snaps = t.refresh().metadata.snapshots
    t.maintenance.expire_snapshots().by_id(snaps[0].snapshot_id).commit()
    reader = stream_reader(table_dir(t), startingVersion=1)
    with pytest.raises(VersionGapError, match="expired"):
        reader.latestOffset(reader.initialOffset(), ReadMaxFiles(1000))


# ---------------------------------------------------------------- a real Spark session --


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java: no java on PATH and no JAVA_HOME")
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # loopback only, also for the JVM
    os.environ["PYSPARK_PYTHON"] = sys.executable  # executors must import deltatail from this venv
    session = (
        SparkSession.builder.master("local[2]")
        .appName("deltatail-iceberg-tests")
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


@pytest.mark.slow
def test_spark_available_now_then_restart_from_the_checkpoint(spark: SparkSession, tmp_path: Path) -> None:
    """availableNow in one-snapshot micro-batches, then more snapshots, then the same checkpoint again, twice."""
    t = build(tmp_path / "t")
    seen: dict[int, pa.Table] = {}

    def collect(df: DataFrame, batch_id: int) -> None:
        seen[batch_id] = df.toArrow()  # a replayed batch id replaces its first attempt

    def run() -> None:
        stream = spark.readStream.format("deltatail").option("startingVersion", 1).option("maxFilesPerTrigger", 1)
        query = (
            stream.load(f"iceberg://{table_dir(t)}")
            .writeStream.foreachBatch(collect)
            .trigger(availableNow=True)
            .option("checkpointLocation", str(tmp_path / "ck"))
            .start()
        )
        assert query.awaitTermination(180)

    run()
    assert len(seen) == LATEST  # one micro-batch per snapshot
    t = t.refresh()
    t.upsert(rows([5, 12], tag="v"))
    newest = newest_version(t)
    assert newest > LATEST
    run()
    assert len(seen) == newest
    run()  # nothing new: the restart adds nothing
    assert len(seen) == newest
    got = pa.concat_tables([seen[b] for b in sorted(seen)])
    assert_same_rows(got, feed_rows(t, 1), drop=())
    assert_equals_the_scans(t, got)


def test_a_later_query_in_the_same_executor_reads_a_new_column(tmp_path: Path) -> None:
    """Executors keep a table's feed between queries: a column added since is read, never left null."""
    t = new_table(tmp_path)
    t.append(rows([1]))
    old = stream_reader(table_dir(t), startingVersion=1)
    assert concat(run_batches(old, old.initialOffset(), ReadMaxFiles(10)), old).num_rows == 1
    with t.update_schema() as u:
        u.add_column("extra", StringType())
    t.append(rows([2]).append_column("extra", pa.array(["e2"])))
    new = stream_reader(table_dir(t), startingVersion=2)
    got = concat(run_batches(new, new.initialOffset(), ReadMaxFiles(10)), new).to_pylist()
    assert [(r["id"], r["extra"], r["_change_type"]) for r in got] == [(2, "e2", "insert")]


def test_offsets_of_another_table_are_a_state_error(table: Table) -> None:
    reader = stream_reader(table_dir(table), startingVersion=1)
    start = reader.initialOffset()
    with pytest.raises(StateError, match="belong to iceberg-other, not to iceberg-") as e:
        reader.latestOffset({**start, "tableId": "iceberg-other"}, ReadMaxFiles(1))
    assert e.value.table == table_dir(table)


CATALOG_READ = """
import pickle, sys
from pyspark.sql.streaming.datasource import ReadMaxFiles
from deltatail.sinks.spark import DeltaTailDataSource
ds = DeltaTailDataSource({"path": "iceberg://catalog:test/db.t", "startingVersion": "1"})
reader = ds.streamReader(ds.schema())
start = reader.initialOffset()
end = reader.latestOffset(start, ReadMaxFiles(10))
remote = pickle.loads(pickle.dumps(reader))
ids = sorted(r["id"] for p in reader.partitions(start, end) for b in remote.read(p) for r in b.to_pylist())
print(end["version"], ids)
"""


@pytest.mark.slow
def test_a_catalog_table_by_name(tmp_path: Path) -> None:
    """``iceberg://catalog:NAME/NS.TABLE``: pyiceberg's catalog configuration (read at import: a process of its own)."""
    t = new_table(tmp_path)
    t.append(rows([1, 2]))
    t.delete("id == 1")
    env = {**os.environ, "PYICEBERG_CATALOG__TEST__TYPE": "sql"}
    env["PYICEBERG_CATALOG__TEST__URI"] = f"sqlite:///{tmp_path}/catalog.db"
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", CATALOG_READ], cwd=root, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "3 [1, 1, 2]"  # insert 1, 2; delete 1


# ---------------------------------------------------------------- a rollback while the query is stopped --


@pytest.mark.parametrize("version", [1, 2])
def test_a_rollback_while_stopped_is_a_state_error_on_restart(tmp_path: Path, version: int) -> None:
    """The saved offset names the snapshot it reads on from; a restarted driver finds another one there.

    Format v2: after the rollback to snapshot 1 and one append, ``main`` is snapshot 1 then a snapshot of
    sequence number 3 (the offset's version): without the check, the restart would read that snapshot
    against snapshot 1 and never say that the rows of snapshot 2 it delivered are gone. Format v1
    (versions are ordinals): the new snapshot takes ordinal 2, before the offset's version 3, and would
    be skipped.
    """
    t = new_table(tmp_path, version=version)
    t.append(rows([1]))
    first_id = t.refresh().metadata.snapshots[0].snapshot_id
    t.append(rows([2]))
    reader = stream_reader(table_dir(t), startingVersion=1)
    done = run_batches(reader, reader.initialOffset(), ReadMaxFiles(1000))
    saved = done[-1][1]
    second_id = t.refresh().metadata.snapshots[1].snapshot_id
    assert saved == {
        "tableId": saved["tableId"],
        "version": 3,
        "index": 0,
        "snapshot": False,
        "baseSnapshotId": second_id,
    }
    t.manage_snapshots().rollback_to_snapshot(first_id).commit()
    t.refresh().append(rows([3]))
    fresh = stream_reader(table_dir(t), startingVersion=1)  # the query restarted from its checkpoint
    with pytest.raises(StateError, match=f"reads on from snapshot {second_id} \\(version 2\\)") as e:
        fresh.latestOffset(saved, ReadMaxFiles(1000))
    assert "rolled back or reset" in str(e.value) and "new checkpointLocation" in str(e.value)
    assert e.value.table == table_dir(t) and e.value.version == 2
    with pytest.raises(StateError, match=f"snapshot {second_id}"):
        stream_reader(table_dir(t), startingVersion=1).partitions(done[-1][0], saved)  # a replayed batch too


def test_offsets_without_a_snapshot_id_are_read_on_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    t = new_table(tmp_path)
    t.append(rows([1]))
    t.append(rows([2]))
    reader = stream_reader(table_dir(t), startingVersion=1)
    start = reader.initialOffset()
    assert start == {"tableId": start["tableId"], "version": 1, "index": 0, "snapshot": False}  # nothing before it
    old = {"tableId": start["tableId"], "version": 2, "index": 0, "snapshot": False}  # an older deltatail's offset
    got = run_batches(stream_reader(table_dir(t), startingVersion=1), old, ReadMaxFiles(1000))
    assert [r["id"] for b in got for r in b[2].to_pylist()] == [2]
    with pytest.raises(StateError, match="invalid deltatail offset"):
        reader.latestOffset({**old, "baseSnapshotId": "x"}, ReadMaxFiles(1000))


@pytest.mark.slow
def test_spark_restart_after_a_rollback_while_stopped_fails_naming_the_snapshot(
    spark: SparkSession, tmp_path: Path
) -> None:
    t = new_table(tmp_path / "t")
    t.append(rows([1]))
    t.append(rows([2]))
    first_id, second_id = (s.snapshot_id for s in t.refresh().metadata.snapshots)
    seen: list[pa.Table] = []

    def collect(df: DataFrame, batch_id: int) -> None:
        seen.append(df.toArrow())

    def start() -> Any:
        stream = spark.readStream.format("deltatail").option("startingVersion", 1)
        return (
            stream.load(f"iceberg://{table_dir(t)}")
            .writeStream.foreachBatch(collect)
            .trigger(availableNow=True)
            .option("checkpointLocation", str(tmp_path / "ck"))
            .start()
        )

    assert start().awaitTermination(180)
    assert sorted(r["id"] for b in seen for r in b.to_pylist()) == [1, 2]
    t.manage_snapshots().rollback_to_snapshot(first_id).commit()
    t.refresh().append(rows([3]))
    query = start()
    with pytest.raises(Exception, match=f"reads on from snapshot {second_id}") as e:
        query.awaitTermination(180)
    assert "rolled back or reset" in str(e.value)
    assert sorted(r["id"] for b in seen for r in b.to_pylist()) == [1, 2]  # nothing read after the rollback
