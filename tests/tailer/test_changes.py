"""Change rows (issue "Change rows"): :class:`tailer.read.feed.ChangeFeed` against the peer and the protocol.

Oracles, never a value computed by deltatail:

- deltalake 1.6.6 ``DeltaTable.load_cdf`` on tables deltalake itself wrote in ``tmp_path`` with the change
  data feed on (read through :func:`cdf_helpers.peer_copy`, which only works around deltalake's
  undecoded-path gap described in MANIFEST.md). Rows are compared as multisets over every column but
  ``_commit_timestamp``, after casting both sides to one type per logical type.
- deltalake 1.6.6 snapshot scans where ``load_cdf`` cannot be used (CDF off: deltalake refuses): the
  rows of version ``v`` minus those of ``v - 1`` as multisets, which is what the protocol's add/remove
  rule implies once rewrite noise is cancelled; plus the ``numRecords`` statistics of the log (read
  with ``json``) for the raw row counts.
- facts written by hand: rows a test wrote itself, DV row sets it chose, timestamps it set with
  ``os.utime``, the per-commit comment of kernel-rs ``cdf.rs::cdf_with_deletion_vector``.

Behaviours pinned here on purpose (where deltatail and deltalake differ, deltatail follows the rule):

- A MERGE with zero inserted/updated/deleted rows in its (Delta Spark) ``operationMetrics`` and no cdc
  files emits nothing; deltalake emits a delete and an insert of every rewritten row. delta-rs itself
  never commits such a MERGE (it skips the commit), so the commit is hand-built.
- A ``remove`` of a file that carries a DV, with no ``add``, deletes the rows *not* in that DV
  (deltalake emits the DV's rows instead).
- An empty-string partition value is null (protocol, "Partition Value Serialization"); deltalake's
  pyarrow-dataset reader agrees, its DataFusion scan and ``load_cdf`` report ``''``.
- ``_commit_timestamp`` is the commit file's mtime made monotonic, or ``inCommitTimestamp`` where
  in-commit timestamps are enabled.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from cdf_helpers import (
    CHANGE_COLUMNS,
    HandTable,
    Row,
    append_commit,
    assert_same_rows,
    canonical,
    change_rows,
    commit_actions,
    corpus_table,
    inline_dv,
    load_cdf,
    multiset,
    peer_copy,
    snapshot_table,
)
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import DeltaError

from deltatail.state.actions import parse_json_actions
from deltatail.state.changes import check_schema_change, prepare
from deltatail.state.commit import Commit
from deltatail.state.errors import (
    ConfigError,
    DeletionVectorError,
    InvalidLogError,
    MissingFileError,
    SchemaChangeError,
    UnsupportedFeatureError,
    VersionGapError,
    VersionNotFoundError,
)
from deltatail.state.schema import StructType, parse_schema
from deltatail.tailer.log.starts import version_at_or_after
from deltatail.tailer.read.feed import ChangeFeed, ChangeOptions
from deltatail.tailer.read.net_changes import net_changes

CDF_ON = {"delta.enableChangeDataFeed": "true"}
UTC = dt.UTC


# ---------------------------------------------------------------- small helpers


def changes(root: Path, start: int | None = None, end: int | None = None, **options: Any) -> pa.Table:
    """deltatail's change rows of ``root`` for ``start..end``."""
    return ChangeFeed(str(root), options=ChangeOptions(**options)).read_table(start, end)


def of_kind(table: pa.Table, kind: str) -> pa.Table:
    table = canonical(table)
    return table.filter(pc.equal(table["_change_type"], kind))


def data_only(table: pa.Table) -> pa.Table:
    return table.drop_columns([c for c in CHANGE_COLUMNS if c in table.column_names])


def data_rows(table: pa.Table) -> Counter[Row]:
    return multiset(data_only(table), drop=())


def snapshot_rows(root: Path, version: int) -> Counter[Row]:
    return Counter() if version < 0 else multiset(snapshot_table(root, version), drop=())


def values(table: pa.Table, kind: str, column: str = "value") -> list[Any]:
    return sorted(of_kind(table, kind)[column].to_pylist())


def timestamps_by_version(table: pa.Table) -> dict[int, int]:
    """``_commit_version`` -> ``_commit_timestamp`` in epoch ms (one per version, checked)."""
    assert table.schema.field("_commit_timestamp").type == pa.timestamp("us", tz="UTC")
    micros = table["_commit_timestamp"].cast(pa.int64()).to_pylist()
    out: dict[int, int] = {}
    for version, us in zip(table["_commit_version"].to_pylist(), micros, strict=True):
        assert us % 1000 == 0
        assert out.setdefault(version, us // 1000) == us // 1000, f"version {version} has two timestamps"
    return out


def commit_file(root: Path, version: int) -> Path:
    return root / "_delta_log" / f"{version:020d}.json"


def set_mtime(path: Path, ms: int) -> None:
    os.utime(path, ns=(ms * 1_000_000, ms * 1_000_000))


def numrecords_by_path(root: Path, last: int) -> dict[str, int]:
    """``numRecords`` of every file ever added in versions ``0..last``, from the add stats in the log."""
    records: dict[str, int] = {}
    for v in range(last + 1):
        for action in commit_actions(root, v):
            add = action.get("add")
            if add and add.get("stats"):
                records[add["path"]] = json.loads(add["stats"])["numRecords"]
    return records


def rows_touched(root: Path, version: int) -> int:
    """Rows in the data-changing adds and removes of one commit, by their ``numRecords`` statistics."""
    records = numrecords_by_path(root, version)
    total = 0
    for action in commit_actions(root, version):
        for kind in ("add", "remove"):
            file = action.get(kind)
            if file and file.get("dataChange"):
                total += records[file["path"]]
    return total


PEOPLE = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64()), ("region", pa.string())])


def people(rows: list[tuple[int | None, str | None, float | None, str | None]]) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(PEOPLE.names, r, strict=True)) for r in rows], schema=PEOPLE)


def write_history(root: Path, *, partitioned: bool, cdf: bool) -> int:
    """Six versions written by deltalake; returns the last one.

    v0 write (nulls in every column, a null partition), v1 append (one row duplicates a v0 row),
    v2 DELETE, v3 UPDATE, v4 MERGE (one update, one delete, one insert), v5 overwrite.
    """
    write_deltalake(
        str(root),
        people(
            [
                (1, "ann", 1.5, "eu"),
                (2, None, 2.5, "us"),
                (3, "cy", None, "eu"),
                (4, "dee", 4.0, None),
                (None, "nobody", 5.0, "us"),
            ]
        ),
        partition_by=["region"] if partitioned else None,
        configuration=CDF_ON if cdf else None,
    )
    write_deltalake(str(root), people([(1, "ann", 1.5, "eu"), (6, "fay", 6.0, "us")]), mode="append")
    DeltaTable(str(root)).delete("id = 2")
    DeltaTable(str(root)).update(updates={"name": "'renamed'"}, predicate="id = 3")
    source = people([(6, "fay-merged", 9.5, "eu"), (4, None, None, None), (10, "new", 0.0, "us")])
    (
        DeltaTable(str(root))
        .merge(source, "t.id = s.id", source_alias="s", target_alias="t")
        .when_matched_update_all(predicate="s.id = 6")
        .when_matched_delete(predicate="s.id = 4")
        .when_not_matched_insert_all()
        .execute()
    )
    write_deltalake(str(root), people([(20, "over", 1.0, "eu"), (21, None, None, None)]), mode="overwrite")
    last = DeltaTable(str(root)).version()
    assert last == 5
    return int(last)


