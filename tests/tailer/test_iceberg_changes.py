"""The Iceberg change feed on tables written by pyiceberg: exact rows per snapshot, checked by hand and
against pyiceberg's own scans (the difference of a snapshot's scan and its parent's is the ground truth).
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from iceberg_tables import catalog, commit_deletes, data_files, in_filter, multiset, new_table, rewrite, rows, table_dir
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import DoubleType, LongType, NestedField, StringType

from deltatail.state.errors import (
    ConfigError,
    DataFileError,
    InvalidLogError,
    MissingFileError,
    SchemaChangeError,
    TableNotFoundError,
    UnsafePathError,
    UnsupportedFeatureError,
    VersionGapError,
    VersionNotFoundError,
)
from deltatail.tailer.iceberg.feed import IcebergFeed, IcebergOptions


def changes(table: Table, **options: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = (
        IcebergFeed(table_dir(table), options=IcebergOptions(**options)).read_table().to_pylist()
    )
    return found


def brief(found: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r["_commit_version"], r["_change_type"], r["id"], r["name"]) for r in found]


def test_appends_deletes_overwrites_and_upserts_by_hand(tmp_path: Path) -> None:
    t = new_table(tmp_path)
    t.append(rows([1, 2, 3]))
    t.append(rows([4]))
    t.delete("id == 2")
    t.overwrite(rows([3], tag="x"), overwrite_filter="id == 3")
    t.upsert(rows([4, 5], tag="u"))
    found = brief(changes(t))
    versions = [s.sequence_number or 0 for s in t.snapshots()]
    assert versions == sorted(versions) and len(versions) == len(set(versions))
    v = dict(enumerate(versions))
    assert found[:5] == [
        (v[0], "insert", 1, "n1"),
        (v[0], "insert", 2, "n2"),
        (v[0], "insert", 3, "n3"),
        (v[1], "insert", 4, "n4"),
        (v[2], "delete", 2, "n2"),
    ]
    rest = Counter(found[5:])
    # the overwrite is a delete snapshot then an append snapshot; the upsert rewrites 4 and adds 5
    assert rest[(v[3], "delete", 3, "n3")] == 1
    assert rest[(v[4], "insert", 3, "x3")] == 1
    assert sum(rest.values()) == len(found) - 5
    upserts = [r for r in found[5:] if r[0] >= v[5]]
    assert Counter(upserts) == Counter(
        [(r[0], "delete", 4, "n4") for r in upserts if r[1] == "delete"]
        + [(r[0], "insert", i, n) for r in upserts if r[1] == "insert" for i, n in [(r[2], r[3])]]
    )
    assert {(c, i, n) for _, c, i, n in upserts} == {("delete", 4, "n4"), ("insert", 4, "u4"), ("insert", 5, "u5")}
    every = changes(t)
    assert {r["_snapshot_id"] for r in every} <= {s.snapshot_id for s in t.snapshots()}


def test_a_rewrite_in_one_snapshot_pairs_updates_by_identifier_fields(tmp_path: Path) -> None:
    t = new_table(tmp_path)
    t.append(rows([1, 2, 3]))
    t = rewrite(t, data_files(t), pa.concat_tables([rows([1, 3]), rows([2], "new")]))
    found = changes(t)
    assert [(r["_change_type"], r["id"], r["name"]) for r in found if r["_commit_version"] == 2] == [
        ("update_preimage", 2, "n2"),
        ("update_postimage", 2, "new2"),
    ]
    summary = t.snapshots()[-1].summary
    assert summary is not None and summary.operation.value == "overwrite"


def test_key_option_pairs_updates_where_the_table_has_no_identifier_fields(tmp_path: Path) -> None:
    cat = catalog(tmp_path)
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "name", StringType()))
    t = cat.create_table("db.t", schema, properties={"format-version": "2"})
    arrow = schema.as_arrow()
    t.append(pa.table({"id": pa.array([1, 2, 3], pa.int64()), "name": ["a", "b", "c"]}, schema=arrow))
    t = rewrite(
        t, data_files(t), pa.table({"id": pa.array([1, 2, 4], pa.int64()), "name": ["a", "B", "d"]}, schema=arrow)
    )
    plain = [(r["_change_type"], r["id"], r["name"]) for r in IcebergFeed(table_dir(t)).read_table(2, 2).to_pylist()]
    assert plain == [("delete", 2, "b"), ("delete", 3, "c"), ("insert", 2, "B"), ("insert", 4, "d")]
    keyed = IcebergFeed(table_dir(t), options=IcebergOptions(key_columns=("id",))).read_table(2, 2).to_pylist()
    assert [(r["_change_type"], r["id"], r["name"]) for r in keyed] == [
        ("update_preimage", 2, "b"),
        ("update_postimage", 2, "B"),
        ("delete", 3, "c"),
        ("insert", 4, "d"),
    ]
    with pytest.raises(ConfigError, match="nope"):
        IcebergFeed(table_dir(t), options=IcebergOptions(key_columns=("nope",))).read_table(2, 2)


# -- differential --------------------------------------------------------------------------------


def _scan(t: Table, snapshot_id: int | None, columns: list[str]) -> Counter[tuple[Any, ...]]:
    if snapshot_id is None:
        return Counter()
    found = t.scan(snapshot_id=snapshot_id).to_arrow().to_pylist()
    return Counter(tuple(r.get(c) for c in columns) for r in found)


def _random_history(t: Table, rng: random.Random, steps: int, *, v2: bool) -> None:
    next_id = 0
    evolved = partitioned = False
    for _ in range(steps):
        op = rng.choice(["append", "append", "delete", "overwrite", "upsert", "evolve", "partition"])
        live = t.scan().to_arrow().column("id").to_pylist() if t.current_snapshot() else []
        if op == "append" or not live:
            n = rng.randint(1, 6)
            t.append(_evolved(t, rows(list(range(next_id, next_id + n)), tag=rng.choice("ab"))))
            next_id += n
        elif op == "delete":
            t.delete(in_filter(rng.sample(live, min(len(live), rng.randint(1, 3)))))
        elif op == "overwrite":
            victim = rng.choice(live)
            t.overwrite(_evolved(t, rows([victim], tag="o")), overwrite_filter=f"id == {victim}")
        elif op == "upsert" and v2:
            pick = [*rng.sample(live, min(len(live), 2)), next_id]
            next_id += 1
            t.upsert(_evolved(t, rows(pick, tag=rng.choice("uv"))))
        elif op == "evolve" and not evolved:
            with t.update_schema() as u:
                u.add_column("score", DoubleType())
            evolved = True
        elif op == "partition" and not partitioned:
            with t.update_spec() as u:
                u.add_identity("grp")
            partitioned = True
        else:
            t.delete(f"id >= {max(live)}")


def _evolved(t: Table, table: pa.Table) -> pa.Table:
    if "score" in t.schema().column_names:
        table = table.append_column("score", pa.array([float(i) / 2 for i in table.column("id").to_pylist()]))
    return table


@pytest.mark.slow
@pytest.mark.parametrize(("seed", "version"), [(1, 2), (2, 2), (3, 1), (4, 2)])
def test_every_snapshot_nets_to_the_difference_of_pyiceberg_scans(tmp_path: Path, seed: int, version: int) -> None:
    t = new_table(tmp_path, version)
    _random_history(t, random.Random(seed), 14, v2=version == 2)
    t = t.refresh()
    feed = IcebergFeed(table_dir(t))
    _, ancestry, _ = feed.current()
    found = feed.read_table().to_pylist()
    by_version: dict[int, list[dict[str, Any]]] = {}
    for r in found:
        by_version.setdefault(r["_commit_version"], []).append(r)
    assert len(ancestry.snapshots) == len(t.snapshots())
    parent: int | None = None
    for snap, v in zip(ancestry.snapshots, ancestry.versions, strict=True):
        columns = t.scan(snapshot_id=snap.snapshot_id).projection().column_names
        before, after = _scan(t, parent, columns), _scan(t, snap.snapshot_id, columns)
        mine = by_version.get(v, [])
        gone = multiset([r for r in mine if r["_change_type"] in ("delete", "update_preimage")], columns)
        came = multiset([r for r in mine if r["_change_type"] in ("insert", "update_postimage")], columns)
        assert gone == before - after, (v, snap.operation)
        assert came == after - before, (v, snap.operation)
        parent = snap.snapshot_id
    if version == 1:
        assert ancestry.versions == tuple(range(1, len(ancestry.versions) + 1))


# -- delete files --------------------------------------------------------------------------------


def _file_rows(path: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = pq.read_table(path.split("://", 1)[-1]).to_pylist()
    return found


def test_position_deletes_are_applied_exactly(tmp_path: Path) -> None:
    t = new_table(tmp_path)
    t.append(rows([10, 11, 12, 13, 14]))
    t.append(rows([20, 21]))
    first = next(p for p in data_files(t) if _file_rows(p)[0]["id"] == 10)
    t = commit_deletes(t, positions=[(first, 1), (first, 3)])
    feed = IcebergFeed(table_dir(t))
    latest = feed.current()[1].latest
    assert brief(feed.read_table(latest, latest).to_pylist()) == [
        (latest, "delete", 11, "n11"),
        (latest, "delete", 13, "n13"),
    ]
    # pyiceberg applies position deletes when it scans: it agrees
    assert sorted(t.scan().to_arrow().column("id").to_pylist()) == [10, 12, 14, 20, 21]
    # a later copy-on-write delete of the same file deletes only the rows still live in it
    t.delete("id == 12")
    after = IcebergFeed(table_dir(t)).read_table(latest + 1).to_pylist()
    assert [(r["_change_type"], r["id"]) for r in after] == [("delete", 12)]
    assert sorted(t.scan().to_arrow().column("id").to_pylist()) == [10, 14, 20, 21]
    initial = IcebergFeed(table_dir(t)).read_table(initial_snapshot=True).to_pylist()
    assert sorted(r["id"] for r in initial) == [10, 14, 20, 21]


def test_equality_deletes_apply_only_to_older_rows(tmp_path: Path) -> None:
    t = new_table(tmp_path)
    t.append(rows([1, 2, 3]))
    t.append(rows([2, 4], tag="m"))  # a second 2, older than the deletes too
    t = commit_deletes(t, equality={"id": [2, 4, 99]})
    t.append(rows([2], tag="late"))  # newer than the deletes: live
    feed = IcebergFeed(table_dir(t))
    _, ancestry, _ = feed.current()
    delete_version, last = ancestry.versions[2], ancestry.versions[3]
    assert Counter(brief(feed.read_table(delete_version, delete_version).to_pylist())) == Counter(
        [
            (delete_version, "delete", 2, "n2"),
            (delete_version, "delete", 2, "m2"),
            (delete_version, "delete", 4, "m4"),
        ]
    )
    assert brief(feed.read_table(last, last).to_pylist()) == [(last, "insert", 2, "late2")]
    live = feed.read_table(initial_snapshot=True).to_pylist()
    assert sorted((r["id"], r["name"]) for r in live) == [(1, "n1"), (2, "late2"), (3, "n3")]


def test_equality_deletes_on_two_columns_match_nulls(tmp_path: Path) -> None:
    t = new_table(tmp_path)
    table = rows([1, 2, 3]).set_column(1, "name", pa.array(["a", None, "c"]))
    t.append(table)
    t = commit_deletes(t, equality={"id": [2, 3], "name": [None, "x"]})
    feed = IcebergFeed(table_dir(t))
    latest = feed.current()[1].latest
    assert [(r["_change_type"], r["id"]) for r in feed.read_table(latest, latest).to_pylist()] == [("delete", 2)]


def test_position_deletes_respect_partitions(tmp_path: Path) -> None:
    spec = PartitionSpec(PartitionField(3, 1000, IdentityTransform(), "grp"))
    t = new_table(tmp_path, spec=spec)
    t.append(rows([0, 1, 2, 3, 4, 5]))
    files = data_files(t)
    grp1 = next(p for p in files if _file_rows(p)[0]["grp"] == 1)
    # a delete file in partition grp=1 naming rows of the grp=1 file, and one in grp=2 naming the same file (ignored)
    t = commit_deletes(t, positions=[(grp1, 0)], partition=Record(1))
    t = commit_deletes(t, positions=[(grp1, 1)], partition=Record(2))
    feed = IcebergFeed(table_dir(t))
    _, ancestry, _ = feed.current()
    assert [(r["_change_type"], r["id"]) for r in feed.read_table(ancestry.versions[1]).to_pylist()] == [("delete", 1)]
    # (pyiceberg's scan applies the grp=2 file to the grp=1 data file too, against the spec's partition rule)


# -- refusals ------------------------------------------------------------------------------------


def test_replace_snapshots_deliver_nothing_and_schema_changes_follow_the_delta_rules(tmp_path: Path) -> None:
    t = new_table(tmp_path)
    t.append(rows([1]))
    with t.update_schema() as u:
        u.rename_column("name", "label")
    t.append(
        pa.table(
            {"id": pa.array([2], pa.int64()), "label": ["x"], "grp": pa.array([0], pa.int64())}, t.schema().as_arrow()
        )
    )
    with pytest.raises(SchemaChangeError, match="renamed") as e:
        changes(t)
    assert e.value.version == 2 and e.value.table == table_dir(t)
    feed = IcebergFeed(table_dir(t), options=IcebergOptions(allow_non_additive=True))
    found = [r for b in feed.batches() for r in b.rows.to_pylist()]
    assert [(r["_change_type"], r["id"], r.get("name"), r.get("label")) for r in found] == [
        ("insert", 1, "n1", None),
        ("insert", 2, None, "x"),
    ]


def test_expired_parent_is_a_version_gap_not_a_skip(tmp_path: Path) -> None:
    t = new_table(tmp_path)
    t.append(rows([1]))
    t.append(rows([2]))
    t.append(rows([3]))
    oldest = t.snapshots()[0].snapshot_id
    t.maintenance.expire_snapshots().by_id(oldest).commit()
    feed = IcebergFeed(table_dir(t.refresh()))
    with pytest.raises(VersionGapError, match="expired") as e:
        feed.read_table()
    assert e.value.version == 2
    assert [r["id"] for r in feed.read_table(3).to_pylist()] == [3]
    with pytest.raises(VersionNotFoundError, match="after the latest"):
        feed.read_table(9)
    with pytest.raises(ConfigError, match="before starting version"):
        feed.read_table(3, 2)


def test_v1_table_with_expired_snapshots_is_refused(tmp_path: Path) -> None:
    t = new_table(tmp_path, 1)
    t.append(rows([1]))
    t.append(rows([2]))
    t.maintenance.expire_snapshots().by_id(t.snapshots()[0].snapshot_id).commit()
    with pytest.raises(VersionGapError, match="upgrade the table to format v2"):
        IcebergFeed(table_dir(t.refresh())).read_table()


def test_files_outside_the_table_are_refused_unless_allowed(tmp_path: Path) -> None:
    t = new_table(tmp_path / "cat")
    t.append(rows([1]))
    outside = tmp_path / "elsewhere" / "x.parquet"
    outside.parent.mkdir()
    plain = pa.schema([pa.field("id", pa.int64(), False), pa.field("name", pa.string()), pa.field("grp", pa.int64())])
    pq.write_table(
        pa.table([pa.array([7], pa.int64()), pa.array(["s"]), pa.array([1], pa.int64())], schema=plain), outside
    )
    t.add_files([str(outside)])
    with pytest.raises(UnsafePathError, match="outside the table root") as e:
        changes(t)
    assert e.value.file is not None and "elsewhere" in e.value.file
    # allowed, the file is read, but it has no field ids (add_files relies on a name mapping): refused clearly
    with pytest.raises(UnsupportedFeatureError, match="name mapping"):
        changes(t, external_roots=(str(tmp_path / "elsewhere"),))


# -- damaged tables ------------------------------------------------------------------------------


def test_damaged_and_missing_files_are_named(tmp_path: Path) -> None:
    t = new_table(tmp_path / "cat")
    t.append(rows([1, 2]))
    t.append(rows([3]))
    root = table_dir(t)
    with pytest.raises(TableNotFoundError, match="no metadata"):
        IcebergFeed(str(tmp_path / "nothing")).read_table()
    # a data file gone: named with the table and the version
    gone = next(p for p in data_files(t) if _file_rows(p)[0]["id"] == 1)  # the first snapshot's file
    Path(gone.split("://", 1)[-1]).unlink()
    with pytest.raises(MissingFileError) as missing:
        IcebergFeed(root).read_table()
    assert missing.value.file == gone.split("://", 1)[-1] and missing.value.table == root and missing.value.version == 1
    # the newest metadata file damaged: an InvalidLogError naming it
    newest = Path(t.metadata_location.split("://", 1)[-1])
    newest.write_text('{"format-version": 2, "table-uuid": ')
    with pytest.raises(InvalidLogError, match="does not parse") as bad:
        IcebergFeed(root).read_table()
    assert bad.value.file == str(newest)


def test_the_version_hint_names_the_newest_metadata(tmp_path: Path) -> None:
    t = new_table(tmp_path / "cat")
    t.append(rows([1]))
    first = Path(t.metadata_location.split("://", 1)[-1])
    t.append(rows([2]))
    meta = Path(table_dir(t)) / "metadata"
    (meta / "v7.metadata.json").write_text(first.read_text())  # a Hadoop-style name, the hint pointing at it
    (meta / "version-hint.text").write_text("7\n")
    assert IcebergFeed(table_dir(t)).iceberg.metadata_location().endswith("/v7.metadata.json")
    assert [r["id"] for r in IcebergFeed(table_dir(t)).read_table().to_pylist()] == [1]
    (meta / "version-hint.text").write_text("99")  # a hint naming no file: the listing decides
    assert IcebergFeed(table_dir(t)).iceberg.metadata_location().endswith("/v7.metadata.json")


def test_a_position_delete_past_the_end_of_its_data_file_is_refused(tmp_path: Path) -> None:
    t = new_table(tmp_path / "cat")
    t.append(rows([1, 2]))
    t = commit_deletes(t, positions=[(data_files(t)[0], 5)])
    with pytest.raises(DataFileError, match="names row 5 of a 2-row data file") as e:
        IcebergFeed(table_dir(t)).read_table()
    assert e.value.version == 2 and e.value.table == table_dir(t)
