"""Change rows of Lance datasets written by pylance, against pylance's own reads.

Oracles: pylance scans of every version (``lance.dataset(root, version=v).to_table()``) and Lance's
own ``DatasetDelta`` (``ds.delta(begin_version=v-1, end_version=v)``); nothing expected is computed
by deltatail. For every version, as multisets of rows (over the columns both versions have):

    contents(v-1) + deleted rows == contents(v) + inserted rows

where deleted rows are ``delete`` and ``update_preimage`` rows and inserted rows are ``insert`` and
``update_postimage`` rows; every deleted row was in ``contents(v-1)`` and every inserted row is in
``contents(v)``.

Where DatasetDelta answers (datasets with stable row ids), deltatail agrees with it except in the
cases written down in :data:`DATASET_DELTA_DISAGREEMENTS`, each with its reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pytest
from lance_datasets import every_kind, rows

from deltatail.state.cursor import Position
from deltatail.state.errors import (
    ConfigError,
    DeletionVectorError,
    MissingFileError,
    SchemaChangeError,
    TableNotFoundError,
    VersionNotFoundError,
)
from deltatail.state.feed import ChangeBatch
from deltatail.tailer.lance.dataset import LanceDataset
from deltatail.tailer.lance.feed import LanceFeed, LanceOptions

Row = tuple[Hashable, ...]
INSERTED = ("insert", "update_postimage")
DELETED = ("delete", "update_preimage")

#: Where deltatail and Lance's DatasetDelta (pylance 14.0.2) differ, by the operation's label in
#: :func:`lance_datasets.every_kind`, and why. Everything else agrees row for row.
DATASET_DELTA_DISAGREEMENTS = {
    "add_columns": (
        "DatasetDelta reports every live row as updated (the new column's values were written); deltatail "
        "gives nothing: no row changed, the schema gained a column (as Delta's ADD COLUMNS)"
    ),
    "restore to the update of 100 rows": (
        "DatasetDelta reports only the rows of the fragments the restore dropped (as deleted ids) and none "
        "of the rows it brings back; deltatail gives the rows brought back as inserts too, so that "
        "contents(v-1) + deletes == contents(v) + inserts holds"
    ),
}


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[int, str]]]:
    base = tmp_path_factory.mktemp("lance")
    out = {}
    for name, stable in (("plain", False), ("stable", True)):
        root = base / name
        out[name] = (root, dict(every_kind(root, stable=stable)))
    return out


def contents(root: Path, version: int, columns: list[str]) -> Counter[Row]:
    if version == 0:
        return Counter()
    table = lance.dataset(str(root), version=version).to_table(columns=columns)
    return Counter(zip(*(table.column(c).to_pylist() for c in columns), strict=True))


def version_rows(feed: LanceFeed, version: int) -> list[ChangeBatch]:
    return list(feed.batches(version, version))


def as_rows(batches: list[ChangeBatch], columns: list[str], kinds: tuple[str, ...]) -> Counter[Row]:
    out: Counter[Row] = Counter()
    for b in batches:
        t = b.rows
        mask = [k in kinds for k in t.column("_change_type").to_pylist()]
        picked = t.filter(pa.array(mask))
        out.update(zip(*(picked.column(c).to_pylist() for c in columns), strict=True))
    return out


def common_columns(root: Path, version: int) -> list[str]:
    after: list[str] = lance.dataset(str(root), version=version).schema.names
    if version == 1:
        return after
    before = lance.dataset(str(root), version=version - 1).schema.names
    return [c for c in after if c in before]


@pytest.mark.parametrize("name", ["plain", "stable"])
def test_every_version_is_the_difference_of_the_contents(
    datasets: dict[str, tuple[Path, dict[int, str]]], name: str
) -> None:
    root, made = datasets[name]
    feed = LanceFeed(str(root), options=LanceOptions(allow_non_additive=True))
    latest = lance.dataset(str(root)).version
    assert latest == max(made)
    for version in range(1, latest + 1):
        batches = version_rows(feed, version)
        columns = common_columns(root, version)
        before, after = contents(root, version - 1, columns), contents(root, version, columns)
        ins, dels = as_rows(batches, columns, INSERTED), as_rows(batches, columns, DELETED)
        label = made.get(version)
        assert before + ins == after + dels, label
        assert not dels - before and not ins - after, label
        # Positions: 0..n-1 of the version, in order, none flagged as snapshot.
        positions = [b.position(i) for b in batches for i in range(len(b))]
        assert positions == [Position.change(version, i) for i in range(len(positions))], label
        kinds = Counter(k for b in batches for k in b.rows.column("_change_type").to_pylist())
        if name == "plain":
            assert not kinds["update_preimage"] and not kinds["update_postimage"], label
        else:
            assert kinds["update_preimage"] == kinds["update_postimage"], label
        if label in ("compaction", "scalar index", "add_columns", "rename (non-additive)", "drop (non-additive)"):
            assert not kinds, label


def test_updates_are_paired_by_stable_row_id(datasets: dict[str, tuple[Path, dict[int, str]]]) -> None:
    root, made = datasets["stable"]
    feed = LanceFeed(str(root))
    by_label = {label: v for v, label in made.items()}
    batches = version_rows(feed, by_label["merge-insert: 20 updated, 5 inserted"])
    table = pa.Table.from_batches([b.rows for b in batches])
    kinds = table.column("_change_type").to_pylist()
    assert Counter(kinds) == {"update_preimage": 20, "update_postimage": 20, "insert": 5}
    pre = [r for r in table.to_pylist() if r["_change_type"] == "update_preimage"]
    post = [r for r in table.to_pylist() if r["_change_type"] == "update_postimage"]
    # The i-th postimage is the i-th preimage's row after the merge (same id; name and score from the source).
    assert [r["id"] for r in pre] == [r["id"] for r in post]
    assert all(r["name"] == f"n{r['id']}" for r in pre) and all(r["name"] == f"m{r['id']}" for r in post)


def _dataset_delta(root: Path, version: int) -> tuple[Counter[Row], Counter[Row], Counter[Row], list[str]]:
    """DatasetDelta's inserted rows, updated rows and deleted rows (read by pylance at v-1 by their row ids)."""
    ds = lance.dataset(str(root), version=version)
    columns = ds.schema.names
    delta = ds.delta(begin_version=version - 1, end_version=version)
    inserted = delta.get_inserted_rows().read_all()
    updated = delta.get_updated_rows().read_all()
    deleted_ids = set(delta.get_deleted_row_ids().read_all().column("_rowid").to_pylist())
    deleted: Counter[Row] = Counter()
    if deleted_ids:
        before = lance.dataset(str(root), version=version - 1)
        cols = [c for c in columns if c in before.schema.names]
        scan = before.to_table(columns=cols, with_row_id=True)
        for r in scan.to_pylist():
            if r["_rowid"] in deleted_ids:
                deleted[tuple(r.get(c) for c in columns)] += 1

    def count(t: pa.Table) -> Counter[Row]:
        return Counter(zip(*(t.column(c).to_pylist() for c in columns), strict=True))

    return count(inserted), count(updated), deleted, columns