# ---------------------------------------------------------------- 1. differential against deltalake


@pytest.mark.parametrize("partitioned", [False, True], ids=["flat", "partitioned"])
def test_cdf_on_history_matches_deltalake(tmp_path: Path, partitioned: bool) -> None:
    root = tmp_path / "t"
    last = write_history(root, partitioned=partitioned, cdf=True)
    cdc_versions = {v for v in range(last + 1) if any("cdc" in a for a in commit_actions(root, v))}
    assert {2, 3, 4} <= cdc_versions  # DELETE, UPDATE and MERGE wrote change data files: rule 1 is exercised
    peer = peer_copy(root, tmp_path)
    for v in range(last + 1):
        assert_same_rows(changes(root, v, v), load_cdf(peer, v, v))
    assert_same_rows(changes(root, 0, last), load_cdf(peer, 0, last))
    assert_same_rows(changes(root, 2, 4), load_cdf(peer, 2, 4))
    assert_same_rows(changes(root), load_cdf(peer, 0))
    kinds = set(changes(root)["_change_type"].to_pylist())
    assert kinds == {"insert", "delete", "update_preimage", "update_postimage"}


@pytest.mark.parametrize("partitioned", [False, True], ids=["flat", "partitioned"])
def test_cdf_off_history_follows_add_remove_rule(tmp_path: Path, partitioned: bool) -> None:
    root = tmp_path / "t"
    last = write_history(root, partitioned=partitioned, cdf=False)
    with pytest.raises(DeltaError, match="change data"):
        load_cdf(root, 0)  # deltalake refuses: the expectation comes from its snapshots instead
    for v in range(last + 1):
        before, after = snapshot_rows(root, v - 1), snapshot_rows(root, v)
        raw = changes(root, v, v)
        assert set(raw["_change_type"].to_pylist()) <= {"insert", "delete"}
        inserted, deleted = data_rows(of_kind(raw, "insert")), data_rows(of_kind(raw, "delete"))
        assert inserted - deleted == after - before, f"version {v}"
        assert deleted - inserted == before - after, f"version {v}"
        assert not deleted - before, f"version {v} deletes rows that were not live"
        assert not inserted - after, f"version {v} inserts rows that are not live"
        assert raw.num_rows == rows_touched(root, v), f"version {v}"
        net = changes(root, v, v, net_changes=True)
        assert data_rows(of_kind(net, "insert")) == after - before, f"version {v}"
        assert data_rows(of_kind(net, "delete")) == before - after, f"version {v}"
    assert changes(root, 3, 3).num_rows > 2  # the UPDATE rewrote unchanged rows: raw mode shows them


ODD_PARTITIONS = [
    pytest.param(pa.array(["a b", "plain"]), id="space"),
    pytest.param(pa.array(["a=b", "plain"]), id="equals"),
    pytest.param(pa.array(["a/b", "plain"]), id="slash"),
    pytest.param(pa.array(["100%", "plain"]), id="percent"),
    pytest.param(pa.array(["a:b#c?d", "plain"]), id="colon-hash-question"),
    pytest.param(pa.array(["é中🙂", "plain"]), id="unicode"),
    pytest.param(pa.array([None, "plain"], pa.string()), id="null"),
    pytest.param(pa.array([dt.date(2024, 2, 29), dt.date(1970, 1, 1)]), id="date"),
    pytest.param(
        pa.array(
            [dt.datetime(2024, 1, 2, 3, 4, 5, 123456), dt.datetime(1999, 12, 31, 23, 59, 59)], pa.timestamp("us", "UTC")
        ),
        id="timestamp",
    ),
    pytest.param(
        pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, 6), dt.datetime(2000, 1, 1)], pa.timestamp("us")),
        id="timestamp_ntz",
    ),
    pytest.param(pa.array([True, False]), id="boolean"),
    pytest.param(pa.array([Decimal("12.34"), Decimal("0.50")], pa.decimal128(6, 2)), id="decimal"),
    pytest.param(pa.array([-7, 2**40], pa.int64()), id="long"),
]


@pytest.mark.parametrize("parts", ODD_PARTITIONS)
def test_odd_partition_values_match_deltalake(tmp_path: Path, parts: pa.Array) -> None:
    root = tmp_path / "t"
    first = pa.table(
        {"id": pa.array([1, 2, 3], pa.int64()), "note": pa.array(["x", None, "z"]), "p": parts.take([0, 0, 1])}
    )
    write_deltalake(str(root), first, partition_by=["p"], configuration=CDF_ON)
    write_deltalake(
        str(root), pa.table({"id": pa.array([4], pa.int64()), "note": ["w"], "p": parts.take([0])}), mode="append"
    )
    DeltaTable(str(root)).delete("id = 2")
    DeltaTable(str(root)).update(updates={"note": "'updated'"}, predicate="id = 1")
    peer = peer_copy(root, tmp_path)
    got = changes(root)
    assert_same_rows(got, load_cdf(peer, 0))
    for v in range(4):
        assert_same_rows(changes(root, v, v), load_cdf(peer, v, v))
    # the partition values come back exactly as written (not only as deltalake reads them)
    inserts = of_kind(got, "insert")
    first_rows = inserts.filter(pc.equal(inserts["_commit_version"], 0))
    assert Counter(first_rows["p"].to_pylist()) == Counter(parts.take([0, 0, 1]).to_pylist())


def test_empty_string_partition_value_is_null(tmp_path: Path) -> None:
    root = tmp_path / "t"
    data = pa.table({"id": pa.array([1, 2], pa.int64()), "p": pa.array(["", "plain"])})
    write_deltalake(str(root), data, partition_by=["p"], configuration=CDF_ON)
    DeltaTable(str(root)).delete("id = 1")
    expected = pa.concat_tables(
        [
            change_rows({"id": pa.array([1, 2], pa.int64()), "p": pa.array([None, "plain"])}, "insert", 0),
            change_rows({"id": pa.array([1], pa.int64()), "p": pa.array([None], pa.string())}, "delete", 1),
        ]
    )
    assert_same_rows(changes(root), expected)
    # deltalake is of two minds: its pyarrow-dataset reader follows the protocol ("An empty string for
    # any type translates to a null partition value"); its DataFusion scan and load_cdf report ''.
    assert sorted(DeltaTable(str(root), version=0).to_pyarrow_table()["p"].to_pylist(), key=str) == [None, "plain"]
    assert "" in load_cdf(root, 0)["p"].to_pylist()


