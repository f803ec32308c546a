"""Audit events of tables deltalake 1.6.6 wrote in the test, one operation per commit.

The tables are described in ``audit_tables.py``. Expected values come from what the test told
deltalake to do (rows written, deleted, updated, users), from the metrics deltalake recorded, from
deltalake's own reads of each version (row counts, the schema after a hand-written rename), and
from ``os.stat`` of the commit files.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from audit_tables import AuditTables
from deltalake import DeltaTable, QueryBuilder

from deltatail.state.audit import AuditEvent
from deltatail.state.errors import (
    ConfigError,
    DeltaTailError,
    InvalidLogError,
    MissingFileError,
    TableNotFoundError,
    VersionGapError,
    VersionNotFoundError,
)
from deltatail.state.snapshot import Snapshot
from deltatail.tailer.audit.feed import AuditFeed, AuditTracker, parquet_row_count, table_row_count
from deltatail.tailer.audit.log import AUDIT_ARROW_SCHEMA, read_audit_log, write_audit_log
from deltatail.tailer.log.delta_log import DeltaLog
from deltatail.tailer.read.feed import ChangeFeed, ChangeOptions
from deltatail.tailer.storage import LocalStorage


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> AuditTables:
    return AuditTables(tmp_path_factory.mktemp("audit"))


def by_version(path: Path, *, counted: bool = False, track_table_rows: bool = False) -> dict[int, AuditEvent]:
    events = AuditFeed(str(path)).events(counted=counted, track_table_rows=track_table_rows)
    return {e.version: e for e in events}


def figures(e: AuditEvent) -> tuple[int | None, int | None, int | None]:
    return (e.counts.rows_inserted, e.counts.rows_deleted, e.counts.rows_updated)


def test_one_event_per_operation_with_who_and_how_much(tables: AuditTables) -> None:
    got = {e.version: e for e in tables.followed}
    assert [(v, e.operation, e.user) for v, e in got.items()] == [
        (0, "WRITE", "alice@corp"),
        (1, "WRITE", "alice@corp"),
        (2, "DELETE", "bob@corp"),
        (3, "UPDATE", "bob@corp"),
        (4, "MERGE", "bob@corp"),
        (5, "WRITE", "alice@corp"),
        (6, "OPTIMIZE", "svc-optimizer"),
        (7, "SET TBLPROPERTIES", "admin@corp"),
        (8, "WRITE", "mallory@corp"),
        (9, "RESTORE", "admin@corp"),
        (10, "VACUUM START", "admin@corp"),
        (11, "VACUUM END", "admin@corp"),
        (12, "WRITE", "mallory@corp"),
    ]
    for e in got.values():
        assert e.actor.user_id == f"id-{e.user}"
        assert e.actor.engine_info == "delta-rs:py-1.6.6" and e.actor.client_version == "delta-rs.py-1.6.6"
    # rows the test wrote, deleted, updated (see audit_tables.py)
    assert {v: figures(e) for v, e in got.items() if v in (0, 1, 2, 3, 4, 5, 8, 12)} == {
        0: (5, 0, 0),
        1: (3, 0, 0),
        2: (0, 2, 0),
        3: (0, 0, 1),
        4: (1, 1, 1),
        5: (2, 0, 0),
        8: (1, 0, 0),
        12: (1, 8, 0),  # the overwrite removes the 8 rows OPTIMIZE put in one file
    }
    assert got[12].counts.row_sources["deleted"] == "files" and got[12].counts.row_sources["inserted"] == "metrics"
    assert got[2].predicate == "id > 6" and got[3].predicate == "id = 1" and got[4].predicate == "t.id = s.id"
    assert [(t.app_id, t.version) for t in got[1].transaction.app_transactions] == [("ingest", 7)]
    assert (got[2].counts.rows_copied, got[3].counts.rows_copied, got[4].counts.rows_copied) == (1, 4, 3)
    assert got[4].transaction.read_version == 3


def test_table_rows_follow_deltalakes_count_of_each_version(tables: AuditTables) -> None:
    expected = {v: DeltaTable(str(tables.ops), version=v).to_pyarrow_dataset().count_rows() for v in range(10)}
    expected |= {v: DeltaTable(str(tables.vacuumed), version=v).to_pyarrow_dataset().count_rows() for v in (10, 11, 12)}
    assert {e.version: e.counts.table_rows_after for e in tables.followed} == expected
    assert [e.counts.table_rows_before for e in tables.followed[1:]] == [expected[v] for v in range(12)]
    assert tables.followed[12].rows_deleted_pct == pytest.approx(100.0)


def test_optimize_moves_files_and_bytes_but_no_rows(tables: AuditTables) -> None:
    e = tables.followed[6]
    m = e.operation_metrics
    added, removed = json.loads(m["filesAdded"]), json.loads(m["filesRemoved"])
    assert (e.counts.files_added, e.counts.files_removed) == (m["numFilesAdded"], m["numFilesRemoved"])
    assert (e.counts.bytes_added, e.counts.bytes_removed) == (added["totalSize"], removed["totalSize"])
    assert (e.counts.data_files_added, e.counts.data_files_removed) == (0, 0)
    assert figures(e) == (0, 0, 0) and not e.data_change and not e.no_op


def test_property_protocol_and_schema_changes(tables: AuditTables) -> None:
    got = {e.version: e for e in tables.followed}
    assert [(c.key, c.old, c.new, c.change) for c in got[7].property_changes] == [
        ("delta.deletedFileRetentionDuration", None, "interval 1 days", "added"),
        ("delta.enableChangeDataFeed", None, "true", "added"),
    ]
    p = got[7].protocol_change
    assert p is not None and (p.old_min_writer_version, p.new_min_writer_version) == (2, 4)
    assert got[7].schema_change is None and not got[7].no_op
    assert got[8].schema_change is not None and got[8].schema_change.added == ("w",)
    assert got[9].schema_change is not None and got[9].schema_change.dropped == ("w",)
    assert got[9].protocol_change is None  # RESTORE repeats the protocol of version 7: no change
    assert got[0].table_created and not any(e.table_created for e in tables.followed[1:])
    changed = [v for v, e in got.items() if e.schema_change is not None or e.protocol_change is not None]
    assert changed == [0, 7, 8, 9]


def test_vacuum_commits_are_no_ops(tables: AuditTables) -> None:
    no_ops = [e.version for e in tables.followed if e.no_op]
    assert no_ops == [10, 11]
    assert tables.followed[10].operation_metrics["numFilesToDelete"] == tables.followed[11].operation_metrics[
        "numDeletedFiles"]  # fmt: skip


def test_restore_rows_unknown_once_vacuum_removed_the_file(tables: AuditTables) -> None:
    live = tables.followed[9]  # audited before the vacuum: the removed file's footer says 1 row
    assert figures(live) == (0, 1, 0) and live.counts.row_sources["deleted"] == "files"
    caught_up = by_version(tables.vacuumed, track_table_rows=True)
    assert caught_up[9].counts.rows_deleted is None and caught_up[9].counts.row_sources["deleted"] == "unknown"
    assert caught_up[9].counts.table_rows_after is None and caught_up[12].rows_deleted_pct is None
    assert caught_up[8].counts.table_rows_after == 9


def test_counting_needs_the_data_files(tables: AuditTables) -> None:
    with pytest.raises(MissingFileError) as e:
        list(AuditFeed(str(tables.vacuumed)).events(2, 2, counted=True))
    assert e.value.file is not None and e.value.file.endswith(".parquet")


def test_timestamps_are_the_commit_files_times(tables: AuditTables) -> None:
    previous: int | None = None
    expected = {}
    for v in range(13):
        ms = os.stat(tables.vacuumed / "_delta_log" / f"{v:020d}.json").st_mtime_ns // 1_000_000
        if previous is not None and ms <= previous:
            ms = previous + 1
        expected[v] = previous = ms
    assert {e.version: e.timestamp_ms for e in by_version(tables.vacuumed).values()} == expected


@pytest.mark.parametrize("version", [2, 3, 4])
def test_metrics_equal_net_change_rows_without_cdf(tables: AuditTables, version: int) -> None:
    e = tables.followed[version]
    assert {e.counts.row_sources[f] for f in ("inserted", "deleted", "updated")} <= {"metrics", "operation"}
    options = ChangeOptions(net_changes=True, key_columns=("id",))
    rows = ChangeFeed(str(tables.ops), options=options).read_table(version, version)
    kinds = Counter(rows.column("_change_type").to_pylist())
    assert figures(e) == (kinds["insert"], kinds["delete"], kinds["update_postimage"])


def test_metrics_equal_change_rows_with_cdf(tables: AuditTables) -> None:
    plain = by_version(tables.cdf)
    counted = by_version(tables.cdf, counted=True)
    # what the test did: delete id 2; update ids 5, 6; merge: update 1, delete 3, insert 7
    assert {v: figures(plain[v]) for v in (1, 2, 3)} == {1: (0, 1, 0), 2: (0, 0, 2), 3: (1, 1, 1)}
    for v in (1, 2, 3):
        assert plain[v].counts.cdc_files > 0
        rows = ChangeFeed(str(tables.cdf)).read_table(v, v)
        kinds = Counter(rows.column("_change_type").to_pylist())
        assert figures(plain[v]) == (kinds["insert"], kinds["delete"], kinds["update_postimage"])
        assert figures(counted[v]) == figures(plain[v])
        assert counted[v].counts.row_sources["updated"] == "counted"


def test_column_mapping_nullability_rename_and_drop(tables: AuditTables) -> None:
    got = by_version(tables.column_mapping)
    assert got[0].table_created and got[0].schema_change is not None
    assert {c.key: c.new for c in got[0].property_changes}["delta.columnMapping.mode"] == "name"
    n = got[2].schema_change
    assert n is not None and [(c.path, c.old_nullable, c.new_nullable) for c in n.nullability_changed] == [
        ("id", False, True)]  # fmt: skip
    assert n.kinds == ("nullability_changed",) and n.additive
    r = got[3].schema_change
    assert r is not None and [(x.old_path, x.new_path) for x in r.renamed] == [("v", "value"), ("s.a", "s.alpha")]
    assert r.kinds == ("renamed",)
    assert got[3].operation == "RENAME COLUMN" and got[3].user == "dba@corp"
    d = got[4].schema_change
    assert d is not None and d.dropped == ("s.b",) and d.kinds == ("dropped",)
    # deltalake (DataFusion) reads the hand-written commits as the protocol means them
    query = QueryBuilder().register("t", DeltaTable(str(tables.column_mapping)))
    rows = pa.table(query.execute("select * from t").read_all())
    assert rows.column_names == ["id", "value", "s"]
    assert sorted(rows.to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "value": "a", "s": {"alpha": 1}},
        {"id": 2, "value": "b", "s": {"alpha": 2}},
    ]


def test_ranges_and_their_errors(tables: AuditTables) -> None:
    feed = AuditFeed(str(tables.ops))
    assert [e.version for e in feed.events(3, 5)] == [3, 4, 5]
    first = next(iter(feed.events(starting_timestamp_ms=tables.followed[4].timestamp_ms)))
    assert first.version == 4
    with pytest.raises(VersionNotFoundError, match="starting version 20 is after the latest version 9"):
        list(feed.events(20))
    with pytest.raises(VersionNotFoundError, match="ending version 20 is after the latest version 9"):
        list(feed.events(0, 20))
    with pytest.raises(ConfigError, match="ending version 2 is before starting version 5"):
        list(feed.events(5, 2))


def test_a_path_without_a_table(tmp_path: Path) -> None:
    with pytest.raises(TableNotFoundError, match="no _delta_log directory"):
        list(AuditFeed(str(tmp_path)).events())
    (tmp_path / "_delta_log").mkdir()
    with pytest.raises(TableNotFoundError, match="holds no commits"):
        list(AuditFeed(str(tmp_path)).events())


def test_a_missing_commit_inside_the_range_is_an_error(tables: AuditTables, tmp_path: Path) -> None:
    copy = tmp_path / "gap"
    shutil.copytree(tables.ops, copy)
    (copy / "_delta_log" / f"{5:020d}.json").unlink()
    with pytest.raises(VersionGapError, match="commit 5 is missing") as e:
        list(AuditFeed(str(copy)).events(3, 6))
    assert e.value.version == 5
    assert [ev.version for ev in AuditFeed(str(copy)).events(0, 4)] == [0, 1, 2, 3, 4]


def test_a_follower_builds_events_with_the_tracker(tables: AuditTables) -> None:
    log = DeltaLog(str(tables.ops))
    listing = log.list_log(0)
    tracker = AuditTracker(str(tables.ops), LocalStorage(), table_rows=0)
    snap = Snapshot.empty(log.table)
    previous: int | None = None
    got = []
    for v in range(10):
        commit = log.read_commit(v)
        event = tracker.event(
            commit, snap, file_mtime_ms=listing.commits[v].modification_time, previous_timestamp_ms=previous
        )
        snap, _ = snap.apply(commit)
        previous = event.timestamp_ms
        got.append(event)
    assert got == tables.followed[:10]
    assert tracker.table_rows == 8
    with pytest.raises(VersionGapError, match="commit 3 does not follow version 9"):
        tracker.event(log.read_commit(3), snap, file_mtime_ms=0, previous_timestamp_ms=None)
    # deltalake writes no statistics on removes: only RESTORE, which records no row metrics, needs a footer
    assert tracker.footer_reads == 1


def test_footer_row_counts(tables: AuditTables, tmp_path: Path) -> None:
    storage = LocalStorage()
    snap = DeltaLog(str(tables.ops)).snapshot(9)
    assert table_row_count(snap, storage) == 8
    data = next(tables.ops.glob("*.parquet"))
    assert parquet_row_count(storage, str(data)) == pq.read_metadata(data).num_rows
    with pytest.raises(MissingFileError):
        parquet_row_count(storage, str(tmp_path / "nope.parquet"))
    short = tmp_path / "short.parquet"
    short.write_bytes(b"PAR1")
    with pytest.raises(DeltaTailError, match="too short to be Parquet"):
        parquet_row_count(storage, str(short))
    not_parquet = tmp_path / "x.parquet"
    not_parquet.write_bytes(b"0" * 64)
    with pytest.raises(DeltaTailError, match="does not end with the Parquet magic"):
        parquet_row_count(storage, str(not_parquet))
    lying = tmp_path / "lying.parquet"
    lying.write_bytes(b"PAR1" + b"0" * 8 + (10_000).to_bytes(4, "little") + b"PAR1")
    with pytest.raises(DeltaTailError, match="footer length 10000 exceeds the file"):
        parquet_row_count(storage, str(lying))
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"PAR1" + b"\xff" * 20 + (20).to_bytes(4, "little") + b"PAR1")
    with pytest.raises(DeltaTailError, match="footer does not parse"):
        parquet_row_count(storage, str(garbage))


def test_audit_logs_round_trip_in_both_formats(tables: AuditTables, tmp_path: Path) -> None:
    for name in ("audit.jsonl", "audit.parquet"):
        path = str(tmp_path / name)
        assert write_audit_log(tables.followed, path) == 13
        assert list(read_audit_log(path)) == tables.followed
    table = pq.read_table(str(tmp_path / "audit.parquet"))
    assert table.schema == AUDIT_ARROW_SCHEMA
    assert table.column("operation").to_pylist()[:5] == ["WRITE", "WRITE", "DELETE", "UPDATE", "MERGE"]
    assert table.column("rows_deleted").to_pylist()[12] == 8
    assert table.column("timestamp").to_pylist()[0].timestamp() * 1000 == tables.followed[0].timestamp_ms
    lines = (tmp_path / "audit.jsonl").read_text().splitlines()
    assert json.loads(lines[2])["operation"] == "DELETE"


def test_audit_log_errors(tables: AuditTables, tmp_path: Path) -> None:
    with pytest.raises(DeltaTailError, match=r"an audit log is .jsonl"):
        write_audit_log(tables.followed, str(tmp_path / "audit.csv"))
    with pytest.raises(DeltaTailError, match="cannot write the audit log"):
        write_audit_log(tables.followed, str(tmp_path / "no" / "audit.jsonl"))
    with pytest.raises(DeltaTailError, match="cannot read the audit log"):
        list(read_audit_log(str(tmp_path / "absent.jsonl")))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format": "deltatail.audit.commit/1"}\n')
    with pytest.raises(InvalidLogError, match="entry 1 is not an audit event: malformed audit event") as e:
        list(read_audit_log(str(bad)))
    assert e.value.file == str(bad)
    bad.write_text("not json\n")
    with pytest.raises(InvalidLogError, match="entry 1 is not an audit event"):
        list(read_audit_log(str(bad)))