def test_agreement_with_lance_dataset_delta(datasets: dict[str, tuple[Path, dict[int, str]]]) -> None:
    root, made = datasets["stable"]
    feed = LanceFeed(str(root), options=LanceOptions(allow_non_additive=True))
    disagreements: dict[str, str] = {}
    for version in range(1, max(made) + 1):
        inserted, updated, deleted, columns = _dataset_delta(root, version)
        batches = version_rows(feed, version)
        mine = {kind: as_rows(batches, columns, (kind,)) for kind in ("insert", "update_postimage", "delete")}
        mine_deleted = mine["delete"]
        label = made[version]
        problems = []
        if mine["insert"] != inserted:
            problems.append(f"inserts {sum(mine['insert'].values())} vs {sum(inserted.values())}")
        if mine["update_postimage"] != updated:
            problems.append(f"updates {sum(mine['update_postimage'].values())} vs {sum(updated.values())}")
        if mine_deleted != deleted:
            problems.append(f"deletes {sum(mine_deleted.values())} vs {sum(deleted.values())}")
        if problems:
            disagreements[label] = "; ".join(problems)
    assert sorted(disagreements) == sorted(DATASET_DELTA_DISAGREEMENTS), disagreements


def test_dataset_delta_does_not_answer_without_stable_row_ids(
    datasets: dict[str, tuple[Path, dict[int, str]]],
) -> None:
    """Why there is nothing to compare on datasets without stable row ids: DatasetDelta returns no rows."""
    root, made = datasets["plain"]
    version = next(v for v, label in made.items() if label == "append: 3 fragments")
    delta = lance.dataset(str(root), version=version).delta(begin_version=version - 1, end_version=version)
    assert delta.get_inserted_rows().read_all().num_rows == 0  # silently empty: 300 rows were appended
    with pytest.raises(Exception, match="stable row ids"):
        delta.get_deleted_row_ids().read_all()
    assert sum(len(b) for b in version_rows(LanceFeed(str(root)), version)) == 300


