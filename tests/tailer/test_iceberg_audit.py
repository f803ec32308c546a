"""``deltatail audit`` on Iceberg tables: one event per snapshot of ``main`` (issue #32).

Histories are written by pyiceberg (SQL catalog on SQLite), one position delete built from the spec
(``iceberg_tables.commit_deletes``); expectations are worked out by hand from what each step wrote.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from iceberg_tables import commit_deletes, new_table, rows, table_dir
from pyiceberg.table import Table
from pyiceberg.types import StringType

from deltatail.state.audit import AuditEvent
from deltatail.state.errors import ConfigError, InvalidLogError, TableNotFoundError, VersionNotFoundError
from deltatail.state.iceberg.audit import Column, SnapshotFacts, build_iceberg_event, schema_diff
from deltatail.state.iceberg.model import SnapshotInfo
from deltatail.tailer.formats.registry import open_table


def history(tmp_path: Path) -> Table:
    """v1 append 1..4 (engine recorded); a property; v2 delete of id 2 (a copy-on-write rewrite); a column;
    v3 append 5..6; v4 a position delete of id 5's row; a partition field; v5 append 7."""
    t = new_table(tmp_path, owner="a")
    t.append(rows([1, 2, 3, 4]), snapshot_properties={"engine-name": "spark", "engine-version": "3.5.1"})
    with t.transaction() as tx:
        tx.set_properties(owner="b", team="x")
    t.delete("id == 2")
    with t.update_schema() as u:
        u.add_column("extra", StringType())
    t.append(rows([5, 6]).append_column("extra", pa.array(["e", "f"])))
    before = set(t.inspect.files(snapshot_id=_ids(t)[1]).column("file_path").to_pylist())
    (appended,) = set(t.refresh().inspect.files().column("file_path").to_pylist()) - before
    t = commit_deletes(t, positions=[(appended, 0)])
    with t.update_spec() as spec:
        spec.add_identity("grp")
    t.append(rows([7]).append_column("extra", pa.array(["g"])))
    return t.refresh()


def _ids(t: Table) -> list[int]:
    return [s.snapshot_id for s in t.refresh().metadata.snapshots]


def events(t: Table, **kwargs: object) -> list[AuditEvent]:
    ref = open_table(table_dir(t))
    return list(ref.format.audit_feed(ref).events(**kwargs))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Table:
    return history(tmp_path_factory.mktemp("iceberg-audit"))


def test_one_event_per_snapshot_with_the_summary_figures(table: Table) -> None:
    found = events(table)
    assert [e.version for e in found] == [1, 2, 3, 4, 5]
    assert [e.operation for e in found] == ["append", "overwrite", "append", "delete", "append"]
    assert [s.snapshot_id for s in table.metadata.snapshots] == [e.operation_parameters["snapshot-id"] for e in found]
    first, rewrite, third, deletes, last = found
    assert first.table_created and not rewrite.table_created
    assert first.actor.engine_info == "spark 3.5.1" and rewrite.actor.engine_info is None
    assert first.timestamp_ms == table.metadata.snapshots[0].timestamp_ms
    c = first.counts
    assert (c.rows_inserted, c.rows_deleted, c.data_files_added, c.table_rows_before, c.table_rows_after) == (
        4,
        0,
        1,
        0,
        4,
    )
    # the delete rewrote the one file: 4 records out, 3 in; the summary cannot tell deleted from carried over
    c = rewrite.counts
    assert (c.data_files_added, c.data_files_removed, c.rows_deleted, c.row_sources["deleted"]) == (
        1,
        1,
        None,
        "unknown",
    )
    assert (c.table_rows_before, c.table_rows_after) == (4, 3)
    assert (third.counts.rows_inserted, third.counts.table_rows_after) == (2, 5)
    # the position delete: one delete file, one row
    c = deletes.counts
    assert (c.files_added, c.data_files_added, c.rows_deleted, c.rows_inserted) == (1, 0, 1, 0)
    assert deletes.operation_metrics["added-position-deletes"] == "1"
    assert (last.counts.rows_inserted, last.counts.data_files_added) == (1, 1)