def test_timestamp_ntz_columns_match_deltalake(tmp_path: Path) -> None:
    root = tmp_path / "t"
    at = pa.array(
        [dt.datetime(2024, 5, 6, 7, 8, 9, 10), None, dt.datetime(1969, 12, 31, 23, 59, 59)], pa.timestamp("us")
    )
    write_deltalake(str(root), pa.table({"id": pa.array([1, 2, 3], pa.int64()), "at": at}), configuration=CDF_ON)
    DeltaTable(str(root)).delete("id = 2")
    DeltaTable(str(root)).update(updates={"id": "id + 10"}, predicate="id = 3")
    protocol = next(a["protocol"] for a in commit_actions(root, 0) if "protocol" in a)
    assert "timestampNtz" in protocol.get("readerFeatures", [])
    got = changes(root)
    assert got.schema.field("at").type == pa.timestamp("us")  # wall clock: no time zone
    assert_same_rows(got, load_cdf(root, 0))
    assert of_kind(got, "update_preimage")["at"].to_pylist() == [dt.datetime(1969, 12, 31, 23, 59, 59)]


# ---------------------------------------------------------------- no-op MERGE and dataChange=false


SPARK_ZERO_METRICS = {
    "numTargetRowsInserted": "0",
    "numTargetRowsUpdated": "0",
    "numTargetRowsDeleted": "0",
    "numTargetRowsCopied": "3",
    "numSourceRows": "1",
}


@pytest.mark.parametrize(
    ("operation", "metrics", "emits"),
    [
        pytest.param("MERGE", SPARK_ZERO_METRICS, False, id="noop-merge"),
        pytest.param("MERGE", {**SPARK_ZERO_METRICS, "numTargetRowsUpdated": "1"}, True, id="merge-updated-one"),
        pytest.param("MERGE", {**SPARK_ZERO_METRICS, "numTargetRowsDeleted": 2}, True, id="merge-deleted-numeric"),
        pytest.param("MERGE", None, True, id="merge-without-metrics"),
        pytest.param("WRITE", SPARK_ZERO_METRICS, True, id="not-a-merge"),
    ],
)
def test_noop_merge_emits_nothing(tmp_path: Path, operation: str, metrics: dict[str, Any] | None, emits: bool) -> None:
    root = tmp_path / "t"
    rows = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "name": ["a", "b", "c"]})
    write_deltalake(str(root), rows, configuration=CDF_ON)
    # delta-rs never commits a MERGE that changes nothing: the version does not move.
    source = pa.table({"id": pa.array([99], pa.int64()), "name": ["zz"]})
    DeltaTable(str(root)).merge(
        source, "t.id = s.id", source_alias="s", target_alias="t"
    ).when_matched_update_all().execute()
    assert DeltaTable(str(root)).version() == 0
    # So the rewrite a no-op MERGE makes (Delta Spark writes these) is built by hand: the one data file
    # is removed and re-added under a new name with the same rows, and no cdc file.
    (add,) = [a["add"] for a in commit_actions(root, 0) if "add" in a]
    shutil.copyfile(root / add["path"], root / "rewritten.parquet")
    info: dict[str, Any] = {"timestamp": add["modificationTime"] + 1000, "operation": operation}
    if metrics is not None:
        info["operationMetrics"] = metrics
    version = append_commit(
        root,
        [
            {"commitInfo": info},
            {
                "remove": {
                    "path": add["path"],
                    "deletionTimestamp": 1,
                    "dataChange": True,
                    "partitionValues": {},
                    "size": add["size"],
                }
            },
            {"add": {**add, "path": "rewritten.parquet", "dataChange": True}},
        ],
    )
    rewrite = pa.concat_tables([change_rows(rows, "delete", version), change_rows(rows, "insert", version)])
    # deltalake emits the rewritten rows as a delete and an insert, whatever the metrics say.
    assert_same_rows(load_cdf(root, version, version), rewrite)
    got = changes(root, version, version)
    if emits:
        assert_same_rows(got, rewrite)
    else:
        assert got.num_rows == 0
    assert_same_rows(changes(root, 0, 0), change_rows(rows, "insert", 0))


@pytest.mark.parametrize("cdf", [True, False], ids=["cdf-on", "cdf-off"])
def test_data_change_false_emits_nothing(tmp_path: Path, cdf: bool) -> None:
    root = tmp_path / "t"
    for i in range(3):
        chunk = pa.table({"id": pa.array([i, i + 10], pa.int64())})
        write_deltalake(str(root), chunk, mode="append", configuration=CDF_ON if cdf else None)
    DeltaTable(str(root)).optimize.compact()
    assert DeltaTable(str(root)).version() == 3
    files = [a[kind] for a in commit_actions(root, 3) for kind in ("add", "remove") if kind in a]
    assert len(files) == 4 and all(f["dataChange"] is False for f in files)  # OPTIMIZE: 3 removes, 1 add
    assert snapshot_rows(root, 3) == snapshot_rows(root, 2)
    assert changes(root, 3, 3).num_rows == 0
    assert changes(root, 3, 3, net_changes=True).num_rows == 0
    if cdf:
        assert load_cdf(root, 3, 3).num_rows == 0
        assert_same_rows(changes(root, 0, 3), load_cdf(root, 0, 3))


# ---------------------------------------------------------------- 2. _commit_timestamp

ID_FIELD = [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]


def id_rows(*ids: int) -> pa.Table:
    return pa.table({"id": pa.array(list(ids), pa.int64())})