def test_initial_snapshot_is_every_live_row(datasets: dict[str, tuple[Path, dict[int, str]]]) -> None:
    root, made = datasets["stable"]
    version = next(v for v, label in made.items() if label == "dense delete (.bin)")
    feed = LanceFeed(str(root))
    plans = feed.plans(version, version + 1, initial_snapshot=True)
    first = next(plans)
    assert first.snapshot and first.version == version
    batches = list(feed.plan_batches(first))
    columns = ["id", "name", "score"]
    assert as_rows(batches, columns, ("insert",)) == contents(root, version, columns)
    assert batches[0].start == Position.in_snapshot(version, 0)
    assert next(plans).version == version + 1


def test_a_non_additive_schema_change_stops_the_range(datasets: dict[str, tuple[Path, dict[int, str]]]) -> None:
    root, made = datasets["plain"]
    rename = next(v for v, label in made.items() if label.startswith("rename"))
    with pytest.raises(SchemaChangeError) as e:
        list(LanceFeed(str(root)).batches(rename - 1, rename))
    assert e.value.version == rename and e.value.table == str(root)
    # An additive one (add_columns) is carried: deletes read before it get nulls in the new column.
    add = next(v for v, label in made.items() if label == "add_columns")
    table = LanceFeed(str(root)).read_table(add - 2, add + 2)
    assert "double" in table.column_names


def test_read_table_is_the_concatenation_of_the_batches(datasets: dict[str, tuple[Path, dict[int, str]]]) -> None:
    root, _ = datasets["plain"]
    feed = LanceFeed(str(root))
    table = feed.read_table(2, 5)
    assert table.num_rows == sum(len(b) for b in feed.batches(2, 5))
    assert table.column_names[-3:] == ["_change_type", "_commit_version", "_commit_timestamp"]


def test_commit_timestamp_is_the_manifest_timestamp(datasets: dict[str, tuple[Path, dict[int, str]]]) -> None:
    root, _ = datasets["plain"]
    versions = {v["version"]: v["timestamp"] for v in lance.dataset(str(root)).versions()}
    for batch in LanceFeed(str(root)).batches(1, 3):
        stamp = batch.rows.column("_commit_timestamp")[0].as_py()
        # The manifest holds nanoseconds; deltatail truncates them to microseconds, while pylance's
        # versions() goes through a float and lands 1 us either side for about one version in 16.
        assert abs(stamp.replace(tzinfo=None) - versions[batch.start.version]) <= timedelta(microseconds=1)


# -- errors --------------------------------------------------------------------------------------


def _small(root: Path) -> Path:
    lance.write_dataset(rows(range(100)), str(root))
    lance.dataset(str(root)).delete("id < 5")
    lance.write_dataset(rows(range(100, 110)), str(root), mode="append")
    lance.dataset(str(root)).delete("id = 50")
    return root