def test_schema_property_and_partition_spec_changes(table: Table) -> None:
    first, rewrite, third, deletes, last = events(table)
    # owner=a was set at creation; owner=b and team=x after the first snapshot show on the next one
    assert first.property_changes == ()
    assert [(p.key, p.old, p.new) for p in rewrite.property_changes] == [("owner", "a", "b"), ("team", None, "x")]
    assert rewrite.schema_change is None and third.property_changes == ()
    assert third.schema_change is not None and third.schema_change.added == ("extra",)
    assert third.schema_change.dropped == () and third.schema_change.renamed == ()
    assert deletes.metadata_changes == ()
    (spec,) = last.metadata_changes
    assert (spec.key, spec.old, spec.new) == ("partition-spec", "[]", "[grp=identity(field 3)]")


def test_counted_figures_are_the_change_rows(table: Table) -> None:
    found = events(table, counted=True)
    assert [(e.counts.rows_inserted, e.counts.rows_deleted) for e in found] == [(4, 0), (0, 1), (2, 0), (0, 1), (1, 0)]
    assert found[1].counts.row_sources["deleted"] == "counted"


def test_range_and_start_by_time(table: Table) -> None:
    assert [e.version for e in events(table, starting_version=2, ending_version=3)] == [2, 3]
    ts = table.metadata.snapshots[3].timestamp_ms
    assert [e.version for e in events(table, starting_timestamp_ms=ts)] == [4, 5]


def _snapshot(**summary: str) -> SnapshotInfo:
    return SnapshotInfo(7, None, 1, 1000, summary.get("operation"), tuple(sorted(summary.items())), 0, "ml")


def test_a_summary_count_that_is_not_a_number_is_an_invalid_log_error() -> None:
    facts = SnapshotFacts("/t", "iceberg-u", 1, None, True, None, None, None)
    with pytest.raises(InvalidLogError, match="added-records='-3' is not a count") as e:
        build_iceberg_event(_snapshot(operation="append", **{"added-records": "-3"}), facts)
    assert (e.value.table, e.value.version) == ("/t", 1)
    with pytest.raises(InvalidLogError, match="is not a count"):
        build_iceberg_event(_snapshot(operation="append", **{"total-records": "9" * 20}), facts)


def test_an_append_of_no_file_inserts_nothing() -> None:
    facts = SnapshotFacts("/t", "iceberg-u", 2, None, False, None, None, None)
    event = build_iceberg_event(_snapshot(operation="append", **{"total-records": "3"}), facts)
    assert (event.counts.rows_inserted, event.counts.rows_deleted, event.no_op) == (0, 0, True)
    assert (event.counts.table_rows_before, event.counts.table_rows_after) == (None, 3)


def test_schema_diff_matches_columns_by_field_id() -> None:
    old = {1: Column("id", "long", True), 2: Column("name", "string", False), 3: Column("n", "int", False)}
    new = {1: Column("id", "long", False), 2: Column("label", "string", False), 3: Column("n", "long", False)}
    new[4] = Column("extra", "string", False)
    d = schema_diff(old, new)
    assert d.added == ("extra",) and d.dropped == ()
    assert [(r.old_path, r.new_path) for r in d.renamed] == [("name", "label")]
    assert [(t.path, t.old_type, t.new_type) for t in d.type_changed] == [("n", "int", "long")]
    assert [(n.path, n.old_nullable, n.new_nullable) for n in d.nullability_changed] == [("id", False, True)]
    assert schema_diff(new, {1: new[1]}).dropped == ("label", "n", "extra")


def test_bad_ranges_and_a_missing_table(table: Table, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="ending version 2 is before starting version 3"):
        events(table, starting_version=3, ending_version=2)
    with pytest.raises(VersionNotFoundError, match="starting version 9 is after the latest version 5"):
        events(table, starting_version=9)
    (tmp_path / "metadata").mkdir()
    ref = open_table(f"iceberg://{tmp_path}")
    with pytest.raises(TableNotFoundError, match="no Iceberg table here"):
        list(ref.format.audit_feed(ref).events())