def test_commit_timestamps_of_a_deltalake_history_are_monotonic(tmp_path: Path) -> None:
    root = tmp_path / "t"
    last = write_history(root, partitioned=False, cdf=True)
    got = timestamps_by_version(changes(root))
    assert sorted(got) == list(range(last + 1))  # every version has rows
    mtimes = [commit_file(root, v).stat().st_mtime_ns // 1_000_000 for v in range(last + 1)]
    floor = -1
    for v in range(last + 1):
        assert got[v] == max(mtimes[v], floor + 1), f"version {v}"  # Delta Spark's monotonization rule
        floor = got[v]
    assert all(got[v] < got[v + 1] for v in range(last))
    # Rewind commit 3's file to a minute before commit 2's: it is reported one millisecond after commit 2.
    set_mtime(commit_file(root, 3), mtimes[2] - 60_000)
    rewound = timestamps_by_version(changes(root))
    assert rewound[3] == rewound[2] + 1 and rewound[2] == got[2]
    assert all(rewound[v] < rewound[v + 1] for v in range(last))


def test_commit_timestamp_is_mtime_made_monotonic(tmp_path: Path) -> None:
    table = HandTable(tmp_path / "t", ID_FIELD, reader_features=())
    base = 1_700_000_000_000
    # v2 is older than v1 on disk, v3 equals what v2 becomes: both are pushed to predecessor + 1 ms.
    mtimes = [base, base + 10_000, base + 4_000, base + 10_001, base + 20_000]
    for i, mtime in enumerate(mtimes):
        table.commit([table.add(f"f{i}.parquet", id_rows(i))], mtime_ms=mtime)
    expected = [base, base + 10_000, base + 10_001, base + 10_002, base + 20_000]
    assert timestamps_by_version(changes(table.root)) == dict(enumerate(expected))
    # Starting in the middle, the commit before the range is the floor.
    assert timestamps_by_version(changes(table.root, 2, 4)) == {2: base + 10_001, 3: base + 10_002, 4: base + 20_000}
    # The rule does not use commitInfo.timestamp (which HandTable sets to other values).
    infos = [
        next(a["commitInfo"]["timestamp"] for a in commit_actions(table.root, v) if "commitInfo" in a) for v in range(5)
    ]
    assert all(info != want for info, want in zip(infos, expected, strict=True))


@pytest.mark.parametrize("enabled", [True, False], ids=["ict-enabled", "ict-not-enabled"])
def test_commit_timestamp_uses_in_commit_timestamps_where_enabled(tmp_path: Path, enabled: bool) -> None:
    configuration = {"delta.enableInCommitTimestamps": "true"} if enabled else {}
    table = HandTable(tmp_path / "t", ID_FIELD, configuration=configuration, reader_features=())
    icts = [1_500_000_000_000, 1_500_000_500_000, 1_600_000_000_000]
    mtimes = [1_700_000_000_000, 1_700_000_000_001, 1_700_000_000_002]
    for i, (ict, mtime) in enumerate(zip(icts, mtimes, strict=True)):
        table.commit([table.add(f"f{i}.parquet", id_rows(i))], mtime_ms=mtime, extra_info={"inCommitTimestamp": ict})
    expected = icts if enabled else mtimes
    assert timestamps_by_version(changes(table.root)) == dict(enumerate(expected))


def test_commit_timestamp_reports_the_ict_of_cdc_ict_table() -> None:
    root = corpus_table("delta-rs/cdc_ict_table")
    got = timestamps_by_version(changes(root, 0, 3))
    icts = {
        v: next(a["commitInfo"]["inCommitTimestamp"] for a in commit_actions(root, v) if "commitInfo" in a)
        for v in range(4)
    }
    assert {v: got[v] for v in (1, 2, 3)} == {v: icts[v] for v in (1, 2, 3)}  # v0 creates the table: no rows
    # version 1's ICT is 2023-05-12, three years before its commitInfo.timestamp (MANIFEST.md caveat)
    epoch = dt.datetime(1970, 1, 1, tzinfo=UTC)
    assert got[1] == (dt.datetime(2023, 5, 12, 6, 50, 6, 883000, tzinfo=UTC) - epoch) // dt.timedelta(milliseconds=1)


# ---------------------------------------------------------------- starting points


def test_starting_timestamp_picks_the_first_commit_at_or_after_it(tmp_path: Path) -> None:
    table = HandTable(tmp_path / "t", ID_FIELD, reader_features=())
    mtimes = [1_700_000_000_000, 1_700_000_060_000, 1_700_000_120_000, 1_700_000_180_000]
    for i, mtime in enumerate(mtimes):
        table.commit([table.add(f"f{i}.parquet", id_rows(i))], mtime_ms=mtime)
    feed = ChangeFeed(str(table.root))
    assert version_at_or_after(feed.log, mtimes[0] - 5) == 0
    assert version_at_or_after(feed.log, mtimes[1]) == 1
    assert version_at_or_after(feed.log, mtimes[1] + 1) == 2
    assert version_at_or_after(feed.log, mtimes[3]) == 3
    got = feed.read_table(starting_timestamp_ms=mtimes[1] + 1)
    assert sorted(got["_commit_version"].to_pylist()) == [2, 3]
    assert sorted(got["id"].to_pylist()) == [2, 3]
    with pytest.raises(VersionNotFoundError, match="no commit at or after"):
        version_at_or_after(feed.log, mtimes[3] + 1)
    with pytest.raises(VersionNotFoundError):
        feed.read_table(starting_timestamp_ms=mtimes[3] + 1)


def test_starting_timestamp_uses_in_commit_timestamps(tmp_path: Path) -> None:
    table = HandTable(
        tmp_path / "t", ID_FIELD, configuration={"delta.enableInCommitTimestamps": "true"}, reader_features=()
    )
    icts = [1_000_000, 2_000_000, 3_000_000]
    for i, ict in enumerate(icts):
        # mtimes run backwards: only the ICTs are ordered
        table.commit(
            [table.add(f"f{i}.parquet", id_rows(i))],
            mtime_ms=1_800_000_000_000 - i,
            extra_info={"inCommitTimestamp": ict},
        )
    feed = ChangeFeed(str(table.root))
    assert version_at_or_after(feed.log, 1_500_000) == 1
    assert version_at_or_after(feed.log, 2_000_000) == 1
    assert version_at_or_after(feed.log, 2_000_001) == 2


def test_initial_snapshot_then_changes(tmp_path: Path) -> None:
    root = tmp_path / "t"
    last = write_history(root, partitioned=True, cdf=True)
    got = changes(root, 2, last)
    assert_same_rows(got, load_cdf(peer_copy(root, tmp_path), 2, last))
    with_snapshot = ChangeFeed(str(root)).read_table(2, last, initial_snapshot=True)
    snap = with_snapshot.filter(pc.equal(with_snapshot["_commit_version"], 2))
    assert set(snap["_change_type"].to_pylist()) == {"insert"}
    assert data_rows(snap) == snapshot_rows(root, 2)  # the live rows at version 2, as inserts
    later = with_snapshot.filter(pc.greater(with_snapshot["_commit_version"], 2))
    assert_same_rows(later, load_cdf(peer_copy(root, tmp_path), 3, last))
    batches = list(ChangeFeed(str(root)).batches(2, last, initial_snapshot=True))
    flags = [(b.start.version, b.start.snapshot) for b in batches]
    assert flags[0] == (2, True) and all(not s for v, s in flags if v > 2)
    assert all(s for v, s in flags if v == 2)
    # Without a starting version, the snapshot is the latest one and nothing follows it.
    latest_only = ChangeFeed(str(root)).read_table(initial_snapshot=True)
    assert set(latest_only["_commit_version"].to_pylist()) == {last}
    assert data_rows(latest_only) == snapshot_rows(root, last)


# ---------------------------------------------------------------- deletion vectors

#: kernel-rs cdf.rs::cdf_with_deletion_vector, its comment per commit (value inserted, value deleted).
KERNEL_RS_DV_STEPS: dict[int, tuple[list[int], list[int]]] = {
    0: (list(range(10)), []),  # Insert 0..=9
    1: ([], [0, 9]),  # Remove [0, 9]: add has a DV, remove has none
    2: ([0, 9], []),  # Restore [0, 9]: remove has a DV, add has none
    3: ([], [0, 1, 4, 5]),  # Remove [0, 1, 4, 5]
    4: ([1, 4], []),  # Restore [1, 4]: both have DVs, the new one is smaller
    5: ([0, 5], [3]),  # Restore [0, 5] and Remove [3]: both have DVs, neither contains the other
    6: ([3], []),  # Restore 3
}


@pytest.mark.parametrize("version", sorted(KERNEL_RS_DV_STEPS))
def test_dv_pairing_in_kernel_rs_cdf_table_with_dv(version: int) -> None:
    root = corpus_table("kernel-rs/cdf-table-with-dv")
    got = changes(root, version, version)
    inserted, deleted = KERNEL_RS_DV_STEPS[version]
    assert values(got, "insert") == inserted
    assert values(got, "delete") == deleted
    assert set(got["_commit_version"].to_pylist()) <= {version}


VALUE_FIELD = [{"name": "value", "type": "long", "nullable": True, "metadata": {}}]
DV_CONFIG = {"delta.enableChangeDataFeed": "true", "delta.enableDeletionVectors": "true"}


def test_dv_pairing_rules_on_hand_built_commits(tmp_path: Path) -> None:
    table = HandTable(tmp_path / "t", VALUE_FIELD, configuration=DV_CONFIG)
    f = "part-0.parquet"
    # DVs in one DV file (offsets 1, then packed after it) and one inline DV.
    dv09, dv019, dv23 = table.file_dvs([{0, 9}, {0, 1, 9}, {2, 3}])
    dv15 = inline_dv({1, 5})
    table.commit([table.add(f, pa.table({"value": pa.array(range(10), pa.int64())}))])  # v0
    table.commit([table.remove(f), table.add(f, dv=dv09)], operation="DELETE")  # v1: DV on the add only
    table.commit([table.remove(f, dv=dv09), table.add(f, dv=dv019)], operation="DELETE")  # v2: DV grows
    table.commit([table.remove(f, dv=dv019), table.add(f, dv=dv15)], operation="MERGE")  # v3: mixed
    table.commit([table.remove(f, dv=dv15), table.add(f)], operation="RESTORE")  # v4: DV on the remove only
    table.commit([table.remove(f), table.add(f, dv=dv23)], operation="DELETE")  # v5
    table.commit([table.remove(f, dv=dv23)], operation="DELETE")  # v6: whole file deleted, it had a DV
    expected: dict[int, tuple[list[int], list[int]]] = {
        0: (list(range(10)), []),
        1: ([], [0, 9]),
        2: ([], [1]),
        3: ([0, 9], [5]),
        4: ([1, 5], []),
        5: ([], [2, 3]),
        6: ([], [0, 1, 4, 5, 6, 7, 8, 9]),  # the rows that were live: not in the DV
    }
    # The fixture is what it claims: deltalake's scan sees exactly these live rows.
    live: set[int] = set()
    for v, (inserted, deleted) in expected.items():
        live = (live | set(inserted)) - set(deleted)
        assert sorted(snapshot_table(table.root, v)["value"].to_pylist()) == sorted(live), f"version {v}"
    for v, (inserted, deleted) in expected.items():
        got = changes(table.root, v, v)
        assert (values(got, "insert"), values(got, "delete")) == (inserted, deleted), f"version {v}"
    # deltalake agrees on the pairs (v0..v5); on v6 it emits the DV's rows {2, 3} instead of the live ones.
    for v in range(6):
        assert_same_rows(changes(table.root, v, v), load_cdf(table.root, v, v))
    assert values(load_cdf(table.root, 6, 6), "delete") == [2, 3]
    # Inside one commit, pair deletes come before restores (emit order of state/changes.py).
    assert changes(table.root, 3, 3)["_change_type"].to_pylist() == ["delete", "insert", "insert"]


def test_pair_without_deletion_vectors_is_invalid(tmp_path: Path) -> None:
    table = HandTable(tmp_path / "t", VALUE_FIELD, configuration=DV_CONFIG)
    f = "part-0.parquet"
    table.commit([table.add(f, pa.table({"value": pa.array(range(3), pa.int64())}))])
    table.commit([table.remove(f), table.add(f)], operation="UPDATE")
    # Through the feed, the commit reader already refuses it (an add and a remove of one logical file).
    with pytest.raises(InvalidLogError) as info:
        changes(table.root)
    assert info.value.version == 1
    assert f in str(info.value) and str(commit_file(table.root, 1)) in str(info.value)
    assert values(changes(table.root, 0, 0), "insert") == [0, 1, 2]  # the version before still reads
    # The planner refuses it on its own too (e.g. for commits read without the duplicate check).
    actions = parse_json_actions(commit_file(table.root, 1).read_bytes())
    commit = Commit.from_actions(1, actions, check_duplicates=False)
    with pytest.raises(InvalidLogError, match="without a deletion vector") as info:
        prepare(commit)
    assert info.value.version == 1 and f in str(info.value)


def test_bad_dv_checksum_names_table_version_data_file_and_dv_file(tmp_path: Path) -> None:
    table = HandTable(tmp_path / "t", VALUE_FIELD, configuration=DV_CONFIG)
    f = "part-0.parquet"
    (dv,) = table.file_dvs([{1}])
    table.commit([table.add(f, pa.table({"value": pa.array(range(3), pa.int64())}))])
    table.commit([table.remove(f), table.add(f, dv=dv)], operation="DELETE")
    assert values(changes(table.root, 1, 1), "delete") == [1]  # intact, it reads
    dv_file = table.dv_file(dv)
    blob = bytearray(dv_file.read_bytes())
    blob[-1] ^= 0xFF  # the last byte of the CRC-32
    dv_file.write_bytes(bytes(blob))
    with pytest.raises(DeletionVectorError, match="CRC-32") as info:
        changes(table.root, 1, 1)
    message = str(info.value)
    assert info.value.version == 1
    for part in (str(table.root), "version 1", f, dv_file.name):
        assert part in message


def test_undecodable_inline_dv_is_a_deletion_vector_error(tmp_path: Path) -> None:
    table = HandTable(tmp_path / "t", VALUE_FIELD, configuration=DV_CONFIG)
    f = "part-0.parquet"
    bad = {**inline_dv({1}), "pathOrInlineDv": "0" * 40, "sizeInBytes": 32}  # zeros: no magic number
    table.commit([table.add(f, pa.table({"value": pa.array(range(3), pa.int64())}))])
    table.commit([table.remove(f), table.add(f, dv=bad)], operation="DELETE")
    with pytest.raises(DeletionVectorError, match="magic") as info:
        changes(table.root)
    assert info.value.version == 1 and f in str(info.value)


# ---------------------------------------------------------------- column mapping


def _cm_field(name: str, type_: str, column_id: int, physical: str) -> dict[str, Any]:
    metadata = {"delta.columnMapping.id": column_id, "delta.columnMapping.physicalName": physical}
    return {"name": name, "type": type_, "nullable": True, "metadata": metadata}


CM_FIELDS = [
    _cm_field("id", "long", 1, "col-5f1e0a"),
    _cm_field("full name", "string", 2, "col-a3b2c1"),
    _cm_field("part", "string", 3, "col-99c0de"),
]


def _cm_file(rows: list[tuple[int, str]], names: tuple[str, str], change_types: list[str] | None = None) -> pa.Table:
    fields = [
        pa.field(names[0], pa.int64(), metadata={"PARQUET:field_id": "1"}),
        pa.field(names[1], pa.string(), metadata={"PARQUET:field_id": "2"}),
    ]
    columns: list[pa.Array] = [pa.array([r[0] for r in rows], pa.int64()), pa.array([r[1] for r in rows])]
    if change_types is not None:
        fields.append(pa.field("_change_type", pa.string()))
        columns.append(pa.array(change_types))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


@pytest.mark.parametrize(
    ("mode", "file_names"),
    [
        pytest.param("name", ("col-5f1e0a", "col-a3b2c1"), id="name"),
        pytest.param("id", ("col-5f1e0a", "col-a3b2c1"), id="id"),
        pytest.param("id", ("written_as_x", "written_as_y"), id="id-resolves-by-field-id"),
    ],
)
def test_column_mapping_modes(tmp_path: Path, mode: str, file_names: tuple[str, str]) -> None:
    configuration = {**CDF_ON, "delta.columnMapping.mode": mode, "delta.columnMapping.maxColumnId": "3"}
    table = HandTable(
        tmp_path / "t",
        CM_FIELDS,
        partition_columns=["part"],
        configuration=configuration,
        reader_features=("columnMapping",),
    )
    px, py = {"col-99c0de": "x"}, {"col-99c0de": "y"}
    table.commit(
        [
            table.add("a.parquet", _cm_file([(1, "Ann"), (2, "Bob")], file_names), partition_values=px),
            table.add("b.parquet", _cm_file([(3, "Cy")], file_names), partition_values=py),
        ]
    )
    cdc = _cm_file([(2, "Bob"), (2, "Bobby")], file_names, ["update_preimage", "update_postimage"])
    table.commit(
        [
            table.remove("a.parquet", partition_values=px),
            table.add("a2.parquet", _cm_file([(1, "Ann"), (2, "Bobby")], file_names), partition_values=px),
            table.cdc("_change_data/c1.parquet", cdc, partition_values=px),
        ],
        operation="UPDATE",
    )
    table.commit([table.remove("b.parquet", partition_values=py)], operation="DELETE")

    def rows(data: list[tuple[int, str, str]], kind: str, version: int) -> pa.Table:
        ids, names, parts = zip(*data, strict=True)
        return change_rows(
            {"id": pa.array(ids, pa.int64()), "full name": list(names), "part": list(parts)}, kind, version
        )

    expected = pa.concat_tables(
        [
            rows([(1, "Ann", "x"), (2, "Bob", "x"), (3, "Cy", "y")], "insert", 0),
            rows([(2, "Bob", "x")], "update_preimage", 1),
            rows([(2, "Bobby", "x")], "update_postimage", 1),
            rows([(3, "Cy", "y")], "delete", 2),
        ]
    )
    got = changes(table.root)
    assert got.column_names[:3] == ["id", "full name", "part"]  # logical names, schema order
    assert_same_rows(got, expected)
    if file_names[0].startswith("col-"):
        # The fixture is a valid column-mapped table: deltalake's scan reads the same live rows.
        assert multiset(snapshot_table(table.root, 2), drop=()) == multiset(
            data_only(rows([(1, "Ann", "x"), (2, "Bobby", "x")], "insert", 2)), drop=()
        )


# ---------------------------------------------------------------- options: require_cdf, schema changes, net changes


def test_require_cdf_refuses_versions_without_cdf(tmp_path: Path) -> None:
    root = tmp_path / "t"
    write_deltalake(str(root), id_rows(1, 2))  # v0: CDF off
    write_deltalake(str(root), id_rows(3), mode="append")  # v1
    DeltaTable(str(root)).alter.set_table_properties(CDF_ON)  # v2
    write_deltalake(str(root), id_rows(4), mode="append")  # v3
    with pytest.raises(InvalidLogError, match="enableChangeDataFeed") as info:
        changes(root, 0, 3, require_cdf=True)
    assert info.value.version == 0 and "version 0" in str(info.value)
    with pytest.raises(InvalidLogError) as info:
        changes(root, 1, 3, require_cdf=True)
    assert info.value.version == 1
    with pytest.raises(DeltaError, match="change data"):
        load_cdf(root, 0, 3)  # deltalake refuses the same range
    assert_same_rows(changes(root, 2, 3, require_cdf=True), load_cdf(root, 2, 3))
    assert changes(root, 0, 3).num_rows == 4  # off by default: the add/remove fallback reads it all


def test_require_cdf_refuses_where_the_corpus_table_turns_cdf_off() -> None:
    root = corpus_table("kernel-rs/table-with-cdf")  # log-only: plan without reading files
    feed = ChangeFeed(str(root), options=ChangeOptions(require_cdf=True))
    planned: list[int] = []
    with pytest.raises(InvalidLogError) as info:
        for plan in feed.plans(0, 4):
            planned.append(plan.context.version)
    assert planned == [0, 1] and info.value.version == 2  # v2 sets enableChangeDataFeed=false
    with pytest.raises(DeltaError, match="version: 2"):
        load_cdf(root, 0, 4)  # deltalake: "Change Data not enabled for version: 2"


def _schema_change(root: Path, new_data: pa.Table) -> None:
    write_deltalake(str(root), pa.table({"id": pa.array([1], pa.int64()), "x": ["a"]}), configuration=CDF_ON)
    write_deltalake(str(root), pa.table({"id": pa.array([2], pa.int64()), "x": ["b"]}), mode="append")
    write_deltalake(str(root), new_data, mode="overwrite", schema_mode="overwrite")  # v2


DROP_X = pa.table({"id": pa.array([7], pa.int64())})
ID_TO_STRING = pa.table({"id": pa.array(["7"]), "x": ["q"]})


@pytest.mark.parametrize(
    ("new_data", "problem"),
    [
        pytest.param(DROP_X, "'x' was dropped", id="drop-column"),
        pytest.param(ID_TO_STRING, "'id' changed type", id="change-type"),
    ],
)
def test_non_additive_schema_change_inside_a_range(tmp_path: Path, new_data: pa.Table, problem: str) -> None:
    root = tmp_path / "t"
    _schema_change(root, new_data)
    with pytest.raises(SchemaChangeError, match=problem) as info:
        changes(root, 0, 2)
    assert info.value.version == 2 and str(commit_file(root, 2)) in str(info.value)
    with pytest.raises(SchemaChangeError):
        changes(root, 2, 2)  # the change is inside even a one-version range
    assert changes(root, 0, 1).num_rows == 2  # the versions before it read normally
    # Allowed, each version's batches carry the schema of that version; the rows version 2 deletes
    # (an overwrite in the new schema) the schema before it, as they were: ids still numbers.
    feed = ChangeFeed(str(root), options=ChangeOptions(allow_non_additive=True))
    by_version: dict[int, list[tuple[Any, str]]] = {}
    for batch in feed.batches(0, 2):
        rows = batch.rows
        by_version.setdefault(batch.start.version, []).extend(
            zip(rows.column("id").to_pylist(), rows.column("_change_type").to_pylist(), strict=True)
        )
    seven = new_data.column("id")[0].as_py()
    versioned = {0: [(1, "insert")], 1: [(2, "insert")], 2: [(1, "delete"), (2, "delete"), (seven, "insert")]}
    expected = {v: sorted(rows, key=str) for v, rows in versioned.items()}
    assert {v: sorted(rows, key=str) for v, rows in by_version.items()} == expected


def test_allowed_column_drop_reads_as_one_table_like_deltalake(tmp_path: Path) -> None:
    root = tmp_path / "t"
    _schema_change(root, DROP_X)
    allowed = changes(root, 0, 2, allow_non_additive=True)
    assert allowed.column_names == ["id", *CHANGE_COLUMNS]  # the newest schema
    assert_same_rows(allowed, load_cdf(root, 0, 2))
    assert values(allowed, "delete", "id") == [1, 2] and values(allowed, "insert", "id") == [1, 2, 7]


def test_allowed_type_change_reads_as_one_table_in_the_newest_schema(tmp_path: Path) -> None:
    """read_table promises "the newest schema of the range"; old rows are cast as the old files are at v2."""
    root = tmp_path / "t"
    _schema_change(root, ID_TO_STRING)
    allowed = changes(root, 0, 2, allow_non_additive=True)
    assert allowed.schema.field("id").type == pa.string()
    expected = pa.concat_tables(
        [
            change_rows({"id": ["1"], "x": ["a"]}, "insert", 0),
            change_rows({"id": ["2"], "x": ["b"]}, "insert", 1),
            change_rows({"id": ["1", "2"], "x": ["a", "b"]}, "delete", 2),
            change_rows({"id": ["7"], "x": ["q"]}, "insert", 2),
        ]
    )
    assert_same_rows(allowed, expected)


def _struct(*fields: dict[str, Any]) -> StructType:
    return parse_schema(json.dumps({"type": "struct", "fields": list(fields)}))


def _f(name: str, type_: Any, physical: str | None = None) -> dict[str, Any]:
    metadata = {} if physical is None else {"delta.columnMapping.physicalName": physical}
    return {"name": name, "type": type_, "nullable": True, "metadata": metadata}


def test_schema_change_check_on_nested_types() -> None:
    point = {"type": "struct", "fields": [_f("x", "long")]}
    point_plus = {"type": "struct", "fields": [_f("x", "long"), _f("y", "long")]}
    old = _struct(
        _f("id", "long"), _f("p", point), _f("ps", {"type": "array", "elementType": point, "containsNull": True})
    )
    grown = _struct(
        _f("id", "long"),
        _f("p", point_plus),
        _f("ps", {"type": "array", "elementType": point_plus, "containsNull": True}),
        _f("new", "string"),
    )
    check_schema_change(old, grown, version=3, allow=False)  # additions at any depth are fine
    shrunk = _struct(_f("id", "long"), _f("p", {"type": "struct", "fields": []}), _f("ps", "string"))
    with pytest.raises(SchemaChangeError, match="'p' changed type") as info:
        check_schema_change(old, shrunk, version=3, allow=False)
    assert info.value.version == 3
    check_schema_change(old, shrunk, version=3, allow=True)
    renamed = _struct(_f("id", "long", physical="col-other"), _f("p", point), _f("ps", "string"))
    with pytest.raises(SchemaChangeError, match="physical name"):
        check_schema_change(_struct(_f("id", "long", physical="col-1")), renamed, version=4, allow=False)


def test_additive_schema_change_carries_nulls(tmp_path: Path) -> None:
    root = tmp_path / "t"
    write_deltalake(str(root), pa.table({"id": pa.array([1, 2], pa.int64())}), configuration=CDF_ON)
    more = pa.table({"id": pa.array([3], pa.int64()), "extra": ["new"]})
    write_deltalake(str(root), more, mode="append", schema_mode="merge")
    got = changes(root)
    assert got.column_names == ["id", "extra", *CHANGE_COLUMNS]
    expected = pa.concat_tables(
        [
            change_rows(
                {"id": pa.array([1, 2], pa.int64()), "extra": pa.array([None, None], pa.string())}, "insert", 0
            ),
            change_rows({"id": pa.array([3], pa.int64()), "extra": ["new"]}, "insert", 1),
        ]
    )
    assert_same_rows(got, expected)
    assert_same_rows(got, load_cdf(root, 0))


def _update_history(root: Path, *, cdf: bool) -> None:
    rows = pa.table({"id": pa.array([1, 2, 3, 4, 5], pa.int64()), "v": ["a", "b", "c", "d", "b"]})
    write_deltalake(str(root), rows, configuration=CDF_ON if cdf else None)
    DeltaTable(str(root)).update(updates={"v": "'changed'"}, predicate="id = 3")


def test_net_changes_cancel_rewrite_noise_and_pair_updates(tmp_path: Path) -> None:
    root = tmp_path / "off"
    _update_history(root, cdf=False)
    assert not any("cdc" in a for a in commit_actions(root, 1))
    raw = changes(root, 1, 1)
    assert raw.num_rows == rows_touched(root, 1) == 10  # the whole file out, the whole file back in
    net = changes(root, 1, 1, net_changes=True)
    assert data_rows(of_kind(net, "delete")) == snapshot_rows(root, 0) - snapshot_rows(root, 1)
    assert data_rows(of_kind(net, "insert")) == snapshot_rows(root, 1) - snapshot_rows(root, 0)
    assert net.num_rows == 2
    keyed = changes(root, 1, 1, net_changes=True, key_columns=("id",))
    assert keyed["_change_type"].to_pylist() == ["update_preimage", "update_postimage"]
    # The same history with CDF on: deltalake's cdc rows are exactly the keyed net changes.
    twin = tmp_path / "on"
    _update_history(twin, cdf=True)
    assert_same_rows(keyed, load_cdf(twin, 1, 1))
    # Net changes never touch commits with cdc files: those rows are the writer's.
    assert_same_rows(changes(twin, 0, 1, net_changes=True), load_cdf(twin, 0, 1))


def test_net_changes_leave_ambiguous_keys_alone() -> None:
    table = pa.table(
        {
            "id": pa.array([1, 1, 1, 2], pa.int64()),
            "v": ["a", "b", "c", "same"],
            "_change_type": ["delete", "insert", "insert", "delete"],
            "_commit_version": pa.array([1, 1, 1, 1], pa.int64()),
            "_commit_timestamp": pa.array([0, 0, 0, 0], pa.timestamp("us", "UTC")),
        }
    )
    out = net_changes(table, ("id",))
    assert Counter(zip(out["id"].to_pylist(), out["_change_type"].to_pylist(), strict=True)) == Counter(
        [(1, "delete"), (1, "insert"), (1, "insert"), (2, "delete")]
    )


def test_net_changes_with_an_unknown_key_column_is_a_config_error(tmp_path: Path) -> None:
    root = tmp_path / "t"
    _update_history(root, cdf=False)
    with pytest.raises(ConfigError, match="nope"):
        changes(root, 1, 1, net_changes=True, key_columns=("nope",))


# ---------------------------------------------------------------- ranges and missing files


def _four_versions(root: Path) -> None:
    write_deltalake(str(root), id_rows(0), configuration=CDF_ON)
    for i in range(1, 4):
        write_deltalake(str(root), id_rows(i), mode="append")


def test_a_range_across_a_missing_commit_is_a_version_gap(tmp_path: Path) -> None:
    root = tmp_path / "t"
    _four_versions(root)
    commit_file(root, 2).unlink()  # cleaned up (or lost) from this copy
    with pytest.raises(VersionGapError) as info:
        changes(root, 0, 3)
    assert info.value.version == 2 and info.value.file == str(commit_file(root, 2))
    assert "commit 2" in str(info.value) and f"{2:020d}.json" in str(info.value)
    with pytest.raises(VersionGapError) as info:
        changes(root, 3, 3)  # the snapshot before the range needs commit 2 too
    assert info.value.version == 2
    assert sorted(changes(root, 0, 1)["id"].to_pylist()) == [0, 1]


def test_versions_outside_the_log_are_not_found(tmp_path: Path) -> None:
    root = tmp_path / "t"
    _four_versions(root)
    with pytest.raises(VersionNotFoundError, match="after the latest version 3"):
        changes(root, 4)
    with pytest.raises(VersionNotFoundError, match="ending version 9"):
        changes(root, 0, 9)


def _cleaned_up(root: Path) -> None:
    """Versions 0..3 with a checkpoint at 2; commits 0 and 1 cleaned up."""
    write_deltalake(str(root), id_rows(0), configuration=CDF_ON)
    for i in (1, 2):
        write_deltalake(str(root), id_rows(i), mode="append")
    DeltaTable(str(root)).create_checkpoint()
    write_deltalake(str(root), id_rows(3), mode="append")
    for v in (0, 1):
        commit_file(root, v).unlink()


def test_a_range_starting_before_a_cleaned_up_log_is_not_found(tmp_path: Path) -> None:
    root = tmp_path / "t"
    _cleaned_up(root)
    with pytest.raises(VersionNotFoundError):
        changes(root, 1, 3)
    with pytest.raises(DeltaError, match="Invalid table version: 1"):
        load_cdf(root, 1)  # deltalake refuses too
    assert_same_rows(changes(root, 3, 3), load_cdf(root, 3, 3))


def test_a_range_can_start_at_the_first_commit_the_log_holds(tmp_path: Path) -> None:
    """Commit 2 and the checkpoint at 2 are there: deltalake reads from 2 (delta-rs asserts the same on
    the corpus table delta-rs/checkpoint-cdf-table, see test_changes_corpus.py)."""
    root = tmp_path / "t"
    _cleaned_up(root)
    expected = load_cdf(root, 2, 3)
    assert_same_rows(
        expected, pa.concat_tables([change_rows(id_rows(2), "insert", 2), change_rows(id_rows(3), "insert", 3)])
    )
    assert_same_rows(changes(root, 2, 3), expected)


def test_missing_data_cdc_and_dv_files(tmp_path: Path) -> None:
    root = tmp_path / "t"
    write_deltalake(str(root), id_rows(1, 2, 3), configuration=CDF_ON)
    DeltaTable(str(root)).delete("id = 2")
    (cdc,) = [a["cdc"]["path"] for a in commit_actions(root, 1) if "cdc" in a]
    (root / cdc).unlink()
    with pytest.raises(MissingFileError) as info:
        changes(root, 1, 1)
    assert info.value.file == str(root / cdc) and info.value.version == 1
    with pytest.raises(MissingFileError):
        list(ChangeFeed(str(root)).batches(1, 1))  # the streaming entry point says the same
    (add,) = [a["add"]["path"] for a in commit_actions(root, 0) if "add" in a]
    (root / add).unlink()
    with pytest.raises(MissingFileError) as info:
        changes(root, 0, 0)
    assert info.value.file == str(root / add) and info.value.version == 0

    table = HandTable(tmp_path / "dv", VALUE_FIELD, configuration=DV_CONFIG)
    (dv,) = table.file_dvs([{0}])
    table.commit([table.add("part-0.parquet", pa.table({"value": pa.array([5, 6], pa.int64())}))])
    table.commit([table.remove("part-0.parquet"), table.add("part-0.parquet", dv=dv)], operation="DELETE")
    table.dv_file(dv).unlink()
    with pytest.raises(MissingFileError) as info:
        changes(table.root, 1, 1)
    assert info.value.file == str(table.dv_file(dv)) and "part-0.parquet" in str(info.value)


def test_unsupported_reader_feature_in_a_range(tmp_path: Path) -> None:
    table = HandTable(tmp_path / "t", VALUE_FIELD, configuration=DV_CONFIG)
    table.commit([table.add("a.parquet", pa.table({"value": pa.array([1], pa.int64())}))])
    upgrade = {
        "protocol": {
            "minReaderVersion": 3,
            "minWriterVersion": 7,
            "readerFeatures": ["deletionVectors", "futureFeatureX"],
            "writerFeatures": ["deletionVectors", "futureFeatureX"],
        }
    }
    table.commit([upgrade, table.add("b.parquet", pa.table({"value": pa.array([2], pa.int64())}))])
    feed = ChangeFeed(str(table.root))
    with pytest.raises(UnsupportedFeatureError) as info:
        feed.read_table(0, 1)
    assert info.value.features == frozenset({"futureFeatureX"}) and info.value.version == 1
    assert values(feed.read_table(0, 0), "insert") == [1]


def test_remove_without_partition_values_takes_them_from_the_live_file(tmp_path: Path) -> None:
    fields = [*VALUE_FIELD, {"name": "p", "type": "string", "nullable": True, "metadata": {}}]
    table = HandTable(tmp_path / "t", fields, partition_columns=["p"], configuration=CDF_ON, reader_features=())
    data = pa.table({"value": pa.array([1, 2], pa.int64())})
    table.commit([table.add("p=x/a.parquet", data, partition_values={"p": "x"})])
    table.commit([table.remove("p=x/a.parquet", with_partition_values=False)], operation="DELETE")
    expected = change_rows({"value": pa.array([1, 2], pa.int64()), "p": ["x", "x"]}, "delete", 1)
    assert_same_rows(changes(table.root, 1, 1), expected)
    # A remove of a file that is not live, without partition values, cannot be completed.
    table.commit([table.remove("p=x/a.parquet", with_partition_values=False)], operation="DELETE")
    with pytest.raises(InvalidLogError, match="no partitionValues") as info:
        changes(table.root, 2, 2)
    assert info.value.version == 2 and "p=x/a.parquet" in str(info.value)