def test_a_cleaned_up_version_is_a_named_error_with_a_hint(tmp_path: Path) -> None:
    root = _small(tmp_path / "ds")
    lance.dataset(str(root)).cleanup_old_versions(older_than=timedelta(0))
    feed = LanceFeed(str(root))
    with pytest.raises(VersionNotFoundError, match="cleanup_old_versions") as e:
        list(feed.batches(2, 4))
    assert e.value.version == 2 and e.value.file is not None and e.value.file.endswith(".manifest")
    assert len(list(feed.batches(4, 4, initial_snapshot=True))) > 0  # what the hint suggests works


def test_a_missing_deletion_file_names_it(tmp_path: Path) -> None:
    root = _small(tmp_path / "ds")
    manifest = LanceDataset(str(root)).manifest(4)
    deletion = next(f.deletion for f in manifest.fragments if f.deletion is not None)
    (root / deletion.path).unlink()
    with pytest.raises(MissingFileError) as e:
        list(LanceFeed(str(root)).batches(4, 4))
    assert e.value.version == 4 and e.value.file == f"{root}/{deletion.path}" and e.value.table == str(root)


def test_a_corrupt_deletion_file_names_it(tmp_path: Path) -> None:
    root = _small(tmp_path / "ds")
    deletion = next(f.deletion for f in LanceDataset(str(root)).manifest(2).fragments if f.deletion is not None)
    (root / deletion.path).write_bytes(b"not arrow")
    with pytest.raises(DeletionVectorError) as e:
        list(LanceFeed(str(root)).batches(2, 2))
    assert e.value.file == f"{root}/{deletion.path}"


def test_a_missing_data_file_names_it(tmp_path: Path) -> None:
    root = _small(tmp_path / "ds")
    manifest = LanceDataset(str(root)).manifest(3)
    new = next(f for f in manifest.fragments if f.id == 1)
    (root / "data" / new.files[0].path).unlink()
    with pytest.raises(MissingFileError) as e:
        list(LanceFeed(str(root)).batches(3, 3))
    assert e.value.file == f"{root}/data/{new.files[0].path}" and e.value.version == 3


def test_no_dataset_is_a_named_error(tmp_path: Path) -> None:
    with pytest.raises(TableNotFoundError):
        LanceDataset(str(tmp_path)).latest_version()


def test_versions_follow_lances_naming_rules(tmp_path: Path) -> None:
    root = _small(tmp_path / "ds")
    versions = root / "_versions"
    names = {p.name for p in versions.iterdir()}
    for junk in ("d3.manifest", "18446744073709551610.manifest#1", "3.manifest-0a1b", ".tmp_4.manifest", "x.tmp"):
        (versions / junk).write_bytes(b"junk")
    found = LanceDataset(str(root)).list_versions()
    assert sorted(found) == [1, 2, 3, 4]
    assert {f.name for f in found.values()} == names - {"latest_version_hint.json"}
    (versions / "latest_version_hint.json").write_text('{"version": 99}')  # a lying hint changes nothing
    assert LanceDataset(str(root)).latest_version() == 4


def test_v1_manifest_names(tmp_path: Path) -> None:
    root = tmp_path / "v1"
    lance.write_dataset(rows(range(10)), str(root), enable_v2_manifest_paths=False)
    lance.dataset(str(root)).delete("id = 3")
    assert sorted(p.name for p in (root / "_versions").glob("*.manifest")) == ["1.manifest", "2.manifest"]
    batches = list(LanceFeed(str(root)).batches(1, 2))
    kinds = Counter(k for b in batches for k in b.rows.column("_change_type").to_pylist())
    assert kinds == {"insert": 10, "delete": 1}


def _ids_of(batches: Iterator[ChangeBatch] | list[ChangeBatch]) -> list[Any]:
    return [i for b in batches for i in b.rows.column("id").to_pylist()]


def test_ranges_and_errors_of_plans(tmp_path: Path) -> None:
    root = _small(tmp_path / "ds")
    feed = LanceFeed(str(root))
    assert _ids_of(feed.batches(0, 1)) == list(range(100))  # version 0 is the empty dataset before 1
    with pytest.raises(VersionNotFoundError):
        list(feed.plans(5))
    with pytest.raises(VersionNotFoundError):
        list(feed.plans(1, 9))
    with pytest.raises(ConfigError):
        list(feed.plans(3, 2))
